"""The runtime: running packs, failures as data, timeouts, cancellation, concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from conftest import clock, manual_clock, write_pack

import convsim
from convsim import (
    BadRequest,
    ConfigError,
    JsonlSink,
    RegistryError,
    ServerError,
    Simulator,
    Status,
    TerminationReason,
    TurnStatus,
    load_pack,
    read_results,
    run_sync,
)
from convsim.adapters import Message
from convsim.metrics import METRICS, Score

pytestmark = pytest.mark.anyio


# -- helpers ------------------------------------------------------------------------


def make_pack(
    tmp_path: Path,
    turns: list[dict[str, Any]] | None = None,
    *,
    n: int = 3,
    flow: dict[str, Any] | None = None,
    scenario: Callable[[int], dict[str, Any]] | None = None,
    name: str = "pack",
) -> Path:
    """A multi-turn pack with ``n`` scenarios s0..s{n-1} and one 'default' flow."""
    if turns is None:
        turns = [
            {"turn_id": "greet", "prompt_template": "Hello, I am {name}."},
            {
                "turn_id": "ask",
                "depends_on": ["greet"],
                "prompt_template": "Turn {turn_index}: help with {topic}.",
            },
            {"turn_id": "bye", "depends_on": ["ask"], "prompt_template": "Thanks, bye."},
        ]
    scenarios = []
    for i in range(n):
        sc: dict[str, Any] = {
            "scenario_id": f"s{i}",
            "scenario_description": f"scenario number {i}",
            "variables": {"name": f"User{i}", "topic": f"topic {i}"},
        }
        if scenario is not None:
            sc.update(scenario(i))
        scenarios.append(sc)
    return write_pack(tmp_path / name, {"default": {**(flow or {}), "turns": turns}}, scenarios)


def by_id(results: list[convsim.ConversationResult]) -> dict[str, convsim.ConversationResult]:
    out = {r.conversation_id: r for r in results}
    assert len(out) == len(results), "a conversation was reported twice"
    return out


def turn(result: convsim.ConversationResult, turn_id: str) -> convsim.TurnRecord:
    (record,) = [t for t in result.turns if t.turn_id == turn_id]
    return record


async def collect(sim: Simulator, pack: Any, **kw: Any) -> list[convsim.ConversationResult]:
    return [r async for r in sim.run(pack, **kw)]


def meta(params: Any) -> tuple[str, str]:
    return params.metadata["conversation_id"], params.metadata["turn_id"]


async def take(handle: convsim.RunHandle, n: int) -> AsyncIterator[convsim.ConversationResult]:
    """The next ``n`` results of ``handle``, as they arrive."""
    for _ in range(n):
        yield await anext(handle)


def sleeper(fake_adapter: Any, *, calls: int) -> tuple[Any, anyio.Event]:
    """A fake model that never answers in time, and an event set once it has ``calls`` calls."""
    reached = anyio.Event()

    async def slow(messages: Any, params: Any) -> str:
        if len(fake.calls) >= calls:
            reached.set()
        await anyio.sleep(10)
        return "late"

    fake = fake_adapter(slow)
    return fake, reached


# -- a normal run -------------------------------------------------------------------


async def test_scripted_run_records_every_turn(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, flow={"system_prompt": "You are a helpful test assistant."})
    before = time.time()
    async with Simulator("scripted", model_args={"latency": 0.002}) as sim:
        results = await collect(sim, pack)
    after = time.time()
    assert sorted(r.conversation_id for r in results) == ["s0", "s1", "s2"]
    for result in results:
        assert result.status is Status.DONE
        assert result.termination_reason is TerminationReason.COMPLETED
        assert result.error is None
        assert result.model == "scripted" and result.pack == "pack"
        assert result.pack_hash == load_pack(pack).pack_hash

        # Transcript: system, then user/assistant alternating, one pair per turn.
        transcript = result.transcript
        assert transcript[0] == Message(role="system", content="You are a helpful test assistant.")
        roles = [m.role for m in transcript[1:]]
        assert roles == ["user", "assistant"] * 3

        i = int(result.conversation_id[1:])
        expected_prompts = [
            f"Hello, I am User{i}.",
            f"Turn 1: help with topic {i}.",
            "Thanks, bye.",
        ]
        assert [t.turn_id for t in result.turns] == ["greet", "ask", "bye"]
        for k, (record, prompt) in enumerate(zip(result.turns, expected_prompts, strict=True)):
            assert record.conversation_id == result.conversation_id
            assert record.turn_index == k
            assert record.status is TurnStatus.COMPLETED
            assert record.skip_reason is None and record.error is None
            assert record.role == "assistant"
            assert record.prompt == prompt
            assert record.user_message == prompt
            # What was sent: the whole history before the turn plus the new user message.
            history = transcript[: 1 + 2 * k]
            assert record.messages == (*history, Message(role="user", content=prompt))
            assert record.messages[0].role == "system"
            assert record.response == transcript[2 + 2 * k].content
            assert record.response  # the scripted model answers something
            assert record.finish_reason == "stop"
            assert record.attempts == 1
            assert record.usage is not None
            assert record.usage.completion_tokens == len(record.response.split())
            assert record.usage.prompt_tokens == sum(
                len(m.content.split()) for m in record.messages
            )
            assert (
                record.usage.total_tokens
                == record.usage.prompt_tokens + record.usage.completion_tokens
            )
            assert record.timings is not None
            assert before <= record.timings.started_at <= after
            assert record.timings.latency_s is not None and record.timings.latency_s > 0
            assert record.timings.duration_s >= record.timings.latency_s
        total = sum(t.usage.total_tokens for t in result.turns)  # type: ignore[union-attr]
        assert result.usage.total_tokens == total
        assert result.timings.started_at <= result.timings.finished_at
        assert result.timings.duration_s >= sum(t.timings.duration_s for t in result.turns)  # type: ignore[union-attr]
        # Default metrics score every run.
        assert set(result.scores) >= {"latency", "response_length"}
        assert result.scores["response_length"].value == pytest.approx(
            sum(len(t.response.split()) for t in result.turns) / 3
        )  # type: ignore[union-attr]


async def test_guide_example_pack_runs(tmp_path: Path) -> None:
    pack = Path(__file__).parent / "data" / "guide_example"
    async with Simulator("scripted") as sim:
        results = by_id(await collect(sim, pack))
    assert set(results) == {"budget-planning", "trip-planning", "db-migration"}
    assert all(r.status is Status.DONE for r in results.values())
    # trip-planning has no {topic}: its optional refinement turn is skipped, not failed.
    refinement = turn(results["trip-planning"], "refinement")
    assert refinement.status is TurnStatus.SKIPPED and "topic" in (refinement.skip_reason or "")
    assert turn(results["budget-planning"], "refinement").status is TurnStatus.COMPLETED
    assert [t.turn_id for t in results["db-migration"].turns] == ["deep_analysis"]
    # Turn-level judge rubrics say why they have no value instead of a fake number.
    score = results["budget-planning"].turn_scores["introduction"]["clarity_score"]
    assert score.value is None and score.reason and score.reason.startswith("not applicable")


@pytest.mark.parametrize("where", ["flow", "scenario"])
async def test_system_prompt_goes_first(tmp_path: Path, fake_adapter: Any, where: str) -> None:
    flow = {"system_prompt": "FLOW SYSTEM"}
    scenario = (lambda i: {"system_prompt": f"OWN SYSTEM {i}"}) if where == "scenario" else None
    pack = make_pack(tmp_path, flow=flow, scenario=scenario, n=2)
    fake = fake_adapter()
    async with Simulator(fake) as sim:
        results = await collect(sim, pack)
    assert len(fake.calls) == 6
    for messages, params in fake.calls:
        cid, _ = meta(params)
        expected = "FLOW SYSTEM" if where == "flow" else f"OWN SYSTEM {cid[1:]}"
        assert messages[0] == Message(role="system", content=expected)
        assert [m.role for m in messages].count("system") == 1
    for result in results:
        assert result.transcript[0].role == "system"


async def test_no_system_message_without_a_system_prompt(tmp_path: Path, fake_adapter: Any) -> None:
    fake = fake_adapter()
    async with Simulator(fake) as sim:
        await collect(sim, make_pack(tmp_path, n=1))
    first_messages, _ = fake.calls[0]
    assert first_messages == (Message(role="user", content="Hello, I am User0."),)


async def test_scripted_replays_reference_responses(tmp_path: Path) -> None:
    pack = make_pack(
        tmp_path,
        scenario=lambda i: {
            "reference_responses": {"greet": f"Hi User{i}, nice to meet you.", "bye": "Goodbye!"}
        },
    )
    async with Simulator("scripted") as sim:
        results = await collect(sim, pack)
    for result in results:
        i = result.conversation_id[1:]
        assert turn(result, "greet").response == f"Hi User{i}, nice to meet you."
        assert turn(result, "bye").response == "Goodbye!"
        # Without a reference the rule-based reply restates the user's message.
        assert "Turn 1: help with topic" in (turn(result, "ask").response or "")


async def test_references_reach_the_adapter_only_for_their_turn(
    tmp_path: Path, fake_adapter: Any
) -> None:
    pack = make_pack(tmp_path, n=1, scenario=lambda i: {"reference_responses": {"ask": "REF"}})
    fake = fake_adapter()
    async with Simulator(fake) as sim:
        await collect(sim, pack)
    refs = {meta(params)[1]: params.reference for _, params in fake.calls}
    assert refs == {"greet": None, "ask": "REF", "bye": None}


async def test_same_seed_gives_identical_transcripts(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, n=4)

    async def transcripts(seed: int) -> dict[str, Any]:
        async with Simulator("scripted", seed=seed, concurrency=2) as sim:
            return {r.conversation_id: (r.seed, r.transcript) for r in await collect(sim, pack)}

    first, again, other = await transcripts(7), await transcripts(7), await transcripts(8)
    assert first == again
    assert set(first) == set(other)
    for cid in first:
        assert first[cid][0] != other[cid][0], "a different run seed must give different seeds"
    # The per-conversation seeds differ between conversations of one run, too.
    assert len({seed for seed, _ in first.values()}) == len(first)
    # The scripted replies depend on the seed, so some transcript differs.
    assert any(first[cid][1] != other[cid][1] for cid in first)


async def test_seed_is_passed_to_the_adapter(tmp_path: Path, fake_adapter: Any) -> None:
    fake = fake_adapter()
    async with Simulator(fake, seed=3) as sim:
        results = by_id(await collect(sim, make_pack(tmp_path, n=2)))
    for _, params in fake.calls:
        cid, _ = meta(params)
        assert params.seed == results[cid].seed


async def test_concurrency_cap_is_respected(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(tmp_path, [{"turn_id": "only", "prompt_template": "Hi {name}"}], n=10)
    in_flight = 0
    peak = 0
    full = anyio.Event()

    async def behave(messages: Any, params: Any) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 3:
            full.set()
        try:
            await full.wait()  # the first calls are held until the cap is reached
        finally:
            in_flight -= 1
        return "ok"

    fake = fake_adapter(behave)
    async with Simulator(fake, concurrency=3) as sim:
        handle = sim.run(pack)
        results = [r async for r in handle]
    assert len(results) == 10 and all(r.status is Status.DONE for r in results)
    assert peak == 3
    stats = handle.statistics()
    assert (stats.total, stats.started, stats.done, stats.in_flight, stats.turns) == (
        10,
        10,
        10,
        0,
        10,
    )


def _busy(seconds: float) -> None:
    """Hold the CPU (and with it the event loop) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_a_run_reaches_its_concurrency_in_one_pass(tmp_path: Path, fake_adapter: Any) -> None:
    """Free slots are taken without a trip through the event loop: by the time the first
    conversation calls its model, every slot already holds a conversation (a dispatcher
    that yields on each slot starts one conversation per loop pass instead)."""
    pack = make_pack(tmp_path, [{"turn_id": "only", "prompt_template": "Hi {name}"}], n=80)
    seen_at_first_call: list[int] = []
    everyone = anyio.Event()
    handle: Any = None

    async def behave(messages: Any, params: Any) -> str:
        if not seen_at_first_call:
            seen_at_first_call.append(handle.statistics().started)
        if len(fake.calls) >= 64:
            everyone.set()
        await everyone.wait()
        return "ok"

    fake = fake_adapter(behave)
    async with Simulator(fake, concurrency=64) as sim:
        handle = sim.run(pack)
        results = [r async for r in handle]
    assert len(results) == 80 and all(r.status is Status.DONE for r in results)
    assert seen_at_first_call == [64]
    stats = handle.statistics()
    assert stats.max_in_flight == 64
    assert 0 < stats.mean_in_flight <= 64
    assert stats.admission_held == 0


