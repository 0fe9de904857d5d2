"""Random 429s cost what the server asked, not the run's pace; a 429 asking for a day
(a used-up quota) fails at once instead of pausing the key for that day.

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

from convsim import ConfigError, QuotaExhausted, RateLimited
from convsim.adapters import GenerationParams, Message
from convsim.adapters._budget import BudgetLimits, Budgets, ProviderBudget, Refusal
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._retry import RetryPolicy

pytestmark = pytest.mark.anyio

HI = [Message(role="user", content="hi")]
OK = {
    "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
    # as a server reports it: no call is spent counting tokens
    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
}


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


@pytest.mark.slow
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


# -- a Retry-After longer than the adapter waits: a quota, not an overload ----------------


def quota_server(requests: list[float]) -> httpx.MockTransport:
    """The first request gets ``429 Retry-After: 86400`` (a daily quota); the rest an
    answer. Records when each request arrived (loop time)."""

    async def answer(request: httpx.Request) -> httpx.Response:
        requests.append(asyncio.get_running_loop().time())
        first = len(requests) == 1
        await asyncio.sleep(0.05)
        if first:
            return httpx.Response(
                429, headers={"Retry-After": "86400"}, json={"error": "daily quota exceeded"}
            )
        return httpx.Response(200, json=OK)

    return httpx.MockTransport(answer)


def test_a_daily_quota_429_fails_at_once_and_pauses_the_key_only_max_retry_after() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        requests: list[float] = []
        adapter = OpenAICompatibleAdapter(
            {"model": "m", "base_url": "http://llm.test/v1", "max_retry_after": 30},
            transport=HttpxTransport(transport=quota_server(requests)),
            env={},
        )
        adapter.budget().clock = loop.time
        try:
            with pytest.raises(QuotaExhausted) as first:
                await adapter.generate(HI, GenerationParams())
            refused_at = loop.time()
            assert first.value.sent and first.value.retry_after == 86400
            assert first.value.attempts == 1 and first.value.paused_s == 30
            message = str(first.value)
            assert "daily quota exceeded" in message  # what the server said
            assert "asked to wait 86400 s (Retry-After), more than max_retry_after=30" in message
            assert "a quota is probably exhausted" in message

            # meanwhile the key refuses calls at once, without sending them
            with pytest.raises(QuotaExhausted) as refused:
                await adapter.generate(HI, GenerationParams())
            assert not refused.value.sent and len(requests) == 1
            assert loop.time() == refused_at
            assert "not sent" in str(refused.value) and "86400 s" in str(refused.value)

            # max_retry_after later, the key sends again
            await asyncio.sleep(30)
            assert (await adapter.generate(HI, GenerationParams())).text == "ok"
            assert len(requests) == 2
            return loop.time() - requests[0]
        finally:
            await adapter.aclose()

    assert on_virtual_time(main) < 31  # not a day


def test_a_quota_refusal_fails_waiting_callers_instead_of_holding_them() -> None:
    """Callers queued behind the key (8 callers, concurrency 2) fail at once after the
    refusal: none waits max_retry_after, let alone the day the server asked."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        requests: list[float] = []
        adapter = OpenAICompatibleAdapter(
            {"model": "m", "base_url": "http://llm.test/v1", "concurrency": 2},
            transport=HttpxTransport(transport=quota_server(requests)),
            env={},
        )
        adapter.budget().clock = loop.time
        outcomes: list[str] = []

        async def caller() -> None:
            try:
                outcomes.append((await adapter.generate(HI, GenerationParams())).text)
            except QuotaExhausted as exc:
                outcomes.append("sent" if exc.sent else "refused")

        started = loop.time()
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(caller)
        finally:
            await adapter.aclose()
        assert outcomes.count("sent") == 1
        # the one sent beside the refused call was answered; the rest never went out
        assert outcomes.count("ok") == len(requests) - 1
        assert outcomes.count("refused") == 8 - len(requests)
        return loop.time() - started

    assert on_virtual_time(main) < 1.0


async def test_max_retry_after_is_an_adapter_argument() -> None:
    """Raised past the server's ask, a long Retry-After is an ordinary 429 again (here
    beyond max_retry_time, so not waited either); a negative cap is refused."""
    requests: list[float] = []
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1", "max_retry_after": 100_000},
        transport=HttpxTransport(transport=quota_server(requests)),
        env={},
    )
    with pytest.raises(RateLimited) as info:
        await adapter.generate(HI, GenerationParams())
    assert type(info.value) is RateLimited and info.value.paused_s == 86400
    assert adapter.budget().paused_for > 80_000
    await adapter.aclose()
    with pytest.raises(ConfigError, match="max_retry_after"):
        OpenAICompatibleAdapter({"model": "m", "base_url": "http://h/v1", "max_retry_after": -1})


async def test_the_budget_caps_a_pause_and_refuses_for_that_long() -> None:
    clock = [100.0]
    budget = ProviderBudget("k", BudgetLimits(), clock=lambda: clock[0])
    assert budget.refusal() is None
    assert budget.rate_limited(5.0, max_pause=60) == 5.0  # within the cap: as asked
    assert budget.refusal() is None and budget.paused_for == 5.0
    assert budget.rate_limited(86400.0, max_pause=60) == 60.0
    assert budget.paused_for == 60.0
    assert budget.refusal() == Refusal(asked_s=86400.0, remaining_s=60.0)
    clock[0] += 59.5
    refusal = budget.refusal()
    assert refusal is not None and refusal.remaining_s == pytest.approx(0.5)
    clock[0] += 0.5
    assert budget.refusal() is None and budget.paused_for == 0.0
