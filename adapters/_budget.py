"""Rate budgets that belong to a provider key, shared by every adapter that uses it.

A :class:`ProviderBudget` paces requests per minute (smoothed: evenly spaced at 99% of
the rate, so no 60 s window ever sees more than R) and tokens per minute (acquired
as the estimated prompt + max_tokens, then corrected to the real usage). Concurrency is
capped per adapter (per role).

A 429 pauses the key for exactly what the server asked (Retry-After; 0 is no pause, an
absent header one second), up to the caller's ``max_pause``; a 429 asking for longer
(a quota used up, not an overload) makes the key refuse calls for ``max_pause`` instead
(:meth:`ProviderBudget.refusal`), so callers fail at once rather than wait for hours.
It also halves the calls it may have in flight, once per burst:
429s of calls sent before that cut are answers to the same overload and cut nothing more.
Each success then adds one call back (the cap doubles per round of calls), and the cap is
gone once it is back where the calls in flight were at the cut. A rare 429 so costs a
few calls' worth of concurrency for a moment, not the run's pace, while a real overload
still halves the load at once. :class:`Budgets` hands out one budget per key, so the
model under test, the simulated user and a judge that share an API key share its limits.

Across processes (runs on Ray), a 429's pause is heard through ``on_pause`` and passed
on to the other processes' budgets of the same key with :meth:`Budgets.pause`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from ._bucket import LeakyBucket

__all__ = [
    "BudgetLimits",
    "Budgets",
    "ProviderBudget",
    "BudgetStatistics",
    "Permit",
    "Refusal",
]


def _pacer(per_minute: float, capacity: float) -> LeakyBucket:
    """A leaky bucket of ``capacity`` draining at 99% of ``per_minute``.

    Any 60 s window then admits at most capacity + 0.99 x per_minute, which stays
    within a server's sliding-window limit when capacity <= 1% of it.
    """
    return LeakyBucket(capacity, capacity * 60.0 / (0.99 * per_minute))


@dataclass(frozen=True)
class BudgetLimits:
    """Limits of one provider key; None is unlimited."""

    rpm: float | None = None
    tpm: float | None = None


@dataclass(frozen=True)
class BudgetStatistics:
    key: str
    in_flight: int
    waiting: int
    """Calls waiting for the budget (rate, tokens, concurrency or a 429 pause)."""
    retrying: int
    """Calls waiting to retry after a failed attempt."""
    requests: int
    rate_limited: int
    """429 answers received."""
    in_flight_cap: float | None
    """Calls the key may have in flight after 429s; None when uncapped."""


@dataclass
class Permit:
    """One admitted call: what it claimed and how long it waited."""

    tokens: float
    queue_wait_s: float
    sequence: int = 0
    """The order in which the key admitted it (1, 2, ...): tells a 429 of a call sent
    before the last cut of the cap from one sent after it."""


@dataclass(frozen=True)
class Refusal:
    """The key refuses calls: a 429 asked for a longer wait than its caller takes."""

    asked_s: float
    """The wait the server asked for (Retry-After), in seconds."""
    remaining_s: float
    """Seconds until the key sends again (the caller's ``max_pause`` after the 429)."""


@dataclass
class ProviderBudget:
    key: str
    limits: BudgetLimits
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    _requests: LeakyBucket | None = None
    _tokens: LeakyBucket | None = None
    _paused_until: float = 0.0
    _cap: float | None = None
    """Calls the key may have in flight since a 429 (None: no cap); see rate_limited."""
    _admitted: int = 0
    """Calls admitted so far (the last permit's sequence)."""
    _cut_after: int = -1
    """The sequence of the last call admitted before the cap was last cut."""
    _freed: anyio.Event | None = None
    _refused_until: float = 0.0
    _refused_asked: float = 0.0
    """What the 429 behind the refusal asked for (see rate_limited's ``max_pause``)."""
    on_pause: Callable[[str, float], None] | None = None
    """Called with (key, seconds) when a 429 pauses the key: how other processes using
    the key hear of it (None: nobody listens)."""
    _stats: dict[str, int] = field(
        default_factory=lambda: {
            "in_flight": 0,
            "waiting": 0,
            "retrying": 0,
            "requests": 0,
            "rate_limited": 0,
        }
    )

    def __post_init__(self) -> None:
        self._build()

    def _build(self) -> None:
        rpm, tpm = self.limits.rpm, self.limits.tpm
        # requests one at a time (no burst at all); tokens up to 1% of the minute's
        # budget at once (a larger claim is capped to it, so it still gets through)
        self._requests = _pacer(rpm, capacity=1.0) if rpm else None
        self._tokens = _pacer(tpm, capacity=max(1.0, tpm / 100)) if tpm else None

    def tighten(self, limits: BudgetLimits) -> None:
        """Adopt the stricter of the current and the given limits (before calls start)."""
        stricter = BudgetLimits(
            rpm=_min(self.limits.rpm, limits.rpm), tpm=_min(self.limits.tpm, limits.tpm)
        )
        if stricter != self.limits:
            self.limits = stricter
            self._build()

    async def acquire(
        self, tokens: float, *, sleep: Callable[[float], Awaitable[None]] | None = None
    ) -> Permit:
        """Wait until the key may send a call claiming ``tokens``; return the permit.

        ``sleep`` is the caller's (adapters inject theirs in tests); the budget's own
        otherwise.
        """
        sleep = sleep or self.sleep
        started = self.clock()
        self._stats["waiting"] += 1
        try:
            delay = self._paused_until - self.clock()
            if delay > 0:  # a 429 paused the key
                await sleep(delay)
            while self._cap is not None and self._stats["in_flight"] >= self._cap:
                if self._freed is None:
                    self._freed = anyio.Event()
                await self._freed.wait()
            if self._requests is not None:
                await self._requests.acquire()
            if self._tokens is not None:
                tokens = min(tokens, self._tokens.capacity)
                await self._tokens.acquire(tokens)
        finally:
            self._stats["waiting"] -= 1
        self._stats["in_flight"] += 1
        self._stats["requests"] += 1
        self._admitted += 1
        return Permit(tokens, self.clock() - started, self._admitted)

    def release(self, permit: Permit, used_tokens: float | None, *, ok: bool) -> None:
        """End the call and correct its token claim to ``used_tokens``."""
        self._stats["in_flight"] -= 1
        if self._freed is not None:
            self._freed.set()
            self._freed = None
        if self._tokens is not None and used_tokens is not None:
            difference = permit.tokens - used_tokens
            if difference > 0:
                self._tokens.refund(difference)
            elif difference < 0:
                # over budget: claim the rest now, without waiting (the tokens are spent)
                self._tokens.charge(-difference)
        if ok and self._cap is not None:
            # quick recovery: one more call in flight per success (the cap doubles per
            # round of calls), and no cap once back where the cut started
            self._cap += 1.0
            if self._cap >= self._uncapped_at:
                self._cap = None

    def rate_limited(
        self,
        retry_after: float | None,
        permit: Permit | None = None,
        *,
        max_pause: float | None = None,
    ) -> float:
        """A 429 for the call holding ``permit``: pause the key for Retry-After (0: not
        at all; absent: 1 s), and halve the calls it may have in flight unless the cap
        was already cut after that call was sent (one cut per burst of 429s).

        A Retry-After beyond ``max_pause`` pauses the key for ``max_pause`` only, and
        the key refuses calls meanwhile (:meth:`refusal`). Returns the pause taken.
        """
        self._stats["rate_limited"] += 1
        asked = 1.0 if retry_after is None else retry_after
        pause = asked if max_pause is None else min(asked, max_pause)
        now = self.clock()
        if pause < asked and now + pause >= self._refused_until:
            self._refused_until, self._refused_asked = now + pause, asked
        self._paused_until = max(self._paused_until, now + pause)
        if self.on_pause is not None and pause > 0:
            self.on_pause(self.key, pause)
        self._cut(permit)
        return pause

    def refusal(self) -> Refusal | None:
        """The refusal in force (a 429 asked for more than its caller's ``max_pause``
        lately), or None: a call should then fail at once instead of waiting."""
        if not self._refused_until:  # never refused: no clock read on the hot path
            return None
        remaining = self._refused_until - self.clock()
        if remaining <= 0:
            return None
        return Refusal(self._refused_asked, remaining)

    def _cut(self, permit: Permit | None) -> None:
        """Halve the calls in flight, once per burst of 429s."""
        if permit is not None and permit.sequence <= self._cut_after:
            return  # sent before the last cut: the same overload, already answered
        self._cut_after = self._admitted
        if self._cap is None:
            in_flight = float(self._stats["in_flight"])
            self._uncapped_at = max(2.0, in_flight)
            self._cap = max(1.0, in_flight / 2)
        else:
            self._cap = max(1.0, self._cap / 2)

    def pause(self, seconds: float) -> None:
        """Send nothing for ``seconds``: a 429's pause heard from another process using
        the key (the calls in flight here are not cut: that process's 429 was not theirs)."""
        if seconds > 0:
            self._paused_until = max(self._paused_until, self.clock() + seconds)

    @property
    def paused_for(self) -> float:
        """Seconds until the key may send again (0 when it is not paused)."""
        return max(0.0, self._paused_until - self.clock())

    _uncapped_at: float = 2.0
    """Where a recovering cap is lifted: the calls in flight at the first cut."""

    def retrying(self, delta: int) -> None:
        self._stats["retrying"] += delta

    async def retry_wait(self, sleep: Callable[[float], Awaitable[None]], seconds: float) -> None:
        """``sleep(seconds)`` before a retry, counted as retrying while it lasts (the
        adapters' wait between attempts)."""
        self.retrying(+1)
        try:
            await sleep(seconds)
        finally:
            self.retrying(-1)

    def statistics(self) -> BudgetStatistics:
        s = self._stats
        return BudgetStatistics(
            self.key,
            s["in_flight"],
            s["waiting"],
            s["retrying"],
            s["requests"],
            s["rate_limited"],
            self._cap,
        )


class Budgets:
    """One :class:`ProviderBudget` per provider key.

    Adapters asking for the same key share one budget with the stricter of their
    limits; ``on_pause(key, seconds)`` hears every 429 pause. Create one per
    application (a :class:`~convsim.Simulator` owns one); nothing is shared between two
    instances.
    """

    def __init__(self, *, on_pause: Callable[[str, float], None] | None = None) -> None:
        self._budgets: dict[str, ProviderBudget] = {}
        self._on_pause = on_pause

    def get(self, key: str, limits: BudgetLimits) -> ProviderBudget:
        budget = self._budgets.get(key)
        if budget is None:
            budget = ProviderBudget(key, limits, on_pause=self._on_pause)
            self._budgets[key] = budget
        else:
            budget.tighten(limits)
        return budget

    def pause(self, key: str, seconds: float) -> bool:
        """Pause the budget of ``key`` for ``seconds`` (a 429 another process heard);
        False when no adapter here uses that key."""
        budget = self._budgets.get(key)
        if budget is None:
            return False
        budget.pause(seconds)
        return True

    def statistics(self) -> list[BudgetStatistics]:
        return [b.statistics() for b in self._budgets.values()]


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
