"""Bounded, classified retries (tenacity) and the HTTP status -> error mapping."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple, TypeVar

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)

from convsim._errors import (
    AdapterError,
    AuthError,
    BadRequest,
    QuotaExhausted,
    RateLimited,
    ServerError,
    Timeout,
)
from convsim._log import get_logger

__all__ = [
    "Attempted",
    "RetryPolicy",
    "error_for_status",
    "quota_exhausted",
    "refused_call",
    "retry_after_seconds",
]

log = get_logger("convsim.adapters")
T = TypeVar("T")


class Attempted(NamedTuple):
    """A call's result and the attempts it took, retries included."""

    result: Any
    attempts: int


@dataclass(frozen=True)
class RetryPolicy:
    """Which failures to retry and how long to keep trying; never unbounded.

    Retried: what the error declares ``retryable`` (408, 409, 429, 5xx, connection
    errors and timeouts, answers that arrived broken); never 400, 401, 403, 404 or 422.
    Waits grow exponentially with jitter up to ``max_backoff_s``; a 429 that says
    Retry-After is waited just that long (0 included: the server asked for no wait).
    """

    max_retries: int = 3
    """Retries after the first attempt."""
    max_elapsed_s: float = 120.0
    """No new attempt starts after this long since the first."""
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 20.0
    jitter_s: float = 0.5

    def backoff(self, failed_attempt: int, exc: BaseException | None) -> float:
        """Seconds to wait after attempt ``failed_attempt`` failed with ``exc``.

        A 429 with Retry-After is waited as the server asked, plus up to 10% of it so
        that the callers it refused together do not all come back at once (the rate
        budget halves the calls in flight meanwhile). Otherwise exponential with
        jitter, capped at ``max_backoff_s``.
        """
        if isinstance(exc, RateLimited) and exc.retry_after is not None:
            return exc.retry_after + random.uniform(0, 0.1 * exc.retry_after)
        exponential = self.initial_backoff_s * 2 ** (failed_attempt - 1)
        return min(exponential + random.uniform(0, self.jitter_s), self.max_backoff_s)

    @staticmethod
    def should_retry(exc: BaseException) -> bool:
        """What the error declares: only an AdapterError can say it is retryable."""
        return isinstance(exc, AdapterError) and exc.retryable

    async def call(
        self,
        attempt: Callable[[int], Awaitable[T]],
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_retry: Callable[[BaseException, float], Awaitable[None] | None] | None = None,
        should_retry: Callable[[AdapterError], bool] | None = None,
    ) -> Attempted:
        """Run ``attempt(n)`` until it succeeds or the policy gives up.

        Returns the result and the number of attempts. The last error is re-raised
        with its ``attempts`` set. ``sleep`` and ``clock`` are injectable together, so
        tests neither wait nor lose the time limit. ``should_retry`` (an adapter's hook)
        decides which errors to try again; by default, what the error declares.
        """
        decide = should_retry or self.should_retry

        def retry_this(exc: BaseException) -> bool:
            return isinstance(exc, AdapterError) and decide(exc)

        # The first attempt runs outside tenacity: most calls succeed at once, and
        # tenacity's per-attempt bookkeeping costs more than a fast local request.
        started = clock()
        try:
            return Attempted(await attempt(1), 1)
        except AdapterError as exc:
            if self.max_retries == 0 or not retry_this(exc):
                exc.attempts = 1
                raise
            first_failure = exc

        def out_of_time(delay: float) -> bool:
            """No wait may end past the time budget."""
            return clock() - started + delay >= self.max_elapsed_s

        async def wait_and_report(exc: BaseException, failed_attempt: int, delay: float) -> None:
            log.info(
                "model_call_retry",
                attempt=failed_attempt,
                wait_s=round(delay, 3),
                error_type=type(exc).__name__,
                error=str(exc),
            )
            if on_retry is not None:
                result = on_retry(exc, delay)
                if result is not None:
                    await result

        delay = self.backoff(1, first_failure)
        if out_of_time(delay):
            first_failure.attempts = 1
            raise first_failure
        await wait_and_report(first_failure, 1, delay)
        await sleep(delay)

        # Attempts 2 and later, under tenacity (it numbers them from 1, we from 2).
        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self.backoff(state.attempt_number + 1, exc)

        def stop_in_time(state: RetryCallState) -> bool:
            return out_of_time(state.upcoming_sleep)

        async def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if exc is not None:
                await wait_and_report(exc, state.attempt_number + 1, state.upcoming_sleep)

        retrying = AsyncRetrying(
            # tenacity types `|` for its stop classes only, though every StopBaseT works
            stop=stop_after_attempt(self.max_retries) | stop_in_time,  # type: ignore[operator]
            wait=wait,
            retry=retry_if_exception(retry_this),
            before_sleep=before_sleep,
            sleep=sleep,
            reraise=True,
        )
        number = 1
        try:
            async for attempt_state in retrying:
                number = attempt_state.retry_state.attempt_number + 1
                with attempt_state:
                    outcome = await attempt(number)
        except AdapterError as exc:
            exc.attempts = number
            raise
        return Attempted(outcome, number)


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None if absent or bad."""
    value = headers.get("retry-after")
    if value is None:
        ms = headers.get("retry-after-ms")
        seconds = _finite(ms)
        return None if seconds is None else seconds / 1000
    seconds = _finite(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _finite(value: str | None) -> float | None:
    """A header's number, at least 0; None when it is missing, not a number, or not
    finite (a NaN wait would stall every timer of the event loop)."""
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return max(0.0, number) if math.isfinite(number) else None


def _message(body: bytes, secret: str | None) -> str:
    """The error message of an API error body, or a short snippet of it (``secret``
    blanked out before anything is cut, so no part of it survives)."""
    text = body.decode("utf-8", errors="replace")
    if secret:
        text = text.replace(secret, "***")
    try:
        data: Any = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python goes
        return text[:200]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    try:
        return json.dumps(data)[:200]
    except RecursionError:
        return text[:200]


def error_for_status(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    model: str | None,
    url: str,
    secret: str | None = None,
) -> AdapterError:
    """The typed error for a non-2xx answer (``secret``, e.g. the API key, blanked out
    should the server echo it)."""
    detail = f"{status} from {url}: {_message(body, secret)}"
    if status == 429:
        return RateLimited(
            f"rate limited: {detail}",
            retry_after=retry_after_seconds(headers),
            model=model,
            status_code=status,
        )
    if status in (401, 403):
        return AuthError(f"authentication failed: {detail}", model=model, status_code=status)
    if status == 408:
        return Timeout(f"request timed out: {detail}", model=model, status_code=status)
    if status >= 500 or status == 409:
        return ServerError(f"server error: {detail}", model=model, status_code=status)
    return BadRequest(f"request rejected: {detail}", model=model, status_code=status)


def _advice(asked: float, max_retry_after: float) -> str:
    return (
        f"the server asked to wait {asked:g} s (Retry-After), more than "
        f"max_retry_after={max_retry_after:g}: a quota is probably exhausted. The key sends "
        f"nothing for {max_retry_after:g} s; to wait as long as asked, raise "
        "--model-arg max_retry_after=SECONDS"
    )


def quota_exhausted(
    error: RateLimited, max_retry_after: float, paused_s: float | None
) -> QuotaExhausted | None:
    """The error for a 429 whose Retry-After is beyond ``max_retry_after`` (a quota,
    not an overload: not worth waiting for), or None when the wait is acceptable."""
    asked = error.retry_after
    if asked is None or asked <= max_retry_after:
        return None
    return QuotaExhausted(
        f"{error}; {_advice(asked, max_retry_after)}",
        retry_after=asked,
        paused_s=paused_s,
        max_retry_after=max_retry_after,
        sent=True,
        model=error.model,
        status_code=error.status_code,
    )


def refused_call(
    asked: float, remaining: float, max_retry_after: float, *, model: str | None
) -> QuotaExhausted:
    """The error for a call not sent because a recent 429 asked for a wait beyond
    ``max_retry_after`` (the key refuses calls for ``remaining`` more seconds)."""
    return QuotaExhausted(
        f"rate limited, not sent ({remaining:.0f} s before the key sends again): "
        f"{_advice(asked, max_retry_after)}",
        retry_after=asked,
        paused_s=remaining,
        max_retry_after=max_retry_after,
        sent=False,
        model=model,
    )
