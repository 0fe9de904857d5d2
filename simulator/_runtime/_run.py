"""One run's work behind its :class:`~convsim.RunHandle`.

A :class:`Run` opens the sink, admits the plan's conversations under the simulator's
concurrency cap, runs each to a result, records every result once (counters, sink,
circuit breaker, the handle's stream), turns a cancellation into a graceful stop, and
finalises the results file however the run ends. Each step is a method of its own, so
that each can be driven alone.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.lowlevel
import structlog

from convsim.adapters import ModelAdapter
from convsim.metrics import Metric
from convsim.scenarios import Conversation, Pack

from .._gauges import LoopMonitor
from .._log import get_logger
from .._records import ConversationResult, Status, TurnStatus
from .._telemetry import Telemetry
from ..plugins import PluginManager
from ..results._sinks import ResultSink, RunManifest
from ._actor import ActorSettings, ConversationActor
from ._breaker import CircuitBreaker, is_infrastructure_failure
from ._call_settings import CallSettings
from ._config import SimulatorConfig
from ._cost import CostMeter
from ._estimate import estimator_for
from ._handle import RunHandle

__all__ = ["CLOSE_TIMEOUT_S", "Run", "RunContext", "RunPlan"]

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

log = get_logger("convsim.runtime")

_ADMISSION_BATCH = 100
"""Conversations started in one pass of the event loop at most: a pass that starts
thousands at once would run late by all their first steps before any lag shows."""

CLOSE_TIMEOUT_S = 30.0
"""The longest a cancelled run waits for its sink or adapters to close."""


@dataclass(frozen=True)
class RunPlan:
    """What one run was asked to do, fixed before it starts."""

    pack: Pack
    sink: ResultSink | None
    limit: int | None
    only: Collection[str] | None
    metric_names: list[str]
    """Every conversation metric of the run, in order."""
    metrics: dict[str, list[Metric]]
    """Conversation metrics by flow (scenario_type)."""
    turn_metrics: dict[str, Metric]


@dataclass(frozen=True)
class RunContext:
    """What a run takes from its simulator, shared with the simulator's other runs."""

    config: SimulatorConfig
    model: ModelAdapter
    """The model under test."""
    model_name: str
    """The model's name as results record it."""
    user_model: ModelAdapter | None
    slots: anyio.Semaphore
    """The simulator's concurrency cap: one slot per conversation alive, across its runs."""
    plugins: PluginManager
    telemetry: Telemetry | None = None
    """Where the run is traced; None: not traced."""


