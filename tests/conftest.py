from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from convsim.adapters import Completion, GenerationParams, Message, ModelAdapter, ModelInfo, Usage

DATA = Path(__file__).parent / "data"


def write_pack(folder: Path, flows: dict[str, Any], scenarios: list[dict[str, Any]]) -> Path:
    """A multi-turn pack folder from flows and scenario dicts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "turn_configs.yml").write_text(
        yaml.safe_dump(flows, sort_keys=False), encoding="utf-8"
    )
    (folder / "scenarios.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in scenarios), encoding="utf-8"
    )
    return folder


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeAdapter(ModelAdapter):
    """A test adapter: answers or raises per call, records what it was sent. Only
    generate() is its own work; the hooks are ModelAdapter's defaults but for its name."""

    def __init__(self, behave=None, *, name: str = "fake") -> None:
        self.behave = behave or (lambda messages, params: f"reply {len(messages)}")
        self.calls: list[tuple[tuple[Message, ...], GenerationParams]] = []
        self.name = name
        self.closed = False

    def model_info(self) -> ModelInfo:
        return ModelInfo(model_id=self.name, model_type="fake", provider="tests")

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        self.calls.append((tuple(messages), params))
        out = self.behave(messages, params)
        if hasattr(out, "__await__"):
            out = await out
        if isinstance(out, BaseException):
            raise out
        return Completion(
            text=out, usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        )

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def fake_adapter() -> type[FakeAdapter]:
    return FakeAdapter
