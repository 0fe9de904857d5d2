"""The tools' environment document a conversation ended with, and ``final_state``.

A tool call that changes the environment document leaves the whole document on its
turn's record (``TurnRecord.environment``); a conversation's final document is the last
one recorded, else the one it started from. The same reading serves the live scoring
session and ``convsim score`` (which rebuilds each conversation from its pack, tools
included), so a rescored run sees the state the run ended in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from convsim._records import Score, TurnRecord
from convsim.scenarios._state_checks import check_state

from ._protocol import MetricTraits

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = ["final_environment", "FinalStateMetric", "NO_DOCUMENT"]

NO_DOCUMENT = "no environment document (the scenario declares no environment and its pack no tools)"
"""Why a state check cannot be made."""


def final_environment(conversation: Conversation, turns: Iterable[TurnRecord]) -> Any | None:
    """The environment document after ``turns``: the ``environment`` of the last record
    that has one, else the document the conversation starts from (its pack's tools'
    ``initial_environment``, else the scenario's ``environment``); None when there is
    none (a conversation without tools)."""
    latest = None
    for turn in turns:
        if turn.environment is not None:
            latest = turn.environment
    if latest is not None:
        return latest
    if conversation.tools is not None:
        return conversation.tools.initial_environment(conversation.scenario)
    return conversation.scenario.environment


@dataclass(frozen=True)
class FinalStateMetric:
    """Whether the environment document ends as the scenario's ``final_state`` says."""

    traits: ClassVar[MetricTraits] = MetricTraits("conversation", needs=frozenset({"final_state"}))
    name: str = "final_state"
    higher_is_better: bool = True
    description: str = (
        "1.0 when every check of the scenario's final_state holds on the tools' "
        "environment document after the conversation, else 0.0 (pass/fail, as "
        "tau2-bench grades the final state); the document is the last one a tool call "
        "left, else the one the conversation started from, and details give each "
        "check's verdict. Blind to how the state was reached (see trajectory_match and "
        "tool_errors)."
    )

    def scorer(self, conversation: Conversation) -> _FinalStateScorer:
        return _FinalStateScorer(conversation)


@dataclass
class _FinalStateScorer:
    conversation: Conversation
    last: list[TurnRecord] = field(default_factory=list)
    """The latest record that left a document (at most one)."""
    turns: int = 0

    def update(self, turn: TurnRecord) -> None:
        self.turns += 1
        if turn.environment is not None:
            self.last[:] = [turn]

    def result(self) -> Score:
        checks = self.conversation.scenario.final_state
        if not checks:
            return Score.not_applicable("the scenario declares no final_state checks")
        if not self.turns:
            return Score.not_applicable("no turn was recorded")
        document = final_environment(self.conversation, self.last)
        if document is None:
            return Score.not_applicable(NO_DOCUMENT)
        verdicts = [check_state(document, check) for check in checks]
        held = sum(v.held for v in verdicts)
        return Score(
            value=1.0 if held == len(verdicts) else 0.0,
            details={
                "checks": [{"held": v.held, "message": v.message} for v in verdicts],
                "held": held,
                "total": len(verdicts),
            },
        )