async def test_admission_waits_while_the_event_loop_lags(tmp_path: Path, fake_adapter: Any) -> None:
    """A model call that blocks the loop (as CPU-bound work would) makes the loop late;
    no conversation starts until it has caught up, and every conversation still runs."""
    pack = make_pack(tmp_path, [{"turn_id": "only", "prompt_template": "Hi {name}"}], n=8)

    async def hog(messages: Any, params: Any) -> str:
        _busy(0.04)  # CPU-bound work blocks the event loop: the lag the gauge must see
        await anyio.lowlevel.checkpoint()
        return "ok"

    fake = fake_adapter(hog)
    async with Simulator(fake, concurrency=2, max_loop_lag=0.01) as sim:
        handle = sim.run(pack)
        results = [r async for r in handle]
    assert len(results) == 8 and all(r.status is Status.DONE for r in results)
    assert handle.statistics().admission_held >= 1


async def test_admission_by_lag_can_be_turned_off(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(tmp_path, [{"turn_id": "only", "prompt_template": "Hi {name}"}], n=6)

    async def hog(messages: Any, params: Any) -> str:
        _busy(0.03)
        await anyio.lowlevel.checkpoint()
        return "ok"

    async with Simulator(fake_adapter(hog), concurrency=2, max_loop_lag=None) as sim:
        handle = sim.run(pack)
        results = [r async for r in handle]
    assert len(results) == 6
    assert handle.statistics().admission_held == 0


# -- failures are data --------------------------------------------------------------


def fail_on(cid: str, turn_id: str, exc: BaseException) -> Callable[[Any, Any], Any]:
    def behave(messages: Any, params: Any) -> Any:
        return exc if meta(params) == (cid, turn_id) else f"reply to {meta(params)[1]}"

    return behave


async def test_server_error_fails_only_that_conversation(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A {name}"},
            {"turn_id": "b", "prompt_template": "B"},
            {"turn_id": "c", "prompt_template": "C"},
        ],
        n=3,
    )
    error = ServerError("upstream 503", model="fake", attempts=3, status_code=503)
    fake = fake_adapter(fail_on("s1", "b", error))
    async with Simulator(fake, concurrency=3) as sim:
        handle = sim.run(pack)
        results = by_id([r async for r in handle])

    failed = results["s1"]
    assert failed.status is Status.FAILED
    assert failed.termination_reason is TerminationReason.INFRASTRUCTURE_ERROR
    assert failed.error is not None
    assert (
        failed.error.type,
        failed.error.turn_id,
        failed.error.status_code,
        failed.error.attempts,
    ) == ("ServerError", "b", 503, 3)
    assert failed.error.infrastructure is True and "upstream 503" in failed.error.message

    a, b, c = failed.turns
    assert a.status is TurnStatus.COMPLETED and a.response == "reply to a"
    assert b.status is TurnStatus.FAILED
    assert b.error == failed.error
    assert b.response is None and b.attempts == 3
    assert b.prompt == "B"
    assert b.messages == (
        Message(role="user", content="A User1"),
        Message(role="assistant", content="reply to a"),
        Message(role="user", content="B"),
    )
    assert c.status is TurnStatus.SKIPPED
    assert (
        c.skip_reason is not None
        and "conversation ended" in c.skip_reason
        and "'b'" in c.skip_reason
    )
    # The failed exchange is not part of the transcript, and turn c was never sent.
    assert [m.content for m in failed.transcript] == ["A User1", "reply to a"]
    assert ("s1", "c") not in [meta(p) for _, p in fake.calls]

    for cid in ("s0", "s2"):
        assert results[cid].status is Status.DONE
        assert [t.status for t in results[cid].turns] == [TurnStatus.COMPLETED] * 3
    stats = handle.statistics()
    assert (stats.done, stats.failed) == (2, 1)


