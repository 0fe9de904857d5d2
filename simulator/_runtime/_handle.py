"""The handle of one run: what the caller holds while the run goes on (its results,
its progress, its stop), and the state the run shares with it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from convsim.adapters import Budgets
from convsim.scenarios import Pack

from .._gauges import InFlight
from .._records import Status
from ..results._sinks import RunManifest
from ._cost import CostMeter
from ._result_stream import ResultStream

__all__ = ["RunHandle", "RunStatistics"]


@dataclass(frozen=True)
class RunStatistics:
    """A snapshot of one run's progress."""

    run_id: str
    total: int
    """Conversations this run will attempt (after --limit and resume)."""
    resumed: int
    """Conversations skipped because the results file already holds them."""
    started: int
    in_flight: int
    done: int
    failed: int
    timed_out: int
    cancelled: int
    turns: int
    """Turns completed by the model under test."""
    retrying: int
    """Model calls waiting to retry after a failed attempt (all of the simulator's)."""
    elapsed_s: float
    infrastructure_failures: int = 0
    """Conversations of this run that failed for infrastructure reasons (FAILED with
    ``infrastructure_error``). A TIMED_OUT conversation is not one: its deadline is a
    setting (``timed_out``, ``timeouts_s``)."""
    stopped_early: str | None = None
    """Why the circuit breaker stopped the run before its last conversation (the
    endpoint looked gone); None when it did not."""
    mean_in_flight: float = 0.0
    """Conversations alive at once, averaged over the run's time so far."""
    max_in_flight: int = 0
    """The most conversations alive at once."""
    admission_held: int = 0
    """Conversations whose start waited for the event loop to catch up (its lag above
    ``max_loop_lag``): the run was as busy as this process could time accurately."""
    timeouts_s: tuple[float, ...] = ()
    """The conversation timeouts (seconds) the TIMED_OUT conversations hit, each once."""
    slowest_turn_s: float | None = None
    """The longest a completed turn of this run took (seconds); None before one did."""
    clipped_turns: int = 0
    """Turns whose pack max_tokens the user's cap (``max_tokens``) clipped."""
    stopped: str | None = None
    """What stopped the run before its last conversation: ``max_cost`` (the cost cap)
    or ``circuit_breaker``; None when nothing did."""
    cost_usd: float | None = None
    """What this run's recorded conversations cost (model, simulated user and judge),
    counted when the run has a cost cap; None otherwise."""
    cost_stop: str | None = None
    """Why the cost cap stopped the run (one line); None when it did not."""

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.timed_out + self.cancelled

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "finished": self.finished}


@dataclass
class _Counters:
    total: int = 0
    resumed: int = 0
    started: int = 0
    turns: int = 0
    infrastructure_failures: int = 0
    admission_held: int = 0
    clipped_turns: int = 0
    slowest_turn_s: float | None = None
    timeouts_s: set[float] = field(default_factory=set)
    by_status: dict[Status, int] = field(default_factory=lambda: dict.fromkeys(Status, 0))


@dataclass
class _Stopping:
    """Shared by the tasks of one run: lets a cancellation become a graceful stop."""

    grace_period: float
    inflight: dict[str, anyio.CancelScope] = field(default_factory=dict)
    dispatch: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    deadline: float | None = None
    finished: bool = False
    on_stop: list[Callable[[float], None]] = field(default_factory=list)
    """Told each stop's deadline, also once every conversation has ended: plugin hooks
    may still be running then."""

    def begin(self, grace_period: float | None = None) -> None:
        """Start no more conversations; cancel in-flight ones after the grace period.

        Calling it again with a shorter grace period brings the deadline forward.
        """
        grace = self.grace_period if grace_period is None else grace_period
        deadline = anyio.current_time() + grace
        for notify in self.on_stop:
            notify(deadline)
        if self.finished:
            return
        if self.deadline is not None and self.deadline <= deadline:
            return
        self.deadline = deadline
        self.dispatch.cancel()
        for scope in self.inflight.values():
            scope.deadline = min(scope.deadline, deadline)


class RunHandle(ResultStream):
    """One run: iterate it for results as conversations finish.

    Returned by :meth:`Simulator.run`; the work starts on creation and goes on in the
    simulator's task group whether or not you iterate.
    """

    def __init__(self, run_id: str, pack: Pack, grace_period: float, budgets: Budgets) -> None:
        super().__init__()
        self.run_id = run_id
        self.pack = pack
        self._counters = _Counters()
        self._started = time.perf_counter()
        self._alive = InFlight(time.perf_counter)
        self._stopping = _Stopping(grace_period)
        self._budgets = budgets
        self._stopped_early: str | None = None
        self._cost: CostMeter | None = None
        """The run's cost cap, when it has one."""
        self.manifest: RunManifest | None = None

    async def wait(self) -> None:
        """Wait until the run has ended. Results not yet read stay available until the
        simulator's ``async with`` block ends."""
        await self._finished.wait()
        if self._error is not None:
            raise self._error

    def stop(self, grace_period: float | None = None) -> None:
        """Start no more conversations; in-flight ones get the grace period.

        Args:
            grace_period: seconds in-flight conversations may still take (default: the
                simulator's); a second call with 0 cancels them at once.
        """
        self._stopping.begin(grace_period)

    def statistics(self) -> RunStatistics:
        c, cost = self._counters, self._cost
        by = c.by_status
        finished = sum(by.values())
        return RunStatistics(
            run_id=self.run_id,
            total=c.total,
            resumed=c.resumed,
            started=c.started,
            in_flight=c.started - finished,
            done=by[Status.DONE],
            failed=by[Status.FAILED],
            timed_out=by[Status.TIMED_OUT],
            cancelled=by[Status.CANCELLED],
            turns=c.turns,
            retrying=sum(b.retrying for b in self._budgets.statistics()),
            elapsed_s=time.perf_counter() - self._started,
            infrastructure_failures=c.infrastructure_failures,
            stopped_early=self._stopped_early,
            mean_in_flight=self._alive.mean(),
            max_in_flight=self._alive.peak,
            admission_held=c.admission_held,
            timeouts_s=tuple(sorted(c.timeouts_s)),
            slowest_turn_s=c.slowest_turn_s,
            clipped_turns=c.clipped_turns,
            stopped=_stopped(self._stopped_early, cost),
            cost_usd=None if cost is None else cost.spent,
            cost_stop=None if cost is None else cost.stopped,
        )


def _stopped(breaker: str | None, cost: CostMeter | None) -> str | None:
    """What stopped the run early, by name."""
    if cost is not None and cost.stopped is not None:
        return "max_cost"
    return "circuit_breaker" if breaker is not None else None
