"""Calls to an adapter written in the guide's style: a synchronous
``generate_response(prompt, config) -> dict`` run as one of convsim's async calls.

:class:`SyncBridge` gives such an adapter what convsim's own adapters have: the rate
budget of its provider key (rpm and tpm, shared with every adapter using the same key,
a 429's pause), a concurrency cap, bounded retries of what may be retried (see
:mod:`convsim.adapters._code_errors` for how an exception is read), a deadline per
attempt, usage (the adapter's figures, else an estimate) and the call's timings. The
sync call runs in a worker thread, never on the event loop; a thread cannot be
stopped, so a call past its deadline (or cancelled) is abandoned: the thread runs on
until the adapter's own code returns, and its answer is dropped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn

import anyio
import anyio.lowlevel
import anyio.to_thread

from convsim._errors import AdapterError, ProtocolError, RateLimited, Timeout
from convsim._log import get_logger
from convsim._secrets import Redactor
from convsim._types import CallTimings, Completion, GenerationParams, Message, Usage

from ._budget import BudgetLimits, Budgets, ProviderBudget, Refusal
from ._code_errors import adapter_error_for
from ._guide_shapes import settings_dict
from ._prompt import estimate_tokens, estimated_usage, render_prompt
from ._retry import RetryPolicy, quota_exhausted, refused_call
from ._text import repair_text

__all__ = [
    "BridgeSettings",
    "SyncBridge",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TIMEOUT_S",
    "read_usage",
]

log = get_logger("convsim.adapters")

DEFAULT_CONCURRENCY = 64
"""Calls in flight (worker threads) when neither the configuration nor a run sets it."""
DEFAULT_TIMEOUT_S = 60.0
"""Seconds one attempt may take when the configuration sets no ``timeout``."""
MAX_TOKEN_COUNT = 10**9
"""More tokens than any one call uses: a count above it is a broken answer."""

Respond = Callable[[str, dict[str, Any]], Any]
"""The adapter's ``generate_response``."""


@dataclass(frozen=True)
class BridgeSettings:
    """How one guide-style adapter's calls are made."""

    model: str
    """The model's name in errors and completions."""
    connection_key: str
    """Adapters with the same key share one rate budget."""
    limits: BudgetLimits
    own_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Settings of the adapter's ``get_default_config()`` that convsim has no field for
    (``top_k``, ...): part of every call's config, under convsim's settings."""
    concurrency: int | None = None
    """Calls in flight at most; None: the run's concurrency, else
    :data:`DEFAULT_CONCURRENCY`."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_retry_after: float = 60.0
    scrub: Redactor = field(default_factory=Redactor)
    """Blanks the configuration's secrets out of error messages."""


class _Answer(NamedTuple):
    """One attempt's answer, read and checked."""

    text: str
    finish_reason: str | None
    model: str
    usage: Usage | None
    """None when the adapter gave no usable figures (estimated once the call is over)."""
    total_s: float
    replaced_chars: int


