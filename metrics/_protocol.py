"""The metric extension point: a metric makes one streaming scorer per conversation.

A scorer says what it is by the protocol it implements: a :class:`ConversationScorer`
is called directly; an :class:`AsyncConversationScorer` (one that calls a model, such as
a judge) is awaited. A metric whose scorers are expensive to compute declares
``cpu_heavy = True`` and the scoring session computes them in a worker thread. A metric
says what it scores and what it reads with ``traits`` (:class:`MetricTraits`), which
``convsim metrics`` lists. Nothing is inferred from how a method happens to be written.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

if TYPE_CHECKING:
    from convsim._records import Score, TurnRecord
    from convsim.scenarios import Conversation

__all__ = [
    "INPUTS",
    "MetricInput",
    "MetricKind",
    "MetricTraits",
    "DescribedMetric",
    "Metric",
    "ConversationScorer",
    "AsyncConversationScorer",
    "CpuHeavyMetric",
    "JudgedMetric",
    "is_cpu_heavy",
]


MetricKind = Literal["turn", "conversation"]
"""``turn``: each answer on its own (a turn may name it in ``evaluation_metrics``; for
a conversation, it scores over the answers); ``conversation``: the conversation as a
whole, what was said before counting."""

MetricInput = Literal[
    "judge",
    "reference",
    "facts",
    "goal",
    "keywords",
    "domain",
    "task",
    "tests",
    "expected_calls",
    "final_state",
]
"""What a metric may read besides the answers: a judge model (``--judge``), the
scenario's reference responses, its facts and probes, its goal, its required keywords,
its domain (``metadata.domain`` or a tag), the task of an lm-eval or task-API pack, its
test cases (``metadata.tests``, run only with ``allow_code``), the tool calls it
expects (``expected_tool_calls``), or the checks its tools' environment must pass at
the end (``final_state``)."""

INPUTS: tuple[MetricInput, ...] = get_args(MetricInput)


@dataclass(frozen=True)
class MetricTraits:
    """What a metric scores and what it reads (``convsim metrics`` lists them)."""

    kind: MetricKind
    needs: frozenset[MetricInput] = frozenset()
    """What it cannot score without: given none, its score is not applicable."""
    uses: frozenset[MetricInput] = frozenset()
    """What it reads when given, and scores without (context_retention reads facts,
    else judges what the user said; goal_achievement grades judge criteria)."""

    def __post_init__(self) -> None:
        if self.kind not in get_args(MetricKind):
            raise ValueError(f"kind must be turn or conversation, not {self.kind!r}")
        unknown = sorted(set(self.needs | self.uses) - set(INPUTS))
        if unknown:
            raise ValueError(f"unknown inputs {unknown}: expected some of {list(INPUTS)}")


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
class DescribedMetric(Protocol):
    """A metric that declares its :class:`MetricTraits`."""

    traits: MetricTraits


@runtime_checkable
class JudgedMetric(Protocol):
    """A metric graded (in part) by a judge model; ``with_judge`` gives it one."""

    def with_judge(self, judge: Any) -> Metric: ...


def is_cpu_heavy(metric: object) -> bool:
    """Whether ``metric`` declared ``cpu_heavy = True`` (:class:`CpuHeavyMetric`'s one
    attribute, read directly: a runtime protocol check costs tens of microseconds, once
    per metric and conversation)."""
    return getattr(metric, "cpu_heavy", False) is True
