"""``task:<key>`` metrics: a task class's own results for a conversation it built."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from convsim._records import HIGHER_IS_BETTER_DETAIL, Score, TurnRecord, TurnStatus
from convsim.metrics import MetricTraits
from convsim.scenarios import Conversation

__all__ = [
    "TASK_METRIC_PREFIX",
    "TaskDocument",
    "TaskHooks",
    "TaskMetric",
    "TaskOrigin",
    "numeric",
]

TASK_METRIC_PREFIX = "task:"


def numeric(value: Any) -> bool:
    """A number a report can average (bools count; NaN and infinities do not)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    ) or isinstance(value, bool)


class TaskHooks(Protocol):
    """What a ``task:<key>`` metric asks of a task class (``AdvancedTask`` and its
    subclasses): its results for an answer, and which way each is better."""

    def process_results(self, doc: Any, results: list[str]) -> dict[str, Any]: ...

    def higher_is_better(self) -> dict[str, bool]: ...


@runtime_checkable
class TaskOrigin(Protocol):
    """A conversation built by a task class: what its ``task:<key>`` metrics ask."""

    task: TaskHooks

    def results(
        self, conversation: Conversation, turns: Sequence[TurnRecord]
    ) -> dict[str, Any] | str:
        """The task's own results for the conversation's completed turns, or why
        there are none (the reason a score is not applicable)."""
        ...


@dataclass
class TaskDocument:
    """A single-turn conversation's origin: the task and the document it was built
    from. The task's ``process_results`` runs once per answer, whichever metric asks
    first."""

    task: TaskHooks
    doc: Any
    _results: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def results(
        self, conversation: Conversation, turns: Sequence[TurnRecord]
    ) -> dict[str, Any] | str:
        if not turns:
            return "the document was not answered"
        response = turns[-1].response or ""
        with self._lock:
            if response not in self._results:
                self._results[response] = dict(self.task.process_results(self.doc, [response]))
            return self._results[response]


class TaskMetric:
    """``task:<key>``: the ``<key>`` of the task's own results for the conversation
    (``process_results`` of a single-turn task, ``evaluate_conversation`` of a
    multi-turn one)."""

    traits: ClassVar[MetricTraits] = MetricTraits("conversation", needs=frozenset({"task"}))
    cpu_heavy = True  # the task's hooks may score with convsim's metrics

    def __init__(self, qualified: str) -> None:
        self.name = qualified
        self.key = qualified[len(TASK_METRIC_PREFIX) :]
        self.higher_is_better: bool | None = True
        self.description = (
            f"The task's own result {self.key!r} for the conversation (tasks written with "
            "convsim.lm_eval.AdvancedTask or MultiTurnTask)."
        )

    def scorer(self, conversation: Conversation) -> _TaskScorer:
        origin = conversation.origin
        if not isinstance(origin, TaskOrigin):
            return _TaskScorer(self.key, conversation, None)
        higher = origin.task.higher_is_better().get(self.key)
        if higher is not None:
            self.higher_is_better = bool(higher)
        return _TaskScorer(self.key, conversation, origin)


@dataclass
class _TaskScorer:
    key: str
    conversation: Conversation
    origin: TaskOrigin | None
    turns: list[TurnRecord] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if turn.status is TurnStatus.COMPLETED:
            self.turns.append(turn)

    def result(self) -> Score:
        if self.origin is None:
            return Score.not_applicable("not a conversation of a task class's pack")
        results = self.origin.results(self.conversation, self.turns)
        if isinstance(results, str):
            return Score.not_applicable(results)
        if self.key not in results:
            return Score.not_applicable(f"the task's results give no {self.key!r}")
        value = results[self.key]
        if not numeric(value):
            return Score.not_applicable(f"the task's {self.key!r} is not a number")
        extras = {k: v for k, v in results.items() if not numeric(v) and _jsonable(v)}
        higher = self.origin.task.higher_is_better().get(self.key)
        if higher is not None:  # the task's own direction, for reports read from files
            extras[HIGHER_IS_BETTER_DETAIL] = bool(higher)
        return Score(value=float(value), details=extras)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