@pytest.mark.parametrize(
    ("exc", "reason", "infrastructure"),
    [
        (ServerError("down", status_code=502), TerminationReason.INFRASTRUCTURE_ERROR, True),
        (
            convsim.RateLimited("slow down", retry_after=2.0),
            TerminationReason.INFRASTRUCTURE_ERROR,
            True,
        ),
        (convsim.Timeout("read timeout"), TerminationReason.INFRASTRUCTURE_ERROR, True),
        (
            convsim.AuthError("bad key", status_code=401),
            TerminationReason.INFRASTRUCTURE_ERROR,
            True,
        ),
        (BadRequest("context too long", status_code=400), TerminationReason.MODEL_ERROR, False),
        (convsim.ProtocolError("garbled", snippet="<html>"), TerminationReason.MODEL_ERROR, False),
        (ConnectionResetError("reset by peer"), TerminationReason.INFRASTRUCTURE_ERROR, None),
        (RuntimeError("adapter bug"), TerminationReason.INTERNAL_ERROR, None),
        (KeyError("missing"), TerminationReason.INTERNAL_ERROR, None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
async def test_error_classification(
    tmp_path: Path,
    fake_adapter: Any,
    exc: BaseException,
    reason: TerminationReason,
    infrastructure: bool | None,
) -> None:
    pack = make_pack(
        tmp_path,
        [{"turn_id": "a", "prompt_template": "A"}, {"turn_id": "b", "prompt_template": "B"}],
        n=2,
    )
    fake = fake_adapter(fail_on("s0", "a", exc))
    async with Simulator(fake) as sim:
        results = by_id(await collect(sim, pack))
    failed = results["s0"]
    assert failed.status is Status.FAILED
    assert failed.termination_reason is reason
    assert failed.error is not None and failed.error.type == type(exc).__name__
    assert failed.error.infrastructure is infrastructure
    assert failed.error.message  # never empty
    assert turn(failed, "a").error == failed.error
    assert turn(failed, "b").status is TurnStatus.SKIPPED
    assert results["s1"].status is Status.DONE  # the run goes on


async def test_optional_turn_failure_skips_dependants_only(
    tmp_path: Path, fake_adapter: Any
) -> None:
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "extra", "prompt_template": "Extra", "optional": True},
            {"turn_id": "needs_extra", "prompt_template": "More", "depends_on": ["extra"]},
            {"turn_id": "d", "prompt_template": "D", "depends_on": ["a"]},
        ],
        n=1,
    )
    fake = fake_adapter(fail_on("s0", "extra", ServerError("flaky")))
    async with Simulator(fake) as sim:
        (result,) = await collect(sim, pack)
    assert result.status is Status.DONE
    assert result.termination_reason is TerminationReason.COMPLETED
    assert result.error is None
    statuses = {t.turn_id: t.status for t in result.turns}
    assert statuses == {
        "a": TurnStatus.COMPLETED,
        "extra": TurnStatus.FAILED,
        "needs_extra": TurnStatus.SKIPPED,
        "d": TurnStatus.COMPLETED,
    }
    assert (
        turn(result, "extra").error is not None
        and turn(result, "extra").error.type == "ServerError"
    )  # type: ignore[union-attr]
    reason = turn(result, "needs_extra").skip_reason or ""
    assert "'extra'" in reason and "failed" in reason
    # d was sent the history without the failed optional exchange.
    d_messages = turn(result, "d").messages
    assert [m.content for m in d_messages] == ["A", "reply to a", "D"]


@manual_clock
@pytest.mark.parametrize("where", ["simulator", "flow"])
async def test_conversation_timeout(tmp_path: Path, fake_adapter: Any, where: str) -> None:
    flow = {"conversation_timeout": 0.05} if where == "flow" else {}
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "b", "prompt_template": "B"},
            {"turn_id": "c", "prompt_template": "C"},
        ],
        flow=flow,
        n=2,
    )

    stuck = anyio.Event()

    async def behave(messages: Any, params: Any) -> str:
        cid, turn_id = meta(params)
        if cid == "s0" and turn_id == "b":
            stuck.set()
            await anyio.sleep_forever()
        return f"reply to {turn_id}"

    timeout = 0.05 if where == "simulator" else None
    async with Simulator(fake_adapter(behave), conversation_timeout=timeout) as sim:
        handle = sim.run(pack)
        first = await anext(handle)  # s1 needs no time at all: the clock stands still
        await stuck.wait()
        clock().advance(1)  # past s0's deadline
        results = by_id([first, *[r async for r in handle]])
    assert first.conversation_id == "s1"
    timed_out = results["s0"]
    assert timed_out.status is Status.TIMED_OUT
    assert timed_out.termination_reason is TerminationReason.CONVERSATION_TIMEOUT
    a, b, c = timed_out.turns
    assert a.status is TurnStatus.COMPLETED
    assert b.status is TurnStatus.FAILED
    assert b.error is not None and b.error.type == "Timeout" and "0.05" in b.error.message
    assert b.messages[-1] == Message(role="user", content="B")  # what was in flight
    assert c.status is TurnStatus.SKIPPED and "timed out" in (c.skip_reason or "")
    assert timed_out.error == b.error
    assert [m.content for m in timed_out.transcript] == ["A", "reply to a"]
    assert results["s1"].status is Status.DONE


async def test_conversation_timeout_with_scripted_latency(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, n=2)
    with anyio.fail_after(5):
        async with Simulator(
            "scripted", model_args={"latency": 10}, conversation_timeout=0.05
        ) as sim:
            results = await collect(sim, pack)
    for result in results:
        assert result.status is Status.TIMED_OUT
        assert [t.status for t in result.turns] == [
            TurnStatus.FAILED,
            TurnStatus.SKIPPED,
            TurnStatus.SKIPPED,
        ]
        assert result.turns[0].error is not None and result.turns[0].error.type == "Timeout"


