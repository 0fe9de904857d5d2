"""One run's steps, each driven alone, without a Simulator around them: choosing the
conversations, admitting them under the cap, running one to its result, recording each
result once, turning a cancellation into a graceful stop, and the circuit breaker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import FakeAdapter, clock, manual_clock, write_pack

from convsim import (
    ConversationResult,
    Pack,
    RunHandle,
    RunManifest,
    ServerError,
    SimulatorConfig,
    Status,
    TerminationReason,
    TurnStatus,
    load_pack,
)
from convsim._gauges import LoopMonitor
from convsim._runtime._run import Run, RunContext, RunPlan
from convsim.adapters import Budgets
from convsim.plugins import PluginManager

pytestmark = pytest.mark.anyio


# -- helpers ------------------------------------------------------------------------


def make_pack(tmp_path: Path, n: int = 3, turns: tuple[str, ...] = ("a",)) -> Pack:
    """A pack of ``n`` conversations s0..s{n-1}, one flow of the given turns in order."""
    flow = [{"turn_id": t, "prompt_template": f"Say {t}."} for t in turns]
    scenarios = [{"scenario_id": f"s{i}", "scenario_description": "run"} for i in range(n)]
    return load_pack(write_pack(tmp_path / "pack", {"default": {"turns": flow}}, scenarios))


class MemorySink:
    """A results sink in memory: what it was asked to write, what it wrote, how it ended.
    Its first ``failures`` writes raise; ``recorded`` ids are skipped as a resume would."""

    def __init__(self, *, failures: int = 0, recorded: set[str] | None = None) -> None:
        self.failures = failures
        self.recorded = recorded or set()
        self.attempts: list[str] = []
        self.written: list[str] = []
        self.closed_with: RunManifest | None = None

    async def open(self, manifest: RunManifest) -> set[str]:
        return set(self.recorded)

    async def write(self, result: ConversationResult) -> None:
        self.attempts.append(result.conversation_id)
        if self.failures:
            self.failures -= 1
            raise OSError("No space left on device")
        self.written.append(result.conversation_id)

    async def close(self, manifest: RunManifest) -> None:
        self.closed_with = manifest


@pytest.fixture(autouse=True)
def _close_handles(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Close the streams of every handle a test built: a run that a test drives in
    parts never reaches the end of ``produce``, which closes them."""
    built.clear()
    yield
    for run in built:
        run.handle._send.close()
        run.handle.close()


built: list[Run] = []


def build(
    pack: Pack,
    adapter: FakeAdapter,
    *,
    sink: MemorySink | None = None,
    limit: int | None = None,
    only: set[str] | None = None,
    slots: anyio.Semaphore | None = None,
    loop: LoopMonitor | None = None,
    **settings: Any,
) -> Run:
    """A run of ``pack`` on ``adapter``, as a simulator would start it (no metrics; the
    loop-lag gauge off unless ``max_loop_lag`` is given)."""
    config = SimulatorConfig(model=adapter, **{"max_loop_lag": None, **settings})
    handle = RunHandle("run1", pack, config.grace_period, Budgets())
    handle.manifest = RunManifest(
        run_id="run1",
        pack=pack.name,
        pack_path=str(pack.path),
        pack_hash=pack.pack_hash,
        model="fake",
        started_at=0.0,
    )
    flows = {c.flow.scenario_type for c in pack.conversations}
    plan = RunPlan(pack, sink, limit, only, [], {flow: [] for flow in flows}, {})
    context = RunContext(
        config=config,
        model=adapter,
        model_name="fake",
        user_model=None,
        slots=slots if slots is not None else anyio.Semaphore(config.concurrency),
        plugins=PluginManager(),
    )
    run = Run(handle, plan, context, loop=loop)
    built.append(run)
    return run


def blocking_on(
    turn_id: str, *, conversations: set[str] | None = None
) -> tuple[FakeAdapter, anyio.Event, anyio.Event]:
    """A model that answers at once, except ``turn_id`` (of ``conversations``, default
    all): that call sets ``entered`` and waits for ``release`` (forever if never set)."""
    entered, release = anyio.Event(), anyio.Event()

    async def behave(messages: Any, params: Any) -> str:
        cid, tid = params.metadata["conversation_id"], params.metadata["turn_id"]
        if tid == turn_id and (conversations is None or cid in conversations):
            entered.set()
            await release.wait()
        return f"reply to {tid}"

    return FakeAdapter(behave), entered, release


