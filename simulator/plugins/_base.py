"""The plugin extension point: one class, hooks with no-op defaults.

A plugin has a ``name`` and a ``version``, takes its configuration through
:meth:`BasePlugin.initialize` (validated against its ``Config`` model first), and
overrides only the hooks it needs. Hooks see records (a manifest, a conversation's
result, a turn record), never the runtime's own objects. :meth:`BasePlugin.score` is
how a plugin contributes scores: it returns them for a finished conversation and they
are recorded in its result before it is written; a plugin whose scoring is CPU-bound
sets ``cpu_heavy`` and it runs in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from convsim._records import ConversationResult, Score, TurnRecord

__all__ = ["BasePlugin", "PluginScores", "NoConfig"]


class NoConfig(BaseModel):
    """A plugin that takes no settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PluginScores:
    """What a plugin adds to a conversation: conversation scores, and scores per turn
    (by turn_id). Names should carry the plugin's name as a prefix (``code_analysis:``)."""

    scores: dict[str, Score] = field(default_factory=dict)
    turn_scores: dict[str, dict[str, Score]] = field(default_factory=dict)


class BasePlugin:
    """Subclass it, set ``name`` (and ``version``, ``Config``), override hooks."""

    name: ClassVar[str]
    version: ClassVar[str] = "0"
    Config: ClassVar[type[BaseModel]] = NoConfig
    cpu_heavy: ClassVar[bool] = False
    """:meth:`score` is CPU-bound: it runs in a worker thread."""

    def initialize(self, config: BaseModel) -> None:
        """Take the validated configuration; called once before the first run."""
        self.config = config

    async def cleanup(self) -> None:
        """Release what :meth:`initialize` took; called once when the simulator closes."""

    async def on_run_start(self, manifest: Any) -> None:
        """A run starts (its :class:`~convsim.RunManifest`)."""

    async def on_run_end(self, statistics: Any) -> None:
        """A run ended (its :class:`~convsim.RunStatistics`)."""

    async def on_conversation_start(self, conversation_id: str, scenario_id: str) -> None:
        """A conversation starts."""

    async def on_turn(self, turn: TurnRecord) -> None:
        """A turn ended (completed, failed or skipped). Called in turn order, off the
        conversation's own task: a slow hook never holds a conversation up."""

    async def on_conversation_end(self, result: ConversationResult) -> None:
        """A conversation ended, scores included (the plugin's own among them)."""

    def score(self, result: ConversationResult) -> PluginScores | None:
        """Scores for a finished conversation, recorded in its result; None for none."""
        return None
