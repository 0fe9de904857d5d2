"""A conversation that hits its deadline is TIMED_OUT (``conversation_timeout``) and is
told apart from infrastructure failures: counted on its own, left out of the circuit
breaker, reported with its own line (the timeout, whose it is, the slowest turn, how to
raise it) and its own exit code (5), so that CI can tell "endpoint down" (4),
"infrastructure failures" (3) and "too slow for the timeout" (5) apart."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner
from conftest import clock, manual_clock, write_pack

from convsim import ServerError, Simulator, Status, TerminationReason, read_results
from convsim._runtime._handle import RunStatistics
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import _console, main

pytestmark = pytest.mark.anyio

TURNS = [
    {"turn_id": "a", "prompt_template": "A"},
    {"turn_id": "b", "prompt_template": "B"},
    {"turn_id": "c", "prompt_template": "C"},
]


def pack(tmp_path: Path, *, flow: dict[str, Any] | None = None, n: int = 2) -> Path:
    scenarios = [
        {"scenario_id": f"s{i}", "scenario_description": f"scenario {i}", "variables": {}}
        for i in range(n)
    ]
    return write_pack(tmp_path / "pack", {"default": {**(flow or {}), "turns": TURNS}}, scenarios)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


def stats(**counts: Any) -> RunStatistics:
    base: dict[str, Any] = dict(
        run_id="r", total=0, resumed=0, started=0, in_flight=0, done=0, failed=0,
        timed_out=0, cancelled=0, turns=0, retrying=0, elapsed_s=1.0,
    )  # fmt: skip
    return RunStatistics(**{**base, **counts})


# -- the runtime ------------------------------------------------------------------------


@manual_clock
async def test_a_timed_out_conversation_is_counted_apart_from_infrastructure_failures(
    tmp_path: Path, fake_adapter: Any
) -> None:
    stuck = anyio.Event()

    async def behave(messages: Any, params: Any) -> str:
        if params.metadata["turn_id"] == "b":
            stuck.set()
            await anyio.sleep_forever()
        return "ok"

    async with Simulator(fake_adapter(behave), circuit_breaker=0) as sim:
        handle = sim.run(pack(tmp_path, flow={"conversation_timeout": 240}, n=1))
        await stuck.wait()
        clock().advance(241)
        (result,) = [r async for r in handle]
        s = handle.statistics()
    assert result.status is Status.TIMED_OUT
    assert result.termination_reason is TerminationReason.CONVERSATION_TIMEOUT
    assert s.timed_out == 1 and s.infrastructure_failures == 0
    assert s.timeouts_s == (240.0,)
    assert s.slowest_turn_s is not None  # turn a completed
    line = _console.timeout_line(s, users_timeout=False)
    assert line is not None and line.startswith(
        "1 of 1 conversation hit the 240 s conversation timeout (the pack's); the slowest turn"
    )


async def test_conversations_timing_out_without_an_answer_do_not_trip_the_breaker(
    tmp_path: Path,
) -> None:
    """A model slower than the timeout is not an endpoint that went away: every
    conversation runs (and times out) rather than the run stopping early with exit 4."""
    with anyio.fail_after(20):
        async with Simulator(
            "scripted", model_args={"latency": 30}, conversation_timeout=0.05, circuit_breaker=2
        ) as sim:
            handle = sim.run(pack(tmp_path, n=4))
            results = [r async for r in handle]
    s = handle.statistics()
    assert [r.status for r in results] == [Status.TIMED_OUT] * 4
    assert s.stopped_early is None and s.infrastructure_failures == 0
    assert s.timeouts_s == (0.05,) and s.slowest_turn_s is None


async def test_timeouts_between_infrastructure_failures_keep_the_streak(
    tmp_path: Path, fake_adapter: Any
) -> None:
    """An endpoint that fails some calls and stalls on others still trips the breaker:
    a timeout neither counts nor starts the count again."""

    async def behave(messages: Any, params: Any) -> Any:
        if params.metadata["conversation_id"] in ("s1", "s3"):
            await anyio.sleep_forever()
        return ServerError("down", status_code=503)

    async with Simulator(
        fake_adapter(behave), conversation_timeout=0.05, circuit_breaker=2, concurrency=1
    ) as sim:
        handle = sim.run(pack(tmp_path, n=6))
        with anyio.fail_after(20):
            results = [r async for r in handle]
    s = handle.statistics()
    assert [r.status for r in results] == [Status.FAILED, Status.TIMED_OUT, Status.FAILED]
    assert s.stopped_early is not None and s.infrastructure_failures == 2


# -- the verdict ------------------------------------------------------------------------


def test_the_timeout_line_says_whose_timeout_and_the_slowest_turn() -> None:
    s = stats(timed_out=2, timeouts_s=(240.0,), slowest_turn_s=131.2)
    assert _console.timeout_line(s, users_timeout=False) == (
        "2 of 2 conversations hit the 240 s conversation timeout (the pack's); the slowest "
        "turn took 131 s — raise it with --conversation-timeout"
    )
    mixed = dataclasses.replace(s, done=1, timeouts_s=(180.0, 240.0), slowest_turn_s=None)
    assert _console.timeout_line(mixed, users_timeout=True) == (
        "2 of 3 conversations hit the 180 to 240 s conversation timeout (yours); no turn "
        "finished within it — raise it with --conversation-timeout"
    )
    assert _console.timeout_line(stats(done=3), users_timeout=False) is None


@pytest.mark.parametrize(
    ("counts", "rate", "code"),
    [
        ({"timed_out": 2}, 0.0, 5),
        ({"timed_out": 1, "done": 3}, 0.25, 0),  # within the rate
        ({"timed_out": 2, "done": 2}, 0.25, 5),
        # infrastructure failures and timeouts each against the rate, not summed
        ({"failed": 1, "infrastructure_failures": 1, "timed_out": 1, "done": 2}, 0.25, 0),
        # infrastructure failures first, the endpoint going away before both
        ({"failed": 2, "infrastructure_failures": 2, "timed_out": 2}, 0.0, 3),
        ({"timed_out": 2, "stopped_early": "gone"}, 0.0, 4),
    ],
)
def test_the_exit_code_tells_timeouts_apart(counts: dict[str, Any], rate: float, code: int) -> None:
    verdict = _console.run_verdict(stats(**counts), interrupted=False, max_failure_rate=rate)
    assert verdict.code == code
    if code == 5:
        assert _console.EXIT_TIMEOUTS == 5
        assert verdict.message is not None and "--conversation-timeout" in verdict.message
    if code == 3:
        assert verdict.message is not None and "infrastructure" in verdict.message


# -- the command line -------------------------------------------------------------------

LINE = re.compile(
    r"^error: 2 of 2 conversations hit the (?P<limit>[\d.]+) s conversation timeout "
    r"\((?P<whose>yours|the pack's)\); the slowest turn took (?P<slowest>[\d.]+) s — raise "
    r"it with --conversation-timeout$",
    re.MULTILINE,
)


def test_a_run_too_slow_for_the_packs_timeout_exits_5_with_the_hint(
    tmp_path: Path, portal: BlockingPortal
) -> None:
    """The mock server takes 0.4 s per answer; the pack allows 1 s per conversation of
    three turns: the first two turns finish, the third hits the deadline."""
    out = tmp_path / "r.jsonl"
    with portal.wrap_async_context_manager(
        MockModelServer(MockServerConfig(ttft_ms=400))
    ) as server:
        code, _, err = invoke(
            "run", str(pack(tmp_path, flow={"conversation_timeout": 1})),
            "--model", "openai-compatible:mock", "--model-arg", f"base_url={server.url}/v1",
            "--out", str(out), "--no-progress",
        )  # fmt: skip
    assert code == _console.EXIT_TIMEOUTS
    match = LINE.search(err)
    assert match is not None, err
    assert match["limit"] == "1" and match["whose"] == "the pack's"
    assert 0.4 <= float(match["slowest"]) < 1
    assert "infrastructure" not in err
    results = read_results(out)
    assert {r.termination_reason for r in results} == {TerminationReason.CONVERSATION_TIMEOUT}


def test_the_users_timeout_is_named_as_theirs(tmp_path: Path) -> None:
    code, _, err = invoke(
        "run", str(pack(tmp_path)), "--model-arg", "latency=0.4",
        "--conversation-timeout", "1", "--out", str(tmp_path / "r.jsonl"), "--no-progress",
    )  # fmt: skip
    assert code == _console.EXIT_TIMEOUTS
    match = LINE.search(err)
    assert match is not None, err
    assert match["limit"] == "1" and match["whose"] == "yours"
    assert 0.4 <= float(match["slowest"]) < 1


def test_timeouts_within_the_failure_rate_exit_0_and_still_say_so(tmp_path: Path) -> None:
    code, _, err = invoke(
        "run", str(pack(tmp_path)), "--model-arg", "latency=0.4",
        "--conversation-timeout", "1", "--max-failure-rate", "1",
        "--out", str(tmp_path / "r.jsonl"), "--no-progress",
    )  # fmt: skip
    assert code == _console.EXIT_OK
    assert "warning: 2 of 2 conversations hit the 1 s conversation timeout (yours)" in err
    assert "error:" not in err


def test_a_resume_with_a_longer_timeout_retries_the_timed_out_conversations(
    tmp_path: Path,
) -> None:
    """The timeout decides whether a conversation finishes, not what its answers are: the
    hint's own advice (raise --conversation-timeout) works on the same results file."""
    out = tmp_path / "r.jsonl"
    args = ["run", str(pack(tmp_path)), "--model-arg", "latency=0.4", "--out", str(out),
            "--no-progress"]  # fmt: skip
    code, _, err = invoke(*args, "--conversation-timeout", "1")
    assert code == _console.EXIT_TIMEOUTS
    assert "--resume --retry-failed and a longer --conversation-timeout" in err
    code, _, err = invoke(*args, "--conversation-timeout", "60", "--resume", "--retry-failed")
    assert code == _console.EXIT_OK, err
    assert {r.status for r in read_results(out)} == {Status.DONE}
    assert len(read_results(out)) == 2
    manifest = json.loads((tmp_path / "r.manifest.json").read_text())
    assert manifest["settings"]["conversation_timeout"] == 60
    # what a conversation says still has to match
    code, _, err = invoke(*args, "--conversation-timeout", "60", "--resume", "--max-turns", "1")
    assert code == 2 and "max_turns" in err