async def run_to_end(run: Run, during: Callable[[], Any] | None = None) -> list[Any]:
    """Run ``run`` whole, reading its handle as a caller would; ``during`` runs beside."""
    results: list[Any] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.produce)
            if during is not None:
                tg.start_soon(during)
            results.extend([r async for r in run.handle])
    return results


# -- open: which conversations the run attempts --------------------------------------


async def test_open_skips_recorded_ones_then_applies_only_and_limit(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, n=6)
    sink = MemorySink(recorded={"s0"})
    run = build(pack, FakeAdapter(), sink=sink, only={"s0", "s2", "s3", "s4"}, limit=2)
    todo = await run.open()
    assert [c.conversation_id for c in todo] == ["s2", "s3"]
    stats = run.handle.statistics()
    assert (stats.total, stats.resumed, stats.started) == (2, 1, 0)


# -- admit: under the simulator's cap, while the loop keeps time ---------------------


@dataclass
class NeverCalm(LoopMonitor):
    """An event-loop gauge that always reads late: admission waits until cancelled."""

    holding: anyio.Event = field(default_factory=anyio.Event)

    async def run(self) -> None:
        await anyio.sleep_forever()

    async def calm(self, max_lag_s: float) -> bool:
        self.holding.set()
        await anyio.sleep_forever()
        return True


async def test_a_stop_while_admission_waits_for_the_loop_gives_the_slot_back(
    tmp_path: Path,
) -> None:
    """The slot taken for a conversation that never started goes back to the
    simulator, whose later runs would otherwise have one fewer (none, here)."""
    slots = anyio.Semaphore(1)
    gauge = NeverCalm()
    run = build(make_pack(tmp_path), FakeAdapter(), slots=slots, loop=gauge, max_loop_lag=0.05)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.produce)
            await gauge.holding.wait()
            run.handle.stop()
            assert [r async for r in run.handle] == []
    assert run.handle.statistics().started == 0
    assert slots.value == 1


# -- record: each result once --------------------------------------------------------


async def test_a_failing_sink_write_records_each_result_once(tmp_path: Path) -> None:
    """The sink's first write fails: that result is not written again, no later one is
    written, the run starts no more, and each result still reaches the reader once."""
    pack = make_pack(tmp_path, n=6)
    sink = MemorySink(failures=1)
    run = build(pack, FakeAdapter(), sink=sink, concurrency=2)
    results: list[ConversationResult] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.produce)
            with pytest.raises(OSError, match="No space left"):
                async for result in run.handle:
                    results.append(result)
    stats = run.handle.statistics()
    assert stats.started == 2  # both in flight when the write failed; no more after
    assert sorted(r.conversation_id for r in results) == ["s0", "s1"]
    assert all(r.status is Status.DONE for r in results)
    assert len(sink.attempts) == 1 and sink.written == []
    assert (stats.done, stats.finished) == (2, 2)  # counted once each
    assert sink.closed_with is not None  # the results file is still finalised
    assert sink.closed_with.statistics is not None
    assert sink.closed_with.statistics["done"] == 2


async def test_an_error_opening_the_sink_reaches_the_reader(tmp_path: Path) -> None:
    class Unopenable(MemorySink):
        async def open(self, manifest: RunManifest) -> set[str]:
            raise PermissionError("results.jsonl: permission denied")

    run = build(make_pack(tmp_path), FakeAdapter(), sink=Unopenable())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.produce)
            with pytest.raises(PermissionError, match="permission denied"):
                await anext(run.handle)
    with pytest.raises(PermissionError):
        await run.handle.wait()
    assert run.handle.statistics().started == 0


# -- converse: one conversation to its result ----------------------------------------


async def test_a_conversation_stopped_mid_turn_ends_cancelled_with_its_turns(
    tmp_path: Path,
) -> None:
    pack = make_pack(tmp_path, n=1, turns=("a", "b", "c"))
    adapter, entered, _ = blocking_on("b")
    run = build(pack, adapter)
    ended: list[ConversationResult] = []

    async def converse() -> None:
        ended.append(await run.converse(pack.conversations[0]))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(converse)
            await entered.wait()
            run.handle.stop(grace_period=0)
    (result,) = ended
    assert result.status is Status.CANCELLED
    assert result.termination_reason is TerminationReason.CANCELLED
    assert [t.status for t in result.turns] == [
        TurnStatus.COMPLETED,
        TurnStatus.FAILED,
        TurnStatus.SKIPPED,
    ]


