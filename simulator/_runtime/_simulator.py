"""The runtime: many conversations at once, inside the caller's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.abc
import anyio.lowlevel
import structlog

from convsim.adapters import ADAPTERS, Budgets, ModelAdapter, create_adapter
from convsim.metrics import DEFAULT_METRICS, METRICS, JudgeSettings, Metric, judged
from convsim.scenarios import Conversation, Pack

from .._errors import ConfigError, EndpointError, RegistryError
from .._gauges import InFlight, LoopMonitor
from .._log import get_logger
from .._records import ConversationResult, Status, TurnStatus
from .._registry import Registry
from ..plugins import PLUGINS, BasePlugin, PluginManager
from ..results._sinks import JsonlSink, ResultSink, RunManifest
from ._actor import ActorSettings, ConversationActor
from ._breaker import CircuitBreaker, is_infrastructure_failure
from ._call_settings import CallSettings
from ._config import ModelChoice, ModelRef, SimulatorConfig
from ._descriptors import DESCRIPTOR_HEADROOM, ensure_descriptors
from ._packs import load_pack
from ._result_stream import ResultStream

__all__ = ["Simulator", "RunHandle", "RunStatistics", "run_sync"]

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

log = get_logger("convsim.runtime")

_ADMISSION_BATCH = 100
"""Conversations started in one pass of the event loop at most: a pass that starts
thousands at once would run late by all their first steps before any lag shows."""

CLOSE_TIMEOUT_S = 30.0
"""The longest a cancelled run waits for its sink or adapters to close."""


@dataclass(frozen=True)
class RunStatistics:
    """A snapshot of one run's progress."""

    run_id: str
    total: int
    """Conversations this run will attempt (after --limit and resume)."""
    resumed: int
    """Conversations skipped because the results file already holds them."""
    started: int
    in_flight: int
    done: int
    failed: int
    timed_out: int
    cancelled: int
    turns: int
    """Turns completed by the model under test."""
    retrying: int
    """Model calls waiting to retry after a failed attempt (all of the simulator's)."""
    elapsed_s: float
    infrastructure_failures: int = 0
    """Conversations of this run that failed for infrastructure reasons: FAILED with
    ``infrastructure_error``, or TIMED_OUT."""
    stopped_early: str | None = None
    """Why the circuit breaker stopped the run before its last conversation (the
    endpoint looked gone); None when it did not."""
    mean_in_flight: float = 0.0
    """Conversations alive at once, averaged over the run's time so far."""
    max_in_flight: int = 0
    """The most conversations alive at once."""
    admission_held: int = 0
    """Conversations whose start waited for the event loop to catch up (its lag above
    ``max_loop_lag``): the run was as busy as this process could time accurately."""

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.timed_out + self.cancelled

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "finished": self.finished}


@dataclass
class _Counters:
    total: int = 0
    resumed: int = 0
    started: int = 0
    turns: int = 0
    infrastructure_failures: int = 0
    admission_held: int = 0
    by_status: dict[Status, int] = field(default_factory=lambda: dict.fromkeys(Status, 0))


@dataclass
class _Stopping:
    """Shared by the tasks of one run: lets a cancellation become a graceful stop."""

    grace_period: float
    inflight: dict[str, anyio.CancelScope] = field(default_factory=dict)
    dispatch: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    deadline: float | None = None
    finished: bool = False
    on_stop: list[Callable[[float], None]] = field(default_factory=list)
    """Told each stop's deadline, also once every conversation has ended: plugin hooks
    may still be running then."""

    def begin(self, grace_period: float | None = None) -> None:
        """Start no more conversations; cancel in-flight ones after the grace period.

        Calling it again with a shorter grace period brings the deadline forward.
        """
        grace = self.grace_period if grace_period is None else grace_period
        deadline = anyio.current_time() + grace
        for notify in self.on_stop:
            notify(deadline)
        if self.finished:
            return
        if self.deadline is not None and self.deadline <= deadline:
            return
        self.deadline = deadline
        self.dispatch.cancel()
        for scope in self.inflight.values():
            scope.deadline = min(scope.deadline, deadline)


@dataclass(frozen=True)
class _RunPlan:
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


class _BoundModel(NamedTuple):
    """A model of the simulator: its adapter, and the name results record."""

    adapter: ModelAdapter
    name: str


