"""Adapters written in the guide's style (``generate_response``, no ``generate``) run as
convsim's async calls: in worker threads, under budgets, a concurrency cap, a deadline
and retries, with exceptions from their code read as typed errors."""

from __future__ import annotations

import threading
import urllib.error
from collections.abc import Callable
from email.message import Message as EmailMessage
from typing import Any

import anyio
import httpx
import pytest
import requests

from convsim import (
    AdapterCodeError,
    AdapterError,
    BadRequest,
    ConfigError,
    ProtocolError,
    QuotaExhausted,
    RateLimited,
    ServerError,
    Timeout,
)
from convsim.adapters import (
    CachedAdapter,
    Cost,
    GenerationParams,
    Message,
    ModelAdapter,
    ModelConfiguration,
    ModelPool,
    ResponseCache,
    Usage,
    is_bridged,
)
from convsim.adapters._code_errors import adapter_error_for

KEY = "sk-bridge-0123456789abcdef"
OK: dict[str, Any] = {
    "text": "fine",
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    "model": "m",
    "finish_reason": "stop",
}
USER = [Message(role="user", content="hello")]


class Guided(ModelAdapter):
    """A guide-style adapter whose answers are queued: a dict is returned, an
    exception raised, a callable called (with the prompt and config)."""

    def __init__(self, config: Any = None, outcomes: Any = ()) -> None:
        self.sleeps: list[float] = []

        async def record(seconds: float) -> None:
            self.sleeps.append(seconds)

        super().__init__(config, sleep=record)
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def generate_response(self, prompt: str, config: dict | None = None) -> dict:
        with self.lock:
            self.calls.append((prompt, dict(config or {})))
            outcome = self.outcomes.pop(0) if self.outcomes else OK
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return outcome(prompt, config)  # type: ignore[no-any-return]
        return outcome  # type: ignore[no-any-return]


def http_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    """The guide's wrapping of a requests error: Exception raised while handling it."""
    response = requests.Response()
    response.status_code = status
    response.url = "http://127.0.0.1:9/generate"
    response.headers.update(headers or {})
    try:
        try:
            raise requests.HTTPError(f"{status} Server Error", response=response)
        except requests.exceptions.RequestException as e:
            raise Exception(f"Custom model API error: {e!s}")  # noqa: B904 - as the guide does
    except Exception as wrapped:
        return wrapped


async def generate(adapter: ModelAdapter, params: GenerationParams | None = None) -> Any:
    return await adapter.generate(USER, params or GenerationParams())


# -- the class -------------------------------------------------------------------------


def test_a_class_with_generate_response_only_is_an_adapter() -> None:
    adapter = Guided()
    assert is_bridged(adapter) and is_bridged(Guided)
    assert adapter.model_info().model_type == "Guided"

    class Neither(ModelAdapter):
        pass

    with pytest.raises(TypeError, match=r"abstract method '?generate"):
        Neither()  # type: ignore[abstract]

    class Native(ModelAdapter):
        async def generate(self, messages: Any, params: Any) -> Any:
            raise NotImplementedError

        def generate_response(self, prompt: str, config: Any = None) -> Any:
            return OK

    assert not is_bridged(Native())  # its own generate is kept


@pytest.mark.anyio
async def test_the_conversation_is_one_prompt_and_the_settings_the_guides_dict() -> None:
    adapter = Guided()
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Hi"),
    ]
    params = GenerationParams(temperature=0.2, stop=("END",), seed=7, frequency_penalty=0.5)
    completion = await adapter.generate(messages, params)
    prompt, config = adapter.calls[0]
    assert prompt == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    assert config == {
        "temperature": 0.2,
        "max_tokens": None,
        "top_p": None,
        "frequency_penalty": 0.5,
        "presence_penalty": None,
        "stop": ["END"],
        "seed": 7,
    }
    assert (completion.text, completion.model, completion.attempts) == ("fine", "m", 1)
    assert completion.usage.total_tokens == 4 and completion.usage.source == "server"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer",
    [
        {"text": "four words of text"},
        {"text": "four words of text", "usage": None},
        {"text": "four words of text", "usage": {"prompt_tokens": 0, "completion_tokens": 0}},
    ],
)
async def test_an_answer_without_figures_has_its_usage_estimated(answer: dict) -> None:
    completion = await generate(Guided(outcomes=[answer]))
    assert completion.usage.source == "estimate" and completion.usage.completion_tokens > 0
    assert completion.finish_reason == "stop"  # the guide's default


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (None, "NoneType, not a dict"),
        ("fine", "str, not a dict"),
        ({"txt": "fine"}, "text is NoneType"),
        ({"text": "x", "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens is -1"),
        ({"text": "x", "usage": {"prompt_tokens": "3"}}, "not a whole number"),
        ({"text": "x", "usage": "many"}, "usage is str"),
        ({"text": "x", "finish_reason": 1}, "finish_reason is int"),
    ],
)
async def test_an_unusable_answer_fails_once_as_a_protocol_error(answer: Any, said: str) -> None:
    adapter = Guided(outcomes=[answer] * 3)
    with pytest.raises(ProtocolError, match=said) as info:
        await generate(adapter)
    assert info.value.attempts == 1 and len(adapter.calls) == 1
    assert not info.value.infrastructure