@manual_clock
async def test_a_conversation_begun_after_a_stop_ends_by_that_stops_deadline(
    tmp_path: Path,
) -> None:
    """Admitted just before a graceful stop, it starts after it: the stop's deadline
    still bounds it (without it, it would wait for its model for ever)."""
    pack = make_pack(tmp_path, n=1)
    adapter, entered, _ = blocking_on("a")
    run = build(pack, adapter, grace_period=5)
    run.handle.stop()
    ended: list[ConversationResult] = []

    async def converse() -> None:
        ended.append(await run.converse(pack.conversations[0]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(converse)
        await entered.wait()
        clock().advance(6)
    (result,) = ended
    assert result.status is Status.CANCELLED


@manual_clock
async def test_a_conversation_that_times_out_is_timed_out_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    pack = make_pack(tmp_path, n=3, turns=("a", "b"))
    adapter, entered, _ = blocking_on("b", conversations={"s0"})
    sink = MemorySink()
    run = build(pack, adapter, sink=sink, concurrency=1, conversation_timeout=5)

    async def time_out_s0() -> None:
        await entered.wait()
        clock().advance(6)  # past s0's deadline; s1 and s2 need no time at all

    results = {r.conversation_id: r for r in await run_to_end(run, time_out_s0)}
    assert results["s0"].status is Status.TIMED_OUT
    assert results["s0"].termination_reason is TerminationReason.CONVERSATION_TIMEOUT
    assert results["s1"].status is Status.DONE and results["s2"].status is Status.DONE
    assert sink.written == ["s0", "s1", "s2"]
    stats = run.handle.statistics()
    # a timeout is counted on its own, not as an infrastructure failure
    assert (stats.timed_out, stats.done, stats.infrastructure_failures) == (1, 2, 0)
    assert stats.timeouts_s == (5.0,)
    assert stats.stopped_early is None


# -- dispatch and watch_for_cancel: a cancelled run stops gracefully -------------------


@manual_clock
@pytest.mark.parametrize("released", [True, False], ids=["within_grace", "grace_runs_out"])
async def test_cancelling_dispatch_stops_gracefully(tmp_path: Path, released: bool) -> None:
    """The caller's cancellation starts no more conversations; the one in flight gets
    the grace period: it ends DONE if it finishes within it, else CANCELLED."""
    pack = make_pack(tmp_path, n=3)
    adapter, entered, release = blocking_on("a", conversations={"s0"})
    run = build(pack, adapter, concurrency=1, grace_period=10)
    todo = await run.open()
    stopped = anyio.Event()
    run.handle._stopping.on_stop.append(lambda deadline: stopped.set())
    caller = anyio.CancelScope()

    async def dispatch() -> None:
        with caller:
            await run.dispatch(todo)

    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatch)
        await entered.wait()
        caller.cancel()
        await stopped.wait()  # the cancel became the run's stop
        if released:
            release.set()
        else:
            clock().advance(11)
    result = await anext(run.handle)
    assert result.conversation_id == "s0"
    assert result.status is (Status.DONE if released else Status.CANCELLED)
    stats = run.handle.statistics()
    assert (stats.started, stats.in_flight, stats.total) == (1, 0, 3)


# -- the circuit breaker stops admission ------------------------------------------------


async def test_the_breaker_stops_admission(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, n=6)
    down = FakeAdapter(lambda messages, params: ServerError("connection refused"))
    sink = MemorySink()
    run = build(pack, down, sink=sink, concurrency=1, circuit_breaker=2)
    results = await run_to_end(run)
    assert [r.status for r in results] == [Status.FAILED, Status.FAILED]
    assert sink.written == ["s0", "s1"]  # the rest stay unrecorded, for --resume
    stats = run.handle.statistics()
    assert (stats.started, stats.total) == (2, 6)
    assert stats.stopped_early is not None
    assert stats.stopped_early.startswith("2 conversations in a row failed")
    assert run.context.slots.value == 1  # every slot given back
