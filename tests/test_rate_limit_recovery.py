"""Random 429s cost what the server asked, not the run's pace.

Calls on virtual time (an event loop whose clock jumps to the next timer when nothing
is ready to run) through the real adapter, budget and retry policy: 32 callers, each
call 50 ms, 3.7% of them refused with ``429 Retry-After: 0``. Nothing really waits.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import httpx
import pytest

from convsim import RateLimited
from convsim.adapters import GenerationParams, Message
from convsim.adapters._budget import BudgetLimits, Budgets, ProviderBudget
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._retry import RetryPolicy

pytestmark = pytest.mark.anyio

HI = [Message(role="user", content="hi")]
OK = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time: when nothing is ready to run, its clock jumps to
    the next timer, so every sleep and timeout takes no real time at all."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        if not self._ready:  # type: ignore[attr-defined]
            timers = [t.when() for t in self._scheduled if not t.cancelled()]  # type: ignore[attr-defined]
            if timers:
                self._now = max(self._now, min(timers))
        super()._run_once()  # type: ignore[misc]


def on_virtual_time(main: Callable[[], Awaitable[float]]) -> float:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main())  # type: ignore[arg-type]


async def calls_per_second(rejected: float, *, callers: int = 32, calls: int = 40) -> float:
    """Calls per (virtual) second when ``rejected`` of the requests get a 429."""
    loop = asyncio.get_running_loop()
    rng = random.Random(7)

    async def answer(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        if rng.random() < rejected:
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"error": "busy"})
        return httpx.Response(200, json=OK)

    budgets = Budgets()
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1", "concurrency": callers},
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
        budgets=budgets,
        env={},
    )
    adapter.budget().clock = loop.time  # the budget's pauses on the loop's clock

    async def caller() -> None:
        for _ in range(calls):
            completion = await adapter.generate(HI, GenerationParams())
            assert completion.text == "ok"

    started = loop.time()
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
    finally:
        await adapter.aclose()
    return callers * calls / (loop.time() - started)


def test_random_429s_with_retry_after_zero_keep_the_throughput() -> None:
    clean = on_virtual_time(lambda: calls_per_second(0.0))
    with_429s = on_virtual_time(lambda: calls_per_second(0.037))
    assert clean == pytest.approx(32 / 0.05)  # the harness itself: 32 calls per 50 ms
    # each 429 costs its one extra round trip; nothing pauses the other callers for long
    assert with_429s / clean >= 0.85


async def test_retry_after_is_waited_as_asked_zero_included() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    errors = iter(
        [RateLimited("429", retry_after=0.0, status_code=429)] * 3
        + [RateLimited("429", retry_after=4.0, status_code=429)]
    )

    async def attempt(number: int) -> str:
        error = next(errors, None)
        if error is not None:
            raise error
        return "ok"

    policy = RetryPolicy(max_retries=5, initial_backoff_s=1.0)
    result, attempts = await policy.call(attempt, sleep=sleep)
    assert (result, attempts) == ("ok", 5)
    # Retry-After 0 three times: no wait (not the 1 s back-off); then 4 s plus <= 10%
    assert sleeps[:3] == [0.0, 0.0, 0.0]
    assert 4.0 <= sleeps[3] <= 4.4


async def test_a_burst_of_429s_cuts_the_cap_once() -> None:
    budget = ProviderBudget("k", BudgetLimits())  # Retry-After 0: nothing sleeps
    permits = [await budget.acquire(1) for _ in range(8)]
    for permit in permits:  # all eight sent before the first answer came back
        budget.rate_limited(0.0, permit)
        budget.release(permit, used_tokens=None, ok=False)
    stats = budget.statistics()
    assert stats.rate_limited == 8 and stats.in_flight_cap == 4  # halved once, not 8 times

    later = await budget.acquire(1)  # sent after the cut: its 429 is news
    budget.rate_limited(0.0, later)
    budget.release(later, used_tokens=None, ok=False)
    assert budget.statistics().in_flight_cap == 2


async def test_the_cap_recovers_within_one_round_of_successes() -> None:
    budget = ProviderBudget("k", BudgetLimits())  # Retry-After 0: nothing sleeps
    permits = [await budget.acquire(1) for _ in range(16)]
    budget.rate_limited(0.0, permits[0])
    for permit in permits:
        budget.release(permit, used_tokens=None, ok=False)
    assert budget.statistics().in_flight_cap == 8  # failures do not raise it
    caps = []
    for _ in range(8):
        permit = await budget.acquire(1)
        budget.release(permit, used_tokens=1, ok=True)
        caps.append(budget.statistics().in_flight_cap)
    # one call more per success, lifted once back at the 16 in flight at the 429
    assert caps == [9, 10, 11, 12, 13, 14, 15, None]