@pytest.mark.anyio
async def test_text_with_half_an_emoji_is_repaired() -> None:
    completion = await generate(Guided(outcomes=[{"text": "ok \ud83d"}]))
    assert completion.text == "ok \ufffd" and completion.replaced_chars == 1


class Talkative(Guided):
    """Says more than convsim reads, in each of the guide's dicts."""

    def get_model_info(self) -> dict:
        return {"model_id": "t/1", "model_type": "custom", "provider": "p", "version": "2"}

    def get_default_config(self) -> dict:
        return {"temperature": 0.3, "top_k": 40, "repetition_penalty": 1.1}

    def get_rate_limits(self) -> dict:
        return {"requests_per_minute": 30, "burst": 5}

    def estimate_cost(self, prompt_tokens: int, completion_tokens: int) -> dict:
        total = (prompt_tokens + completion_tokens) / 1000
        return {"prompt_cost": 0, "completion_cost": total, "total_cost": total, "tier": "x"}


@pytest.mark.anyio
async def test_what_convsim_does_not_read_in_the_guides_dicts_is_left_alone() -> None:
    adapter = Talkative()
    assert adapter.model_info().model_id == "t/1" and adapter.model_info().capabilities
    assert adapter.default_config().temperature == 0.3
    assert adapter.rate_limits().requests_per_minute == 30
    usage = Usage(prompt_tokens=500, completion_tokens=500, total_tokens=1000)
    assert adapter.usage_cost(usage) == Cost(completion_cost=1.0, total_cost=1.0)
    await adapter.generate(USER, adapter.default_config().merged({"temperature": 0.9}))
    _, config = adapter.calls[0]
    # its own settings come back to it; convsim's win where both have one
    assert config["top_k"] == 40 and config["repetition_penalty"] == 1.1
    assert config["temperature"] == 0.9


def test_a_wrong_value_in_the_guides_dicts_names_the_method_and_field() -> None:
    class Wrong(Guided):
        def get_model_info(self) -> dict:
            return {"context_length": "long"}

        def get_default_config(self) -> dict:
            return {"temperature": "warm"}

    with pytest.raises(ConfigError, match=r"get_model_info\(\).*context_length"):
        Wrong().model_info()
    with pytest.raises(ConfigError, match=r"get_default_config\(\).*temperature"):
        Wrong().default_config()


# -- failures, retries, budgets ------------------------------------------------------


@pytest.mark.anyio
async def test_a_503_and_a_dropped_connection_are_retried() -> None:
    adapter = Guided(outcomes=[http_error(503), requests.ConnectionError("reset"), OK])
    completion = await generate(adapter)
    assert completion.attempts == 3 and len(adapter.calls) == 3
    assert len(adapter.sleeps) == 2  # the back-off, through the injected sleep


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("failure", "kind", "cause"),
    [
        (http_error(400), BadRequest, None),
        (http_error(401), AdapterError, None),
        (KeyError("choices"), AdapterCodeError, "KeyError"),
        (ValueError("bad"), AdapterCodeError, "ValueError"),
    ],
)
async def test_what_retrying_cannot_mend_fails_at_once(
    failure: Exception, kind: type[AdapterError], cause: str | None
) -> None:
    adapter = Guided(outcomes=[failure, OK])
    with pytest.raises(kind) as info:
        await generate(adapter)
    assert info.value.attempts == 1 and len(adapter.calls) == 1 and not adapter.sleeps
    if cause is not None:
        assert isinstance(info.value, AdapterCodeError) and info.value.cause == cause
        assert not info.value.infrastructure


@pytest.mark.anyio
async def test_retries_stop_at_max_retries() -> None:
    adapter = Guided(ModelConfiguration(max_retries=1), outcomes=[http_error(502)] * 5)
    with pytest.raises(ServerError) as info:
        await generate(adapter)
    assert info.value.attempts == 2 and info.value.status_code == 502 and info.value.retryable


