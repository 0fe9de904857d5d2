"""The conversation state machine: states, legal transitions, and the pure turn planner.

The planner decides which turn runs next and which are skipped (and why) from the
outcomes so far, without any I/O; the actor performs the I/O it asks for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from convsim._errors import InvalidTransition
from convsim.scenarios import Conversation, PreparedTurn

from .._records import Status, TerminationReason, TurnStatus

__all__ = [
    "ConversationState",
    "TRANSITIONS",
    "StateMachine",
    "TurnPlanner",
    "Run",
    "Skip",
    "Finish",
]


class ConversationState(Enum):
    PENDING = "PENDING"
    """Created, no turn started."""
    USER_TURN = "USER_TURN"
    """Producing the user's message (render the template; ask the simulated user)."""
    ASSISTANT_TURN = "ASSISTANT_TURN"
    """Waiting for the model under test."""
    SCORING = "SCORING"
    """Handing the finished turn record to the scorers and choosing what comes next."""
    DONE = "DONE"
    """Ended normally (all turns, max_turns, or the user stopped)."""
    FAILED = "FAILED"
    """A required turn failed; the cause is recorded."""
    TIMED_OUT = "TIMED_OUT"
    """conversation_timeout elapsed."""
    CANCELLED = "CANCELLED"
    """The run was stopped before this conversation finished."""


_S = ConversationState
_ENDINGS = frozenset({_S.FAILED, _S.TIMED_OUT, _S.CANCELLED})
TRANSITIONS: dict[ConversationState, frozenset[ConversationState]] = {
    _S.PENDING: frozenset({_S.USER_TURN, _S.DONE}) | _ENDINGS,
    _S.USER_TURN: frozenset({_S.ASSISTANT_TURN, _S.SCORING, _S.DONE}) | _ENDINGS,
    # FAILED straight from ASSISTANT_TURN only when convsim itself breaks mid-call; a
    # failed model call goes through SCORING so its turn record reaches the scorers.
    _S.ASSISTANT_TURN: frozenset({_S.SCORING}) | _ENDINGS,
    _S.SCORING: frozenset({_S.USER_TURN, _S.DONE}) | _ENDINGS,
    _S.DONE: frozenset(),
    _S.FAILED: frozenset(),
    _S.TIMED_OUT: frozenset(),
    _S.CANCELLED: frozenset(),
}
TERMINAL = frozenset(s for s, targets in TRANSITIONS.items() if not targets)
_STATUS = {
    _S.DONE: Status.DONE,
    _S.FAILED: Status.FAILED,
    _S.TIMED_OUT: Status.TIMED_OUT,
    _S.CANCELLED: Status.CANCELLED,
}


@dataclass
class StateMachine:
    """Holds one conversation's state and refuses illegal transitions."""

    conversation_id: str
    state: ConversationState = ConversationState.PENDING

    def advance(self, target: ConversationState) -> None:
        if target not in TRANSITIONS[self.state]:
            raise InvalidTransition(self.conversation_id, self.state.value, target.value)
        self.state = target

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def status(self) -> Status:
        if self.state not in TERMINAL:
            raise InvalidTransition(self.conversation_id, self.state.value, "a final status")
        return _STATUS[self.state]


@dataclass(frozen=True)
class Run:
    turn: PreparedTurn


@dataclass(frozen=True)
class Skip:
    turn: PreparedTurn
    reason: str


@dataclass(frozen=True)
class Finish:
    reason: TerminationReason
    failed_turn: str | None = None
    """The required turn whose failure ended the conversation, if one did."""


@dataclass
class TurnPlanner:
    """Walks a flow: which turn runs next, which are skipped, when it ends.

    Pure: feed it each turn's outcome with :meth:`record`; iterate :meth:`steps`.
    """

    conversation: Conversation
    max_turns: int | None = None
    outcomes: dict[str, TurnStatus] = field(default_factory=dict)
    _failed_required: str | None = None
    _failure: TerminationReason = TerminationReason.INTERNAL_ERROR

    def record(
        self,
        turn: PreparedTurn,
        status: TurnStatus,
        *,
        failure: TerminationReason = TerminationReason.INTERNAL_ERROR,
    ) -> None:
        """Note how ``turn`` ended; ``failure`` says why, when it failed."""
        self.outcomes[turn.turn_id] = status
        if (
            status is TurnStatus.FAILED
            and not turn.config.optional
            and self._failed_required is None
        ):
            self._failed_required, self._failure = turn.turn_id, failure

    def steps(self) -> Iterator[Run | Skip | Finish]:
        """Yield Run/Skip for each turn in order, then one Finish.

        The caller must :meth:`record` the outcome of each Run before asking for the
        next step; a failed required turn ends the walk.
        """
        flow = self.conversation.flow
        limit = self.max_turns or flow.flow.max_turns or len(flow.turns)
        executed = 0
        hit_limit = False
        for turn in self.conversation.flow.turns:
            if self._failed_required is not None:
                reason: str | None = f"conversation ended: turn {self._failed_required!r} failed"
            elif executed >= limit:
                hit_limit = True
                reason = f"max_turns ({limit}) reached"
            else:
                reason = self._skip_reason(turn)
            if reason is not None:
                self.outcomes[turn.turn_id] = TurnStatus.SKIPPED
                yield Skip(turn, reason)
                continue
            executed += 1
            yield Run(turn)
        if self._failed_required is not None:
            yield Finish(self._failure, failed_turn=self._failed_required)
        else:
            yield Finish(TerminationReason.MAX_TURNS if hit_limit else TerminationReason.COMPLETED)

    def _skip_reason(self, turn: PreparedTurn) -> str | None:
        for dep in turn.config.depends_on:
            outcome = self.outcomes.get(dep)
            if outcome is not TurnStatus.COMPLETED:
                what = (
                    "was skipped"
                    if outcome is TurnStatus.SKIPPED
                    else ("failed" if outcome is TurnStatus.FAILED else "has not run")
                )
                return f"depends on {dep!r}, which {what}"
        if turn.config.optional:
            missing = self.conversation.missing_variables(turn)
            if missing:
                return f"optional turn: the scenario does not define {', '.join(sorted(missing))}"
        return None
