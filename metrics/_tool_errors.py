"""``tool_errors``: how much of a conversation's tool use went wrong.

Each call made and each turn stopped at its round limit is one event. An event went
wrong when it is

- a call answered with an error (its record's ``error``: unknown_tool,
  invalid_arguments, precondition, tool_error, timeout, raised);
- a repeated call: the same tool with the same parsed arguments (JSON-equal, key order
  aside) as an earlier call of the conversation that did not fail; the earlier answer
  was there to be used, so asking again is wasted or, for a tool that changes the
  environment, a side effect made twice. Repeating a call that failed is a retry, not
  a repeat. A call both repeated and failed counts once as an event, under both kinds;
- a turn that hit ``max_tool_rounds`` with the model still asking for tools.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, get_args

from convsim._records import Score, ToolErrorKind, TurnRecord

from ._protocol import MetricTraits
from ._tool_calls import MadeCall

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = ["ToolErrorsMetric", "TOOL_ERROR_KINDS"]

TOOL_ERROR_KINDS: tuple[str, ...] = (*get_args(ToolErrorKind), "repeated", "round_limit")
"""What ``tool_errors`` counts, in the order its details list them."""


@dataclass(frozen=True)
class ToolErrorsMetric:
    """The share of tool events (calls, turns at the round limit) that went wrong."""

    traits: ClassVar[MetricTraits] = MetricTraits("conversation")
    name: str = "tool_errors"
    higher_is_better: bool = False
    description: str = (
        "Share of tool events that went wrong (calls made, and turns stopped at "
        "max_tool_rounds); a call goes wrong when answered with an error (unknown tool, "
        "arguments not JSON or failing the schema, a precondition, the tool's own error, "
        "a timeout, code that raised) or when it repeats an earlier successful call "
        "(same tool, JSON-equal arguments), and details count each kind. Not applicable "
        "where no tool was called. Blind to whether a call that worked was the right one."
    )

    def scorer(self, conversation: Conversation) -> _ToolErrorsScorer:
        return _ToolErrorsScorer()


@dataclass
class _ToolErrorsScorer:
    kinds: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    wrong_calls: int = 0
    limit_turns: list[str] = field(default_factory=list)
    succeeded: set[tuple[str, str]] = field(default_factory=set)
    """(tool, canonical arguments) of the calls that did not fail."""

    def update(self, turn: TurnRecord) -> None:
        for record in turn.tool_calls:
            self.calls += 1
            made = MadeCall.of(turn.turn_id, record)
            key = (
                None
                if made.arguments is None
                else (record.name, json.dumps(_canonical(made.arguments), sort_keys=True))
            )
            repeated = key is not None and key in self.succeeded
            if repeated:
                self.kinds["repeated"] += 1
            if record.error is not None:
                self.kinds[record.error] += 1
            elif key is not None:
                self.succeeded.add(key)
            self.wrong_calls += repeated or record.error is not None
        if turn.tool_round_limit:
            self.limit_turns.append(turn.turn_id)
            self.kinds["round_limit"] += 1

    def result(self) -> Score:
        events = self.calls + len(self.limit_turns)
        if not events:
            return Score.not_applicable("no tool was called")
        wrong = self.wrong_calls + len(self.limit_turns)
        return Score(
            value=wrong / events,
            details={
                "kinds": {k: self.kinds[k] for k in TOOL_ERROR_KINDS if self.kinds[k]},
                "calls": self.calls,
                "wrong_calls": self.wrong_calls,
                "round_limit_turns": self.limit_turns,
            },
        )


def _canonical(value: object) -> object:
    """``value`` with whole floats as integers, so ``1.0`` and ``1`` write the same."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value