@pytest.mark.anyio
async def test_a_429_pauses_the_key_as_long_as_it_asks() -> None:
    adapter = Guided(outcomes=[http_error(429, {"Retry-After": "2"}), OK])
    completion = await generate(adapter)
    assert completion.attempts == 2
    assert any(2.0 <= s <= 2.2 for s in adapter.sleeps), adapter.sleeps
    (stats,) = adapter._sync_bridge()._budgets.statistics()
    assert stats.rate_limited == 1 and stats.in_flight == 0


@pytest.mark.anyio
async def test_a_429_asking_for_hours_is_a_quota_and_not_retried() -> None:
    adapter = Guided(outcomes=[http_error(429, {"Retry-After": "3600"}), OK])
    with pytest.raises(QuotaExhausted):
        await generate(adapter)
    with pytest.raises(QuotaExhausted, match="not sent"):  # the key refuses meanwhile
        await generate(adapter)
    assert len(adapter.calls) == 1


@pytest.mark.anyio
async def test_the_adapters_should_retry_hook_decides() -> None:
    class Never(Guided):
        def should_retry(self, error: AdapterError) -> bool:
            return False

    adapter = Never(outcomes=[http_error(503), OK])
    with pytest.raises(ServerError):
        await generate(adapter)
    assert len(adapter.calls) == 1


@pytest.mark.anyio
async def test_secrets_of_the_configuration_stay_out_of_errors() -> None:
    config = ModelConfiguration(api_key=KEY, api_endpoint="http://user:pa55word@127.0.0.1:9")
    adapter = Guided(config, outcomes=[RuntimeError(f"refused {KEY} at user:pa55word")])
    with pytest.raises(AdapterCodeError) as info:
        await generate(adapter)
    assert KEY not in str(info.value) and "pa55word" not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.anyio
async def test_an_attempt_past_its_deadline_is_abandoned_and_retried() -> None:
    release = threading.Event()

    def stuck(prompt: str, config: Any) -> dict:
        release.wait(30)
        return {"text": "late"}

    adapter = Guided(ModelConfiguration(timeout=0.2), outcomes=[stuck, OK])
    try:
        completion = await generate(adapter)
    finally:
        release.set()
    assert completion.text == "fine" and completion.attempts == 2


@pytest.mark.anyio
async def test_a_deadline_with_no_retries_left_is_a_timeout() -> None:
    release = threading.Event()
    adapter = Guided(
        ModelConfiguration(timeout=0.1, max_retries=0),
        outcomes=[lambda p, c: release.wait(30) and OK],
    )
    try:
        with pytest.raises(Timeout, match=r"timeout=0\.1 s") as info:
            await generate(adapter)
    finally:
        release.set()
    assert info.value.retryable


@pytest.mark.anyio
async def test_cancelling_a_call_returns_at_once_and_gives_its_budget_back() -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck(prompt: str, config: Any) -> dict:
        entered.set()
        release.wait(30)
        return OK

    adapter = Guided(ModelConfiguration(rpm=6000), outcomes=[stuck])
    finished = False
    try:
        async with anyio.create_task_group() as group:

            async def call() -> None:
                nonlocal finished
                await generate(adapter)
                finished = True

            group.start_soon(call)
            await anyio.to_thread.run_sync(entered.wait, 10)
            group.cancel_scope.cancel()
        assert not finished and not release.is_set()  # returned while the thread waits
        (stats,) = adapter._sync_bridge()._budgets.statistics()
        assert stats.in_flight == 0 and stats.waiting == 0
    finally:
        release.set()
    assert (await generate(adapter)).text == "fine"  # the adapter serves on


@pytest.mark.anyio
async def test_calls_in_flight_never_pass_the_concurrency_cap() -> None:
    release = threading.Event()
    lock = threading.Lock()
    now = peak = 0

    def counted(prompt: str, config: Any) -> dict:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        release.wait(30)
        with lock:
            now -= 1
        return OK

    adapter = Guided(ModelConfiguration(concurrency=2), outcomes=[counted] * 5)
    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(generate, adapter)
        slots = adapter._sync_bridge()._slots
        with anyio.fail_after(10):
            while slots is None or slots.statistics().tasks_waiting < 3:
                await anyio.sleep(0.01)
                slots = adapter._sync_bridge()._slots
        release.set()
    assert peak == 2 and len(adapter.calls) == 5


