"""Finding, loading and calling plugins, each failure kept to its own plugin.

Plugins are found by name in a registry that reads the entry-point group
``convsim.plugins`` (``name = "package.module:PluginClass"``) on first use, beside the
bundled ``code_analysis``; an unknown name is a :class:`~convsim.RegistryError` listing
the known ones (also a ValueError, as the guide's ``load_plugin`` raises). Each manager
has its own copy of that registry: the guide's :meth:`PluginManager.register_plugin`
adds a class to it (and to :attr:`PluginManager.plugin_registry`, the guide's view of
it) without touching any other manager. Settings are checked before anything runs
(``_base.checked_settings``; ``hook_timeout`` is the manager's, taken out first).

A plugin is built with its settings when its class takes them (the guide's
``Plugin(config)``), else with none, and then initialised: ``initialize(config)``
(convsim's form) or ``initialize()`` (the guide's, for a plugin whose ``initialize``
takes no argument). One that raises, or returns False, is left out, and that is
recorded, unless what it raised is :class:`~convsim.MissingExtra`: the run does not
start without the extra.

Every hook call is isolated (``_calls``): a hook that raises anything, or overruns its
time limit, is logged and recorded (plugin, hook, error) and the run goes on; one that
overran is called no more, as it may still be stuck. Scores are checked before they
are written (``_scores``); a plugin whose ``score`` fails or returns scores that may
not be written gets a failed ``NAME:failed`` score instead.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field

from convsim._errors import ConfigError, MissingExtra, parse_config
from convsim._log import get_logger
from convsim._records import ConversationResult, Score, TurnRecord
from convsim._registry import Registry

from ._base import BasePlugin, checked_settings, guide_style
from ._calls import HookOutcome, RunStop, call_hook, hook_threads
from ._scores import checked_scores

__all__ = [
    "PLUGINS",
    "PluginManager",
    "PluginRun",
    "PluginFailure",
    "PluginRegistryView",
]

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


class PluginRegistryView(Mapping[str, Callable[..., BasePlugin]]):
    """The guide's ``plugin_registry``: every plugin name a manager can load (bundled,
    entry points, registered) to its class. Reading a name imports its class; setting
    one is :meth:`PluginManager.register_plugin`."""

    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager

    def __getitem__(self, name: str) -> Callable[..., BasePlugin]:
        if name not in self._manager.registry:
            raise KeyError(name)
        return self._manager.registry.get(name)

    def __setitem__(self, name: str, plugin_class: type[BasePlugin]) -> None:
        self._manager.register_plugin(name, plugin_class)

    def __contains__(self, name: object) -> bool:
        return name in self._manager.registry

    def __iter__(self) -> Iterator[str]:
        return iter(self._manager.registry.names())

    def __len__(self) -> int:
        return len(self._manager.registry.names())

    def __repr__(self) -> str:
        return f"PluginRegistryView({self._manager.registry.names()!r})"


@dataclass
class _Loaded:
    plugin: BasePlugin
    settings: dict[str, Any]


@dataclass
class PluginManager:
    """The plugins of one simulator, loaded and configured, and how to call them.

    convsim's own form is :meth:`load` (many plugins, before a run); the guide's is
    :meth:`register_plugin`, :meth:`load_plugin`, :meth:`unload_plugin`,
    :meth:`get_plugin`, :meth:`list_available_plugins`, :meth:`list_loaded_plugins` and
    :attr:`plugin_registry`. Both fill :attr:`plugins`, which runs call in order.
    """

    plugins: list[BasePlugin] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    hook_timeouts: dict[str, float] = field(default_factory=dict)
    """Seconds one hook call may take, by plugin name (else the plugin's own)."""
    stalled: dict[str, str] = field(default_factory=dict)
    """Plugins called no more, by name: why (a hook overran its time limit)."""
    registry: Registry[BasePlugin] = field(default_factory=PLUGINS.copy, repr=False)
    """The plugins this manager can load by name: its own copy."""
    _loaded: dict[str, _Loaded] = field(default_factory=dict, init=False, repr=False)
    """What :meth:`load` and :meth:`load_plugin` loaded, by the name asked for."""

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
            ConfigError: settings a plugin refuses (or a bad ``hook_timeout``), or
                settings for a plugin that is not asked for.
            MissingExtra: a plugin's ``initialize`` found its extra not installed.
        """
        configs = dict(configs or {})
        unknown = sorted(set(configs) - set(names))
        if unknown:
            raise ConfigError(f"settings given for plugins not asked for: {', '.join(unknown)}")
        manager = cls(registry=registry.copy())
        for name in dict.fromkeys(names):
            manager._load_one(name, dict(configs.get(name, {})))
        return manager

    def _load_one(
        self, name: str, settings: dict[str, Any], registry: Registry[BasePlugin] | None = None
    ) -> bool:
        """Build, check and initialise plugin ``name`` (from ``registry``, else this
        manager's); False (recorded) if it could not be built or initialised.

        Raises:
            RegistryError: no such plugin.
            ConfigError: settings it refuses.
            MissingExtra: its extra is not installed.
        """
        factory = (self.registry if registry is None else registry).get(name)
        given = dict(settings)
        if HOOK_TIMEOUT_SETTING in settings:
            limit = {HOOK_TIMEOUT_SETTING: settings.pop(HOOK_TIMEOUT_SETTING)}
            hook = parse_config(_HookSettings, limit, f"plugin {name}")
        else:
            hook = None
        try:
            built = _build(factory, settings)
        except MissingExtra:  # the install, not the run: stop before it starts
            raise
        except Exception as exc:
            self.record_failure(name, "__init__", f"{type(exc).__name__}: {exc}")
            return False
        plugin = built.plugin
        config = checked_settings(plugin, settings, f"plugin {name}")
        try:
            if guide_style(plugin):
                if not built.took_settings:
                    plugin.config = config
                ready = plugin.initialize()
            else:
                ready = plugin.initialize(config)
        except MissingExtra:
            raise
        except Exception as exc:
            self.record_failure(plugin.name, "initialize", f"{type(exc).__name__}: {exc}")
            return False
        if ready is False:
            self.record_failure(plugin.name, "initialize", "initialize() returned False")
            return False
        if hook is not None:
            self.hook_timeouts[plugin.name] = hook.hook_timeout
        self.stalled.pop(plugin.name, None)
        self.plugins.append(plugin)
        self._loaded[name] = _Loaded(plugin, given)
        return True

    # -- the guide's calls ----------------------------------------------------------

    @property
    def plugin_registry(self) -> PluginRegistryView:
        """The guide's registry: every plugin name this manager can load, to its class."""
        return PluginRegistryView(self)

    def register_plugin(self, name: str, plugin_class: type[BasePlugin]) -> None:
        """Make ``plugin_class`` loadable as ``name`` by this manager (the guide's call);
        a name already known now means this class. Plugins already loaded stay.

        Raises:
            TypeError: ``plugin_class`` is not a :class:`BasePlugin` subclass.
            ValueError: ``name`` is empty.
        """
        if not (isinstance(plugin_class, type) and issubclass(plugin_class, BasePlugin)):
            raise TypeError(
                f"register_plugin({name!r}, ...): {plugin_class!r} is not a subclass of "
                "convsim.plugins.BasePlugin"
            )
        if not isinstance(name, str) or not name:
            raise ValueError(f"register_plugin(): a name is a non-empty string, not {name!r}")
        self.registry.register(name, plugin_class, replace=True)

    def load_plugin(
        self,
        name: str,
        config: Mapping[str, Any] | None = None,
        *,
        registry: Registry[BasePlugin] | None = None,
    ) -> bool:
        """Load and initialise one plugin by name (the guide's call). True when it is
        loaded (also when it already was, with the same settings); False, recorded in
        :attr:`failures`, when it could not be built, configured or initialised.

        Raises:
            RegistryError: no plugin of that name, listing the known ones (a
                ValueError, as the guide raises, and a KeyError).
            ConfigError: the plugin is already loaded with other settings
                (:meth:`unload_plugin` it first).
            MissingExtra: the plugin's extra is not installed.
        """
        settings = dict(config or {})
        if name in self._loaded:
            if self._loaded[name].settings == settings:
                return True
            raise ConfigError(
                f"plugin {name} is already loaded with other settings; "
                f"unload_plugin({name!r}) first"
            )
        try:
            return self._load_one(name, settings, registry)
        except ConfigError as exc:
            if isinstance(exc, MissingExtra):
                raise
            self.record_failure(name, "load", str(exc))
            return False

    async def unload(self, name: str) -> bool:
        """Unload a plugin (convsim's form of :meth:`unload_plugin`): runs call it no
        more, and its ``cleanup`` is called, isolated like every hook. False when no
        plugin of that name is loaded."""
        plugin = self.get_plugin(name)
        if plugin is None:
            return False
        self.plugins.remove(plugin)
        for loaded_as in [k for k, v in self._loaded.items() if v.plugin is plugin]:
            del self._loaded[loaded_as]
        stop, threads = RunStop(), hook_threads()
        await self.call(plugin, "cleanup", (), stop=stop, threads=threads, stalled_too=True)
        self.stalled.pop(plugin.name, None)
        self.hook_timeouts.pop(plugin.name, None)
        return True

    def unload_plugin(self, name: str) -> bool:
        """Unload a plugin from synchronous code (the guide's call); see :meth:`unload`.

        Raises:
            ConfigError: called inside a running event loop: ``await
                manager.unload(name)`` there.
        """
        try:
            sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            return anyio.run(self.unload, name)
        raise ConfigError(
            "unload_plugin() was called inside a running event loop; "
            f"use 'await manager.unload({name!r})'"
        )

    def get_plugin(self, name: str) -> BasePlugin | None:
        """A loaded plugin by the name it was loaded as, else by its own name."""
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded.plugin
        return next((p for p in self.plugins if p.name == name), None)

    def list_available_plugins(self) -> list[str]:
        """Every plugin name this manager can load: bundled, entry points, registered."""
        return self.registry.names()

    def list_loaded_plugins(self) -> list[str]:
        """The loaded plugins, in the order runs call them, by the names they were
        loaded as."""
        names = {id(entry.plugin): name for name, entry in self._loaded.items()}
        return [names.get(id(p), p.name) for p in self.plugins]

    # -- running ----------------------------------------------------------------------

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
        for plugin in list(self.plugins):
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


class _Built(NamedTuple):
    plugin: BasePlugin
    took_settings: bool
    """Its constructor was given the settings."""


def _build(factory: Callable[..., BasePlugin], settings: dict[str, Any]) -> _Built:
    """The plugin, given its settings if its constructor takes them (the guide's
    ``Plugin(config)``), else none (a factory of convsim's form)."""
    try:
        inspect.signature(factory).bind(settings)
    except TypeError:
        return _Built(factory(), took_settings=False)
    except ValueError:  # no signature to read (a builtin): try the guide's form
        pass
    return _Built(factory(settings), took_settings=True)


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
        for plugin in list(self.manager.plugins):  # one unloaded meanwhile is not skipped over
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
        for plugin in list(self.manager.plugins):
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