class Run:
    """Runs one plan to its end, reporting through ``handle``.

    Args:
        handle: the caller's side of the run: its stream, counters and stop.
        plan: the pack, sink, selection and metrics of the run.
        context: the models, concurrency cap, plugins and settings of the simulator.
        loop: the event-loop gauge that holds admission back while the loop runs late
            (a fresh one by default).
    """

    def __init__(
        self,
        handle: RunHandle,
        plan: RunPlan,
        context: RunContext,
        *,
        loop: LoopMonitor | None = None,
    ) -> None:
        self.handle = handle
        self.plan = plan
        self.context = context
        self.loop = loop if loop is not None else LoopMonitor()
        config = context.config
        self.breaker = CircuitBreaker(config.circuit_breaker)
        self.plugins = context.plugins.start_run()
        user = context.user_model
        self.settings = ActorSettings(
            run_id=handle.run_id,
            pack_name=handle.pack.name,
            pack_hash=handle.pack.pack_hash,
            model_name=context.model_name,
            assistant=CallSettings(
                context.model.default_config(), "assistant", config.token_cap("assistant")
            ),
            user=CallSettings(user.default_config(), "user", config.token_cap("user"))
            if user is not None
            else None,
            seed=config.seed,
            conversation_timeout=config.conversation_timeout,
            max_turns=config.max_turns,
            on_turn=self.plugins.turn if self._hooked else None,
            max_transcript_chars=config.max_transcript_chars,
            metric_tiers=handle.pack.metric_tiers,
            telemetry=context.telemetry,
        )

    @property
    def _hooked(self) -> bool:
        """Whether any plugin is loaded: without one, no hook call is made at all."""
        return bool(self.context.plugins.plugins)

    @property
    def manifest(self) -> RunManifest:
        manifest = self.handle.manifest
        assert manifest is not None, "the simulator gives every handle a manifest"
        return manifest

    async def produce(self) -> None:
        """The whole run, as the simulator's task group runs it. Never raises: the run's
        error goes to the handle, which is finished (its stream closed) at the end."""
        handle = self.handle
        try:
            async with handle._send:
                with structlog.contextvars.bound_contextvars(run_id=handle.run_id):
                    await self.execute()
        except Exception as exc:
            handle._error = handle._error or _single(exc)
        finally:
            handle._finished.set()

    async def execute(self) -> None:
        """Open the sink, run every conversation to be run with the plugins' run hooks
        around them, then finish the run, also when it is cancelled."""
        todo = await self.open()
        try:
            async with anyio.create_task_group() as hooks:
                if self._hooked:
                    await hooks.start(self.plugins.turn_worker)
                    await self.plugins.run_start(self.manifest)
                try:
                    await self.dispatch(todo)
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.plugins.close_turns()  # the turn worker drains, then ends
        finally:
            await self.finish()

    async def open(self) -> list[Conversation]:
        """Open the sink; the conversations this run will attempt: the pack's, less those
        the results file already holds (resume), then ``only`` and ``limit``."""
        plan, handle = self.plan, self.handle
        done = await plan.sink.open(self.manifest) if plan.sink is not None else set()
        config, context = self.context.config, self.context
        if config.max_cost is not None:
            handle._cost = CostMeter(
                config.max_cost,
                estimator_for(
                    config, plan.metrics, plan.turn_metrics, context.model, context.user_model
                ),
            )
        todo = [
            c
            for c in handle.pack.conversations
            if c.conversation_id not in done
            and (plan.only is None or c.conversation_id in plan.only)
        ]
        if plan.limit is not None:
            todo = todo[: plan.limit]
        counters = handle._counters
        counters.total, counters.resumed = len(todo), len(done)
        handle._stopping.on_stop.append(self.plugins.stop)  # a stop cuts the hooks short too
        log.info(
            "run_started",
            run_id=handle.run_id,
            pack=handle.pack.name,
            model=self.context.model_name,
            conversations=len(todo),
            resumed=len(done),
            concurrency=self.context.config.concurrency,
        )
        return todo

    async def dispatch(self, todo: list[Conversation]) -> None:
        """Admit the conversations of ``todo`` in order and wait until every admitted one
        has ended. Cancelling this call stops the run gracefully rather than at once:
        in-flight conversations get the grace period, and each is still recorded."""
        stopping = self.handle._stopping
        async with anyio.create_task_group() as outer:
            outer.start_soon(self.watch_for_cancel)
            if self.context.config.max_loop_lag is not None:
                outer.start_soon(self.loop.run)
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as conversations:
                    with stopping.dispatch:
                        for conv in todo:
                            await self.admit(conv, conversations)
            stopping.finished = True
            outer.cancel_scope.cancel()

    async def admit(self, conv: Conversation, conversations: anyio.abc.TaskGroup) -> None:
        """Start ``conv`` in ``conversations`` once the simulator has a free slot and the
        event loop keeps time; :meth:`conversation` gives the slot back."""
        counters = self.handle._counters
        max_lag = self.context.config.max_loop_lag
        await self.context.slots.acquire()
        try:
            # a loop that runs late would add its lag to every timing it takes: start
            # no more until it has caught up
            if max_lag is not None and await self.loop.calm(max_lag):
                counters.admission_held += 1
            elif counters.started % _ADMISSION_BATCH == 0:
                await anyio.lowlevel.checkpoint()  # let the loop run
        except BaseException:  # stopped before it started: the slot is the simulator's
            self.context.slots.release()
            raise
        cost = self.handle._cost
        if cost is not None and not cost.admit(conv):
            # the cap could be passed: start no more (they stay unrecorded, for --resume)
            self.context.slots.release()
            log.info("run_stopped_early", reason="max_cost", detail=cost.stopped)
            self.handle._stopping.begin()
            return
        counters.started += 1
        self.handle._alive.change(+1)
        conversations.start_soon(self.conversation, conv)

    async def conversation(self, conv: Conversation) -> None:
        """One admitted conversation: the plugins' hooks around :meth:`converse`, then
        :meth:`record`. Its slot is given back however it ends."""
        cid = conv.conversation_id
        try:
            with structlog.contextvars.bound_contextvars(conversation_id=cid):
                if self._hooked:
                    await self.plugins.conversation_start(cid, conv.scenario.scenario_id)
                result = await self.converse(conv)
                if self._hooked:
                    result = await self.plugins.conversation_end(result)
            await self.record(result)
        finally:
            self.handle._alive.change(-1)
            self.context.slots.release()

    async def converse(self, conv: Conversation) -> ConversationResult:
        """Run ``conv`` to its result, inside a cancel scope the run's stop can reach:
        a stop's deadline ends it CANCELLED, with every turn it had."""
        stopping = self.handle._stopping
        actor = ConversationActor(
            conv,
            model=self.context.model,
            settings=self.settings,
            metrics=self.plan.metrics[conv.flow.scenario_type],
            turn_metrics=self.plan.turn_metrics,
            user_model=self.context.user_model,
        )
        with anyio.CancelScope() as scope:
            stopping.inflight[conv.conversation_id] = scope
            if stopping.deadline is not None:
                scope.deadline = stopping.deadline
            try:
                await actor.run()
            finally:
                stopping.inflight.pop(conv.conversation_id, None)
        assert actor.result is not None  # run() leaves one however it ends
        if actor.result.status is Status.TIMED_OUT:
            self.handle._counters.timeouts_s.add(actor.timeout)
        return actor.result

    async def record(self, result: ConversationResult) -> None:
        """Record one finished conversation, once: count it, write it to the sink, show
        it to the circuit breaker, and send it to the handle's reader.

        A sink that fails to write ends the recording: the run stops (in-flight
        conversations get the grace period and still reach the reader), the sink is
        written no more, and the error is raised at the end of the iteration. A
        tripped breaker stops the run too.
        """
        handle, stopping = self.handle, self.handle._stopping
        counters = handle._counters
        counters.by_status[result.status] += 1
        for turn in result.turns:
            if turn.status is TurnStatus.COMPLETED:
                counters.turns += 1
                if turn.timings is not None and (
                    counters.slowest_turn_s is None
                    or turn.timings.duration_s > counters.slowest_turn_s
                ):
                    counters.slowest_turn_s = turn.timings.duration_s
            counters.clipped_turns += turn.max_tokens_clipped_from is not None
        if is_infrastructure_failure(result):
            counters.infrastructure_failures += 1
        if handle._cost is not None:
            handle._cost.record(result)
        sink = self.plan.sink
        if sink is not None and handle._error is None:
            try:
                await sink.write(result)
            except Exception as exc:
                handle._error = exc
                stopping.begin()
        if self.breaker.record(result):
            # the endpoint looks gone: start no more (they stay unrecorded)
            handle._stopped_early = self.breaker.reason
            log.info("run_stopped_early", reason=self.breaker.reason)
            stopping.begin()
        # nobody reading any more is fine: the sink has the result
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            handle._send.send_nowait(result)

    async def watch_for_cancel(self) -> None:
        """Wait to be cancelled; a cancellation that is not the run's own end becomes
        the run's stop (the grace period, then in-flight conversations end CANCELLED)."""
        stopping = self.handle._stopping
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            if not stopping.finished:  # not the run's own end
                stopping.begin()
            raise

    async def finish(self) -> None:
        """End the run: the plugins' run-end hooks, the manifest's end and statistics,
        the sink closed (each bounded and shielded, so a cancelled run still finalises
        its results), and one summary log line."""
        handle = self.handle
        stats = handle.statistics()
        if self._hooked:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self.plugins.run_end(stats)
        manifest = self.manifest
        manifest.finished_at = time.time()
        manifest.statistics = stats.as_dict()
        manifest.stopped = stats.stopped
        if self.plan.sink is not None:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self.plan.sink.close(manifest)
        log.info(
            "run_finished",
            run_id=handle.run_id,
            done=stats.done,
            failed=stats.failed,
            timed_out=stats.timed_out,
            cancelled=stats.cancelled,
            not_started=stats.total - stats.started,
            elapsed_s=round(stats.elapsed_s, 3),
        )


def _single(exc: Exception) -> Exception:
    """The one error inside nested exception groups, if there is exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
