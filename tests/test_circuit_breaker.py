"""A run whose endpoint goes away stops early (the circuit breaker): no conversation
starts after N in a row failed for infrastructure reasons, the unstarted ones stay out
of the results file, and ``--resume`` runs them later."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import FakeAdapter, write_pack

from convsim import (
    BadRequest,
    ConfigError,
    JsonlSink,
    ServerError,
    Simulator,
    SimulatorConfig,
    Status,
    read_results,
)

pytestmark = pytest.mark.anyio


def pack(tmp_path: Path, conversations: int = 12, turns: int = 1) -> Path:
    flow = [{"turn_id": f"t{i}", "prompt_template": f"Message {i}."} for i in range(turns)]
    scenarios = [
        {"scenario_id": f"c{i:03d}", "scenario_description": "breaker"}
        for i in range(conversations)
    ]
    return write_pack(tmp_path / "pack", {"default": {"turns": flow}}, scenarios)


def failing_after(successes: int, error: Exception | None = None) -> FakeAdapter:
    """Answers the first ``successes`` calls, then fails every call."""
    calls = 0

    def behave(messages: Any, params: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= successes:
            return "fine"
        return error or ServerError("connection to http://x/v1 failed: refused")

    return FakeAdapter(behave)


async def run(
    adapter: Any, folder: Path, out: Path, *, resume: bool = False, **settings: Any
) -> Any:
    with anyio.fail_after(10):
        async with Simulator(SimulatorConfig(model=adapter, **settings)) as sim:
            handle = sim.run(folder, sink=JsonlSink(out, resume=resume))
            results = [r async for r in handle]
    return handle.statistics(), results


async def test_the_breaker_stops_the_run_and_resume_completes_it(tmp_path: Path) -> None:
    folder, out = pack(tmp_path), tmp_path / "results.jsonl"
    stats, results = await run(failing_after(2), folder, out, concurrency=1, circuit_breaker=3)
    assert [r.status for r in results] == [Status.DONE] * 2 + [Status.FAILED] * 3
    assert stats.started == 5 and stats.total == 12  # seven never started
    assert stats.infrastructure_failures == 3
    assert stats.stopped_early is not None
    assert stats.stopped_early.startswith(
        "3 conversations in a row failed for infrastructure reasons"
    )
    assert "ServerError: connection to http://x/v1 failed: refused" in stats.stopped_early
    recorded = read_results(out)
    assert [r.conversation_id for r in recorded] == [f"c{i:03d}" for i in range(5)]
    manifest = out.with_name("results.manifest.json").read_text()
    assert "stopped_early" in manifest

    stats, results = await run(
        FakeAdapter(), folder, out, resume=True, concurrency=1, circuit_breaker=3
    )
    assert stats.resumed == 5 and stats.stopped_early is None
    assert {r.status for r in results} == {Status.DONE} and len(results) == 7
    recorded = read_results(out)
    assert len(recorded) == 12 and len({r.conversation_id for r in recorded}) == 12


async def test_in_flight_conversations_finish_and_are_recorded(tmp_path: Path) -> None:
    folder, out = pack(tmp_path, conversations=40), tmp_path / "results.jsonl"
    stats, results = await run(failing_after(0), folder, out, concurrency=8, circuit_breaker=5)
    assert stats.stopped_early is not None
    assert 5 <= stats.started < 40
    statuses = Counter(r.status for r in read_results(out))
    assert statuses[Status.FAILED] == stats.started  # nothing started was lost
    assert len(results) == stats.started


async def test_any_success_in_between_resets_the_count(tmp_path: Path) -> None:
    calls = 0

    def every_other(messages: Any, params: Any) -> Any:
        nonlocal calls
        calls += 1
        return "fine" if calls % 2 else ServerError("dropped")

    stats, results = await run(
        FakeAdapter(every_other),
        pack(tmp_path),
        tmp_path / "r.jsonl",
        concurrency=1,
        circuit_breaker=2,
    )
    assert stats.stopped_early is None and len(results) == 12
    assert stats.infrastructure_failures == 6


async def test_a_conversation_with_an_answered_turn_shows_the_endpoint_lives(
    tmp_path: Path,
) -> None:
    """Each conversation's second turn fails: FAILED, but the server answered."""

    def second_fails(messages: Any, params: Any) -> Any:
        return "fine" if len(messages) == 1 else ServerError("500")

    stats, results = await run(
        FakeAdapter(second_fails),
        pack(tmp_path, turns=2),
        tmp_path / "r.jsonl",
        concurrency=1,
        circuit_breaker=2,
    )
    assert stats.stopped_early is None and len(results) == 12
    assert {r.status for r in results} == {Status.FAILED}
    assert stats.infrastructure_failures == 12  # still counted for the exit code


async def test_model_errors_are_not_the_endpoints_fault(tmp_path: Path) -> None:
    adapter = failing_after(0, BadRequest("400: bad prompt"))
    stats, results = await run(
        adapter, pack(tmp_path), tmp_path / "r.jsonl", concurrency=1, circuit_breaker=2
    )
    assert stats.stopped_early is None and len(results) == 12
    assert stats.infrastructure_failures == 0


async def test_conversation_timeouts_are_not_the_endpoints_fault(tmp_path: Path) -> None:
    """A model slower than the conversation timeout is a setting to raise, not an
    endpoint gone (a server that stops answering fails its calls on the adapter's read
    timeout, an infrastructure failure): every conversation runs and times out."""

    async def hang(messages: Any, params: Any) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    stats, results = await run(
        FakeAdapter(hang),
        pack(tmp_path),
        tmp_path / "r.jsonl",
        concurrency=1,
        circuit_breaker=3,
        conversation_timeout=0.01,
    )
    assert [r.status for r in results] == [Status.TIMED_OUT] * 12
    assert stats.stopped_early is None and stats.infrastructure_failures == 0
    assert stats.timed_out == 12


async def test_zero_turns_the_breaker_off(tmp_path: Path) -> None:
    stats, results = await run(
        failing_after(0), pack(tmp_path), tmp_path / "r.jsonl", concurrency=1, circuit_breaker=0
    )
    assert stats.stopped_early is None and len(results) == 12
    assert stats.infrastructure_failures == 12


def test_the_default_and_bad_values() -> None:
    assert SimulatorConfig().circuit_breaker == 20
    assert SimulatorConfig().preflight is True
    with pytest.raises(ConfigError, match="circuit_breaker"):
        Simulator(circuit_breaker=-1)
