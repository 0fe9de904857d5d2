"""The tool calls a conversation made against those its scenario expects.

A made call matches an expected one (:func:`call_matches`) when the tool's name is the
same, the call's arguments parse as a JSON object, and every argument the expected call
names is there with an equal value; arguments it does not name are not held against the
call, and an expected ``turn_id`` admits only calls of that turn. Values are equal
(:func:`same_value`) as JSON values, with the tolerance models need:

- numbers by value (``1 == 1.0``), and a string holding one number equals that number
  (``"1" == 1``, ``" 2.50" == 2.5``); a boolean is never a number;
- strings after trimming whitespace at both ends (case counts);
- objects with the same keys, lists of the same length in order, each value compared
  by these rules; ``null`` only equals ``null``.

Arguments that are not a JSON object (malformed text, an array) match no expected call,
not even one that names no arguments.

``tool_call_accuracy`` pairs them one to one, greedily in order; ``trajectory_match``
compares the sequences by the scenario's ``trajectory_mode``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from convsim._records import Score, ToolCallRecord, TurnRecord
from convsim._types import ToolCall
from convsim.scenarios._tool_schema import ExpectedToolCall

from ._protocol import MetricTraits

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = [
    "MadeCall",
    "same_value",
    "call_matches",
    "ToolCallAccuracyMetric",
    "TrajectoryMatchMetric",
]

_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
NO_EXPECTED = "the scenario declares no expected_tool_calls"


@dataclass(frozen=True)
class MadeCall:
    """One tool call a conversation made, with the turn that made it."""

    turn_id: str
    record: ToolCallRecord
    arguments: dict[str, Any] | None
    """The parsed arguments; None when they are not a JSON object."""

    @classmethod
    def of(cls, turn_id: str, record: ToolCallRecord) -> MadeCall:
        call = ToolCall(id=record.id, name=record.name, arguments=record.arguments)
        try:
            arguments: dict[str, Any] | None = call.parsed_arguments()
        except (ValueError, RecursionError):  # RecursionError: nested past the parser
            arguments = None
        return cls(turn_id, record, arguments)

    def shown(self) -> dict[str, Any]:
        """As the details list it: the arguments as the model wrote them."""
        return {
            "name": self.record.name,
            "arguments": self.record.arguments,
            "turn_id": self.turn_id,
        }


def _number(value: Any) -> int | float | None:
    """``value`` as a number: a JSON number, or a string holding one; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and _NUMBER_TEXT.fullmatch(text := value.strip()):
        try:
            return int(text)
        except ValueError:
            number = float(text)
            return number if number not in (float("inf"), float("-inf")) else None
    return None


def same_value(expected: Any, made: Any) -> bool:
    """Whether an argument's value ``made`` equals ``expected`` (the module docstring
    says with what tolerance)."""
    if isinstance(expected, bool) or isinstance(made, bool):
        return type(expected) is type(made) and expected == made
    if isinstance(expected, (int, float)) or isinstance(made, (int, float)):
        a, b = _number(expected), _number(made)
        return a is not None and b is not None and a == b
    if isinstance(expected, str) and isinstance(made, str):
        return expected.strip() == made.strip()
    if isinstance(expected, Mapping) and isinstance(made, Mapping):
        return expected.keys() == made.keys() and all(
            same_value(expected[k], made[k]) for k in expected
        )
    if isinstance(expected, list) and isinstance(made, list):
        return len(expected) == len(made) and all(
            same_value(e, m) for e, m in zip(expected, made, strict=True)
        )
    return expected is None and made is None


def call_matches(expected: ExpectedToolCall, made: MadeCall) -> bool:
    """Whether ``made`` is the call ``expected`` asks for."""
    if made.arguments is None or made.record.name != expected.name:
        return False
    if expected.turn_id is not None and made.turn_id != expected.turn_id:
        return False
    return all(
        key in made.arguments and same_value(value, made.arguments[key])
        for key, value in expected.arguments.items()
    )


def _shown_expected(call: ExpectedToolCall) -> dict[str, Any]:
    return call.model_dump(exclude_none=True)


def _described(name: str, arguments: Any) -> str:
    return f"{name}({arguments if isinstance(arguments, str) else _json(arguments)})"


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@dataclass
class _CallsScorer:
    """Collects the calls made, in order, from every turn record."""

    expected: Sequence[ExpectedToolCall]
    made: list[MadeCall] = field(default_factory=list)
    turns: int = 0

    def update(self, turn: TurnRecord) -> None:
        self.turns += 1
        self.made.extend(MadeCall.of(turn.turn_id, r) for r in turn.tool_calls)

    def _not_applicable(self) -> Score | None:
        if not self.expected:
            return Score.not_applicable(NO_EXPECTED)
        if not self.turns:
            return Score.not_applicable("no turn was recorded")
        return None


# -- tool_call_accuracy -----------------------------------------------------------------


@dataclass(frozen=True)
class ToolCallAccuracyMetric:
    """How well the calls made match the calls expected: F1 of precision and recall."""

    traits: ClassVar[MetricTraits] = MetricTraits(
        "conversation", needs=frozenset({"expected_calls"})
    )
    name: str = "tool_call_accuracy"
    higher_is_better: bool = True
    description: str = (
        "F1 of precision (matched calls / calls made) and recall (matched / expected "
        "calls); each expected_tool_calls entry, in order, takes the first unused call "
        "made with its name and every argument it names, numbers by value, numeric "
        "strings equal to numbers, strings trimmed, extra arguments allowed, malformed "
        "ones never matching, an expected turn_id admitting only that turn's calls. "
        "Blind to order (see trajectory_match) and to what the calls did (see "
        "final_state)."
    )

    def scorer(self, conversation: Conversation) -> _AccuracyScorer:
        return _AccuracyScorer(tuple(conversation.scenario.expected_tool_calls))


