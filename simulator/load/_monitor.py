"""The load generator measuring itself: event-loop lag, CPU use, and what was in flight.

A load generator whose own event loop is late adds that delay to every latency it
reports. A ticker task asks to wake every ``interval`` seconds and records how late it
woke (the loop's lag); CPU time is read from the process at the start and end of the
measured window. In-flight counts are integrated over time exactly, on every change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

__all__ = ["InFlight", "LoopMonitor", "Progress", "TimelinePoint"]


@dataclass
class InFlight:
    """A count of things in flight and its time-weighted mean since ``reset``."""

    clock: Callable[[], float]
    now: int = 0
    peak: int = 0
    _area: float = 0.0
    _since: float = 0.0
    _last: float = 0.0

    def reset(self) -> None:
        """Start the mean (and the peak) afresh from now."""
        t = self.clock()
        self._area, self._since, self._last, self.peak = 0.0, t, t, self.now

    def change(self, delta: int) -> None:
        t = self.clock()
        self._area += self.now * (t - self._last)
        self._last = t
        self.now += delta
        if self.now > self.peak:
            self.peak = self.now

    def mean(self) -> float:
        """The time-weighted mean since ``reset``."""
        t = self.clock()
        span = t - self._since
        area = self._area + self.now * (t - self._last)
        return area / span if span > 0 else float(self.now)


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One second of the run: time (run clock), requests and sessions in flight, and
    requests completed and failed so far."""

    t_s: float
    in_flight: int
    sessions: int
    completed: int
    failed: int


@dataclass
class LoopMonitor:
    """Samples event-loop lag every ``interval`` seconds while running."""

    clock: Callable[[], float] = time.perf_counter
    interval: float = 0.01
    lags_s: list[float] = field(default_factory=list)
    recording: bool = False

    async def run(self) -> None:
        """Tick until cancelled; record each tick's lateness while ``recording``."""
        due = self.clock() + self.interval
        while True:
            await anyio.sleep(max(0.0, due - self.clock()))
            now = self.clock()
            if self.recording:
                self.lags_s.append(max(0.0, now - due))
            due = max(due + self.interval, now)


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
