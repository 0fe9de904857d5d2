"""Gauges a run keeps of itself: what is in flight, and how late its event loop is.

Both the runtime (admission held back while the loop lags) and the load generator (runs
flagged invalid when it lagged) read them. In-flight counts are integrated over time
exactly, on every change; lag is sampled by a ticker task that asks to wake every
``interval`` seconds and records how late it woke.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

__all__ = ["InFlight", "LoopMonitor"]


@dataclass
class InFlight:
    """A count of things in flight and its time-weighted mean since ``reset``."""

    clock: Callable[[], float]
    now: int = 0
    peak: int = 0
    _area: float = 0.0
    _since: float = 0.0
    _last: float = 0.0

    def __post_init__(self) -> None:
        self.reset()

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


@dataclass
class LoopMonitor:
    """Samples event-loop lag every ``interval`` seconds while running.

    ``recent_s`` is the largest lag of the last ``window`` ticks; :meth:`calm` waits
    until it is at most a given lag (admission control). One late tick is followed by an
    early one, so the latest tick alone would forget a busy loop at once.
    """

    clock: Callable[[], float] = time.perf_counter
    interval: float = 0.01
    lags_s: list[float] = field(default_factory=list)
    recording: bool = False
    window: int = 10
    _recent: deque[float] = field(default_factory=deque)
    _tick: anyio.Event | None = None

    @property
    def recent_s(self) -> float:
        """The largest lag of the last ``window`` ticks (0 before the first)."""
        return max(self._recent, default=0.0)

    async def run(self) -> None:
        """Tick until cancelled; record each tick's lateness while ``recording``."""
        due = self.clock() + self.interval
        while True:
            await anyio.sleep(max(0.0, due - self.clock()))
            now = self.clock()
            lag = max(0.0, now - due)
            self._recent.append(lag)
            if len(self._recent) > self.window:
                self._recent.popleft()
            if self.recording:
                self.lags_s.append(lag)
            if self._tick is not None:
                self._tick.set()
                self._tick = None
            due = max(due + self.interval, now)

    async def calm(self, max_lag_s: float) -> bool:
        """Return once the recent ticks were at most ``max_lag_s`` late (at once when
        they were); whether it had to wait. Only while :meth:`run` runs."""
        waited = False
        while self.recent_s > max_lag_s:
            waited = True
            if self._tick is None:
                self._tick = anyio.Event()
            await self._tick.wait()
        return waited