class _AccuracyScorer(_CallsScorer):
    def result(self) -> Score:
        missing = self._not_applicable()
        if missing is not None:
            return missing
        used: set[int] = set()
        unmatched: list[dict[str, Any]] = []
        for expected in self.expected:
            found = next(
                (
                    i
                    for i, made in enumerate(self.made)
                    if i not in used and call_matches(expected, made)
                ),
                None,
            )
            if found is None:
                unmatched.append(_shown_expected(expected))
            else:
                used.add(found)
        matched = len(used)
        precision = matched / len(self.made) if self.made else None
        recall = matched / len(self.expected)
        p = precision or 0.0
        f1 = 2 * p * recall / (p + recall) if p + recall else 0.0
        return Score(
            value=f1,
            details={
                "expected": len(self.expected),
                "made": len(self.made),
                "matched": matched,
                "precision": precision,
                "recall": recall,
                "unmatched_expected": unmatched,
                "unmatched_made": [m.shown() for i, m in enumerate(self.made) if i not in used],
            },
        )


# -- trajectory_match -------------------------------------------------------------------


@dataclass(frozen=True)
class TrajectoryMatchMetric:
    """Whether the sequence of calls made fits the expected one, by the scenario's
    ``trajectory_mode``."""

    traits: ClassVar[MetricTraits] = MetricTraits(
        "conversation", needs=frozenset({"expected_calls"})
    )
    name: str = "trajectory_match"
    higher_is_better: bool = True
    description: str = (
        "1.0 when the calls made fit expected_tool_calls by the scenario's "
        "trajectory_mode, else 0.0; strict: the same calls in the same order, unordered: "
        "the same calls in any order, subset: every call made is an expected one, each "
        "used once (making none fits), superset: every expected call was made, perhaps "
        "among others. Calls match as in tool_call_accuracy; details name the first "
        "difference."
    )

    def scorer(self, conversation: Conversation) -> _TrajectoryScorer:
        scenario = conversation.scenario
        return _TrajectoryScorer(tuple(scenario.expected_tool_calls), mode=scenario.trajectory_mode)


@dataclass
class _TrajectoryScorer(_CallsScorer):
    mode: str = "strict"

    def result(self) -> Score:
        missing = self._not_applicable()
        if missing is not None:
            return missing
        difference = (
            self._strict_difference() if self.mode == "strict" else self._matching_difference()
        )
        return Score(
            value=1.0 if difference is None else 0.0,
            details={
                "mode": self.mode,
                "expected": [c.name for c in self.expected],
                "made": [m.record.name for m in self.made],
                "first_difference": difference,
            },
        )

    def _strict_difference(self) -> str | None:
        for i in range(max(len(self.expected), len(self.made))):
            expected = self.expected[i] if i < len(self.expected) else None
            made = self.made[i] if i < len(self.made) else None
            if expected is None and made is not None:
                return f"call {i + 1}: made {self._made(made)}, none expected"
            if made is None and expected is not None:
                return f"call {i + 1}: expected {self._expected(expected)}, none made"
            if expected is not None and made is not None and not call_matches(expected, made):
                return f"call {i + 1}: expected {self._expected(expected)}, made {self._made(made)}"
        return None

    def _matching_difference(self) -> str | None:
        pairs = _max_matching(self.expected, self.made)
        taken = set(pairs.values())
        missed = [e for j, e in enumerate(self.expected) if j not in taken]
        extra = [m for i, m in enumerate(self.made) if i not in pairs]
        if missed and self.mode in ("unordered", "superset"):
            return f"expected {self._expected(missed[0])} was not made"
        if extra and self.mode in ("unordered", "subset"):
            return f"made {self._made(extra[0])} was not expected"
        return None

    @staticmethod
    def _expected(call: ExpectedToolCall) -> str:
        where = f" in turn {call.turn_id}" if call.turn_id is not None else ""
        return _described(call.name, call.arguments) + where

    @staticmethod
    def _made(call: MadeCall) -> str:
        return f"{_described(call.record.name, call.record.arguments)} in turn {call.turn_id}"


def _max_matching(expected: Sequence[ExpectedToolCall], made: Sequence[MadeCall]) -> dict[int, int]:
    """A largest one-to-one pairing of made calls with expected ones they match: made
    index -> expected index. Augmenting paths, searched breadth-first (no recursion,
    whatever the number of calls): a greedy pairing could miss one, since a made call
    may match several expected ones."""
    fits = [[j for j, e in enumerate(expected) if call_matches(e, m)] for m in made]
    pairs: dict[int, int] = {}  # made -> expected
    owner: dict[int, int] = {}  # expected -> made
    for start in range(len(made)):
        via: dict[int, int] = {}  # expected -> the made call that reached it
        queue = deque([start])
        while queue:
            i = queue.popleft()
            free = next((j for j in fits[i] if j not in via and j not in owner), None)
            for j in fits[i]:
                via.setdefault(j, i)
            if free is not None:
                while free is not None:  # flip the path back to start
                    taker = via[free]
                    previous = pairs.get(taker)
                    pairs[taker], owner[free] = free, taker
                    free = previous
                break
            queue.extend(owner[j] for j in fits[i] if via[j] == i)
    return pairs
