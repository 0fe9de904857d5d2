"""A reasoning model through a run: its thoughts recorded on the turn apart from the
answer, TTFT (first token of any kind) and TTFOT (first answer token) on its timings,
results lines of version 4 only when they hold them, read back equal."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import write_pack

import convsim
from convsim import Simulator
from convsim._records import TurnTimings
from convsim.adapters.mock import MockModelServer, MockServerConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
async def thinker() -> AsyncIterator[MockModelServer]:
    # no cached-token counts: the lines' versions here are those of reasoning alone
    config = MockServerConfig(reasoning_tokens=5, prefix_cache=False)
    async with MockModelServer(config) as server:
        yield server


async def _run(server: MockModelServer, tmp_path: Any, *, stream: bool) -> Any:
    pack = write_pack(
        tmp_path / "pack",
        {"default": {"turns": [{"turn_id": "t1", "prompt_template": "Is 91 prime?"}]}},
        [{"scenario_id": "s1", "scenario_description": "a question"}],
    )
    async with Simulator(
        model="openai-compatible:mock-model",
        model_args={"base_url": server.base_url, "stream": stream},
        preflight=False,
        metrics=[],
    ) as sim:
        (result,) = [r async for r in sim.run(pack)]
    assert all(t.request_ids for t in result.turns)  # the mock's answer ids
    # without them, as from a server that sends none: the versions of reasoning alone
    return type(result).model_validate(  # made afresh: its version is worked out again
        {
            **result.model_dump(exclude={"schema_version", "turns"}),
            "turns": tuple(dataclasses.replace(t, request_ids=()) for t in result.turns),
        }
    )


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
async def test_the_reasoning_is_recorded_on_the_turn(
    thinker: MockModelServer, tmp_path: Any, stream: bool
) -> None:
    result = await _run(thinker, tmp_path, stream=stream)
    (turn,) = result.turns
    assert turn.reasoning == "Thinking step step step step"
    assert turn.reasoning_tokens == 5
    assert "Thinking" not in (turn.response or "")
    assert result.transcript[-1].content == turn.response  # the history has no thoughts
    line = json.loads(result.model_dump_json())
    assert line["schema_version"] == 4
    assert line["turns"][0]["reasoning"] == turn.reasoning
    assert convsim.ConversationResult.model_validate_json(result.model_dump_json()) == result
    timings = turn.timings
    if stream:
        assert timings.ttft_s is not None and timings.ttfot_s is not None
        assert timings.ttft_s < timings.ttfot_s
        assert line["turns"][0]["timings"]["ttfot_s"] == timings.ttfot_s
    else:
        assert timings.ttft_s is None and timings.ttfot_s is None


async def test_a_line_without_reasoning_is_written_as_before(tmp_path: Any) -> None:
    """An older convsim reads it: no reasoning keys, no ttfot_s, version 2."""
    async with MockModelServer(MockServerConfig(prefix_cache=False)) as server:
        result = await _run(server, tmp_path, stream=True)
    (turn,) = result.turns
    assert turn.reasoning is None and turn.reasoning_tokens is None
    assert turn.timings.ttfot_s == turn.timings.ttft_s is not None
    line = json.loads(result.model_dump_json())
    assert line["schema_version"] == 2
    assert not {"reasoning", "reasoning_tokens"} & set(line["turns"][0])
    assert "ttfot_s" not in line["turns"][0]["timings"]
    assert convsim.ConversationResult.model_validate_json(result.model_dump_json()) == result


async def test_a_turn_that_only_reasoned_keeps_its_missing_ttfot(
    thinker: MockModelServer, tmp_path: Any
) -> None:
    result = await _run(thinker, tmp_path, stream=True)
    (turn,) = result.turns
    assert turn.timings is not None
    silent = dataclasses.replace(
        turn,
        reasoning=None,
        reasoning_tokens=None,
        timings=dataclasses.replace(turn.timings, ttfot_s=None),
    )
    changed = result.model_copy(update={"turns": (silent,)})
    line = json.loads(changed.model_dump_json())
    assert line["schema_version"] == 4  # ttfot_s null, apart from ttft_s: only 4 holds it
    assert line["turns"][0]["timings"]["ttfot_s"] is None
    back = convsim.ConversationResult.model_validate_json(changed.model_dump_json())
    assert back == changed


def test_timings_from_an_older_line_read_ttfot_as_ttft() -> None:
    timings = TurnTimings(started_at=0.0, duration_s=1.0, ttft_s=0.25)
    assert timings.ttfot_s == 0.25
    assert TurnTimings(started_at=0.0, duration_s=1.0, ttft_s=0.25, ttfot_s=0.5).ttfot_s == 0.5


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
async def test_the_run_summary_gives_ttft_and_ttfot_where_they_were_measured(
    thinker: MockModelServer, tmp_path: Any, stream: bool
) -> None:
    result = await _run(thinker, tmp_path, stream=stream)
    report = convsim.summarize([result])
    summary = json.loads(report.model_dump_json())
    if not stream:  # nothing streamed: no figure, not a zero
        assert "ttft_s" not in summary and "ttfot_s" not in summary
        assert "TTFT" not in report.to_markdown()
        return
    (turn,) = result.turns
    assert summary["ttft_s"]["p50"] == turn.timings.ttft_s
    assert summary["ttfot_s"]["p50"] == turn.timings.ttfot_s
    assert summary["ttft_s"]["max"] < summary["ttfot_s"]["max"]  # the thinking came first
    assert "| TTFOT |" in report.to_markdown()
