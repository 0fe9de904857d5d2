"""The cost cap of a run (``max_cost``): what was spent, and whether the next
conversation may start.

A conversation may start while what the run has spent (the model under test's, the
simulated user's and the judge's calls of every recorded conversation, as their
adapters price them) plus what the conversations in flight and this one may still
cost stays within the cap. What a conversation may cost is its upper bound from the
pack (every answer at its cap, :class:`~convsim._runtime._estimate.CostEstimator`),
scaled by how far below their bounds the finished conversations stayed; before any
has finished, the bound itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from convsim.scenarios import Conversation

from .._plural import counted
from .._records import ConversationResult
from ._estimate import CostEstimator

__all__ = ["CostMeter", "result_cost"]


def result_cost(result: ConversationResult) -> float:
    """What ``result`` cost (USD): its model's, its simulated user's and its judge's
    calls, as far as each was priced."""
    total = (result.cost_usd or 0.0) + (result.user_cost_usd or 0.0)
    for score in result.scores.values():
        judged = score.details.get("judge_cost_usd")
        if isinstance(judged, (int, float)) and not isinstance(judged, bool):
            total += float(judged)
    for scores in result.turn_scores.values():
        for score in scores.values():
            judged = score.details.get("judge_cost_usd")
            if isinstance(judged, (int, float)) and not isinstance(judged, bool):
                total += float(judged)
    return total


@dataclass
class CostMeter:
    """Spent and reserved cost of one run against its cap (USD)."""

    limit: float
    estimator: CostEstimator
    spent: float = 0.0
    reserved: dict[str, float] = field(default_factory=dict)
    """What each conversation in flight may still cost, by conversation id."""
    _bounds: dict[str, float | None] = field(default_factory=dict)
    _spent_bounded: float = 0.0
    """Spent by the finished conversations that had a bound ..."""
    _bound_finished: float = 0.0
    """... and the sum of those bounds."""
    _finished: int = 0
    stopped: str | None = None
    """Why the cap stopped the run (one line); None while it has not."""

    def scale(self) -> float:
        """How much of its bound a conversation spends, as the finished ones did (1
        before any has)."""
        if self._bound_finished <= 0:
            return 1.0
        return self._spent_bounded / self._bound_finished

    def reservation(self, conv: Conversation) -> float:
        """What ``conv`` may cost: its bound scaled (see :meth:`scale`); without a bound
        (an answer with no cap), the mean of the finished conversations."""
        bound = self._bounds[conv.conversation_id] = self.estimator.high_cost(conv)
        if bound is not None:
            return bound * self.scale()
        return self.spent / self._finished if self._finished else 0.0

    def admit(self, conv: Conversation) -> bool:
        """Reserve ``conv``'s cost and say True, or say False (and why, in
        :attr:`stopped`) when it could take the run past the cap."""
        if self.stopped is not None:
            return False
        reserve = self.reservation(conv)
        in_flight = sum(self.reserved.values())
        if self.spent + in_flight + reserve > self.limit:
            self.stopped = (
                f"spent ${self.spent:.4f} of --max-cost ${self.limit:g}, "
                f"{counted(len(self.reserved), 'conversation')} in flight may cost "
                f"${in_flight:.4f} more and the next up to ${reserve:.4f}"
            )
            return False
        self.reserved[conv.conversation_id] = reserve
        return True

    def record(self, result: ConversationResult) -> None:
        """Count what a finished conversation cost; its reservation is released."""
        cid = result.conversation_id
        self.reserved.pop(cid, None)
        cost = result_cost(result)
        self.spent += cost
        self._finished += 1
        bound = self._bounds.pop(cid, None)
        if bound:
            self._spent_bounded += cost
            self._bound_finished += bound
