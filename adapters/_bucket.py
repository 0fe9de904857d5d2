"""A leaky bucket on anyio primitives: pacing that works under asyncio and trio alike.

The bucket holds at most ``capacity`` and drains ``capacity`` every ``period`` seconds.
:meth:`LeakyBucket.acquire` pours an amount in, waiting first until it fits; waiters are
served in the order they came (a large claim is not starved by a stream of small ones).
Unlike aiolimiter's, whose waiting is asyncio's, this one gives back what a call
over-claimed (:meth:`~LeakyBucket.refund`, which wakes the waiter at the head at once)
and charges what it used beyond its claim (:meth:`~LeakyBucket.charge`).

Time is the event loop's clock, the one its timeouts run on, so a test clock (trio's
``MockClock``, an asyncio loop with its own ``time()``) moves the bucket as it moves the
sleeps. Like aiolimiter's, a bucket belongs to the event loop it is first used in: it
reads that loop's clock directly, several times cheaper than through anyio.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

import anyio
import sniffio

__all__ = ["LeakyBucket"]

_SLACK = 1e-9
"""Relative tolerance of "it fits": a waiter woken when the computed drain has passed
must not sleep again for a rounding error."""


class _Waiter:
    """One caller waiting for room: woken to look again (a new event each time)."""

    __slots__ = ("woken",)

    def __init__(self) -> None:
        self.woken = anyio.Event()


class LeakyBucket:
    """A leaky bucket of ``capacity`` draining ``capacity`` per ``period`` seconds."""

    __slots__ = ("_clock", "_last", "_level", "_rate", "_waiters", "capacity", "period")

    def __init__(
        self, capacity: float, period: float, *, clock: Callable[[], float] | None = None
    ) -> None:
        if not (capacity > 0 and period > 0 and math.isfinite(capacity * period)):
            raise ValueError(
                f"a bucket needs a capacity and a period above 0: {capacity}, {period}"
            )
        self.capacity = capacity
        self.period = period
        self._rate = capacity / period
        self._clock = clock
        """Seconds, on the clock the event loop's sleeps use; None: the running loop's,
        looked up at the first use."""
        self._level = 0.0
        self._last: float | None = None
        """When the level was last drained (None: never filled, so nothing to drain)."""
        self._waiters: deque[_Waiter] = deque()

    @property
    def level(self) -> float:
        """What the bucket holds now."""
        self._drain()
        return self._level

    @property
    def waiting(self) -> int:
        """Callers waiting for room."""
        return len(self._waiters)

    def has_capacity(self, amount: float = 1.0) -> bool:
        """Whether ``amount`` fits now (waiters aside)."""
        self._drain()
        return self._fits(amount)

    async def acquire(self, amount: float = 1.0) -> None:
        """Wait until ``amount`` fits, after every earlier waiter, then pour it in.

        Raises:
            ValueError: ``amount`` is more than the bucket holds (it would never fit).
        """
        if amount > self.capacity:
            raise ValueError(f"cannot acquire {amount:g}: the bucket holds {self.capacity:g}")
        if not self._waiters:
            self._drain()
            if self._fits(amount):  # the hot path: no wait, no checkpoint
                self._level += amount
                return
        waiter = _Waiter()
        self._waiters.append(waiter)
        try:
            while True:
                delay: float | None = None  # behind others: until woken at the head
                if self._waiters[0] is waiter:
                    self._drain()
                    missing = self._level + amount - self.capacity
                    if missing <= _SLACK * self.capacity:
                        break
                    delay = missing / self._rate
                with anyio.move_on_after(delay):
                    await waiter.woken.wait()
                waiter.woken = anyio.Event()
        except BaseException:
            self._waiters.remove(waiter)
            self._wake_head()
            raise
        self._waiters.popleft()
        self._level += amount
        self._wake_head()

    def refund(self, amount: float) -> None:
        """Give back ``amount`` poured in earlier (a claim larger than the use)."""
        self._drain()
        self._level = max(0.0, self._level - amount)
        self._wake_head()

    def charge(self, amount: float) -> None:
        """Pour ``amount`` in without waiting (what was used beyond a claim is spent);
        the bucket may then hold more than its capacity, and waiters wait longer."""
        self._drain()
        self._level += amount

    def _fits(self, amount: float) -> bool:
        return self._level + amount <= self.capacity * (1 + _SLACK)

    def _drain(self) -> None:
        clock = self._clock
        if clock is None:
            clock = self._clock = _loop_clock()
        now = clock()
        if self._last is not None and self._level:
            self._level = max(0.0, self._level - (now - self._last) * self._rate)
        self._last = now

    def _wake_head(self) -> None:
        """Let the first waiter look again: the level or the queue changed."""
        if self._waiters:
            self._waiters[0].woken.set()


def _loop_clock() -> Callable[[], float]:
    """The running event loop's clock: asyncio's ``loop.time`` itself (anyio's
    ``current_time`` finds the loop anew at every call); anyio's elsewhere."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return anyio.current_time  # raises outside an event loop, saying so
    return asyncio.get_running_loop().time if library == "asyncio" else anyio.current_time