class RunHandle(ResultStream):
    """One run: iterate it for results as conversations finish.

    Returned by :meth:`Simulator.run`; the work starts on creation and goes on in the
    simulator's task group whether or not you iterate.
    """

    def __init__(self, run_id: str, pack: Pack, grace_period: float, budgets: Budgets) -> None:
        super().__init__()
        self.run_id = run_id
        self.pack = pack
        self._counters = _Counters()
        self._started = time.perf_counter()
        self._alive = InFlight(time.perf_counter)
        self._stopping = _Stopping(grace_period)
        self._budgets = budgets
        self._stopped_early: str | None = None
        self.manifest: RunManifest | None = None

    async def wait(self) -> None:
        """Wait until the run has ended. Results not yet read stay available until the
        simulator's ``async with`` block ends."""
        await self._finished.wait()
        if self._error is not None:
            raise self._error

    def stop(self, grace_period: float | None = None) -> None:
        """Start no more conversations; in-flight ones get the grace period.

        Args:
            grace_period: seconds in-flight conversations may still take (default: the
                simulator's); a second call with 0 cancels them at once.
        """
        self._stopping.begin(grace_period)

    def statistics(self) -> RunStatistics:
        c = self._counters
        by = c.by_status
        finished = sum(by.values())
        return RunStatistics(
            run_id=self.run_id,
            total=c.total,
            resumed=c.resumed,
            started=c.started,
            in_flight=c.started - finished,
            done=by[Status.DONE],
            failed=by[Status.FAILED],
            timed_out=by[Status.TIMED_OUT],
            cancelled=by[Status.CANCELLED],
            turns=c.turns,
            retrying=sum(b.retrying for b in self._budgets.statistics()),
            elapsed_s=time.perf_counter() - self._started,
            infrastructure_failures=c.infrastructure_failures,
            stopped_early=self._stopped_early,
            mean_in_flight=self._alive.mean(),
            max_in_flight=self._alive.peak,
            admission_held=c.admission_held,
        )


