"""``convsim load --trace FILE`` alone (no --rate, no --concurrency) replays the file's
arrivals from the command line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            MockModelServer(MockServerConfig(ttft_ms=1, itl_ms=0))
        ) as mock,
    ):
        yield mock


def test_a_trace_alone_replays_its_arrivals(server: Any, tmp_path: Path) -> None:
    trace = tmp_path / "arrivals.txt"
    trace.write_text("0\n0.05\n0.1\n")
    reqs = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "load", "--model", "openai-compatible:mock-model",
            "--model-arg", f"base_url={server.base_url}", "--trace", str(trace),
            "--synthetic", "input_tokens=8,output_tokens=2", "--repeat", "1",
            "--max-requests", "3", "--no-calibrate", "--max-schedule-delay-ms", "1000",
            "--max-loop-lag-ms", "1000", "--requests", str(reqs),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in reqs.read_text().splitlines()]
    assert sorted(r["scheduled_s"] for r in rows) == pytest.approx([0.0, 0.05, 0.1])
