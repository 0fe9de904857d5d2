"""The metric extension point: a metric makes one streaming scorer per conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from convsim._records import Score, TurnRecord
    from convsim.scenarios import Conversation

__all__ = ["Metric", "ConversationScorer"]


@runtime_checkable
class ConversationScorer(Protocol):
    """A streaming reducer: sees each turn as it ends, gives one score at the end."""

    def update(self, turn: TurnRecord) -> None:
        """Fold in one turn record (completed, failed or skipped)."""
        ...

    def result(self) -> Score:
        """The score so far; ``Score.not_applicable(reason)`` when it cannot apply."""
        ...


@runtime_checkable
class Metric(Protocol):
    """A named metric. Turn-level use feeds a fresh scorer a single turn."""

    @property
    def name(self) -> str:
        """The registry name."""
        ...

    @property
    def higher_is_better(self) -> bool | None:
        """True/False for scores to maximise/minimise; None where neither is better."""
        ...

    @property
    def description(self) -> str:
        """What the metric rewards and where it is blind."""
        ...

    def scorer(self, conversation: Conversation) -> ConversationScorer:
        """A new scorer for one conversation."""
        ...