def test_adapters_with_one_endpoint_and_key_share_a_budget() -> None:
    def built(key: str, endpoint: str = "http://127.0.0.1:9") -> Guided:
        return Guided(ModelConfiguration(api_key=key, api_endpoint=endpoint, rpm=60))

    a, b, c = built(KEY), built(KEY), built("another-key-0123456789")
    d = built(KEY, "http://127.0.0.1:10")
    assert a.connection_key() == b.connection_key()
    assert len({a.connection_key(), c.connection_key(), d.connection_key()}) == 3
    assert KEY not in (a.connection_key() or "")


@pytest.mark.anyio
async def test_the_pool_gives_a_guide_style_adapter_its_budgets_and_cap() -> None:
    class Declared(Guided):
        def get_rate_limits(self) -> dict:
            return {"requests_per_minute": 60, "tokens_per_minute": 9000, "requests_per_day": 5}

    adapter = Declared(ModelConfiguration(rpm=600))
    async with ModelPool(concurrency=3) as pool:
        assert pool.get(adapter) is adapter
        limits = adapter.rate_limits()
        # the configuration's rpm over the declared one, the declared rest
        assert (limits.requests_per_minute, limits.tokens_per_minute) == (600, 9000)
        assert limits.requests_per_day == 5 and limits.concurrency == 64  # not sized
        await generate(adapter)
        (stats,) = pool.budgets.statistics()
        assert stats.key == adapter.connection_key() and stats.requests == 1
    sized = Guided()
    sized.size_pool(3)
    assert sized.rate_limits().concurrency == 3
    await generate(sized)
    with pytest.raises(RuntimeError, match="before the first call"):
        sized.size_pool(5)
    fixed = Guided(ModelConfiguration(concurrency=7))
    fixed.size_pool(3)
    assert fixed.rate_limits().concurrency == 7


@pytest.mark.anyio
async def test_the_response_cache_answers_a_guide_style_adapter(tmp_path: Any) -> None:
    adapter = Guided()
    cached = CachedAdapter(adapter, ResponseCache(tmp_path))
    first = await generate(cached)
    again = await generate(cached)
    assert again.cached and again.text == first.text and len(adapter.calls) == 1
    await generate(cached, GenerationParams(presence_penalty=0.5))  # another request
    assert len(adapter.calls) == 2


# -- what an exception says ------------------------------------------------------------


def _urllib_error(status: int) -> Exception:
    headers = EmailMessage()
    headers["Retry-After"] = "1"
    return urllib.error.HTTPError("http://h/generate", status, "bad", headers, None)


def _httpx_error(status: int) -> Exception:
    request = httpx.Request("POST", "http://h/generate")
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError("failed", request=request, response=response)


class _Status(Exception):
    status_code = 409


def _suppressed() -> Exception:
    try:
        try:
            raise requests.HTTPError("503", response=requests.Response())
        except requests.HTTPError:
            raise RuntimeError("hidden") from None
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    ("make", "kind", "retryable"),
    [
        (lambda: http_error(503), ServerError, True),
        (lambda: http_error(429, {"Retry-After": "5"}), RateLimited, True),
        (lambda: http_error(404), BadRequest, False),
        (lambda: _urllib_error(502), ServerError, True),
        (lambda: _httpx_error(422), BadRequest, False),
        (lambda: _Status("conflict"), ServerError, True),
        (lambda: requests.ConnectionError("refused"), ServerError, True),
        (lambda: requests.ReadTimeout("slow"), Timeout, True),
        (lambda: TimeoutError(), Timeout, True),
        (lambda: httpx.ConnectError("refused"), ServerError, True),
        (lambda: httpx.ReadTimeout("slow"), Timeout, True),
        (lambda: urllib.error.URLError("no route"), ServerError, True),
        (lambda: ConnectionResetError(), ServerError, True),
        (lambda: ServerError("mine", status_code=500), ServerError, True),
        (lambda: KeyError("choices"), AdapterCodeError, False),
        (lambda: Exception("Custom model API error: bad"), AdapterCodeError, False),
        (_suppressed, AdapterCodeError, False),  # `from None` hides what it was handling
        (lambda: FileNotFoundError("prompt.txt"), AdapterCodeError, False),
    ],
)
def test_exceptions_from_an_adapters_code_are_read_as_the_table_says(
    make: Callable[[], Exception], kind: type[AdapterError], retryable: bool
) -> None:
    error = adapter_error_for(make(), model="m")
    assert type(error) is kind and error.retryable is retryable


def test_a_429_from_the_adapters_code_keeps_its_retry_after() -> None:
    error = adapter_error_for(http_error(429, {"Retry-After": "5"}), model="m")
    assert isinstance(error, RateLimited) and error.retry_after == 5 and error.status_code == 429
    assert "Custom model API error" in str(error) and "/generate" in str(error)
