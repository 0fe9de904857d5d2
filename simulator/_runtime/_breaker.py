"""The circuit breaker: a run stops starting conversations once its endpoint looks gone,
rather than failing every conversation left (they stay unrecorded, for ``--resume``)."""

from __future__ import annotations

from dataclasses import dataclass

from .._plural import counted
from .._records import ConversationResult, Status, TerminationReason, TurnStatus

__all__ = ["CircuitBreaker", "is_infrastructure_failure"]


def is_infrastructure_failure(result: ConversationResult) -> bool:
    """Whether a conversation failed for reasons outside the model: a call that failed
    on the server, the network, a rate limit or a local limit (``infrastructure_error``).

    A conversation that hit its deadline (TIMED_OUT, ``conversation_timeout``) is not
    one: the model answers too slowly for a setting the user can raise, which is told
    apart (its own exit code, its own line) rather than blamed on the endpoint."""
    return (
        result.status is Status.FAILED
        and result.termination_reason is TerminationReason.INFRASTRUCTURE_ERROR
    )


@dataclass
class CircuitBreaker:
    """Trips after ``threshold`` conversations in a row failed for infrastructure
    reasons without a single answer from the model; any conversation with an answered
    turn, or that failed for another reason, starts the count again. A conversation
    that timed out without an answer neither counts nor starts it again."""

    threshold: int
    """Conversations in a row; 0 never trips."""
    streak: int = 0
    reason: str | None = None
    """Why it tripped (one line); None while it has not."""

    def record(self, result: ConversationResult) -> bool:
        """Count one finished conversation; True when this one trips the breaker."""
        if not self.threshold or self.reason is not None or result.status is Status.CANCELLED:
            return False
        answered = any(turn.status is TurnStatus.COMPLETED for turn in result.turns)
        if not answered and result.status is Status.TIMED_OUT:
            return False  # a deadline says nothing of the endpoint: the streak stands
        if answered or not is_infrastructure_failure(result):
            self.streak = 0
            return False
        self.streak += 1
        if self.streak < self.threshold:
            return False
        error = result.error
        last = f"{error.type}: {error.message}" if error else result.termination_reason.value
        self.reason = (
            f"{counted(self.streak, 'conversation')} in a row failed for infrastructure reasons "
            f"(last: {' '.join(last.split())[:200]})"
        )
        return True