async def test_a_template_that_fails_to_render_is_an_internal_error(
    tmp_path: Path, fake_adapter: Any
) -> None:
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "price", "prompt_template": "It costs {price:.2f}."},
            {"turn_id": "c", "prompt_template": "C"},
        ],
        n=2,
        scenario=lambda i: {"variables": {"price": 9.5}},
    )
    # validation refuses a value its format spec cannot take, so this pack is changed
    # after loading, as code building its own Pack might do
    loaded = load_pack(pack)
    first = loaded.conversations[0]
    broken_scenario = first.scenario.model_copy(update={"variables": {"price": "cheap"}})
    loaded = dataclasses.replace(
        loaded,
        conversations=(
            dataclasses.replace(first, scenario=broken_scenario),
            *loaded.conversations[1:],
        ),
    )
    fake = fake_adapter()
    async with Simulator(fake) as sim:
        results = by_id(await collect(sim, loaded))
    broken = results["s0"]
    assert broken.status is Status.FAILED
    assert broken.termination_reason is TerminationReason.INTERNAL_ERROR
    price = turn(broken, "price")
    assert price.status is TurnStatus.FAILED and price.error is not None
    assert price.error.type == "TemplateError" and "price" in price.error.message
    assert price.messages == () and price.prompt is None  # nothing was sent
    assert turn(broken, "c").status is TurnStatus.SKIPPED
    assert ("s0", "price") not in [meta(p) for _, p in fake.calls]
    assert results["s1"].status is Status.DONE
    assert turn(results["s1"], "price").prompt == "It costs 9.50."


async def test_a_conversation_whose_turns_all_skip_is_done(
    tmp_path: Path, fake_adapter: Any
) -> None:
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "opt", "prompt_template": "About {not_defined}", "optional": True},
            {"turn_id": "after", "prompt_template": "After", "depends_on": ["opt"]},
        ],
        n=1,
    )
    fake = fake_adapter()
    async with Simulator(fake) as sim:
        (result,) = await collect(sim, pack)
    assert fake.calls == []
    assert result.status is Status.DONE
    assert result.termination_reason is TerminationReason.COMPLETED
    assert [t.status for t in result.turns] == [TurnStatus.SKIPPED, TurnStatus.SKIPPED]
    assert result.transcript == ()
    assert result.scores["latency"].value is None
    assert (result.scores["latency"].reason or "").startswith("not applicable")


async def test_max_turns_override(tmp_path: Path, fake_adapter: Any) -> None:
    fake = fake_adapter()
    async with Simulator(fake, max_turns=1) as sim:
        results = await collect(sim, make_pack(tmp_path, n=2, flow={"max_turns": 5}))
    assert len(fake.calls) == 2
    for result in results:
        assert result.status is Status.DONE
        assert result.termination_reason is TerminationReason.MAX_TURNS
        assert [t.status for t in result.turns] == [
            TurnStatus.COMPLETED,
            TurnStatus.SKIPPED,
            TurnStatus.SKIPPED,
        ]
        assert all("max_turns (1)" in (t.skip_reason or "") for t in result.turns[1:])
        assert len(result.transcript) == 2


# -- cancellation and stopping ------------------------------------------------------


