"""Retries (classified, bounded, Retry-After aware) and provider rate budgets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
import structlog
from conftest import write_pack

from convsim import (
    AdapterError,
    AuthError,
    BadRequest,
    MalformedResponse,
    ProtocolError,
    RateLimited,
    ServerError,
    Simulator,
    Status,
    Timeout,
)
from convsim.adapters import GenerationParams, Message
from convsim.adapters._budget import BudgetLimits, Budgets, Permit, ProviderBudget
from convsim.adapters._http import AiohttpTransport, HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._retry import RetryPolicy, retry_after_seconds

pytestmark = pytest.mark.anyio


class Sleeps(list[float]):
    """A recording sleep that never waits."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)
        await anyio.lowlevel.checkpoint()


class FakeClock:
    """Time that moves only when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 500.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()


def clocked(limits: BudgetLimits) -> tuple[ProviderBudget, FakeClock]:
    clock = FakeClock()
    return ProviderBudget("key", limits, clock=clock, sleep=clock.sleep), clock


def failing_with(*errors: BaseException, result: str = "ok") -> tuple[Any, list[int]]:
    """An attempt function that raises ``errors`` in turn, then returns ``result``."""
    numbers: list[int] = []

    async def attempt(number: int) -> str:
        numbers.append(number)
        if len(numbers) <= len(errors):
            raise errors[len(numbers) - 1]
        return result

    return attempt, numbers


@pytest.fixture
def info_logs() -> Iterator[list[dict[str, Any]]]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def final(error: AdapterError) -> AdapterError:
    """``error`` marked as not to be retried (what an adapter does once text was streamed)."""
    error.retryable = False  # type: ignore[attr-defined]
    return error


# -- RetryPolicy ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (RateLimited("429", status_code=429), True),
        (RateLimited("429 with a wait", status_code=429, retry_after=3.0), True),
        (Timeout("read timeout"), True),
        (Timeout("408", status_code=408), True),
        (ServerError("connection refused"), True),
        (ServerError("500", status_code=500), True),
        (ServerError("503", status_code=503), True),
        (ServerError("529 overloaded", status_code=529), True),
        (ServerError("409 conflict", status_code=409), True),
        (ServerError("400 in a ServerError", status_code=400), False),
        (final(ServerError("503 after streamed text", status_code=503)), False),
        (final(Timeout("timeout after streamed text")), False),
        (BadRequest("400", status_code=400), False),
        (BadRequest("404", status_code=404), False),
        (BadRequest("422", status_code=422), False),
        (AuthError("401", status_code=401), False),
        (AuthError("403", status_code=403), False),
        (ProtocolError("not JSON", snippet="<html>"), False),
        (MalformedResponse("a 200 that is not JSON", snippet="<html>"), True),
        (final(MalformedResponse("a bad event after streamed text")), False),
        (AdapterError("something else"), False),
        (ValueError("a bug"), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_should_retry_classifies_failures(error: BaseException, retried: bool) -> None:
    assert RetryPolicy().should_retry(error) is retried


async def test_success_after_retries_reports_the_attempts() -> None:
    sleeps = Sleeps()
    attempt, numbers = failing_with(ServerError("a", status_code=502), Timeout("b"))
    result, attempts = await RetryPolicy(max_retries=3).call(attempt, sleep=sleeps)
    assert (result, attempts) == ("ok", 3)
    assert numbers == [1, 2, 3]
    assert len(sleeps) == 2


async def test_attempts_are_bounded_and_set_on_the_final_error() -> None:
    sleeps = Sleeps()
    errors = [ServerError(f"down {i}", status_code=503) for i in range(10)]
    attempt, numbers = failing_with(*errors)
    with pytest.raises(ServerError) as info:
        await RetryPolicy(max_retries=2).call(attempt, sleep=sleeps)
    assert numbers == [1, 2, 3]
    assert info.value is errors[2]  # the last error itself, not a wrapper
    assert info.value.attempts == 3
    assert len(sleeps) == 2


async def test_no_retries_means_one_attempt() -> None:
    sleeps = Sleeps()
    attempt, numbers = failing_with(ServerError("down", status_code=500))
    with pytest.raises(ServerError) as info:
        await RetryPolicy(max_retries=0).call(attempt, sleep=sleeps)
    assert numbers == [1] and info.value.attempts == 1 and sleeps == []


async def test_errors_that_cannot_be_fixed_by_retrying_fail_at_once() -> None:
    sleeps = Sleeps()
    attempt, numbers = failing_with(BadRequest("400", status_code=400))
    with pytest.raises(BadRequest) as info:
        await RetryPolicy(max_retries=5).call(attempt, sleep=sleeps)
    assert numbers == [1] and info.value.attempts == 1 and sleeps == []

    bug, numbers = failing_with(ZeroDivisionError("a defect"))
    with pytest.raises(ZeroDivisionError):
        await RetryPolicy(max_retries=5).call(bug, sleep=sleeps)
    assert numbers == [1] and sleeps == []


async def test_waits_grow_exponentially_up_to_the_cap() -> None:
    sleeps = Sleeps()
    attempt, _ = failing_with(*[ServerError("x") for _ in range(5)])
    policy = RetryPolicy(max_retries=5, initial_backoff_s=0.5, max_backoff_s=3.0, jitter_s=0.0)
    await policy.call(attempt, sleep=sleeps)
    assert sleeps == [0.5, 1.0, 2.0, 3.0, 3.0]


async def test_jittered_waits_stay_within_the_cap() -> None:
    sleeps = Sleeps()
    attempt, _ = failing_with(*[ServerError("x") for _ in range(6)])
    policy = RetryPolicy(max_retries=6, initial_backoff_s=0.5, max_backoff_s=4.0, jitter_s=0.5)
    await policy.call(attempt, sleep=sleeps)
    assert len(sleeps) == 6 and all(0.5 <= s <= 4.0 for s in sleeps)


async def test_retry_after_is_the_wait() -> None:
    sleeps = Sleeps()
    attempt, _ = failing_with(
        RateLimited("429", retry_after=7.0, status_code=429),
        RateLimited("429", retry_after=0.1, status_code=429),  # shorter than the back-off
        RateLimited("429 without Retry-After", status_code=429),
    )
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=2.0, jitter_s=0.0)
    result, attempts = await policy.call(attempt, sleep=sleeps)
    assert (result, attempts) == ("ok", 4)
    assert 7.0 <= sleeps[0] <= 7.7  # Retry-After beats the 1 s back-off (and its cap)
    assert 0.1 <= sleeps[1] <= 0.11  # what the server asked, not the 2 s back-off
    assert sleeps[2] == 2.0  # no Retry-After: the back-off


async def test_max_retry_time_stops_retrying() -> None:
    sleeps = Sleeps()
    attempt, numbers = failing_with(*[ServerError("down", status_code=503) for _ in range(10)])
    # ten retries are allowed, but the first back-off (>= 0.5 s) does not fit in 0.2 s
    with pytest.raises(ServerError) as info:
        await RetryPolicy(max_retries=10, max_elapsed_s=0.2).call(attempt, sleep=sleeps)
    assert numbers == [1] and sleeps == []
    assert info.value.attempts == 1


async def test_max_retry_time_counts_slow_attempts() -> None:
    sleeps = Sleeps()
    numbers: list[int] = []

    async def attempt(number: int) -> str:
        numbers.append(number)
        if number == 2:
            await anyio.sleep(0.06)  # the only real wait: this attempt itself is slow
        raise ServerError("down", status_code=503)

    policy = RetryPolicy(max_retries=10, max_elapsed_s=0.05, initial_backoff_s=0.001, jitter_s=0)
    with pytest.raises(ServerError) as info:
        await policy.call(attempt, sleep=sleeps)
    assert numbers == [1, 2]  # time ran out during the second attempt
    assert info.value.attempts == 2 and len(sleeps) == 1


async def test_a_later_wait_beyond_max_retry_time_is_not_taken() -> None:
    sleeps = Sleeps()
    attempt, numbers = failing_with(
        ServerError("busy", status_code=503),
        *[RateLimited("429", retry_after=3600.0, status_code=429) for _ in range(3)],
    )
    with pytest.raises(RateLimited) as info:
        await RetryPolicy(max_retries=3, max_elapsed_s=10.0).call(attempt, sleep=sleeps)
    assert numbers == [1, 2]
    assert len(sleeps) == 1 and sleeps[0] < 10  # the 3600 s wait is never started
    assert info.value.attempts == 2


async def test_a_first_wait_beyond_max_retry_time_is_not_taken() -> None:
    sleeps = Sleeps()
    attempt, numbers = failing_with(RateLimited("429", retry_after=3600.0, status_code=429))
    with pytest.raises(RateLimited) as info:
        await RetryPolicy(max_retries=3, max_elapsed_s=10.0).call(attempt, sleep=sleeps)
    assert sleeps == [] and numbers == [1]
    assert info.value.attempts == 1


async def test_no_retry_is_reported_when_time_is_up(info_logs: list[dict[str, Any]]) -> None:
    sleeps = Sleeps()
    reported: list[BaseException] = []
    attempt, numbers = failing_with(RateLimited("429", retry_after=3600.0, status_code=429))
    with pytest.raises(RateLimited):
        await RetryPolicy(max_elapsed_s=10.0).call(
            attempt, sleep=sleeps, on_retry=lambda exc, delay: reported.append(exc)
        )
    assert numbers == [1] and sleeps == []
    assert [e for e in info_logs if e["event"] == "model_call_retry"] == []
    assert reported == []


async def test_cancellation_is_neither_retried_nor_logged(
    info_logs: list[dict[str, Any]],
) -> None:
    sleeps = Sleeps()
    numbers: list[int] = []

    async def attempt(number: int) -> str:
        numbers.append(number)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.move_on_after(0.01) as scope:
        await RetryPolicy(max_retries=5).call(attempt, sleep=sleeps)
    assert scope.cancelled_caught
    assert numbers == [1] and sleeps == []
    assert not [e for e in info_logs if e["event"] == "model_call_retry"]


async def test_each_retry_is_logged(info_logs: list[dict[str, Any]]) -> None:
    sleeps = Sleeps()
    attempt, _ = failing_with(
        ServerError("server error: 503 busy", status_code=503),
        RateLimited("rate limited", retry_after=2.0, status_code=429),
    )
    seen: list[tuple[str, float]] = []

    async def on_retry(exc: BaseException, delay: float) -> None:
        seen.append((type(exc).__name__, delay))

    await RetryPolicy().call(attempt, sleep=sleeps, on_retry=on_retry)
    retries = [e for e in info_logs if e["event"] == "model_call_retry"]
    assert [(e["attempt"], e["error_type"]) for e in retries] == [
        (1, "ServerError"),
        (2, "RateLimited"),
    ]
    assert retries[0]["error"] == "server error: 503 busy"
    assert retries[0]["log_level"] == "info"
    assert [e["wait_s"] for e in retries] == [round(s, 3) for s in sleeps]
    assert seen == [("ServerError", sleeps[0]), ("RateLimited", sleeps[1])]


# -- Retry-After --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "-4"}, 0.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "soon"}, None),
        ({"retry-after": ""}, None),
        ({"retry-after-ms": "later"}, None),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after-ms": "inf"}, None),
        ({"retry-after-ms": "-5"}, 0.0),
        ({"retry-after": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_seconds(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after_seconds(headers) == seconds


def test_retry_after_headers_are_case_insensitive() -> None:
    assert retry_after_seconds(httpx.Headers({"Retry-After": "3"})) == 3.0
    assert retry_after_seconds(httpx.Headers({"Retry-After-Ms": "250"})) == 0.25


def test_retry_after_as_an_http_date() -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    when = parsedate_to_datetime(date).timestamp()
    assert retry_after_seconds({"retry-after": date}, now=when - 30) == pytest.approx(30.0)
    assert retry_after_seconds({"retry-after": date}, now=when + 30) == 0.0  # in the past
    again = format_datetime(parsedate_to_datetime(date), usegmt=True)
    assert retry_after_seconds({"retry-after": again}, now=when - 1) == pytest.approx(1.0)


# -- provider budgets -----------------------------------------------------------------


def adapter(
    *, key: str | None = "sk-a", base_url: str = "http://llm.test/v1", **config: Any
) -> OpenAICompatibleAdapter:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"role": "assistant", "content": "fine"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            },
        )

    args: dict[str, Any] = {"model": "m", "base_url": base_url, **config}
    if key is not None:
        args["api_key"] = key
    return OpenAICompatibleAdapter(
        args,
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
        env={},
        sleep=Sleeps(),
    )


def test_same_url_and_key_share_one_budget() -> None:
    budgets = Budgets()
    a, b = adapter(), adapter(base_url="http://llm.test/v1/")
    c, d = adapter(key="sk-b"), adapter(base_url="http://other.test/v1")
    keyless = adapter(key=None)
    for each in (a, b, c, d, keyless):
        each.share_budgets(budgets)
    assert a.connection_key() == b.connection_key()
    assert a.budget() is b.budget()
    assert c.connection_key() != a.connection_key() and c.budget() is not a.budget()
    assert d.budget() is not a.budget()
    assert keyless.budget() is not a.budget()
    assert "sk-a" not in a.connection_key()  # the key is hashed, never shown
    assert len(budgets.statistics()) == 4


def test_separate_budgets_objects_share_nothing() -> None:
    a, b = adapter(), adapter()
    a.share_budgets(Budgets())
    b.share_budgets(Budgets())
    assert a.connection_key() == b.connection_key()
    assert a.budget() is not b.budget()


def test_adapters_sharing_a_key_get_the_stricter_limits() -> None:
    budgets = Budgets()
    loose, strict = adapter(rpm=600, tpm=90_000), adapter(rpm=60)
    loose.share_budgets(budgets)
    strict.share_budgets(budgets)
    assert loose.budget() is strict.budget()
    assert loose.budget().limits == BudgetLimits(rpm=60, tpm=90_000)


def test_an_adapter_takes_the_runs_concurrency_unless_it_set_its_own() -> None:
    unset, own = adapter(), adapter(concurrency=3)
    given_default = adapter(concurrency=64)  # the default value, but given: the user's
    for each in (unset, own, given_default):
        each.size_pool(5)
        each.share_budgets(Budgets())
    alone = adapter()
    alone.share_budgets(Budgets())  # no run concurrency to take
    assert unset.rate_limits().concurrency == 5
    assert own.rate_limits().concurrency == 3
    assert given_default.rate_limits().concurrency == 64
    assert alone.rate_limits().concurrency == 64


async def test_the_runs_concurrency_caps_calls_in_flight_and_sizes_the_pool() -> None:
    gate = anyio.Event()
    in_flight = most = 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await gate.wait()
        in_flight -= 1
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    model = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1"},
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
        env={},
    )
    default_seam = OpenAICompatibleAdapter({"model": "m", "base_url": "http://llm.test/v1"})
    model.size_pool(2)
    model.share_budgets(Budgets())
    default_seam.size_pool(2)
    default_seam.share_budgets(Budgets())
    pool = default_seam._http()  # built on first use, sized to the concurrency
    assert isinstance(pool, AiohttpTransport) and pool.pool_size == 2
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(
                    model.generate, [Message(role="user", content="hi")], GenerationParams()
                )
            await anyio.wait_all_tasks_blocked()
            assert (in_flight, model.budget().statistics().in_flight) == (2, 2)
            gate.set()
        assert most == 2
        with pytest.raises(RuntimeError, match="before the first call"):
            model.size_pool(8)
    finally:
        await model.aclose()
        await default_seam.aclose()


def test_tighten_keeps_the_stricter_limits() -> None:
    budgets = Budgets()
    budget = budgets.get("k", BudgetLimits(rpm=600))
    assert budgets.get("k", BudgetLimits(rpm=1200, tpm=5000)) is budget
    assert budget.limits == BudgetLimits(rpm=600, tpm=5000)
    budgets.get("k", BudgetLimits(rpm=60, tpm=None))
    assert budget.limits == BudgetLimits(rpm=60, tpm=5000)
    budgets.get("k", BudgetLimits())
    assert budget.limits == BudgetLimits(rpm=60, tpm=5000)
    assert budgets.get("other", BudgetLimits()) is not budget


async def test_simulator_binds_one_budget_to_model_and_user_model(tmp_path: Path) -> None:
    model, user = adapter(), adapter()
    pack = write_pack(
        tmp_path / "pack",
        {
            "default": {
                "turns": [
                    {"turn_id": "ask", "role": "user", "prompt_template": "Ask something."},
                    {"turn_id": "thanks", "prompt_template": "Thanks."},
                ]
            }
        },
        [{"scenario_id": f"s{i}", "scenario_description": "a chat"} for i in range(3)],
    )
    try:
        async with Simulator(model, user_model=user, metrics=[]) as sim:
            assert model.budget() is user.budget()
            (stats,) = sim.budgets.statistics()
            assert stats.key == model.connection_key()
            results = [r async for r in sim.run(pack)]
        assert all(r.status is Status.DONE for r in results)
        # three conversations: one user call and two model calls each, on one budget
        (stats,) = sim.budgets.statistics()
        assert stats.requests == 9 and stats.in_flight == 0 and stats.waiting == 0
    finally:
        await model.aclose()
        await user.aclose()


async def test_rpm_is_smoothed_to_evenly_spaced_requests() -> None:
    budget = ProviderBudget("k", BudgetLimits(rpm=600))
    assert budget._requests is not None and budget._requests.capacity == 1
    await budget.acquire(1)
    assert not budget._requests.has_capacity()  # not 600 at once: one at a time
    # drained at 99% of the rate, so no 60 s window of a server sees more than 600
    assert budget._requests.period == pytest.approx(60 / (0.99 * 600))

    slow = ProviderBudget("k", BudgetLimits(rpm=30))
    assert slow._requests is not None and slow._requests.capacity == 1
    await slow.acquire(1)
    assert not slow._requests.has_capacity()

    unlimited = ProviderBudget("k", BudgetLimits())
    for _ in range(1000):
        await unlimited.acquire(10**6)
    assert unlimited.statistics().requests == 1000


TPM = 1_000_000  # the token bucket holds 1% of the minute's budget: 10,000 tokens


async def test_tokens_over_claimed_are_given_back() -> None:
    budget = ProviderBudget("k", BudgetLimits(tpm=TPM))
    tokens = budget._tokens
    assert tokens is not None and tokens.capacity == 10_000
    permit = await budget.acquire(9000)
    assert permit.tokens == 9000
    assert not tokens.has_capacity(5000)
    budget.release(permit, used_tokens=1000, ok=True)
    assert tokens.has_capacity(5000)  # 8000 of the 9000 claimed came back
    assert not tokens.has_capacity(9500)


async def test_a_small_token_budget_caps_a_long_claim_to_its_bucket() -> None:
    budget = ProviderBudget("k", BudgetLimits(tpm=6000))  # 1%: 60 tokens at once
    assert budget._tokens is not None and budget._tokens.capacity == 60
    permit = await budget.acquire(5000)  # admitted, paced as one full bucket
    assert permit.tokens == 60


async def test_a_claim_larger_than_the_bucket_is_capped() -> None:
    budget = ProviderBudget("k", BudgetLimits(tpm=TPM))
    big = await budget.acquire(500_000)  # more than the bucket holds: capped, not refused
    assert big.tokens == 10_000
    assert budget._tokens is not None and not budget._tokens.has_capacity(100)
    budget.release(big, used_tokens=10_000, ok=True)
    assert not budget._tokens.has_capacity(100)


async def test_tokens_used_beyond_the_claim_are_charged() -> None:
    budget = ProviderBudget("k", BudgetLimits(tpm=TPM))
    tokens = budget._tokens
    assert tokens is not None
    permit = await budget.acquire(1000)
    budget.release(permit, used_tokens=7000, ok=True)
    assert not tokens.has_capacity(4000)
    assert tokens.has_capacity(2500)


async def test_a_429_pauses_the_key_and_halves_the_calls_in_flight() -> None:
    budget, clock = clocked(BudgetLimits())
    permits = [await budget.acquire(1) for _ in range(8)]
    budget.rate_limited(2.0)
    stats = budget.statistics()
    assert stats.rate_limited == 1 and stats.in_flight_cap == 4

    admitted: list[Permit] = []

    async def one_more() -> None:
        admitted.append(await budget.acquire(1))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one_more)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleeps == [pytest.approx(2.0)]  # the pause (Retry-After) was waited
        assert admitted == []  # 8 in flight, cap 4: it must wait for calls to end
        for permit in permits[:4]:
            budget.release(permit, used_tokens=None, ok=False)
        await anyio.wait_all_tasks_blocked()
        assert admitted == []  # 4 in flight is still at the cap
        budget.release(permits[4], used_tokens=None, ok=False)
    assert len(admitted) == 1 and budget.statistics().in_flight == 4


async def test_a_429_without_retry_after_pauses_a_second() -> None:
    budget, clock = clocked(BudgetLimits())
    budget.rate_limited(None)
    await budget.acquire(1)
    assert clock.sleeps == [pytest.approx(1.0)]


async def test_retry_after_zero_does_not_pause() -> None:
    budget, clock = clocked(BudgetLimits())
    budget.rate_limited(0.0)
    await budget.acquire(1)
    assert clock.sleeps == []


async def test_the_cap_recovers_quickly_and_only_on_success() -> None:
    budget, _ = clocked(BudgetLimits())
    permits = [await budget.acquire(1) for _ in range(8)]
    budget.rate_limited(0.0)
    for permit in permits:
        budget.release(permit, used_tokens=None, ok=False)
    assert budget.statistics().in_flight_cap == 4  # failures do not raise it

    caps = []
    for _ in range(10):  # one call more per success
        permit = await budget.acquire(1)
        budget.release(permit, used_tokens=1, ok=True)
        caps.append(budget.statistics().in_flight_cap)
    assert caps[:3] == [5, 6, 7]
    assert caps[3:] == [None] * 7  # back at the 8 in flight at the 429: no cap at all

    permits = [await budget.acquire(1) for _ in range(3)]
    budget.rate_limited(0.0)
    budget.rate_limited(0.0)  # a second 429 halves the cap again
    assert budget.statistics().in_flight_cap == pytest.approx(1.0)
    for permit in permits:
        budget.release(permit, used_tokens=None, ok=False)


async def test_statistics_count_waiting_in_flight_and_retrying() -> None:
    release_pause = anyio.Event()
    now = [0.0]

    async def blocked_sleep(seconds: float) -> None:
        await release_pause.wait()
        now[0] += seconds

    budget = ProviderBudget("k", BudgetLimits(), clock=lambda: now[0], sleep=blocked_sleep)
    first, other = await budget.acquire(1), await budget.acquire(1)
    assert budget.statistics().in_flight == 2
    budget.rate_limited(5.0)  # 2 in flight: the cap becomes 1
    budget.retrying(+1)
    permits = []

    async def second() -> None:
        permits.append(await budget.acquire(1))

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        stats = budget.statistics()
        assert (stats.in_flight, stats.waiting, stats.retrying) == (2, 1, 1)
        budget.retrying(-1)
        release_pause.set()
        budget.release(other, used_tokens=None, ok=False)
        budget.release(first, used_tokens=None, ok=True)
    stats = budget.statistics()
    assert (stats.in_flight, stats.waiting, stats.retrying) == (1, 0, 0)
    assert stats.requests == 3 and stats.key == "k"
    budget.release(permits[0], used_tokens=None, ok=False)
    assert budget.statistics().in_flight == 0


async def test_an_adapter_waiting_to_retry_counts_as_retrying() -> None:
    gate = anyio.Event()
    calls = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    async def sleep(seconds: float) -> None:
        await gate.wait()

    model = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1"},
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
        env={},
        sleep=sleep,
    )
    texts = []

    async def call() -> None:
        completion = await model.generate([Message(role="user", content="hi")], GenerationParams())
        texts.append(completion.text)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        stats = model.budget().statistics()
        assert (stats.retrying, stats.in_flight, stats.requests) == (1, 0, 1)
        gate.set()
    stats = model.budget().statistics()
    assert (stats.retrying, stats.in_flight, stats.requests) == (0, 0, 2)
    assert texts == ["ok"]
    await model.aclose()


async def test_a_429_pause_is_heard_and_can_be_passed_to_another_budget() -> None:
    heard: list[tuple[str, float]] = []
    here = Budgets(on_pause=lambda key, seconds: heard.append((key, seconds)))
    budget = here.get("openai|https://api.example/v1|ab12", BudgetLimits())
    budget.rate_limited(2.5)
    budget.rate_limited(0.0)  # Retry-After: 0 pauses nothing, so there is nothing to tell
    assert heard == [("openai|https://api.example/v1|ab12", 2.5)]

    # another process's budget of the same key pauses for what was heard, no more
    clock = FakeClock()
    there = ProviderBudget("openai|https://api.example/v1|ab12", BudgetLimits(), clock=clock)
    elsewhere = Budgets()
    elsewhere._budgets[there.key] = there
    assert elsewhere.pause(there.key, 2.5) and not elsewhere.pause("other|key", 2.5)
    assert there.paused_for == 2.5
    permit = await there.acquire(1, sleep=clock.sleep)
    assert clock.sleeps == [2.5] and permit.queue_wait_s == 2.5
    there.release(permit, None, ok=True)
    # a heard pause cuts nothing: the 429 was another process's calls' answer
    assert there.statistics().in_flight_cap is None and there.statistics().rate_limited == 0
