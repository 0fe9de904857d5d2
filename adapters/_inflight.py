"""A budget of answer bytes held at once by every call of one adapter.

``max_body_bytes`` bounds one answer; at a concurrency of 32, 32 answers near that
limit would still fill memory together. :class:`BytesInFlight` counts the bytes the
calls of one adapter are reading (bodies and streams, after decompression) and refuses
a piece that would take the total past ``max_inflight_bytes``: that call fails at once
with :class:`~convsim.ResponseTooLarge` and gives back what it held. It never waits for
bytes to come free: calls each holding part of the budget would wait for one another.
"""

from __future__ import annotations

from dataclasses import dataclass

from convsim._errors import ResponseTooLarge

__all__ = ["BytesInFlight", "Holding", "InflightStatistics", "SETTING"]

SETTING = "max_inflight_bytes"
"""The adapter argument that sets the budget."""


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


@dataclass(frozen=True)
class InflightStatistics:
    limit: int
    held: int
    """Bytes held now by calls reading their answers."""
    peak: int
    """The most ever held at once."""
    refused: int
    """Calls failed because their answer would have passed the limit."""


class BytesInFlight:
    """The bytes being read by an adapter's calls, against ``limit``; one per adapter."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._peak = 0
        self._refused = 0

    def holding(self, what: str) -> Holding:
        """What one call will hold while it reads ``what`` (such as the answer from a
        URL); release it when the call ends."""
        return Holding(self, what)

    def statistics(self) -> InflightStatistics:
        return InflightStatistics(self.limit, self._held, self._peak, self._refused)


class Holding:
    """The bytes one call holds. :meth:`take` is called for each piece before it is
    kept; :meth:`release` gives every byte back (a ``with`` block does it)."""

    __slots__ = ("_budget", "_what", "held")

    def __init__(self, budget: BytesInFlight, what: str) -> None:
        self._budget = budget
        self._what = what
        self.held = 0

    def take(self, size: int) -> None:
        """Count ``size`` more bytes, or raise ResponseTooLarge if all calls together
        would pass the limit (this call's bytes stay held until :meth:`release`)."""
        budget = self._budget
        total = budget._held + size
        if total > budget.limit:
            budget._refused += 1
            others = budget._held - self.held
            raise ResponseTooLarge(
                f"reading {self._what} would take the answers this adapter is reading "
                f"past {SETTING}={budget.limit} ({_mib(budget.limit)}): other calls "
                f"hold {_mib(others)}; lower --concurrency or raise --model-arg "
                f"{SETTING}=BYTES",
                limit=budget.limit,
                setting=SETTING,
                retryable=True,  # by the retry, the others' answers have been read
            )
        budget._held = total
        self.held += size
        if total > budget._peak:
            budget._peak = total

    def release(self) -> None:
        self._budget._held -= self.held
        self.held = 0

    def __enter__(self) -> Holding:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