async def test_cancelling_the_caller_scope(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(
        tmp_path,
        [{"turn_id": "a", "prompt_template": "A"}, {"turn_id": "b", "prompt_template": "B"}],
        n=6,
    )
    fast = {"s0", "s1"}

    async def behave(messages: Any, params: Any) -> str:
        cid, _ = meta(params)
        await anyio.sleep(0 if cid in fast else 10)
        return "ok"

    fake = fake_adapter(behave)
    out = tmp_path / "results.jsonl"
    tasks_before = asyncio.all_tasks()
    seen: list[convsim.ConversationResult] = []
    with anyio.fail_after(5):  # a hang guard
        with anyio.CancelScope() as caller:
            async with Simulator(fake, concurrency=10, grace_period=0.05) as sim:
                handle = sim.run(pack, sink=JsonlSink(out))
                async for result in handle:
                    seen.append(result)
                    if len(seen) == len(fast):
                        caller.cancel()
            pytest.fail("the cancellation did not propagate")  # pragma: no cover
    assert caller.cancelled_caught
    assert asyncio.all_tasks() - tasks_before == set(), "tasks were left behind"
    assert fake.closed is False  # not owned by the simulator: the caller closes it

    assert {r.conversation_id for r in seen} == fast
    lines = out.read_text(encoding="utf-8").splitlines()
    written = by_id([convsim.ConversationResult.model_validate_json(line) for line in lines])
    assert len(lines) == 6  # every started conversation, once each
    assert by_id(read_results(out)).keys() == written.keys()
    for cid, result in written.items():
        if cid in fast:
            assert result.status is Status.DONE
        else:
            assert result.status is Status.CANCELLED
            assert result.termination_reason is TerminationReason.CANCELLED
            a, b = result.turns
            assert (
                a.status is TurnStatus.FAILED
                and a.error is not None
                and a.error.type == "Cancelled"
            )
            assert b.status is TurnStatus.SKIPPED and "cancelled" in (b.skip_reason or "")
            assert result.error is not None and result.error.type == "Cancelled"
    for result in seen:
        assert written[result.conversation_id] == result
    stats = handle.statistics()
    assert (stats.done, stats.cancelled, stats.in_flight, stats.started) == (2, 4, 0, 6)
    manifest = json.loads((tmp_path / "results.manifest.json").read_text(encoding="utf-8"))
    assert manifest["finished_at"] is not None
    assert manifest["statistics"]["cancelled"] == 4 and manifest["statistics"]["done"] == 2


async def test_an_error_in_the_callers_code_still_records_in_flight_conversations(
    tmp_path: Path, fake_adapter: Any
) -> None:
    pack = make_pack(tmp_path, [{"turn_id": "a", "prompt_template": "A"}], n=4)

    fake, three_in_flight = sleeper(fake_adapter, calls=3)
    out = tmp_path / "results.jsonl"
    with anyio.fail_after(5), pytest.raises(ValueError, match="bug in the caller"):
        async with Simulator(fake, concurrency=3, grace_period=0.01) as sim:
            handle = sim.run(pack, sink=JsonlSink(out))
            await three_in_flight.wait()
            raise ValueError("bug in the caller")
    written = read_results(out)
    assert sorted(r.conversation_id for r in written) == ["s0", "s1", "s2"]
    assert all(r.status is Status.CANCELLED for r in written)
    assert handle.statistics().in_flight == 0


@manual_clock
async def test_timed_out_then_cancelled_keeps_a_consistent_reason(
    tmp_path: Path, fake_adapter: Any
) -> None:
    class SlowScorer:
        def update(self, turn: Any) -> None:
            if turn.status is TurnStatus.FAILED:
                clock().advance(1)  # scoring the timed-out turn outlasts the grace period

        def result(self) -> Score:
            return Score(value=1.0)

    class SlowMetric:
        name = "slow"
        higher_is_better = None
        description = "scores slowly"

        def scorer(self, conversation: Any) -> SlowScorer:
            return SlowScorer()

    reg = METRICS.copy()
    reg.register("slow", SlowMetric)
    pack = make_pack(
        tmp_path,
        [{"turn_id": "a", "prompt_template": "A"}, {"turn_id": "b", "prompt_template": "B"}],
        n=1,
    )
    fake, in_flight = sleeper(fake_adapter, calls=1)
    out = tmp_path / "results.jsonl"
    with anyio.CancelScope() as caller:
        async with Simulator(
            fake,
            conversation_timeout=0.02,
            grace_period=0.05,
            metric_registry=reg,
            metrics=["slow"],
        ) as sim:
            sim.run(pack, sink=JsonlSink(out))
            await in_flight.wait()
            caller.cancel()
            # past the conversation's own deadline (0.02), before the grace deadline
            # the stop sets from now (0.05 on)
            clock().advance(0.03)
            await anyio.sleep_forever()
    assert caller.cancelled_caught
    (result,) = read_results(out)
    assert turn(result, "a").error is not None and turn(result, "a").error.type == "Timeout"  # type: ignore[union-attr]
    assert result.status is Status.TIMED_OUT
    assert result.termination_reason is TerminationReason.CONVERSATION_TIMEOUT


async def test_conversations_not_started_are_not_recorded(
    tmp_path: Path, fake_adapter: Any
) -> None:
    pack = make_pack(tmp_path, [{"turn_id": "a", "prompt_template": "A"}], n=5)

    fake, two_in_flight = sleeper(fake_adapter, calls=2)
    out = tmp_path / "results.jsonl"
    with anyio.fail_after(5):
        with anyio.CancelScope() as caller:
            async with Simulator(fake, concurrency=2, grace_period=0.01) as sim:
                handle = sim.run(pack, sink=JsonlSink(out))
                await two_in_flight.wait()
                caller.cancel()
                await anyio.sleep(10)
    stats = handle.statistics()
    assert (stats.total, stats.started, stats.cancelled, stats.in_flight) == (5, 2, 2, 0)
    written = by_id(read_results(out))
    assert set(written) == {"s0", "s1"}
    assert all(r.status is Status.CANCELLED for r in written.values())

    # A resumed run picks up both the cancelled and the never-started conversations.
    async with Simulator(fake_adapter()) as sim:
        resumed = by_id(await collect(sim, pack, sink=JsonlSink(out, resume=True)))
    assert set(resumed) == {f"s{i}" for i in range(5)}
    final = by_id(read_results(out))
    assert set(final) == set(resumed) and all(r.status is Status.DONE for r in final.values())


@manual_clock
async def test_grace_period_lets_in_flight_conversations_finish(
    tmp_path: Path, fake_adapter: Any
) -> None:
    """The caller is cancelled while four conversations are in flight: the two that can
    still finish do, second turn included; the other two are recorded CANCELLED when the
    grace period ends; every conversation is written once."""
    grace = 2.0
    pack = make_pack(
        tmp_path,
        [{"turn_id": "a", "prompt_template": "A"}, {"turn_id": "b", "prompt_template": "B"}],
        n=4,
    )
    finishing = {"s0", "s1"}
    answer = {cid: anyio.Event() for cid in ("s0", "s1", "s2", "s3")}
    all_in_flight = anyio.Event()

    async def behave(messages: Any, params: Any) -> str:
        cid, turn_id = meta(params)
        if turn_id == "a":
            if len(fake.calls) == 4:
                all_in_flight.set()
            await answer[cid].wait()  # set by the test, and never for s2 and s3
        return f"{turn_id} done in time"

    fake = fake_adapter(behave)
    out = tmp_path / "results.jsonl"
    caller = anyio.CancelScope()
    running = anyio.Event()
    handle: convsim.RunHandle | None = None

    async def the_callers_code() -> None:
        nonlocal handle
        with caller:
            async with Simulator(fake, concurrency=4, grace_period=grace) as sim:
                handle = sim.run(pack, sink=JsonlSink(out))
                running.set()
                await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(the_callers_code)
        await running.wait()
        assert handle is not None
        await all_in_flight.wait()
        caller.cancel()
        for cid in finishing:
            answer[cid].set()  # answered after the stop: these go on to their turn b
        finished = {r.conversation_id: r async for r in take(handle, 2)}
        assert set(finished) == finishing
        assert all(r.status is Status.DONE for r in finished.values())
        # the clock has not moved: within the grace period, the others are still in flight
        assert handle.statistics().in_flight == 2
        clock().advance(grace + 1)  # the grace period ends

    assert caller.cancelled_caught
    written = by_id(read_results(out))
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4  # each once, none lost
    assert set(written) == {"s0", "s1", "s2", "s3"}
    for cid, result in written.items():
        if cid in finishing:
            assert result.status is Status.DONE, cid
            assert [t.status for t in result.turns] == [TurnStatus.COMPLETED] * 2
            assert result == finished[cid]
        else:
            assert result.status is Status.CANCELLED, cid
            assert result.termination_reason is TerminationReason.CANCELLED
            a, b = result.turns
            assert a.status is TurnStatus.FAILED and a.error is not None
            assert a.error.type == "Cancelled"
            assert b.status is TurnStatus.SKIPPED
    assert [meta(p)[1] for _, p in fake.calls].count("b") == 2  # only the finishing two
    stats = handle.statistics()
    assert (stats.started, stats.done, stats.cancelled, stats.in_flight) == (4, 2, 2, 0)


async def one_loop_turn(messages: Any, params: Any) -> str:
    """An answer that takes one turn of the event loop (and no time)."""
    await anyio.lowlevel.checkpoint()
    return "ok"


@manual_clock  # the grace period cannot run out however slow the machine is
async def test_breaking_out_early_does_not_hang(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(tmp_path, n=10)
    async with Simulator(fake_adapter(one_loop_turn), concurrency=2) as sim:
        handle = sim.run(pack)
        first = await anext(handle)
    await handle.wait()
    assert first.status is Status.DONE
    stats = handle.statistics()
    assert stats.in_flight == 0
    assert stats.cancelled == 0  # the in-flight ones finished within the grace period
    assert stats.started < stats.total  # no new conversations were started
    assert stats.done == stats.started


@manual_clock
async def test_stop_starts_no_new_conversations(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(tmp_path, n=10)
    async with Simulator(fake_adapter(one_loop_turn), concurrency=2) as sim:
        handle = sim.run(pack)
        results = []
        async for result in handle:
            results.append(result)
            handle.stop()
    assert 1 <= len(results) < 10
    assert all(r.status is Status.DONE for r in results)
    assert handle.statistics().started == len(results)


async def test_stop_right_after_run_is_honoured(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, [{"turn_id": "a", "prompt_template": "A"}], n=10)
    with anyio.fail_after(5):
        async with Simulator("scripted", model_args={"latency": 0.01}, concurrency=1) as sim:
            handle = sim.run(pack)
            handle.stop()
            results = [r async for r in handle]
    assert handle.statistics().started == 0
    assert results == []


@pytest.mark.parametrize("use", ["iterate", "break", "wait", "ignore"])
async def test_handles_leave_no_unclosed_streams(tmp_path: Path, use: str) -> None:
    pack = make_pack(tmp_path, n=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with Simulator("scripted") as sim:
            handle = sim.run(pack)
            if use == "iterate":
                assert len([r async for r in handle]) == 3
            elif use == "break":
                await anext(handle)
            elif use == "wait":
                await handle.wait()
        del handle
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


async def test_closing_a_handle_stops_delivery_but_not_the_run(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, n=4)
    out = tmp_path / "results.jsonl"
    async with Simulator("scripted", model_args={"latency": 0.002}, concurrency=1) as sim:
        handle = sim.run(pack, sink=JsonlSink(out))
        first = await anext(handle)
        handle.close()
        assert [r async for r in handle] == []
        await handle.wait()
    assert handle.statistics().done == 4
    assert first.conversation_id in {r.conversation_id for r in read_results(out)}
    assert len(read_results(out)) == 4


async def test_run_needs_the_async_with_block(tmp_path: Path) -> None:
    sim = Simulator("scripted")
    with pytest.raises(ConfigError, match="async with"):
        sim.run(make_pack(tmp_path))


# -- several runs, event loops, run_sync --------------------------------------------


async def test_two_runs_on_one_simulator(tmp_path: Path, fake_adapter: Any) -> None:
    pack_a = make_pack(tmp_path, n=3, name="pack_a")
    pack_b = make_pack(tmp_path, n=2, name="pack_b")

    async def behave(messages: Any, params: Any) -> str:
        await anyio.sleep(0.002)
        return f"answer for {params.metadata['conversation_id']}"

    got: dict[str, list[convsim.ConversationResult]] = {}
    async with Simulator(fake_adapter(behave), concurrency=2) as sim:
        handle_a, handle_b = sim.run(pack_a), sim.run(pack_b)

        async def drain(key: str, handle: convsim.RunHandle) -> None:
            got[key] = [r async for r in handle]

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, "a", handle_a)
            tg.start_soon(drain, "b", handle_b)
    assert handle_a.run_id != handle_b.run_id
    assert sorted(r.conversation_id for r in got["a"]) == ["s0", "s1", "s2"]
    assert sorted(r.conversation_id for r in got["b"]) == ["s0", "s1"]
    assert all(r.run_id == handle_a.run_id and r.pack == "pack_a" for r in got["a"])
    assert all(r.run_id == handle_b.run_id and r.pack == "pack_b" for r in got["b"])
    assert all(r.status is Status.DONE for r in got["a"] + got["b"])
    for r in got["a"] + got["b"]:
        assert r.transcript[-1].content == f"answer for {r.conversation_id}"


async def test_two_simulators_in_one_event_loop(tmp_path: Path, fake_adapter: Any) -> None:
    pack = make_pack(tmp_path, n=3)

    async def behave(messages: Any, params: Any) -> str:
        await anyio.sleep(0.002)
        return "hi"

    fakes = [fake_adapter(behave, name="one"), fake_adapter(behave, name="two")]
    got: dict[str, list[convsim.ConversationResult]] = {}

    async def use(fake: Any) -> None:
        async with Simulator(fake, seed=1) as sim:
            got[fake.name] = await collect(sim, pack)

    async with anyio.create_task_group() as tg:
        for fake in fakes:
            tg.start_soon(use, fake)
    for fake in fakes:
        assert len(fake.calls) == 9  # 3 conversations x 3 turns, each on its own adapter
        assert {r.model for r in got[fake.name]} == {fake.name}
        assert all(r.status is Status.DONE for r in got[fake.name])
    assert got["one"][0].run_id != got["two"][0].run_id


def test_run_sync_from_sync_code(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, n=4)
    out = tmp_path / "sync.jsonl"
    results = run_sync(pack, "scripted", out=out, concurrency=2, seed=5)
    assert sorted(r.conversation_id for r in results) == ["s0", "s1", "s2", "s3"]
    assert all(r.status is Status.DONE for r in results)
    assert by_id(read_results(out)) == by_id(results)


def test_run_sync_accepts_an_adapter_and_limit(tmp_path: Path, fake_adapter: Any) -> None:
    fake = fake_adapter()
    results = run_sync(make_pack(tmp_path, n=4), fake, limit=2)
    assert [r.conversation_id for r in sorted(results, key=lambda r: r.conversation_id)] == [
        "s0",
        "s1",
    ]
    assert len(fake.calls) == 6


async def test_run_sync_inside_a_running_loop_is_refused(tmp_path: Path) -> None:
    pack = make_pack(tmp_path)
    out = tmp_path / "never.jsonl"
    with pytest.raises(ConfigError) as info:
        run_sync(pack, "scripted", out=out)
    assert "async" in str(info.value) and "Simulator" in str(info.value)
    assert not out.exists()


# -- metrics ------------------------------------------------------------------------


class _Boom(Exception):
    pass


class BoomMetric:
    name = "boom"
    higher_is_better = True
    description = "raises where it is told to"

    def __init__(self, where: str) -> None:
        self.where = where

    def scorer(self, conversation: Any) -> Any:
        if self.where == "scorer":
            raise _Boom("kaboom in scorer()")
        return _BoomScorer(self.where)


class _BoomScorer:
    def __init__(self, where: str) -> None:
        self.where = where
        self.n = 0

    def update(self, turn: Any) -> None:
        if self.where == "update":
            raise _Boom("kaboom in update()")
        self.n += 1

    def result(self) -> Score:
        if self.where == "result":
            raise _Boom("kaboom in result()")
        return Score(value=float(self.n))


@pytest.mark.parametrize("where", ["scorer", "update", "result"])
async def test_a_failing_metric_does_not_fail_the_conversation(tmp_path: Path, where: str) -> None:
    reg = METRICS.copy()
    reg.register("boom", lambda: BoomMetric(where))
    assert "boom" not in METRICS  # the default registry is untouched
    async with Simulator(
        "scripted", metric_registry=reg, metrics=["boom", "response_length"]
    ) as sim:
        results = await collect(sim, make_pack(tmp_path, n=2))
    for result in results:
        assert result.status is Status.DONE
        assert all(t.status is TurnStatus.COMPLETED for t in result.turns)
        score = result.scores["boom"]
        assert score.value is None
        assert score.reason is not None and score.reason.startswith("metric failed")
        assert f"kaboom in {where}()" in score.reason and "_Boom" in score.reason
        assert result.scores["response_length"].value is not None  # the others still score


async def test_a_failing_turn_metric_is_recorded_per_turn(tmp_path: Path) -> None:
    reg = METRICS.copy()
    reg.register("boom", lambda: BoomMetric("update"))
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A", "evaluation_metrics": ["boom"]},
            {"turn_id": "b", "prompt_template": "B"},
        ],
        n=1,
    )
    async with Simulator("scripted", metric_registry=reg) as sim:
        (result,) = await collect(sim, pack)
    assert result.status is Status.DONE
    score = result.turn_scores["a"]["boom"]
    assert score.value is None and (score.reason or "").startswith("metric failed")
    assert "b" not in result.turn_scores


async def test_cpu_heavy_turn_metrics_are_scored_off_the_event_loop(tmp_path: Path) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    class HeavyTurnMetric(BoomMetric):
        name = "heavy"
        cpu_heavy = True

        def scorer(self, conversation: Any) -> Any:
            class Spy(_BoomScorer):
                def update(self, turn: Any) -> None:
                    threads.append(threading.get_ident())
                    super().update(turn)

            return Spy("nowhere")

    reg = METRICS.copy()
    reg.register("heavy", lambda: HeavyTurnMetric("nowhere"))
    pack = make_pack(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A", "evaluation_metrics": ["heavy"]},
            {"turn_id": "b", "prompt_template": "B", "evaluation_metrics": ["heavy"]},
        ],
        n=2,
    )
    async with Simulator("scripted", metric_registry=reg) as sim:
        results = await collect(sim, pack)
    assert len(threads) == 4 and loop_thread not in threads
    assert all(r.turn_scores[t]["heavy"].value == 1.0 for r in results for t in "ab")


