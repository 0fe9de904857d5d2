"""A conversation's transcript has a limit: prompts that repeat the context, and answers
that keep growing, fail their turn instead of filling memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FakeAdapter, write_pack

import convsim
from convsim import Simulator, Status, TranscriptTooLong
from convsim.scenarios import Template

pytestmark = pytest.mark.anyio


def test_a_template_stops_before_it_passes_its_limit() -> None:
    template = Template.parse("{context}{context}x")
    assert template.render({"context": "ab"}, max_chars=5) == "ababx"
    big = "y" * 1000
    with pytest.raises(TranscriptTooLong, match="max_transcript_chars"):
        template.render({"context": big}, max_chars=1500)


async def test_a_prompt_that_doubles_the_context_fails_at_the_limit(tmp_path: Path) -> None:
    flows = {"default": {"turns": [{"turn_id": "t", "prompt_template": "{context}{context}x",
                                    "repeat": 60}]}}  # fmt: skip
    pack = write_pack(tmp_path / "pack", flows, [{"scenario_id": "s", "scenario_description": "d"}])
    async with Simulator(FakeAdapter(lambda m, p: "ok"), max_transcript_chars=100_000) as sim:
        results = [r async for r in sim.run(convsim.load_pack(pack))]
    (result,) = results
    assert result.status is Status.FAILED
    assert result.error is not None and result.error.type == "TranscriptTooLong"
    chars = sum(len(m.content) for m in result.transcript)
    assert chars <= 100_000
    assert 5 <= len([t for t in result.turns if t.status.value == "completed"]) < 20


async def test_answers_that_grow_fail_the_turn_that_passes_the_limit(tmp_path: Path) -> None:
    flows = {"default": {"turns": [{"turn_id": "t", "prompt_template": "more", "repeat": 20}]}}
    pack = write_pack(tmp_path / "pack", flows, [{"scenario_id": "s", "scenario_description": "d"}])
    model = FakeAdapter(lambda m, p: "z" * 3000)
    async with Simulator(model, max_transcript_chars=10_000) as sim:
        (result,) = [r async for r in sim.run(convsim.load_pack(pack))]
    assert result.status is Status.FAILED and result.error is not None
    assert result.error.type == "TranscriptTooLong" and result.error.side == "assistant"
    assert sum(len(m.content) for m in result.transcript) <= 10_000
    assert len(model.calls) == 4  # three answers fit, the fourth is refused
    assert result.usage.total_tokens == 8  # what the refused answer cost is still counted


async def test_without_a_limit_nothing_changes(tmp_path: Path) -> None:
    flows = {"default": {"turns": [{"turn_id": "t", "prompt_template": "more", "repeat": 5}]}}
    pack = write_pack(tmp_path / "pack", flows, [{"scenario_id": "s", "scenario_description": "d"}])
    async with Simulator(FakeAdapter(lambda m, p: "z" * 3000)) as sim:
        (result,) = [r async for r in sim.run(convsim.load_pack(pack))]
    assert result.status is Status.DONE