class Simulator:
    """Runs scenario packs against a model, many conversations at once.

    Use it inside any running event loop (asyncio or trio, through anyio)::

        async with Simulator(model="scripted", concurrency=64) as sim:
            async for result in sim.run("customer_support"):
                print(result.conversation_id, result.status)

    Several runs may go on at once, on one simulator or several. Leaving the ``async
    with`` block stops unfinished runs: in-flight conversations get ``grace_period``
    seconds to finish, the rest are recorded CANCELLED, and every finished result is
    written.

    A simulator is built from a :class:`~convsim.SimulatorConfig`, given directly
    (``Simulator(config)``) or built from the keyword arguments below.

    Args:
        model: an adapter, a model spec such as ``"scripted"``, or a SimulatorConfig.
        model_args: adapter arguments when ``model`` is a spec (``--model-arg``).
        user_model: the simulated user's adapter or spec, for turns with role ``user``.
        user_model_args: adapter arguments when ``user_model`` is a spec.
        judge: the adapter or spec that grades judge metrics (rubrics, ``judge:<rubric>``).
        judge_args: adapter arguments when ``judge`` is a spec.
        judge_samples: grades per turn.
        judge_combine: how several grades of a turn combine: ``mean`` or ``majority``.
        concurrency: at most this many conversations run at once, across every run of
            this simulator.
        metrics: conversation metrics to score (default: latency, response_length,
            context_retention, goal_achievement); the pack's own metrics are added.
        seed: the run seed; each conversation derives its own from it.
        conversation_timeout: overrides every flow's conversation_timeout (seconds).
        max_turns: overrides every flow's max_turns.
        grace_period: seconds in-flight conversations get to finish after a stop.
        preflight: check each model endpoint with one cheap call when the ``async
            with`` block starts (default on); EndpointError says what to fix.
        circuit_breaker: start no more conversations after this many in a row failed
            for infrastructure reasons (default 20; 0: never).
        metric_registry: where metric names are looked up (default: convsim's).
        adapter_registry: where model specs are looked up (default: convsim's).

    Raises:
        ConfigError: a setting is invalid, or a model or metric name is unknown.
    """

    def __init__(
        self,
        model: SimulatorConfig | ModelAdapter | str = "scripted",
        *,
        metric_registry: Registry[Metric] = METRICS,
        adapter_registry: Registry[ModelAdapter] = ADAPTERS,
        plugin_registry: Registry[BasePlugin] = PLUGINS,
        budgets: Budgets | None = None,
        **settings: Any,
    ) -> None:
        if isinstance(model, SimulatorConfig):
            if settings:
                raise ConfigError(
                    f"Simulator(config) takes no other settings ({', '.join(sorted(settings))}); "
                    "put them in the SimulatorConfig"
                )
            config = model
        else:
            config = SimulatorConfig.from_arguments(model, **settings)
        self.config = config
        self.plugins = PluginManager.load(
            config.plugins, config.plugin_config, registry=plugin_registry
        )
        """The plugins of every run of this simulator, configured."""
        self.budgets = budgets if budgets is not None else Budgets()
        """Rate budgets by provider key, shared by this simulator's adapters."""
        self._owned: list[ModelAdapter] = []
        self._registry = adapter_registry
        try:
            self.model, self.model_name = self._adapter(config.model)
            self.user_model: ModelAdapter | None = None
            self.user_model_name: str | None = None
            if config.user_model is not None:
                self.user_model, self.user_model_name = self._adapter(config.user_model)
            self.judge: JudgeSettings | None = None
            self.judge_name: str | None = None
            if config.judge is not None:
                adapter, self.judge_name = self._adapter(config.judge.model)
                self.judge = JudgeSettings(
                    adapter, samples=config.judge.samples, combine=config.judge.combine
                )
            self.metric_names = tuple(DEFAULT_METRICS if config.metrics is None else config.metrics)
            self.metric_registry = metric_registry
            for name in self.metric_names:
                metric_registry.get(name)  # unknown names fail now, not mid-run
        except BaseException:
            self._owned.clear()  # nothing has connected yet: nothing to close
            raise
        self._tg: anyio.abc.TaskGroup | None = None
        self._handles: list[RunHandle] = []

    @property
    def concurrency(self) -> int:
        return self.config.concurrency

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def grace_period(self) -> float:
        return self.config.grace_period

    @property
    def conversation_timeout(self) -> float | None:
        return self.config.conversation_timeout

    @property
    def max_turns(self) -> int | None:
        return self.config.max_turns

    @property
    def model_args(self) -> dict[str, Any]:
        """The model's adapter arguments (empty when it was given as an instance)."""
        model = self.config.model
        return dict(model.args) if isinstance(model, ModelRef) else {}

    @property
    def user_model_args(self) -> dict[str, Any]:
        model = self.config.user_model
        return dict(model.args) if isinstance(model, ModelRef) else {}

    def _adapter(self, choice: ModelChoice) -> _BoundModel:
        """The adapter for a model reference (built here, owned) or instance (the
        caller's), bound to this simulator's budgets."""
        if isinstance(choice, ModelRef):
            adapter = create_adapter(choice.spec, choice.args, registry=self._registry)
            if not isinstance(adapter, ModelAdapter):
                raise ConfigError(
                    f"{choice.spec}: the registered factory made a {type(adapter).__name__}, "
                    "not a convsim.adapters.ModelAdapter"
                )
            self._owned.append(adapter)
            # adapters with the same connection key share one budget; the pool of an
            # adapter built here fits the run
            adapter.bind_budgets(self.budgets, concurrency=self.config.concurrency)
            return _BoundModel(adapter, choice.spec)
        # the caller's adapter keeps its own pool and cap (it may serve other simulators)
        choice.bind_budgets(self.budgets)
        return _BoundModel(choice, choice.model_info().model_id)

    def _endpoints(self) -> list[tuple[str, ModelAdapter]]:
        """The models of this simulator, each with the role it plays."""
        roles: list[tuple[str, ModelAdapter | None]] = [
            ("model under test", self.model),
            ("simulated user", self.user_model),
            ("judge", self.judge.adapter if self.judge is not None else None),
        ]
        return [(role, adapter) for role, adapter in roles if adapter is not None]

    async def preflight(self) -> None:
        """Check each distinct model endpoint (model under test, simulated user, judge)
        with one cheap call, before any conversation; ``async with`` does it unless
        the config's ``preflight`` is off.

        Raises:
            EndpointError: naming the role and what to fix (server down, key refused,
                wrong base_url).
        """
        checked: list[ModelAdapter] = []
        keys: set[str] = set()
        for role, adapter in self._endpoints():
            key = adapter.connection_key()
            if any(adapter is seen for seen in checked) or (key is not None and key in keys):
                continue  # one check per endpoint
            checked.append(adapter)
            if key is not None:
                keys.add(key)
            try:
                await adapter.preflight()
            except EndpointError as exc:
                raise EndpointError(
                    f"{role}: {exc}", url=exc.url, status_code=exc.status_code
                ) from exc
            log.debug("endpoint_checked", role=role, model=adapter.model_info().model_id)

    def _connections_needed(self) -> int:
        """Connections the simulator may hold at once: one per call in flight to each
        model that talks to a server (one with a connection key), capped by its own
        concurrency."""
        needed = 0
        seen: list[ModelAdapter] = []
        for _, adapter in self._endpoints():
            if any(adapter is other for other in seen) or adapter.connection_key() is None:
                continue
            seen.append(adapter)
            cap = adapter.rate_limits().concurrency
            needed += self.concurrency if cap is None else min(cap, self.concurrency)
        return needed

    async def __aenter__(self) -> Simulator:
        connections = self._connections_needed()
        if connections:
            ensure_descriptors(connections + DESCRIPTOR_HEADROOM, concurrency=self.concurrency)
        if self.config.preflight:
            try:
                await self.preflight()
            except BaseException:
                with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                    for adapter in self._owned:
                        await adapter.aclose()
                raise
        # one cap for every run of this simulator: concurrent runs share it. A free slot
        # is taken without a pass through the event loop, so a run reaches its
        # concurrency at once rather than one conversation per loop pass
        self._slots = anyio.Semaphore(self.concurrency, fast_acquire=True)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            # The body's own exception is not handed to the task group, so it reaches
            # the caller as itself rather than wrapped in an ExceptionGroup. Run tasks
            # never raise (their errors go to their RunHandle), so nothing else is lost.
            await self._tg.__aexit__(None, None, None)
        finally:
            self._tg = None
            for handle in self._handles:
                handle.close()
            self._handles.clear()
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                for adapter in self._owned:
                    await adapter.aclose()
                await self.plugins.cleanup()

    def run(
        self,
        pack: Pack | str | Path,
        *,
        sink: ResultSink | None = None,
        limit: int | None = None,
        only: Collection[str] | None = None,
    ) -> RunHandle:
        """Start running ``pack``; iterate the handle for results as they finish.

        Args:
            pack: a loaded pack, a bundled pack's name, or a pack folder.
            sink: where results are written (e.g. :class:`JsonlSink`); its resume
                state decides which conversations are skipped.
            limit: run at most this many conversations (in file order).
            only: run only the conversations with these ids.

        Raises:
            ConfigError, PackError, RegistryError: before anything runs.
        """
        if self._tg is None:
            raise ConfigError("Simulator.run() needs 'async with Simulator(...) as sim:' first")
        plan = self._plan(pack, sink, limit, only)
        pack = plan.pack
        handle = RunHandle(uuid.uuid4().hex[:12], pack, self.grace_period, self.budgets)
        judge = self.config.judge
        handle.manifest = RunManifest(
            run_id=handle.run_id,
            pack=pack.name,
            pack_path=str(pack.path),
            pack_hash=pack.pack_hash,
            pack_options=dict(pack.load_options),
            model=self.model_name,
            user_model=self.user_model_name,
            started_at=time.time(),
            plugins=self.plugins.manifest(),
            settings={
                "concurrency": self.concurrency,
                "seed": self.seed,
                "metrics": plan.metric_names,
                "conversation_timeout": self.config.conversation_timeout,
                "max_turns": self.config.max_turns,
                "model_args": _redacted(self.config.model),
                "judge": self.judge_name,
                "judge_args": _redacted(judge.model if judge else None),
                "judge_samples": judge.samples if judge else None,
                "judge_combine": judge.combine if judge else None,
                "user_model_args": _redacted(self.config.user_model),
                "limit": limit,
                "grace_period": self.grace_period,
                "circuit_breaker": self.config.circuit_breaker,
            },
        )
        self._tg.start_soon(self._produce, handle, plan)
        self._handles.append(handle)
        return handle

    def check(self, pack: Pack | str | Path) -> Pack:
        """Check that ``pack`` can run on this simulator, without running it.

        Returns the loaded pack. Raises ConfigError or PackError as :meth:`run` would.
        """
        return self._plan(pack, None, None, None).pack

    def _plan(
        self,
        pack: Pack | str | Path,
        sink: ResultSink | None,
        limit: int | None,
        only: Collection[str] | None,
    ) -> _RunPlan:
        if limit is not None and limit < 0:
            raise ConfigError(f"limit must be >= 0, not {limit!r}")
        if not isinstance(pack, Pack):
            pack = load_pack(
                pack, metric_names=self.metric_registry, allow_code=self.config.allow_code
            )
        if isinstance(only, str):
            raise ConfigError("only= takes a collection of conversation ids, not one string")
        if only is not None:
            unknown = sorted(set(only) - {c.conversation_id for c in pack.conversations})
            if unknown:
                raise ConfigError(
                    f"pack {pack.name!r} has no conversations {', '.join(unknown[:5])}"
                )
        if pack.uses_user_role() and self.user_model is None:
            raise ConfigError(
                f"pack {pack.name!r} has turns with role 'user': they need a simulated "
                "user model (user_model=..., or --user-model SPEC)"
            )
        self._check_turn_settings(pack)
        # each flow scores the run's metrics, the pack's, and its own
        base = [*self.metric_names, *pack.metrics]
        names_by_flow = {
            conv.flow.scenario_type: list(dict.fromkeys([*base, *conv.flow.flow.metrics]))
            for conv in pack.conversations
        }
        metric_names = list(dict.fromkeys(n for names in names_by_flow.values() for n in names))
        try:
            instances = {n: judged(self.metric_registry.get(n)(), self.judge) for n in metric_names}
            turn_metrics = {
                n: judged(self.metric_registry.get(n)(), self.judge) for n in pack.metric_names()
            }
        except RegistryError as exc:
            raise ConfigError(f"pack {pack.name!r}: {exc}") from None
        metrics = {flow: [instances[n] for n in names] for flow, names in names_by_flow.items()}
        return _RunPlan(pack, sink, limit, only, metric_names, metrics, turn_metrics)

    def _check_turn_settings(self, pack: Pack) -> None:
        """Every turn's sampling settings, as the adapter that will answer it sees them."""
        seen: set[tuple[str, str]] = set()
        for conv in pack.conversations:
            for turn in conv.flow.turns:
                key = (conv.flow.scenario_type, turn.turn_id)
                if key in seen:
                    continue
                seen.add(key)
                settings = turn.config.config.model_dump(exclude_none=True)
                adapters = [self.model]
                if turn.config.role == "user" and self.user_model is not None:
                    adapters.append(self.user_model)
                for adapter in adapters:
                    try:
                        adapter.validate_config(settings)
                    except ConfigError as exc:
                        raise ConfigError(
                            f"pack {pack.name!r}, flow {conv.flow.scenario_type!r}, turn "
                            f"{turn.turn_id!r}: {exc}"
                        ) from None

    async def _produce(self, handle: RunHandle, plan: _RunPlan) -> None:
        try:
            async with handle._send:
                with structlog.contextvars.bound_contextvars(run_id=handle.run_id):
                    await self._execute(handle, plan)
        except Exception as exc:
            handle._error = handle._error or _single(exc)
        finally:
            handle._finished.set()

    async def _execute(self, handle: RunHandle, plan: _RunPlan) -> None:
        sink, limit, only = plan.sink, plan.limit, plan.only
        manifest = handle.manifest
        assert manifest is not None
        done = await sink.open(manifest) if sink is not None else set()
        todo = [
            c
            for c in handle.pack.conversations
            if c.conversation_id not in done and (only is None or c.conversation_id in only)
        ]
        if limit is not None:
            todo = todo[:limit]
        counters = handle._counters
        counters.total, counters.resumed = len(todo), len(done)
        stopping = handle._stopping
        plugins = self.plugins.start_run()
        stopping.on_stop.append(plugins.stop)  # a stop cuts the plugins' hooks short too
        settings = ActorSettings(
            run_id=handle.run_id,
            pack_name=handle.pack.name,
            pack_hash=handle.pack.pack_hash,
            model_name=self.model_name,
            assistant=CallSettings(self.model.default_config(), "assistant"),
            user=(
                CallSettings(self.user_model.default_config(), "user")
                if self.user_model is not None
                else None
            ),
            seed=self.seed,
            conversation_timeout=self.config.conversation_timeout,
            max_turns=self.config.max_turns,
            on_turn=plugins.turn if plugins.manager.plugins else None,
            max_transcript_chars=self.config.max_transcript_chars,
        )
        slots = self._slots
        alive = handle._alive
        loop = LoopMonitor()
        max_lag = self.config.max_loop_lag
        breaker = CircuitBreaker(self.config.circuit_breaker)
        log.info(
            "run_started",
            run_id=handle.run_id,
            pack=handle.pack.name,
            model=self.model_name,
            conversations=len(todo),
            resumed=len(done),
            concurrency=self.concurrency,
        )

        async def drive(conv: Conversation) -> None:
            cid = conv.conversation_id
            try:
                with structlog.contextvars.bound_contextvars(conversation_id=cid):
                    if plugins.manager.plugins:
                        await plugins.conversation_start(cid, conv.scenario.scenario_id)
                    result = await converse(conv)
                    if plugins.manager.plugins:
                        result = await plugins.conversation_end(result)
                counters.by_status[result.status] += 1
                counters.turns += sum(1 for t in result.turns if t.status is TurnStatus.COMPLETED)
                if is_infrastructure_failure(result):
                    counters.infrastructure_failures += 1
                if sink is not None and handle._error is None:
                    try:
                        await sink.write(result)
                    except Exception as exc:
                        # Nothing more can be recorded: stop the run (in-flight
                        # conversations get the grace period and still reach the
                        # caller) and raise this error from the iteration.
                        handle._error = exc
                        stopping.begin()
                if breaker.record(result):
                    # the endpoint looks gone: start no more (they stay unrecorded)
                    handle._stopped_early = breaker.reason
                    log.info("run_stopped_early", reason=breaker.reason)
                    stopping.begin()
                # nobody reading any more is fine: the sink has the result
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    handle._send.send_nowait(result)
            finally:
                alive.change(-1)
                slots.release()

        async def converse(conv: Conversation) -> ConversationResult:
            actor = ConversationActor(
                conv,
                model=self.model,
                settings=settings,
                metrics=plan.metrics[conv.flow.scenario_type],
                turn_metrics=plan.turn_metrics,
                user_model=self.user_model,
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
            return actor.result

        async def watch_for_cancel() -> None:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if not stopping.finished:  # not the run's own end
                    stopping.begin()
                raise

        try:
            async with anyio.create_task_group() as hooks:
                if plugins.manager.plugins:
                    await hooks.start(plugins.turn_worker)
                    await plugins.run_start(manifest)
                try:
                    async with anyio.create_task_group() as outer:
                        outer.start_soon(watch_for_cancel)
                        if max_lag is not None:
                            outer.start_soon(loop.run)
                        with anyio.CancelScope(shield=True):
                            async with anyio.create_task_group() as tg:
                                with stopping.dispatch:
                                    for conv in todo:
                                        await slots.acquire()
                                        # a loop that runs late would add its lag to every timing
                                        # it takes: start no more until it has caught up
                                        if max_lag is not None and await loop.calm(max_lag):
                                            counters.admission_held += 1
                                        elif counters.started % _ADMISSION_BATCH == 0:
                                            await anyio.lowlevel.checkpoint()  # let the loop run
                                        counters.started += 1
                                        alive.change(+1)
                                        tg.start_soon(drive, conv)
                        stopping.finished = True
                        outer.cancel_scope.cancel()

                finally:
                    with anyio.CancelScope(shield=True):
                        await plugins.close_turns()  # the turn worker drains, then ends
        finally:
            stats = handle.statistics()
            if plugins.manager.plugins:
                with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                    await plugins.run_end(stats)
            manifest.finished_at = time.time()
            manifest.statistics = stats.as_dict()
            if sink is not None:
                # shielded so a cancelled run still finalises its results, but bounded
                with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                    await sink.close(manifest)
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


def _redacted(choice: ModelChoice | None) -> dict[str, str]:
    """A model's adapter arguments fit for a manifest: secrets replaced, values as text
    (an adapter instance has none to record)."""
    return choice.redacted_args() if isinstance(choice, ModelRef) else {}


def _single(exc: Exception) -> Exception:
    """The one error inside nested exception groups, if there is exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def run_sync(
    pack: Pack | str | Path,
    model: ModelAdapter | str = "scripted",
    *,
    out: str | Path | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    limit: int | None = None,
    **simulator_args: Any,
) -> list[ConversationResult]:
    """Run a pack from synchronous code and return every result (with ``out``, those
    of this run; ``resume`` and ``retry_failed`` as for :class:`JsonlSink`).

    Refuses to run inside a running event loop: use ``async with Simulator(...)`` there.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ConfigError(
            "run_sync() was called inside a running event loop; "
            "use 'async with Simulator(...)' and 'async for ... in sim.run(...)'"
        )

    async def main() -> list[ConversationResult]:
        sink = JsonlSink(out, resume=resume, retry_failed=retry_failed) if out is not None else None
        async with Simulator(model, **simulator_args) as sim:
            handle = sim.run(pack, sink=sink, limit=limit)
            return [result async for result in handle]

    return anyio.run(main)