class _BlockingHeavy:
    """CPU-heavy metrics; the first of them to run (update for a turn metric, result for
    a conversation metric) blocks its worker thread until released, so that a test can
    cancel meanwhile."""

    higher_is_better = True
    description = "blocks once"
    cpu_heavy = True

    def __init__(self, name: str, started: threading.Event, release: threading.Event) -> None:
        self.name, self.started, self.release = name, started, release

    def scorer(self, conversation: Any) -> Any:
        metric = self

        class Scorer:
            def _block(self) -> None:
                if not metric.started.is_set():  # the first to run blocks
                    metric.started.set()
                    metric.release.wait(5)

            def update(self, turn: Any) -> None:
                if metric.name.startswith("turn"):
                    self._block()

            def result(self) -> Score:
                if metric.name.startswith("conv"):
                    self._block()
                return Score(value=1.0)

        return Scorer()


async def _cancel_while_blocked(
    tmp_path: Path, fake_adapter: Any, turns: list[dict[str, Any]], metrics: list[str]
) -> convsim.ConversationResult:
    started, release = threading.Event(), threading.Event()
    reg = METRICS.copy()
    for name in ("turn1", "turn2", "conv1", "conv2"):
        reg.register(name, lambda name=name: _BlockingHeavy(name, started, release))

    async def answer(messages: Any, params: Any) -> str:
        if params.metadata["turn_id"] == "b":
            await anyio.sleep(30)  # never reached in time: cancelled
        return "ok"

    out = tmp_path / "results.jsonl"
    with anyio.CancelScope() as caller:
        async with Simulator(
            fake_adapter(answer), metric_registry=reg, metrics=metrics, grace_period=0.01
        ) as sim:
            handle = sim.run(make_pack(tmp_path, turns, n=1), sink=JsonlSink(out))
            async with anyio.create_task_group() as tg:

                async def stop_once_blocked() -> None:
                    await anyio.to_thread.run_sync(started.wait, 5)
                    # The stop fixes the grace deadline now (the cancelled caller would
                    # set the same one a few loop turns later); then the clock passes it
                    # and only then is the metric released: the cancellation is due
                    # before the worker thread returns.
                    handle.stop()
                    caller.cancel()
                    clock().advance(1)
                    release.set()

                tg.start_soon(stop_once_blocked)
                async for _ in handle:
                    pass
    assert caller.cancelled_caught
    (result,) = read_results(out)
    return result


