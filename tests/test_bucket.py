"""The leaky bucket behind rate budgets: pacing, order, refunds, charges, cancellation.

Most tests run under trio with a mock clock that jumps ahead whenever every task is
waiting: time passes exactly as the bucket asks, and never for real. One runs under
asyncio, so both event loops are covered.
"""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from convsim.adapters._bucket import LeakyBucket

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> object:
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


async def test_calls_are_spaced_one_period_apart() -> None:
    bucket = LeakyBucket(1, 0.1)
    started = anyio.current_time()
    admitted = []
    for _ in range(5):
        await bucket.acquire()
        admitted.append(anyio.current_time() - started)
    assert admitted == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


async def test_a_capacity_is_taken_at_once_then_refills_at_its_rate() -> None:
    bucket = LeakyBucket(100, 60)  # 100 at once, then 100 a minute
    started = anyio.current_time()
    await bucket.acquire(100)
    assert anyio.current_time() == started
    assert not bucket.has_capacity(1)
    await bucket.acquire(50)
    assert anyio.current_time() - started == pytest.approx(30.0)
    assert bucket.level == pytest.approx(100.0)


async def test_waiters_are_served_in_the_order_they_came() -> None:
    bucket = LeakyBucket(10, 10)  # one a second
    await bucket.acquire(10)
    order: list[str] = []

    async def take(name: str, amount: float) -> None:
        await bucket.acquire(amount)
        order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take, "big", 8)
        await anyio.wait_all_tasks_blocked()
        for i in range(3):  # each would fit long before the big claim does
            tg.start_soon(take, f"small{i}", 1)
            await anyio.wait_all_tasks_blocked()
        assert bucket.waiting == 4
    assert order == ["big", "small0", "small1", "small2"]
    assert bucket.waiting == 0


async def test_a_refund_admits_the_waiter_at_once() -> None:
    bucket = LeakyBucket(100, 60)
    await bucket.acquire(100)
    started = anyio.current_time()
    admitted: list[float] = []

    async def wait_for_room() -> None:
        await bucket.acquire(50)
        admitted.append(anyio.current_time() - started)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_room)
        await anyio.wait_all_tasks_blocked()
        assert admitted == []
        bucket.refund(60)  # the claim was 60 more than the call used
    assert admitted == [0.0]  # no drain was waited for
    assert bucket.level == pytest.approx(90.0)


async def test_a_refund_never_leaves_the_bucket_below_empty() -> None:
    bucket = LeakyBucket(100, 60)
    await bucket.acquire(10)
    bucket.refund(1000)
    assert bucket.level == 0.0
    await bucket.acquire(100)  # a full bucket's worth fits, no more
    assert not bucket.has_capacity(1)


async def test_a_charge_beyond_the_capacity_delays_the_next_call() -> None:
    bucket = LeakyBucket(100, 60)
    await bucket.acquire(50)
    bucket.charge(110)  # used 110 more than claimed: 160 in a bucket of 100
    assert bucket.level == pytest.approx(160.0)
    started = anyio.current_time()
    await bucket.acquire(10)  # waits until 70 have drained: 42 s
    assert anyio.current_time() - started == pytest.approx(42.0)


async def test_a_waiter_that_gives_up_leaves_the_queue_and_the_next_is_served() -> None:
    bucket = LeakyBucket(1, 1)
    await bucket.acquire()
    started = anyio.current_time()
    admitted: list[float] = []

    async def give_up_at_half_a_second() -> None:
        with anyio.move_on_after(0.5):
            await bucket.acquire()
            admitted.append(-1.0)  # never: the bucket has room only at 1 s

    async def second() -> None:
        await bucket.acquire()
        admitted.append(anyio.current_time() - started)

    async with anyio.create_task_group() as tg:
        tg.start_soon(give_up_at_half_a_second)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(second)  # queued behind the one that gives up
    assert admitted == [pytest.approx(1.0)]  # when room came, not later
    assert bucket.waiting == 0
    assert bucket.level == pytest.approx(1.0)


async def test_a_cancelled_head_lets_a_waiter_behind_it_in() -> None:
    bucket = LeakyBucket(10, 10)  # one a second
    await bucket.acquire(10)
    started = anyio.current_time()
    admitted: list[tuple[str, float]] = []
    big = anyio.CancelScope()

    async def take(name: str, amount: float) -> None:
        await bucket.acquire(amount)
        admitted.append((name, anyio.current_time() - started))

    async def take_big() -> None:
        with big:
            await take("big", 9)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_big)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(take, "small", 1)
        await anyio.sleep(2)  # 2 drained: the small one fits, but waits its turn
        assert admitted == []
        big.cancel()
    assert admitted == [("small", pytest.approx(2.0))]
    assert bucket.waiting == 0


async def test_a_claim_larger_than_the_bucket_is_refused() -> None:
    bucket = LeakyBucket(10, 1)
    with pytest.raises(ValueError, match="holds 10"):
        await bucket.acquire(11)


def test_a_bucket_needs_a_positive_capacity_and_period() -> None:
    for capacity, period in ((0, 1), (1, 0), (-1, 1), (float("inf"), 1)):
        with pytest.raises(ValueError, match="above 0"):
            LeakyBucket(capacity, period)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_under_asyncio_a_full_bucket_waits_for_its_drain() -> None:
    bucket = LeakyBucket(1, 0.05)
    started = anyio.current_time()
    for _ in range(3):
        await bucket.acquire()
    # two drains waited for; the loop's timers may wake late, never early
    assert anyio.current_time() - started >= 0.1 * (1 - 1e-6)
    assert bucket.waiting == 0
