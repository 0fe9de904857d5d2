"""The run's gauges of itself: time-weighted in-flight counts and event-loop lag."""

from __future__ import annotations

import anyio
import pytest

from convsim._gauges import InFlight, LoopMonitor

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_in_flight_mean_is_weighted_by_time() -> None:
    clock = Clock()
    gauge = InFlight(clock)
    gauge.change(+2)  # 2 for 1 s
    clock.t += 1.0
    gauge.change(+2)  # 4 for 3 s
    clock.t += 3.0
    gauge.change(-4)  # 0 for 1 s
    clock.t += 1.0
    assert gauge.mean() == pytest.approx((2 * 1 + 4 * 3) / 5)
    assert (gauge.now, gauge.peak) == (0, 4)


def test_reset_starts_the_mean_and_peak_afresh() -> None:
    clock = Clock()
    gauge = InFlight(clock)
    gauge.change(+5)
    clock.t += 2.0
    gauge.change(-4)
    gauge.reset()
    clock.t += 2.0
    assert gauge.mean() == pytest.approx(1.0)
    assert gauge.peak == 1


def test_mean_before_any_time_passed_is_the_count() -> None:
    gauge = InFlight(Clock())
    gauge.change(+3)
    assert gauge.mean() == 3.0


async def test_calm_returns_at_once_when_the_loop_is_on_time() -> None:
    monitor = LoopMonitor()
    assert await monitor.calm(0.05) is False


async def test_calm_waits_for_a_tick_on_time() -> None:
    """After a late tick, calm() waits; the next tick that comes on time releases it."""
    clock = Clock()
    monitor = LoopMonitor(clock=clock, interval=0.0, window=3)
    monitor._recent.append(0.5)  # a tick came half a second late
    released = anyio.Event()

    async def wait_calm() -> None:
        assert await monitor.calm(0.05) is True
        released.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_calm)
        await anyio.wait_all_tasks_blocked()
        assert not released.is_set()
        tg.start_soon(monitor.run)  # the injected clock stands still: every tick on time
        with anyio.fail_after(5):
            await released.wait()
        assert monitor.recent_s == 0.0
        tg.cancel_scope.cancel()


async def test_lags_are_recorded_only_while_recording() -> None:
    clock = Clock()
    monitor = LoopMonitor(clock=clock, interval=0.0)
    ticked = 0

    async def late_clock() -> None:
        nonlocal ticked
        while ticked < 3:
            await anyio.lowlevel.checkpoint()
            clock.t += 0.002  # time moves on between ticks: each tick 2 ms late at most
            ticked += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        await late_clock()
        assert monitor.lags_s == []
        monitor.recording = True
        ticked = 0
        await late_clock()
        tg.cancel_scope.cancel()
    assert monitor.lags_s and all(0.0 <= lag <= 0.0021 for lag in monitor.lags_s)
