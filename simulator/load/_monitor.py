"""What a load run shows while it runs: a timeline of each second, and progress snapshots.

The gauges it reads (requests in flight, event-loop lag) are :mod:`convsim._gauges`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Progress", "TimelinePoint"]


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One second of the run: time (run clock), requests and sessions in flight, and
    requests completed and failed so far."""

    t_s: float
    in_flight: int
    sessions: int
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class Progress:
    """A snapshot of a running point, for a live display."""

    label: str
    elapsed_s: float
    measuring: bool
    """Whether the measured window has begun (ramp-up and warm-up are over)."""
    completed: int
    failed: int
    in_flight: int
    sessions: int
    recent_ttft_ms: float | None
    """Median of the latest answers' time to first token."""
    recent_e2e_ms: float | None
