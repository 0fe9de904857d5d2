"""Finding, loading and calling plugins, each failure kept to its own plugin.

Plugins are found by name in a registry that reads the entry-point group
``convsim.plugins`` (``name = "package.module:PluginClass"``) on first use, beside the
bundled ``code_analysis``. Their settings are validated with each plugin's pydantic
``Config`` before anything runs. A hook that raises is logged and recorded (plugin,
hook, error) and the run goes on; a plugin whose ``initialize`` raises is left out of
the run, and that is recorded too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from convsim._errors import ConfigError, parse_config
from convsim._log import get_logger
from convsim._records import ConversationResult, Score, TurnRecord
from convsim._registry import Registry

from ._base import BasePlugin

__all__ = ["PLUGINS", "PluginManager", "PluginFailure"]

log = get_logger("convsim.plugins")

PLUGINS: Registry[BasePlugin] = Registry("plugin", "convsim.plugins")
PLUGINS.register("code_analysis", "convsim.plugins._code_analysis:CodeAnalysisPlugin")


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
    _send: MemoryObjectSendStream[TurnRecord] | None = None

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
            ConfigError: settings a plugin's ``Config`` refuses, or settings for a plugin
                that is not asked for.
        """
        configs = dict(configs or {})
        unknown = sorted(set(configs) - set(names))
        if unknown:
            raise ConfigError(f"settings given for plugins not asked for: {', '.join(unknown)}")
        manager = cls()
        for name in dict.fromkeys(names):
            factory = registry.get(name)
            plugin = factory()
            config = parse_config(plugin.Config, configs.get(name, {}), f"plugin {name}")
            try:
                plugin.initialize(config)
            except Exception as exc:
                manager._failed(name, "initialize", exc)
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
            self._failed(name, "load", exc)
            return False
        self.failures.extend(loaded.failures)
        self.plugins.extend(p for p in loaded.plugins if self.get_plugin(p.name) is None)
        return self.get_plugin(name) is not None

    def get_plugin(self, name: str) -> BasePlugin | None:
        """A loaded plugin by name."""
        return next((p for p in self.plugins if p.name == name), None)

    def manifest(self) -> list[dict[str, str]]:
        """Which plugins ran, and their versions, for the run manifest."""
        return [{"name": p.name, "version": str(p.version)} for p in self.plugins]

    def _failed(self, plugin: str, hook: str, exc: BaseException) -> None:
        failure = PluginFailure(plugin, hook, f"{type(exc).__name__}: {exc}")
        self.failures.append(failure)
        log.warning("plugin_hook_failed", plugin=plugin, hook=hook, error=failure.error)

    async def _each(self, hook: str, *args: Any) -> None:
        for plugin in self.plugins:
            try:
                await getattr(plugin, hook)(*args)
            except Exception as exc:  # never BaseException: cancellation goes through
                self._failed(plugin.name, hook, exc)

    async def run_start(self, manifest: Any) -> None:
        await self._each("on_run_start", manifest)

    async def run_end(self, statistics: Any) -> None:
        await self._each("on_run_end", statistics)

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
        """``result`` with every plugin's scores in it; then the end hooks."""
        for plugin in self.plugins:
            try:
                if plugin.cpu_heavy:
                    added = await anyio.to_thread.run_sync(plugin.score, result)
                else:
                    added = plugin.score(result)
            except Exception as exc:
                self._failed(plugin.name, "score", exc)
                failed = Score.failed(f"plugin {plugin.name} failed: {type(exc).__name__}: {exc}")
                result = result.model_copy(
                    update={"scores": {**result.scores, f"{plugin.name}:failed": failed}}
                )
                continue
            if added is not None:
                turn_scores = {k: dict(v) for k, v in result.turn_scores.items()}
                for turn_id, scores in added.turn_scores.items():
                    turn_scores.setdefault(turn_id, {}).update(scores)
                result = result.model_copy(
                    update={"scores": {**result.scores, **added.scores}, "turn_scores": turn_scores}
                )
        await self._each("on_conversation_end", result)
        return result

    async def cleanup(self) -> None:
        await self._each("cleanup")
