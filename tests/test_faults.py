"""A run against a faulty server ends cleanly: every conversation DONE or FAILED with its
cause, retries counted, nothing hangs; and a pack runs end to end over real HTTP."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import write_pack

import convsim
from convsim import Status, TurnStatus
from convsim.adapters import create_adapter
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.adapters.mock._faults import DEFAULT_FAULTS

pytestmark = pytest.mark.anyio


async def no_wait(seconds: float) -> None:
    """Retry back-off and 429 pauses without real waiting."""
    await anyio.lowlevel.checkpoint()


def pack(tmp_path: Path, conversations: int, turns: int = 3) -> Path:
    flow = [
        {"turn_id": f"t{i}", "prompt_template": f"Message {i} about {{topic}}."}
        for i in range(turns)
    ]
    scenarios = [
        {
            "scenario_id": f"c{i:03d}",
            "scenario_description": "faults",
            "variables": {"topic": f"order {1000 + i}"},
        }
        for i in range(conversations)
    ]
    return write_pack(tmp_path / "pack", {"default": {"turns": flow}}, scenarios)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_run_against_twenty_percent_faults_ends_cleanly(
    tmp_path: Path, stream: bool
) -> None:
    config = MockServerConfig(fault_rate=0.2, retry_after_s=1.0, seed=7)
    async with MockModelServer(config) as server:
        from convsim.adapters._openai import OpenAICompatibleAdapter

        adapter = OpenAICompatibleAdapter(
            {
                "model": "mock-model",
                "base_url": server.base_url,
                "stream": stream,
                "max_retries": 2,
                "timeout": 5,
                "concurrency": 16,
            },
            sleep=no_wait,
        )
        out = tmp_path / "results.jsonl"
        with anyio.fail_after(30):  # no hang: the whole run has a deadline
            async with convsim.Simulator(adapter, concurrency=16) as sim:
                handle = sim.run(pack(tmp_path, 60), sink=convsim.JsonlSink(out))
                results = [r async for r in handle]
        await adapter.aclose()
        served = server.statistics()

    assert len(results) == 60
    assert len({r.conversation_id for r in results}) == 60
    assert {r.status for r in results} <= {Status.DONE, Status.FAILED}
    for result in results:
        if result.status is Status.FAILED:
            assert result.error is not None and result.error.type in {
                "ServerError",
                "RateLimited",
                "MalformedResponse",
                "Timeout",
            }
            # every injected fault lies with the server, none with the model
            assert result.termination_reason.value == "infrastructure_error"
    statuses = Counter(r.status for r in results)
    assert statuses[Status.DONE] > statuses[Status.FAILED]  # retries rescue most faults
    attempts = [t.attempts for r in results for t in r.turns if t.status is not TurnStatus.SKIPPED]
    assert max(attempts) > 1  # retries happened and were counted
    assert sum(served.faults_injected.values()) > 0
    assert len(convsim.read_results(out)) == 60  # every one recorded, none twice


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", DEFAULT_FAULTS)  # the tool fault: test_tool_wire
async def test_each_fault_kind_on_eight_percent_of_calls_is_retried_away(
    tmp_path: Path, kind: str, stream: bool
) -> None:
    config = MockServerConfig(fault_rate=0.08, faults={kind: 1}, retry_after_s=0, seed=3)
    async with MockModelServer(config) as server:
        adapter = OpenAICompatibleAdapter(
            {"model": "mock-model", "base_url": server.base_url, "stream": stream, "timeout": 5},
            sleep=no_wait,
        )
        with anyio.fail_after(30):
            async with convsim.Simulator(adapter, concurrency=8) as sim:
                results = [r async for r in sim.run(pack(tmp_path, 40))]
        await adapter.aclose()
        injected = sum(server.statistics().faults_injected.values())
    assert injected > 0
    assert [r.status for r in results] == [Status.DONE] * 40  # none lost
    answers = [t.response or "" for r in results for t in r.turns]
    assert all("\ud83d" not in a and "\ude00" not in a for a in answers)  # valid text
    if kind == "lone_surrogate" or (kind == "split_surrogate" and not stream):
        assert sum("\ufffd" in a for a in answers) == injected  # replaced, and recorded
    if kind == "split_surrogate" and stream:
        assert sum("\U0001f600" in a for a in answers) == injected  # the halves joined


async def test_a_bundled_pack_runs_over_http_with_streaming_ttft_and_usage() -> None:
    async with MockModelServer(MockServerConfig(ttft_ms=5, itl_ms=1)) as server:
        adapter = create_adapter(
            "openai-compatible:mock-model", {"base_url": server.base_url, "stream": "true"}
        )
        async with convsim.Simulator(adapter, concurrency=8) as sim:
            results = [r async for r in sim.run("customer_support")]
        await adapter.aclose()
    assert {r.status for r in results} == {Status.DONE}
    completed = [t for r in results for t in r.turns if t.status is TurnStatus.COMPLETED]
    assert completed and all(t.timings and t.timings.ttft_s for t in completed)
    assert all(t.timings.ttft_s >= 0.005 for t in completed)  # the server's TTFT is in it
    assert all(
        t.usage and not t.usage.estimated and t.usage.completion_tokens > 0 for t in completed
    )
    assert all(r.usage.total_tokens > 0 for r in results)


async def test_the_mock_models_memory_window_shows_in_answers(tmp_path: Path) -> None:
    """The mock server's forgetful model: a fact from three user turns ago is gone."""
    flow = [
        {"turn_id": "fact", "prompt_template": "My locker code is {code}."},
        {"turn_id": "f1", "prompt_template": "The weather is mild today."},
        {"turn_id": "f2", "prompt_template": "I had soup for lunch."},
        {"turn_id": "ask", "prompt_template": "What is my locker code?"},
    ]
    folder = write_pack(
        tmp_path / "mem",
        {"default": {"turns": flow}},
        [{"scenario_id": "m", "scenario_description": "memory", "variables": {"code": "4471"}}],
    )

    async def answer(memory_turns: int | None) -> str:
        async with MockModelServer(MockServerConfig(memory_turns=memory_turns)) as server:
            adapter: Any = create_adapter(
                "openai-compatible:mock-model", {"base_url": server.base_url}
            )
            async with convsim.Simulator(adapter) as sim:
                (result,) = [r async for r in sim.run(folder)]
            await adapter.aclose()
        return result.transcript[-1].content

    assert "4471" in await answer(None)
    assert "4471" not in await answer(1)