@manual_clock
async def test_cancelling_while_a_heavy_turn_metric_runs_keeps_every_turn_score(
    tmp_path: Path, fake_adapter: Any
) -> None:
    turns = [
        {"turn_id": "a", "prompt_template": "A", "evaluation_metrics": ["turn1", "turn2"]},
        {"turn_id": "b", "prompt_template": "B"},
    ]
    result = await _cancel_while_blocked(tmp_path, fake_adapter, turns, [])
    assert result.status is Status.CANCELLED
    assert {n: s.value for n, s in result.turn_scores["a"].items()} == {"turn1": 1.0, "turn2": 1.0}


@manual_clock
async def test_cancelling_while_heavy_conversation_metrics_run_loses_none(
    tmp_path: Path, fake_adapter: Any
) -> None:
    turns = [{"turn_id": "a", "prompt_template": "A"}]
    result = await _cancel_while_blocked(tmp_path, fake_adapter, turns, ["conv1", "conv2"])
    assert result.status is Status.DONE  # every turn ran: only the scoring was cut short
    assert {n: s.value for n, s in result.scores.items()} == {"conv1": 1.0, "conv2": 1.0}


async def test_scorers_see_turns_while_the_conversation_runs(
    tmp_path: Path, fake_adapter: Any
) -> None:
    events: list[tuple[str, str]] = []

    class OrderScorer:
        def update(self, turn: Any) -> None:
            events.append(("update", turn.turn_id))

        def result(self) -> Score:
            return Score(value=float(sum(1 for e in events if e[0] == "update")))

    class OrderMetric:
        name = "order"
        higher_is_better = None
        description = "records when turns arrive"

        def scorer(self, conversation: Any) -> OrderScorer:
            return OrderScorer()

    async def behave(messages: Any, params: Any) -> str:
        turn_id = meta(params)[1]
        events.append(("call_start", turn_id))
        await anyio.sleep(0.02)
        events.append(("call_end", turn_id))
        return "ok"

    reg = METRICS.copy()
    reg.register("order", OrderMetric)
    pack = make_pack(
        tmp_path,
        [{"turn_id": "t1", "prompt_template": "one"}, {"turn_id": "t2", "prompt_template": "two"}],
        n=1,
    )
    async with Simulator(fake_adapter(behave), metric_registry=reg, metrics=["order"]) as sim:
        (result,) = await collect(sim, pack)
    assert result.scores["order"].value == 2.0
    assert (
        events.index(("call_end", "t1"))
        < events.index(("update", "t1"))
        < events.index(("call_end", "t2"))
    )
    assert events[-1] == ("update", "t2")


async def test_flow_metrics_are_scored(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, flow={"metrics": ["response_length"]}, n=1)
    async with Simulator("scripted", metrics=[]) as sim:
        (result,) = await collect(sim, pack)
    assert "response_length" in result.scores
    assert result.scores["response_length"].value is not None


# -- the simulated user -------------------------------------------------------------


def user_pack(tmp_path: Path) -> Path:
    return make_pack(
        tmp_path,
        [
            {"turn_id": "ask", "role": "user", "prompt_template": "Ask about {topic}."},
            {"turn_id": "follow", "role": "user", "prompt_template": "Push back politely."},
            {"turn_id": "close", "prompt_template": "Thanks."},
        ],
        n=1,
    )


