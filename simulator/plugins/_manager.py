"""Finding, loading and calling plugins, each failure kept to its own plugin.

Plugins are found by name in a registry that reads the entry-point group
``convsim.plugins`` (``name = "package.module:PluginClass"``) on first use, beside the
bundled ``code_analysis``. Their settings are validated with each plugin's pydantic
``Config`` before anything runs (``hook_timeout`` is the manager's, taken out first).

Every hook call is isolated (``_calls``): a hook that raises anything, or overruns its
time limit, is logged and recorded (plugin, hook, error) and the run goes on; one that
overran is called no more, as it may still be stuck. Scores are checked before they
are written (``_scores``); a plugin whose ``score`` fails or returns scores that may
not be written gets a failed ``NAME:failed`` score instead. A plugin whose
``initialize`` raises is left out of the run, and that is recorded too, unless what it
raised is :class:`~convsim.MissingExtra`: the run does not start without the extra.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field

from convsim._errors import ConfigError, MissingExtra, parse_config
from convsim._log import get_logger
from convsim._records import ConversationResult, Score, TurnRecord
from convsim._registry import Registry

from ._base import BasePlugin
from ._calls import HookOutcome, RunStop, call_hook, hook_threads
from ._scores import checked_scores

__all__ = ["PLUGINS", "PluginManager", "PluginRun", "PluginFailure"]

log = get_logger("convsim.plugins")

PLUGINS: Registry[BasePlugin] = Registry("plugin", "convsim.plugins")
PLUGINS.register("code_analysis", "convsim.plugins._code_analysis:CodeAnalysisPlugin")

HOOK_TIMEOUT_SETTING = "hook_timeout"
"""The plugin setting the manager takes for itself: the plugin's hook time limit."""


class _HookSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hook_timeout: float = Field(gt=0, allow_inf_nan=False)
    """Seconds one hook call may take."""


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    hook: str
    error: str


@dataclass
class PluginManager:
    """The plugins of one simulator, loaded and configured, and how to call them."""

    plugins: list[BasePlugin] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    hook_timeouts: dict[str, float] = field(default_factory=dict)
    """Seconds one hook call may take, by plugin name (else the plugin's own)."""
    stalled: dict[str, str] = field(default_factory=dict)
    """Plugins called no more, by name: why (a hook overran its time limit)."""

    @classmethod
    def load(
        cls,
        names: Sequence[str],
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        registry: Registry[BasePlugin] = PLUGINS,
    ) -> PluginManager:
        """The named plugins with their settings validated.

        Raises:
            RegistryError: an unknown plugin name (listing the known ones).
            ConfigError: settings a plugin's ``Config`` refuses (or a bad
                ``hook_timeout``), or settings for a plugin that is not asked for.
            MissingExtra: a plugin's ``initialize`` found its extra not installed.
        """
        configs = dict(configs or {})
        unknown = sorted(set(configs) - set(names))
        if unknown:
            raise ConfigError(f"settings given for plugins not asked for: {', '.join(unknown)}")
        manager = cls()
        for name in dict.fromkeys(names):
            factory = registry.get(name)
            plugin = factory()
            settings = dict(configs.get(name, {}))
            if HOOK_TIMEOUT_SETTING in settings:
                limit = {HOOK_TIMEOUT_SETTING: settings.pop(HOOK_TIMEOUT_SETTING)}
                hook = parse_config(_HookSettings, limit, f"plugin {name}")
                manager.hook_timeouts[name] = hook.hook_timeout
            config = parse_config(plugin.Config, settings, f"plugin {name}")
            try:
                plugin.initialize(config)
            except MissingExtra:  # the install, not the run: stop before it starts
                raise
            except Exception as exc:
                manager.record_failure(name, "initialize", f"{type(exc).__name__}: {exc}")
                continue
            manager.plugins.append(plugin)
        return manager

    def load_plugin(
        self,
        name: str,
        config: Mapping[str, Any] | None = None,
        *,
        registry: Registry[BasePlugin] = PLUGINS,
    ) -> bool:
        """The guide's way: load one plugin by name; False (and recorded) if it cannot
        be found, configured or initialised."""
        try:
            loaded = PluginManager.load([name], {name: dict(config or {})}, registry=registry)
        except Exception as exc:
            self.record_failure(name, "load", f"{type(exc).__name__}: {exc}")
            return False
        self.failures.extend(loaded.failures)
        self.hook_timeouts.update(loaded.hook_timeouts)
        self.plugins.extend(p for p in loaded.plugins if self.get_plugin(p.name) is None)
        return self.get_plugin(name) is not None

    def get_plugin(self, name: str) -> BasePlugin | None:
        """A loaded plugin by name."""
        return next((p for p in self.plugins if p.name == name), None)

    def manifest(self) -> list[dict[str, str]]:
        """Which plugins ran, and their versions, for the run manifest."""
        return [{"name": p.name, "version": str(p.version)} for p in self.plugins]

    def hook_timeout(self, plugin: BasePlugin) -> float:
        return self.hook_timeouts.get(plugin.name, plugin.hook_timeout)

    def start_run(self) -> PluginRun:
        """The plugins' side of a run that starts now."""
        return PluginRun(self)

    async def cleanup(self) -> None:
        """Every plugin's ``cleanup``, a stalled one's too (it may free what is stuck)."""
        stop, threads = RunStop(), hook_threads()
        for plugin in self.plugins:
            await self.call(plugin, "cleanup", (), stop=stop, threads=threads, stalled_too=True)

    async def call(
        self,
        plugin: BasePlugin,
        hook: str,
        args: tuple[Any, ...],
        *,
        stop: RunStop,
        threads: anyio.CapacityLimiter,
        stalled_too: bool = False,
    ) -> HookOutcome:
        """One hook of one plugin, isolated; a failure is recorded before it is returned."""
        fn = getattr(plugin, hook)
        if getattr(type(plugin), hook, None) is getattr(BasePlugin, hook, None):
            return HookOutcome(called=False)  # not overridden: nothing to call
        why = self.stalled.get(plugin.name)
        if why is not None and not stalled_too:
            return HookOutcome(error=f"not called: {why}", called=False)
        limit = self.hook_timeout(plugin)
        name = f"convsim plugin {plugin.name}.{hook}"
        outcome = await call_hook(fn, args, limit=limit, stop=stop, threads=threads, name=name)
        if outcome.timed_out:
            self.stalled.setdefault(plugin.name, f"its {hook} hook timed out after {limit:g} s")
            self.record_failure(plugin.name, hook, f"{outcome.error}; the plugin is called no more")
        elif outcome.called and outcome.error is not None:
            self.record_failure(plugin.name, hook, outcome.error)
        return outcome

    def record_failure(self, plugin: str, hook: str, error: str) -> None:
        failure = PluginFailure(plugin, hook, error)
        self.failures.append(failure)
        log.warning("plugin_hook_failed", plugin=plugin, hook=hook, error=error)


