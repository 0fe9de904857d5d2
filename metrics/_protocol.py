"""The metric extension point: a metric makes one streaming scorer per conversation.

A scorer says what it is by the protocol it implements: a :class:`ConversationScorer`
is called directly; an :class:`AsyncConversationScorer` (one that calls a model, such as
a judge) is awaited. A metric whose scorers are expensive to compute declares
``cpu_heavy = True`` and the scoring session computes them in a worker thread. Nothing is
inferred from how a method happens to be written.

A score's value exists only when the metric measured something. Every scorer keeps
this convention, so that a value never stands for "nothing was checked":

- nothing to check (no completed turn, no facts or goal or reference, no code, nothing
  financial said, a single turn where memory needs two):
  ``Score.not_applicable(reason)``, the reason saying what was missing;
- something checked but no evidence either way (what the user said was never recalled
  nor forgotten, statements never restated): ``Score.not_applicable("no evidence:
  ...")``, with details saying what was checked (``checks``, ``evidence``, ...);
- the scorer or its judge broke: ``Score.failed(reason)``;
- otherwise a value, with details saying what it rests on.

Summaries count the three apart: a mean and its interval are over the scored
conversations only, beside how many were not applicable and how many failed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from convsim._records import Score, TurnRecord
    from convsim.scenarios import Conversation

__all__ = [
    "Metric",
    "ConversationScorer",
    "AsyncConversationScorer",
    "CpuHeavyMetric",
    "JudgedMetric",
    "is_cpu_heavy",
]


@runtime_checkable
class ConversationScorer(Protocol):
    """A streaming reducer: sees each turn as it ends, gives one score at the end."""

    def update(self, turn: TurnRecord) -> None:
        """Fold in one turn record (completed, failed or skipped)."""
        ...

    def result(self) -> Score:
        """The score so far; ``Score.not_applicable(reason)`` when it measured nothing
        (nothing to check, or no evidence either way: see the module docstring)."""
        ...


class AsyncConversationScorer(ABC):
    """A scorer that awaits, such as a judge calling a model. Subclass it: the scoring
    session awaits ``update`` and ``result``, in turn order, beside the conversation."""

    @abstractmethod
    async def update(self, turn: TurnRecord) -> None:
        """Fold in one turn record (completed, failed or skipped)."""

    @abstractmethod
    async def result(self) -> Score:
        """The score; ``Score.not_applicable(reason)`` when it measured nothing."""


@runtime_checkable
class Metric(Protocol):
    """A named metric. Turn-level use feeds a fresh scorer a single turn.

    A metric may also declare ``cpu_heavy = True`` (:class:`CpuHeavyMetric`): its
    results are then computed in a worker thread so the event loop never waits on them.
    """

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

    def scorer(self, conversation: Conversation) -> ConversationScorer | AsyncConversationScorer:
        """A new scorer for one conversation."""
        ...


@runtime_checkable
class CpuHeavyMetric(Protocol):
    """A metric that declares whether its scorers are CPU-heavy."""

    cpu_heavy: bool


@runtime_checkable
class JudgedMetric(Protocol):
    """A metric graded (in part) by a judge model; ``with_judge`` gives it one."""

    def with_judge(self, judge: Any) -> Metric: ...


def is_cpu_heavy(metric: object) -> bool:
    """Whether ``metric`` declared ``cpu_heavy = True`` (:class:`CpuHeavyMetric`'s one
    attribute, read directly: a runtime protocol check costs tens of microseconds, once
    per metric and conversation)."""
    return getattr(metric, "cpu_heavy", False) is True