async def test_user_turns_need_a_user_model(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    async with Simulator("scripted") as sim:
        with pytest.raises(ConfigError) as info:
            sim.run(user_pack(tmp_path), sink=JsonlSink(out))
    assert "user" in str(info.value) and "user_model" in str(info.value)
    assert not out.exists()  # refused before anything ran


async def test_the_user_models_reply_is_what_the_assistant_receives(
    tmp_path: Path, fake_adapter: Any
) -> None:
    user_replies = iter(["What tea should I try first?", "Hm, I don't like green tea."])
    user = fake_adapter(lambda messages, params: next(user_replies), name="user-sim")
    assistant = fake_adapter(
        lambda messages, params: f"assistant answer {len(messages)}", name="assistant"
    )
    async with Simulator(assistant, user_model=user) as sim:
        (result,) = await collect(sim, user_pack(tmp_path))
    assert result.status is Status.DONE

    ask, follow, close = result.turns
    assert ask.prompt == "Ask about topic 0."
    assert ask.user_message == "What tea should I try first?"
    assert ask.messages == (Message(role="user", content="What tea should I try first?"),)
    assert follow.user_message == "Hm, I don't like green tea."
    assert close.user_message == close.prompt == "Thanks."
    sent = [messages[-1].content for messages, _ in assistant.calls]
    assert sent == ["What tea should I try first?", "Hm, I don't like green tea.", "Thanks."]
    assert [m.content for m in result.transcript if m.role == "user"] == sent

    # The user model got the scenario and the rendered instruction, with roles flipped.
    assert len(user.calls) == 2
    (first, first_params), (second, _) = user.calls
    assert first[0].role == "system"
    assert "scenario number 0" in first[0].content and "Ask about topic 0." in first[0].content
    assert first[1:] == (Message(role="user", content="(Write your next message.)"),)
    assert first_params.metadata["role"] == "user" and first_params.reference is None
    assert "Push back politely." in second[0].content
    assert second[1:] == (
        Message(role="assistant", content="What tea should I try first?"),
        Message(role="user", content="assistant answer 1"),
    )

    assert ask.user_usage is not None and ask.user_usage.total_tokens == 2
    assert close.user_usage is None
    assert result.user_usage is not None and result.user_usage.total_tokens == 4
    assert result.usage.total_tokens == 6  # the assistant's three calls only


async def test_a_failing_user_model_fails_the_turn(tmp_path: Path, fake_adapter: Any) -> None:
    user = fake_adapter(lambda messages, params: ServerError("user sim down"), name="user-sim")
    assistant = fake_adapter()
    async with Simulator(assistant, user_model=user) as sim:
        (result,) = await collect(sim, user_pack(tmp_path))
    assert result.status is Status.FAILED
    assert result.termination_reason is TerminationReason.INFRASTRUCTURE_ERROR
    ask = result.turns[0]
    assert (
        ask.status is TurnStatus.FAILED
        and ask.error is not None
        and ask.error.type == "ServerError"
    )
    assert ask.prompt == "Ask about topic 0." and ask.messages == ()
    assert assistant.calls == []  # the assistant was never asked


async def test_a_user_turn_can_time_out(tmp_path: Path, fake_adapter: Any) -> None:
    async def slow_user(messages: Any, params: Any) -> str:
        await anyio.sleep(10)
        return "never"

    with anyio.fail_after(5):
        async with Simulator(
            fake_adapter(), user_model=fake_adapter(slow_user, name="u"), conversation_timeout=0.05
        ) as sim:
            (result,) = await collect(sim, user_pack(tmp_path))
    assert result.status is Status.TIMED_OUT
    assert result.turns[0].status is TurnStatus.FAILED
    assert result.turns[0].error is not None and result.turns[0].error.type == "Timeout"
    assert [t.status for t in result.turns[1:]] == [TurnStatus.SKIPPED, TurnStatus.SKIPPED]


# -- settings are checked up front --------------------------------------------------


def test_unknown_metric_lists_the_known_ones() -> None:
    with pytest.raises(RegistryError) as info:
        Simulator("scripted", metrics=["latency", "no_such_metric"])
    message = str(info.value)
    assert "no_such_metric" in message
    assert "latency" in message and "response_length" in message and "exact_match" in message
    assert info.value.name == "no_such_metric"
    assert {"latency", "response_length"} <= set(info.value.known)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"concurrency": -3},
        {"concurrency": 2.5},
        {"conversation_timeout": 0},
        {"conversation_timeout": -1.0},
        {"max_turns": 0},
        {"grace_period": -0.1},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_bad_settings_raise_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        Simulator("scripted", **kwargs)
    assert next(iter(kwargs)) in str(info.value)


def test_model_args_need_a_model_spec(fake_adapter: Any) -> None:
    with pytest.raises(ConfigError, match="spec"):
        Simulator(fake_adapter(), model_args={"latency": 1})


def test_concurrency_must_be_a_real_positive_integer() -> None:
    for bad in (True, 0, -1, 2.5):
        with pytest.raises(ConfigError, match="concurrency"):
            Simulator("scripted", concurrency=bad)  # type: ignore[arg-type]


# -- robustness: a broken adapter or a defect never sinks the run ------------------


@pytest.mark.anyio
async def test_an_adapter_returning_garbage_fails_only_its_conversation(
    tmp_path: Path, fake_adapter: Any
) -> None:
    class Garbage(fake_adapter):  # type: ignore[misc, valid-type]
        async def generate(self, messages: Any, params: Any) -> Any:
            if params.metadata["conversation_id"] == "s1":
                return "not a Completion"
            return await super().generate(messages, params)

    async with Simulator(Garbage()) as sim:
        results = by_id(await collect(sim, make_pack(tmp_path)))
    assert results["s1"].status is Status.FAILED
    assert results["s1"].error is not None and results["s1"].error.type == "ProtocolError"
    assert results["s1"].termination_reason is TerminationReason.MODEL_ERROR
    assert results["s0"].status is Status.DONE and results["s2"].status is Status.DONE


@pytest.mark.anyio
async def test_an_internal_defect_is_recorded_and_the_run_goes_on(
    tmp_path: Path, fake_adapter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from convsim._runtime._state import TurnPlanner

    real = TurnPlanner.steps

    def broken(self: TurnPlanner) -> Any:
        for step in real(self):
            if self.conversation.conversation_id == "s1" and self.outcomes:
                raise RuntimeError("defect in the planner")
            yield step

    monkeypatch.setattr(TurnPlanner, "steps", broken)
    turns = [{"turn_id": t, "prompt_template": t.upper()} for t in ("a", "b", "c")]
    out = tmp_path / "r.jsonl"
    async with Simulator(fake_adapter()) as sim:
        handle = sim.run(make_pack(tmp_path, turns), sink=convsim.JsonlSink(out))
        results = by_id([r async for r in handle])
    broken_result = results["s1"]
    assert broken_result.status is Status.FAILED
    assert broken_result.termination_reason is TerminationReason.INTERNAL_ERROR
    assert (
        broken_result.error is not None and "defect in the planner" in broken_result.error.message
    )
    assert [t.status.value for t in broken_result.turns] == ["completed", "skipped", "skipped"]
    assert {results["s0"].status, results["s2"].status} == {Status.DONE}
    assert handle.statistics().in_flight == 0
    assert len(convsim.read_results(out)) == 3


@pytest.mark.anyio
async def test_concurrency_is_shared_by_every_run_of_a_simulator(
    tmp_path: Path, fake_adapter: Any
) -> None:
    active = peak = 0
    full = anyio.Event()

    async def slow(messages: Any, params: Any) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == 2:
            full.set()
        await full.wait()  # the first calls are held until the shared cap is reached
        active -= 1
        return "ok"

    pack = make_pack(tmp_path, n=6)
    async with Simulator(fake_adapter(slow), concurrency=2) as sim:
        first, second = sim.run(pack), sim.run(pack)
        await first.wait()
        await second.wait()
    assert peak == 2


@pytest.mark.anyio
async def test_only_must_name_known_conversations(tmp_path: Path) -> None:
    pack = make_pack(tmp_path)
    async with Simulator("scripted") as sim:
        with pytest.raises(ConfigError, match="not one string"):
            sim.run(pack, only="s1")
        with pytest.raises(ConfigError, match="no conversations nope"):
            sim.run(pack, only=["s1", "nope"])
        results = await collect(sim, pack, only=["s1"])
    assert [r.conversation_id for r in results] == ["s1"]


@pytest.mark.anyio
async def test_stop_with_zero_grace_cancels_in_flight_at_once(
    tmp_path: Path, fake_adapter: Any
) -> None:
    started = anyio.Event()

    async def forever(messages: Any, params: Any) -> str:
        started.set()
        await anyio.sleep(3600)
        return "never"

    async with Simulator(fake_adapter(forever), grace_period=3600) as sim:
        handle = sim.run(make_pack(tmp_path, n=2))
        await started.wait()
        handle.stop()  # the long grace period: nothing would end for an hour
        handle.stop(grace_period=0)  # a second stop brings the deadline forward
        results = [r async for r in handle]
    assert [r.status for r in results] == [Status.CANCELLED, Status.CANCELLED]


def test_check_validates_without_running(tmp_path: Path) -> None:
    user_turn = [{"turn_id": "u", "role": "user", "prompt_template": "ask something"}]
    pack = make_pack(tmp_path, user_turn)
    with pytest.raises(ConfigError, match="role 'user'"):
        Simulator("scripted").check(pack)
    assert len(Simulator("scripted", user_model="scripted").check(pack)) == 3
