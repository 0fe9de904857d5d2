"""The runtime: many conversations at once, inside the caller's event loop."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.abc
import sniffio

from convsim.adapters import ADAPTERS, Budgets, ModelAdapter, ModelPool, ResponseCache
from convsim.metrics import DEFAULT_METRICS, METRICS, JudgeSettings, Metric, judged
from convsim.scenarios import Pack

from .._errors import ConfigError, RegistryError
from .._log import get_logger
from .._records import ConversationResult
from .._registry import Registry
from .._telemetry import Telemetry
from ..plugins import PLUGINS, BasePlugin, PluginManager
from ..results._sinks import JsonlSink, ResultSink, RunManifest
from ._config import ModelChoice, ModelRef, SimulatorConfig
from ._descriptors import DESCRIPTOR_HEADROOM, ensure_descriptors
from ._estimate import RunEstimate, estimator_for
from ._handle import RunHandle
from ._packs import load_pack
from ._run import CLOSE_TIMEOUT_S, Run, RunContext, RunPlan

__all__ = ["Simulator", "run_sync"]

log = get_logger("convsim.runtime")


class _BoundModel(NamedTuple):
    """A model of the simulator: its adapter, and the name results record."""

    adapter: ModelAdapter
    name: str


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
        judge_sees_reasoning: show the judge a reasoning model's reasoning before each
            answer, marked (by default it sees the answers only).
        concurrency: at most this many conversations run at once, across every run of
            this simulator.
        metrics: conversation metrics to score (default: latency, response_length,
            context_retention, goal_achievement); the pack's own metrics are added.
        seed: the run seed; each conversation derives its own from it.
        conversation_timeout: overrides every flow's conversation_timeout (seconds); a
            conversation that passes it ends TIMED_OUT (``conversation_timeout``), which
            is not counted as an infrastructure failure.
        max_turns: overrides every flow's max_turns.
        max_tokens: caps every model call of a turn: a pack's larger per-turn
            max_tokens is clipped to it, a smaller one kept; a ``max_tokens`` model
            argument caps its own model the same way (the smaller cap wins). The
            manifest records the caps; each clipped turn records the pack's value.
        max_cost: USD the run may spend (model, simulated user and judge calls): no
            conversation starts that could take it past the cap (counting the ones in
            flight); the run then stops as :meth:`RunHandle.stop` does, and the
            manifest records ``stopped: max_cost``. Every model needs a price.
        grace_period: seconds in-flight conversations get to finish after a stop.
        preflight: check each model endpoint with one cheap call when the ``async
            with`` block starts (default on); EndpointError says what to fix.
        circuit_breaker: start no more conversations after this many in a row failed
            for infrastructure reasons (default 20; 0: never).
        cache: a :class:`~convsim.adapters.ResponseCache` or its folder (True: the
            default folder): calls made before are answered from it, without a call.
        metric_registry: where metric names are looked up (default: convsim's).
        adapter_registry: where model specs are looked up (default: convsim's).
        tracing: trace every conversation with OpenTelemetry (the extra ``otel``):
            ``True`` sends spans and metrics to the application's global providers; an
            :class:`~convsim.OpenTelemetry` (or any other telemetry) sends them where it
            says. Off by default, and then it costs nothing.

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
        tracing: bool | Telemetry = False,
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
        self._models = ModelPool(
            budgets=budgets,
            concurrency=config.concurrency,
            registry=adapter_registry,
            cache=config.cache,
        )
        """Builds the models given by reference (one adapter per distinct reference,
        pools sized for the concurrency) and closes them; a caller's adapter is only
        given the budgets. Nothing has connected before ``async with``: a failure here
        leaves nothing to close."""
        self.budgets = self._models.budgets
        """Rate budgets by provider key, shared by this simulator's adapters."""
        self.model, self.model_name = self._adapter(config.model, "model under test")
        self.user_model: ModelAdapter | None = None
        self.user_model_name: str | None = None
        if config.user_model is not None:
            self.user_model, self.user_model_name = self._adapter(
                config.user_model, "simulated user"
            )
        self.judge: JudgeSettings | None = None
        self.judge_name: str | None = None
        if config.judge is not None:
            adapter, self.judge_name = self._adapter(config.judge.model, "judge")
            self.judge = JudgeSettings(
                adapter,
                samples=config.judge.samples,
                combine=config.judge.combine,
                sees_reasoning=config.judge.sees_reasoning,
            )
        self.metric_names = tuple(DEFAULT_METRICS if config.metrics is None else config.metrics)
        self.metric_registry = metric_registry
        for name in self.metric_names:
            metric_registry.get(name)  # unknown names fail now, not mid-run
        self._tg: anyio.abc.TaskGroup | None = None
        self._handles: list[RunHandle] = []
        self.telemetry = _telemetry(tracing)
        """Where this simulator's runs are traced; None when tracing is off."""

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
    def max_tokens(self) -> int | None:
        """The cap on the model under test's calls (see :meth:`SimulatorConfig.token_cap`)."""
        return self.config.token_cap("assistant")

    @property
    def model_args(self) -> dict[str, Any]:
        """The model's adapter arguments (empty when it was given as an instance)."""
        model = self.config.model
        return dict(model.args) if isinstance(model, ModelRef) else {}

    @property
    def user_model_args(self) -> dict[str, Any]:
        model = self.config.user_model
        return dict(model.args) if isinstance(model, ModelRef) else {}

    def _adapter(self, choice: ModelChoice, role: str) -> _BoundModel:
        """The adapter for a model reference (built by the pool, which owns it) or an
        instance (the caller's), sharing this simulator's budgets."""
        adapter = self._models.get(choice, role=role)
        if isinstance(choice, ModelRef):
            return _BoundModel(adapter, choice.spec)
        return _BoundModel(adapter, adapter.model_info().model_id)

    async def preflight(self) -> None:
        """Check each distinct model endpoint (model under test, simulated user, judge)
        with one cheap call, before any conversation; ``async with`` does it unless
        the config's ``preflight`` is off.

        Raises:
            EndpointError: naming the role and what to fix (server down, key refused,
                wrong base_url).
        """
        await self._models.preflight()

    async def __aenter__(self) -> Simulator:
        connections = self._models.connections_needed()
        if connections:
            ensure_descriptors(connections + DESCRIPTOR_HEADROOM, concurrency=self.concurrency)
        if self.config.preflight:
            try:
                await self.preflight()
            except BaseException:
                with contextlib.suppress(Exception):  # the check's error is the one to see
                    await self._models.aclose()  # shielded and bounded; failures logged
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
            try:
                await self._models.aclose()  # shielded and bounded
            finally:
                if self.config.cache is not None:
                    self.config.cache.close()  # reopened on its next use
                with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
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
        if self.config.max_cost is not None:
            self._check_priced(plan, limit, only)
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
                "max_tokens": self.config.token_cap("assistant"),
                "user_max_tokens": self.config.token_cap("user"),
                "model_args": _redacted(self.config.model),
                "judge": self.judge_name,
                "judge_args": _redacted(judge.model if judge else None),
                "judge_samples": judge.samples if judge else None,
                "judge_combine": judge.combine if judge else None,
                "judge_sees_reasoning": judge.sees_reasoning if judge else None,
                "user_model_args": _redacted(self.config.user_model),
                "limit": limit,
                "grace_period": self.grace_period,
                "circuit_breaker": self.config.circuit_breaker,
                **_cache_settings(self.config.cache),
                "max_cost": self.config.max_cost,
                "allow_code": self.config.allow_code,
            },
        )
        context = RunContext(
            config=self.config,
            model=self.model,
            model_name=self.model_name,
            user_model=self.user_model,
            slots=self._slots,
            plugins=self.plugins,
            telemetry=self.telemetry,
        )
        self._tg.start_soon(Run(handle, plan, context).produce)
        self._handles.append(handle)
        return handle

    def check(self, pack: Pack | str | Path) -> Pack:
        """Check that ``pack`` can run on this simulator, without running it.

        Returns the loaded pack. Raises ConfigError or PackError as :meth:`run` would.
        """
        plan = self._plan(pack, None, None, None)
        if self.config.max_cost is not None:
            self._check_priced(plan, None, None)
        return plan.pack

    def estimate(
        self,
        pack: Pack | str | Path,
        *,
        limit: int | None = None,
        only: Collection[str] | None = None,
    ) -> RunEstimate:
        """What a run of ``pack`` would take, without calling a model: conversations,
        turns, calls by role (model, user, judge), prompt tokens and the cost range
        (see :mod:`convsim._runtime._estimate`). Raises as :meth:`run` would."""
        plan = self._plan(pack, None, limit, only)
        todo = [c for c in plan.pack.conversations if only is None or c.conversation_id in only]
        if limit is not None:
            todo = todo[:limit]
        return estimator_for(
            self.config,
            plan.metrics,
            plan.turn_metrics,
            self.model,
            self.user_model,
            self.model_name,
            self.user_model_name,
        ).run(todo)

    def _check_priced(self, plan: RunPlan, limit: int | None, only: Collection[str] | None) -> None:
        """A cost cap needs a price for every model the run calls."""
        unpriced = self.estimate(plan.pack, limit=limit, only=only).unpriced
        if unpriced:
            raise ConfigError(
                f"max_cost needs a price for every model; none for {', '.join(unpriced)}: "
                "give input_price=... output_price=... (USD per million tokens) in its "
                "arguments, or a price file (pricing_file=PATH, CONVSIM_PRICING_FILE)"
            )

    def _plan(
        self,
        pack: Pack | str | Path,
        sink: ResultSink | None,
        limit: int | None,
        only: Collection[str] | None,
    ) -> RunPlan:
        if limit is not None and limit < 0:
            raise ConfigError(f"limit must be >= 0, not {limit!r}")
        if not isinstance(pack, Pack):
            pack = load_pack(
                pack,
                metric_names=self.metric_registry,
                allow_code=self.config.allow_code,
                seed=self.seed,
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
        return RunPlan(pack, sink, limit, only, metric_names, metrics, turn_metrics)

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
                        adapter.check_config(settings)
                    except ConfigError as exc:
                        raise ConfigError(
                            f"pack {pack.name!r}, flow {conv.flow.scenario_type!r}, turn "
                            f"{turn.turn_id!r}: {exc}"
                        ) from None


def _redacted(choice: ModelChoice | None) -> dict[str, str]:
    """A model's adapter arguments fit for a manifest: secrets replaced, values as text
    (an adapter instance has none to record)."""
    return choice.redacted_args() if isinstance(choice, ModelRef) else {}


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
        sniffio.current_async_library()  # asyncio's or trio's loop alike
    except sniffio.AsyncLibraryNotFoundError:
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


def _cache_settings(cache: ResponseCache | None) -> dict[str, Any]:
    """The response cache as the manifest records it (only when there is one)."""
    if cache is None:
        return {}
    return {"cache": str(cache.directory), "cache_expiry": cache.expiry}


def _telemetry(tracing: bool | Telemetry) -> Telemetry | None:
    """The telemetry ``tracing`` asks for: none, OpenTelemetry on the application's
    global providers, or the one given.

    Raises:
        MissingExtra: ``tracing=True`` without OpenTelemetry installed.
    """
    if tracing is False:
        return None
    if tracing is True:
        from .._otel import OpenTelemetry

        return OpenTelemetry()
    return tracing