class SyncBridge:
    """The async calls of one adapter whose work is a synchronous ``respond``."""

    def __init__(
        self,
        respond: Respond,
        settings: BridgeSettings,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        should_retry: Callable[[AdapterError], bool] | None = None,
    ) -> None:
        self.respond = respond
        self.settings = settings
        self.sleep = sleep
        """Waits between retries (and for the budget); tests inject a recording one."""
        self.should_retry = should_retry
        """The adapter's hook deciding which failures to try again (default: what the
        error declares)."""
        self._concurrency = settings.concurrency
        self._budgets = Budgets()
        self._budget: ProviderBudget | None = None
        self._slots: anyio.Semaphore | None = None
        self._threads: anyio.CapacityLimiter | None = None

    @property
    def concurrency(self) -> int:
        """Calls in flight at most (also the worker threads this adapter uses)."""
        return self._concurrency or DEFAULT_CONCURRENCY

    def share_budgets(self, budgets: Budgets) -> None:
        """Take the application's rate budgets (resolved now, before any call)."""
        self._budgets = budgets
        self._budget = None
        self.budget()

    def size_pool(self, concurrency: int) -> None:
        """Take the run's concurrency, unless the configuration set one.

        Raises:
            RuntimeError: a call has already been made.
        """
        if self.settings.concurrency is not None:
            return
        if self._slots is not None:
            raise RuntimeError("size_pool() must come before the first call")
        self._concurrency = concurrency

    def budget(self) -> ProviderBudget:
        if self._budget is None:
            self._budget = self._budgets.get(self.settings.connection_key, self.settings.limits)
        return self._budget

    # -- one call -------------------------------------------------------------------

    async def call(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """``messages`` as one prompt and ``params`` as the guide's settings dict, through
        the budget, the cap and retries; the answer as a Completion.

        Raises:
            AdapterError: the call failed, after retries where they apply.
        """
        if self._slots is None:
            self._slots = anyio.Semaphore(self.concurrency, fast_acquire=True)
            self._threads = anyio.CapacityLimiter(self.concurrency)
        settings = self.settings
        prompt = render_prompt(messages)
        config = {**settings.own_defaults, **settings_dict(params)}
        budget = self.budget()
        claim = estimate_tokens(prompt) + (params.max_tokens or 256) if budget.limits.tpm else 0
        budget_wait = 0.0

        async def refuse(refusal: Refusal) -> NoReturn:
            await anyio.lowlevel.checkpoint()
            raise refused_call(
                refusal.asked_s,
                refusal.remaining_s,
                settings.max_retry_after,
                model=settings.model,
            )

        async def attempt(number: int) -> _Answer:
            nonlocal budget_wait
            refusal = budget.refusal()
            if refusal is not None:
                await refuse(refusal)
            permit = await budget.acquire(claim, sleep=self.sleep)
            budget_wait += permit.queue_wait_s
            refusal = budget.refusal()
            if refusal is not None:
                budget.release(permit, 0, ok=False)
                await refuse(refusal)
            used, ok = 0, False
            try:
                answer = await self._attempt(prompt, dict(config))
                used = (answer.usage or self._estimated(prompt, answer.text)).total_tokens
                ok = True
                return answer
            except AdapterError as exc:
                if isinstance(exc, RateLimited):
                    exc.paused_s = budget.rate_limited(
                        exc.retry_after, permit, max_pause=settings.max_retry_after
                    )
                    exhausted = quota_exhausted(exc, settings.max_retry_after, exc.paused_s)
                    if exhausted is not None:
                        raise exhausted from exc
                raise
            finally:
                budget.release(permit, used, ok=ok)

        queued = time.perf_counter()
        async with self._slots:
            started = time.perf_counter()
            answer, attempts = await settings.retry.call(
                attempt,
                sleep=functools.partial(budget.retry_wait, self.sleep),
                should_retry=self.should_retry,
            )
            spent = time.perf_counter() - started
        usage = answer.usage or self._estimated(prompt, answer.text)
        return Completion(
            text=answer.text,
            finish_reason=answer.finish_reason,
            usage=usage,
            timings=CallTimings(
                queue_wait_s=(started - queued) + budget_wait,
                retry_wait_s=max(0.0, spent - budget_wait - answer.total_s),
                total_s=answer.total_s,
            ),
            attempts=attempts,
            model=answer.model,
            replaced_chars=answer.replaced_chars,
        )

    async def _attempt(self, prompt: str, config: dict[str, Any]) -> _Answer:
        """One call of ``respond`` in a worker thread, within the deadline."""
        settings = self.settings
        t0 = time.perf_counter()
        with anyio.move_on_after(settings.timeout_s) as scope:
            try:
                result = await anyio.to_thread.run_sync(
                    self.respond, prompt, config, limiter=self._threads, abandon_on_cancel=True
                )
            except Exception as exc:
                raise adapter_error_for(exc, model=settings.model, scrub=settings.scrub) from exc
        if scope.cancelled_caught:
            raise Timeout(
                f"generate_response did not answer within timeout={settings.timeout_s:g} s "
                "(its thread runs on; the answer will be dropped)",
                model=settings.model,
            )
        return self._read(result, time.perf_counter() - t0)

    def _read(self, result: Any, total_s: float) -> _Answer:
        """The dict ``generate_response`` returned, checked."""
        model = self.settings.model
        try:
            if not isinstance(result, Mapping):
                raise TypeError(f"it returned {type(result).__name__}, not a dict")
            text = result.get("text")
            if not isinstance(text, str):
                raise TypeError(f"text is {type(text).__name__}, not a string")
            finish = result.get("finish_reason", "stop")
            if finish is not None and not isinstance(finish, str):
                raise TypeError(f"finish_reason is {type(finish).__name__}, not a string")
            named = result.get("model")
            usage = read_usage(result.get("usage"), text)
        except TypeError as exc:
            raise ProtocolError(
                f"generate_response returned an unusable answer: {exc}",
                snippet=self.settings.scrub(repr(result))[:200],
                model=model,
            ) from None
        repaired = repair_text(text)
        return _Answer(
            repaired.text,
            None if finish is None else repair_text(finish).text,
            named if isinstance(named, str) and named else model,
            usage,
            total_s,
            repaired.replaced,
        )

    @staticmethod
    def _estimated(prompt: str, text: str) -> Usage:
        return estimated_usage(prompt, text)


def read_usage(data: Any, text: str) -> Usage | None:
    """The ``usage`` of an answer (a guide-style adapter's, an application's); None
    when it gives no figures (absent, or all three 0 for an answer that has text: the
    guide's example fills 0 in for a server that sent none), so that the usage is
    estimated instead.

    Raises:
        TypeError: a count that is not a whole number from 0 to 10**9.
    """
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise TypeError(f"usage is {type(data).__name__}, not a dict")
    counts: dict[str, int] = {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = data.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"usage.{name} is {value!r}, not a whole number")
        if not 0 <= value <= MAX_TOKEN_COUNT:
            raise TypeError(f"usage.{name} is {value}, not a token count")
        counts[name] = value
    if not any(counts.values()) and text:
        return None
    prompt, completion = counts["prompt_tokens"], counts["completion_tokens"]
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=counts["total_tokens"] or prompt + completion,
    )