class PluginRun:
    """The plugins' side of one run: its hook calls, the turn hooks' queue, and its
    stop (:meth:`stop`), which cuts the run's hook calls short."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager
        self._stop = RunStop()
        """Cuts the hooks of the run and its conversations at a stop's deadline."""
        self._stop_at_once = RunStop()
        """Cuts ``on_run_end`` only when the run is stopped at once: it is owed a call
        after a graceful stop."""
        self._threads = hook_threads()
        self._send: MemoryObjectSendStream[TurnRecord] | None = None

    def stop(self, deadline: float) -> None:
        """This run's hook calls end by ``deadline`` (``anyio.current_time()``), and
        later ones are not made; ``on_run_end`` too if the deadline is now."""
        self._stop.stop(deadline)
        if deadline <= anyio.current_time():
            self._stop_at_once.stop(deadline)

    async def _each(self, hook: str, *args: Any, stop: RunStop | None = None) -> None:
        for plugin in self.manager.plugins:
            await self.manager.call(
                plugin, hook, args, stop=stop or self._stop, threads=self._threads
            )

    async def run_start(self, manifest: Any) -> None:
        await self._each("on_run_start", manifest)

    async def run_end(self, statistics: Any) -> None:
        await self._each("on_run_end", statistics, stop=self._stop_at_once)

    async def conversation_start(self, conversation_id: str, scenario_id: str) -> None:
        await self._each("on_conversation_start", conversation_id, scenario_id)

    def turn(self, record: TurnRecord) -> None:
        """Hand a finished turn to the turn worker (never blocks the conversation)."""
        if self._send is not None:
            self._send.send_nowait(record)

    async def turn_worker(self, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Call every plugin's ``on_turn`` in turn order until the run closes the
        stream; started in the run's task group."""
        send, receive = anyio.create_memory_object_stream[TurnRecord](math.inf)
        self._send = send
        task_status.started()
        await self._drain(receive)

    async def _drain(self, receive: MemoryObjectReceiveStream[TurnRecord]) -> None:
        async with receive:
            async for record in receive:
                await self._each("on_turn", record)

    async def close_turns(self) -> None:
        if self._send is not None:
            await self._send.aclose()
            self._send = None

    async def conversation_end(self, result: ConversationResult) -> ConversationResult:
        """``result`` with every plugin's scores in it, checked; then the end hooks."""
        for plugin in self.manager.plugins:
            outcome = await self.manager.call(
                plugin, "score", (result,), stop=self._stop, threads=self._threads
            )
            error = outcome.error
            added = None
            if error is None:
                try:
                    added = checked_scores(outcome.value, plugin, result)
                except ValueError as exc:
                    error = f"scores not written: {exc}"
                    self.manager.record_failure(plugin.name, "score", error)
            if error is not None:
                failed = Score.failed(f"plugin {plugin.name} failed: {error}")
                result = result.model_copy(
                    update={"scores": {**result.scores, f"{plugin.name}:failed": failed}}
                )
            elif added is not None:
                turn_scores = {k: dict(v) for k, v in result.turn_scores.items()}
                for turn_id, scores in added.turn_scores.items():
                    turn_scores.setdefault(turn_id, {}).update(scores)
                result = result.model_copy(
                    update={"scores": {**result.scores, **added.scores}, "turn_scores": turn_scores}
                )
        await self._each("on_conversation_end", result)
        return result
