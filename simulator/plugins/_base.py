"""The plugin extension point: one class, hooks with no-op defaults.

A plugin has a ``name`` and a ``version``, declares the scores it gives in ``metrics``
(:class:`PluginMetric`: ``convsim metrics`` lists them), takes its configuration through
:meth:`BasePlugin.initialize` (validated against its ``Config`` model first), and
overrides only the hooks it needs. Hooks see records (a manifest, a conversation's
result, a turn record), never the runtime's own objects. :meth:`BasePlugin.score` is
how a plugin contributes scores: it returns them for a finished conversation and they
are recorded in its result before it is written, once checked (each a :class:`Score`
with a finite value within :meth:`BasePlugin.score_range`).

Each hook call is isolated from the run (see ``_calls``): it has ``hook_timeout``
seconds; a sync hook (``score``, or any hook written without ``async``) runs in a
thread of its own, so blocking work belongs there, never in an ``async`` hook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict

from convsim._records import ConversationResult, Score, TurnRecord
from convsim.metrics import MetricTraits

__all__ = [
    "BasePlugin",
    "PluginMetric",
    "PluginScores",
    "ScoreRange",
    "NoConfig",
    "DEFAULT_HOOK_TIMEOUT_S",
]

DEFAULT_HOOK_TIMEOUT_S = 10.0
"""How long one hook call may take unless the plugin or its settings say otherwise."""


class NoConfig(BaseModel):
    """A plugin that takes no settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PluginScores:
    """What a plugin adds to a conversation: conversation scores, and scores per turn
    (by turn_id). Names should carry the plugin's name as a prefix (``code_analysis:``)."""

    scores: dict[str, Score] = field(default_factory=dict)
    turn_scores: dict[str, dict[str, Score]] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginMetric:
    """A score a plugin gives (from :meth:`BasePlugin.score`), declared so that
    ``convsim metrics`` can list it before any run."""

    name: str
    """As scored, with the plugin's prefix: ``code_analysis:summary``."""
    traits: MetricTraits
    """``turn`` for scores of each answer (``turn_scores``), ``conversation`` for those
    of the whole conversation (``scores``)."""
    description: str
    higher_is_better: bool | None = None


class BasePlugin:
    """Subclass it, set ``name`` (and ``version``, ``Config``, ``metrics``), override
    hooks."""

    name: ClassVar[str]
    version: ClassVar[str] = "0"
    metrics: ClassVar[tuple[PluginMetric, ...]] = ()
    """The scores the plugin gives, for ``convsim metrics`` (none declared: none
    listed, any still scored)."""
    Config: ClassVar[type[BaseModel]] = NoConfig
    hook_timeout: ClassVar[float] = DEFAULT_HOOK_TIMEOUT_S
    """Seconds one hook call may take; a user overrides it with the plugin setting
    ``hook_timeout`` (``--plugin-arg NAME.hook_timeout=30``). A hook that overruns it is
    abandoned and recorded, and the plugin is called no more: it may still be stuck."""

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
        """Scores for a finished conversation, recorded in its result; None for none.
        Runs in a worker thread (it may block or compute)."""
        return None

    def score_range(self, name: str) -> ScoreRange | None:
        """The values score ``name`` may take; None: any finite value. A score outside
        its range is not written (the plugin's scores for that conversation are
        recorded as failed)."""
        return None


class ScoreRange(NamedTuple):
    """The closed interval a score's value lies in."""

    low: float = -math.inf
    high: float = math.inf
