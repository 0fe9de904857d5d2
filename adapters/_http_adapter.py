"""What every HTTP model adapter shares: config, keys, budgets, retries, streaming, cost.

A backend subclass says how to build its request and read its answers
(:meth:`HttpModelAdapter.request`, :meth:`parse_response`, :meth:`parse_event`); this
base does the rest the same way for all of them. A call that is not a generation (an
:class:`Exchange`, such as scoring a prompt) takes the same path.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import socket
import time
import uuid
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, NoReturn, Protocol
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from convsim._errors import (
    AdapterError,
    BadRequest,
    ConfigError,
    EgressRefused,
    EndpointError,
    MalformedResponse,
    ProtocolError,
    RateLimited,
    ServerError,
    parse_config,
)
from convsim._log import get_logger
from convsim._secrets import Redactor, redact_url
from convsim._telemetry import Telemetry, current_telemetry
from convsim._types import (
    CallTimings,
    Completion,
    Cost,
    GenerationParams,
    Message,
    ModelInfo,
    RateLimits,
    RequestIds,
    ToolCall,
    Usage,
)

from ._base_url import EXAMPLE, check_base_url
from ._budget import BudgetLimits, Budgets, ProviderBudget, Refusal
from ._egress import EgressPolicy
from ._http import (
    JSON_HEADERS,
    PROBE_BODY_LIMIT,
    AiohttpTransport,
    HttpLibrary,
    HttpTimeouts,
    HttpTransport,
    HttpxTransport,
    SSEDecoder,
    SSEEvent,
    StreamResponse,
    default_http_library,
    read_limited,
    too_large,
)
from ._inflight import BytesInFlight, InflightStatistics
from ._pricing import PRICING_ENV, Price, PriceTable, price_table
from ._prompt import estimate_tokens, tool_calls_text
from ._protocol import ModelAdapter
from ._retry import RetryPolicy, error_for_status, quota_exhausted, refused_call
from ._streamed_answer import StreamedAnswer
from ._text import repair_text
from ._tokenizer import MESSAGE_OVERHEAD_TOKENS, ServerTokenizer
from ._tool_stream import ToolCallPiece

__all__ = [
    "HttpAdapterConfig",
    "HttpModelAdapter",
    "HttpRequest",
    "ParsedAnswer",
    "Delta",
    "Exchange",
    "estimate_tokens",
]


class HttpAdapterConfig(BaseModel):
    """Arguments every HTTP adapter takes (``--model-arg KEY=VALUE``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    base_url: str | None = None
    """Where the API lives (http:// or https://, a host, a port from 1 to 65535); each
    backend has a default where one exists."""
    api_key: SecretStr | None = None
    """The key itself; prefer ``api_key_env``. Never logged or written to results."""
    api_key_env: str | None = None
    """The environment variable that holds the key (each backend has a default)."""
    rpm: float | None = Field(default=None, gt=0)
    """Requests per minute for this provider key, shared by every role using it."""
    tpm: float | None = Field(default=None, gt=0)
    """Tokens per minute for this provider key."""
    rpd: float | None = Field(default=None, gt=0)
    """Requests per day, as the provider states it: reported by ``rate_limits()``, not
    enforced (a run that long is better split)."""
    concurrency: int = Field(default=64, ge=1)
    """Calls this adapter has in flight at most; also the pool size. When
    not set, the adapter takes the concurrency of the run it serves (see
    :meth:`HttpModelAdapter.size_pool`), and 64 when it serves none."""
    stream: bool = False
    """Stream responses (measures time to first token and inter-token gaps)."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds between two reads of a response."""
    connect_timeout: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=3, ge=0, le=20)
    max_retry_time: float = Field(default=120.0, gt=0)
    """No retry starts after this many seconds since the first attempt."""
    max_retry_after: float = Field(default=60.0, ge=0)
    """The longest Retry-After (seconds) a 429 is waited for. A longer one (a daily
    quota used up) fails the call with QuotaExhausted, and the key then refuses calls
    for this long instead of pausing them for as long as the server asked."""
    http: HttpLibrary | None = None
    """The HTTP library: ``aiohttp``, ``httpx`` or ``lean`` (HTTP/1.1 on pooled
    keep-alive connections, the cheapest per request: ``convsim load``'s default; no
    proxies, asyncio only); by default aiohttp under asyncio and httpx under trio
    (aiohttp runs on asyncio only)."""
    max_body_bytes: int = Field(default=64 * 2**20, ge=1024)
    """The largest answer read, in bytes after decompression (a whole stream counts);
    beyond it the call fails with ResponseTooLarge rather than filling memory."""
    max_event_bytes: int = Field(default=2**20, ge=1024)
    """The largest server-sent event (or line of one) of a stream, in bytes."""
    max_inflight_bytes: int = Field(default=256 * 2**20, ge=1024)
    """The bytes of answers (bodies and streams, after decompression) all calls of
    this adapter may hold at once while reading them; a call that would pass it fails
    at once with ResponseTooLarge (retried) rather than filling memory. At least
    max_body_bytes."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    max_tokens_cap: int | None = Field(default=None, gt=0)
    """The most tokens any call may ask for: a turn asking for more, or for no limit,
    asks for this many (an operator's limit, as the evaluation service sets it)."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    """A default where a turn sets none (sent where the API has it), as temperature."""
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    input_price: float | None = Field(default=None, ge=0)
    """USD per million prompt tokens (overrides the pricing file)."""
    output_price: float | None = Field(default=None, ge=0)
    """USD per million completion tokens."""
    cached_input_price: float | None = Field(default=None, ge=0)
    """USD per million prompt tokens read from the server's prompt cache (default: the
    pricing file's, else ``input_price``)."""
    pricing_file: str | None = None
    """A JSON price file that extends and overrides the bundled one (default: the file
    ``CONVSIM_PRICING_FILE`` names, if set)."""
    context_length: int | None = Field(default=None, gt=0)
    api_endpoint: str | None = None
    """The guide's name for ``base_url`` (checked the same way; base_url wins)."""
    model_name: str | None = None
    """The guide's name for ``model`` (model wins)."""
    request_id_header: str | None = None
    """A header to send a fresh id in with every attempt (``x-request-id``), recorded
    with the call's ids so that it can be found in the server's logs; None sends none."""

    @field_validator("request_id_header")
    @classmethod
    def _plain_header(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _HEADER_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not an HTTP header name (letters, digits, '-')")
        if value.lower() in _RESERVED_HEADERS:
            raise ValueError(
                f"{value!r} is a header convsim or the server needs for itself; choose "
                "another name, such as x-request-id"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _guide_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if data.get("model_name") and not data.get("model"):
                data["model"] = data["model_name"]
            endpoint = data.get("api_endpoint")
            if endpoint and not data.get("base_url") and _usable(endpoint):
                data["base_url"] = endpoint  # a bad one is reported as api_endpoint
        return data

    @field_validator("base_url", "api_endpoint")
    @classmethod
    def _usable_base_url(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)

    @model_validator(mode="after")
    def _one_answer_fits_in_flight(self) -> HttpAdapterConfig:
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_inflight_bytes={self.max_inflight_bytes} is below "
                f"max_body_bytes={self.max_body_bytes}: one answer of that size could never "
                "be read; raise max_inflight_bytes"
            )
        return self


_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_RESERVED_HEADERS = frozenset(
    {
        *("authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"),
        *("content-type", "content-length", "content-encoding", "host", "accept"),
        *("traceparent", "tracestate", "anthropic-version", "transfer-encoding"),
    }
)
"""Headers a request id may not be sent in: credentials, the body's framing, the trace."""

_MAX_ID_CHARS = 200
"""The longest request id recorded; a longer header value is cut (it is not an id)."""


class _Seen:
    """What one attempt learnt of its exchange, kept however the attempt ends."""

    __slots__ = ("server", "status", "url")

    def __init__(self) -> None:
        self.server: str | None = None
        self.status: int | None = None
        self.url: str | None = None


def _server_request_id(headers: Mapping[str, str]) -> str | None:
    """The request id a server answered with: ``x-request-id`` (vLLM, OpenAI, most
    proxies), else ``request-id`` (Anthropic)."""
    value = headers.get("x-request-id") or headers.get("request-id")
    return value[:_MAX_ID_CHARS] if value else None


def _usable(url: Any) -> bool:
    try:
        check_base_url(url)
    except (TypeError, ValueError, AttributeError):
        return False
    return True


class HttpRequest(NamedTuple):
    """One call as it goes on the wire."""

    path: str
    """Where it goes, after the adapter's base_url (``/chat/completions``)."""
    body: dict[str, Any]
    """The JSON body."""


class ParsedAnswer(NamedTuple):
    """What a (non-streamed) answer says."""

    text: str
    finish_reason: str | None
    usage: Usage | None
    """None when the server sent none (the adapter then estimates it)."""
    reasoning: str | None = None
    """What a reasoning model thought before answering; None when it sent none."""
    reasoning_tokens: int | None = None
    """Of the completion tokens, those spent reasoning; None when not reported."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tools the model asked to run."""
    response_id: str | None = None
    """The provider's id of the answer (``chatcmpl-...``, ``msg_...``); None if none."""


class Delta(NamedTuple):
    """What one streamed event contributed (a tuple: one is made per streamed token)."""

    text: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    done: bool = False
    reasoning: str | None = None
    """A piece of reasoning (it arrives before the answer)."""
    reasoning_tokens: int | None = None
    """Reasoning tokens, where the event reports usage with them."""
    tool_calls: tuple[ToolCallPiece, ...] = ()
    """Pieces of tool calls, joined by their index across events."""
    response_id: str | None = None
    """The provider's id of the answer, where the event carries it."""


class _Answer(NamedTuple):
    """One attempt's answer, checked; :meth:`HttpModelAdapter._call` makes it a
    :class:`~convsim.Completion` (one object per call on the hot path)."""

    text: str
    finish_reason: str | None
    usage: Usage | None
    """None when the server sent none (counted or estimated once the call is over)."""
    total_s: float
    ttft_s: float | None = None
    inter_token_s: tuple[float, ...] = ()
    replaced_chars: int = 0
    reasoning: str | None = None
    reasoning_tokens: int | None = None
    ttfot_s: float | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    response_id: str | None = None


class Exchange(Protocol):
    """A call other than a generation (e.g. scoring a prompt) on the shared call path.

    It takes the place of :meth:`HttpModelAdapter.request` and
    :meth:`~HttpModelAdapter.parse_response` for one call, which is never streamed;
    budgets, retries, error mapping and key redaction stay as for any call.
    """

    def request(self) -> HttpRequest:
        """The path (after base_url) and JSON body of the call."""
        ...

    def parse(self, data: Any) -> ParsedAnswer:
        """Text, finish reason and usage (None if the server sent none) of the answer."""
        ...


log = get_logger("convsim.adapters")

_ERROR_BODY_BYTES = 64 * 1024
"""What is read of an error answer: its message is in the first few hundred bytes."""


def _optional_text(value: Any, what: str) -> str | None:
    """``value`` if it is a string or None; a wrong shape raises (a malformed answer)."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not a string")
    return value


MAX_TOKEN_COUNT = 10**9
"""More tokens than any one call uses: a count above it is a broken answer."""


def _valid_usage(usage: Usage | None) -> Usage | None:
    """``usage`` if its counts are token counts (0 to :data:`MAX_TOKEN_COUNT`); a
    negative or absurd count raises (a malformed answer, not a figure to add up)."""
    if usage is None:
        return None
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        count = getattr(usage, name)
        if not 0 <= count <= MAX_TOKEN_COUNT:
            raise ValueError(f"usage.{name} is {count}, not a token count")
    return usage


def _reasoning_tokens(count: Any) -> int | None:
    """``count`` if it is a token count (0 to :data:`MAX_TOKEN_COUNT`) or None; anything
    else raises (a malformed answer)."""
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_TOKEN_COUNT:
        raise ValueError(f"reasoning_tokens is {count!r}, not a token count")
    return count


def _response_id(value: Any) -> str | None:
    """The answer's id if it is a string (cut to a sensible length); None otherwise: an
    id in a strange shape is no reason to fail an answer."""
    return value[:_MAX_ID_CHARS] if isinstance(value, str) and value else None


def _finish_reason(reason: str | None) -> str | None:
    return None if reason is None else repair_text(reason).text


def _merge_usage(old: Usage | None, new: Usage | None) -> Usage | None:
    """Streams report usage in parts (Anthropic: input first, output at the end)."""
    if old is None or new is None:
        return new or old
    prompt = new.prompt_tokens or old.prompt_tokens
    completion = new.completion_tokens or old.completion_tokens
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cached_prompt_tokens=new.cached_prompt_tokens or old.cached_prompt_tokens,
        cached_tokens=new.cached_tokens if new.cached_tokens is not None else old.cached_tokens,
    )


def _prompt_tokens(messages: Sequence[Message]) -> int:
    return sum(
        estimate_tokens(m.content + tool_calls_text(m.tool_calls)) + MESSAGE_OVERHEAD_TOKENS
        for m in messages
    )


def _checked_tool_calls(calls: Any) -> tuple[ToolCall, ...]:
    """``calls`` if it is a tuple of ToolCalls; a wrong shape raises (a malformed
    answer). Names and arguments are repaired as answer text is."""
    if not isinstance(calls, tuple) or not all(isinstance(c, ToolCall) for c in calls):
        raise TypeError("the answer's tool calls are not ToolCalls")
    return tuple(
        ToolCall(id=c.id, name=repair_text(c.name).text, arguments=repair_text(c.arguments).text)
        for c in calls
    )


_NOT_SHAPING_ANSWERS = frozenset(
    {
        *("api_key", "api_key_env", "base_url", "rpm", "tpm", "rpd", "concurrency", "http"),
        *("stream", "stream_usage", "timeout", "connect_timeout", "max_retries"),
        *("max_retry_time", "max_retry_after", "max_body_bytes", "max_event_bytes"),
        *("max_inflight_bytes", "input_price", "output_price", "context_length"),
        *("api_endpoint", "model_name"),  # the guide's names of base_url and model
        "request_id_header",
    }
)
"""Adapter arguments that change how a call is made, paced or priced, not its answer:
left out of response-cache keys, so a new limit or timeout still finds the answers."""


class HttpModelAdapter(ModelAdapter):
    """Base of the HTTP adapters. Subclasses set the class attributes and the hooks."""

    model_type: ClassVar[str]
    provider: ClassVar[str]
    default_base_url: ClassVar[str | None] = None
    base_url_env: ClassVar[str | None] = None
    """The environment variable that, when set, replaces ``default_base_url``
    (``OPENAI_BASE_URL``); ``base_url`` in the arguments wins over it."""
    default_key_env: ClassVar[str | None] = None
    requires_key: ClassVar[bool] = False
    supports_streaming: ClassVar[bool] = True
    Config: ClassVar[type[HttpAdapterConfig]] = HttpAdapterConfig

    def __init__(
        self,
        config: HttpAdapterConfig | Mapping[str, Any],
        *,
        transport: HttpTransport | None = None,
        budgets: Budgets | None = None,
        env: Mapping[str, str] | None = None,
        egress: EgressPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        cfg = self.config = parse_config(self.Config, config, f"{self.model_type} model")
        if env is None:
            env = os.environ
        base_url = cfg.base_url or self._base_url_from(env) or self.default_base_url
        if not base_url:
            where = f" or set {self.base_url_env}" if self.base_url_env else ""
            raise ConfigError(
                f"{self.model_type}:{cfg.model} needs a base_url (--model-arg "
                f"base_url={EXAMPLE}{where})"
            )
        self.base_url = base_url.rstrip("/")
        self.egress = egress
        """Where this adapter's calls may go (None: anywhere); checked at every
        connection. A policy needs convsim's aiohttp transport."""
        if egress is not None:
            if cfg.http == "httpx" or transport is not None:
                raise ConfigError("an egress policy needs the aiohttp transport (drop http=httpx)")
            egress.check_url(self.base_url)
        self._api_key = self._resolve_key(env)
        self._prices: PriceTable = price_table(
            cfg.pricing_file or env.get(PRICING_ENV, "").strip() or None
        )
        self._scrub = Redactor.of(keys=[self._api_key], urls=[self.base_url])
        """Blanks the key, and credentials inside base_url, out of errors, snippets and
        answers."""
        self._headers = {**JSON_HEADERS, **self.auth_headers()}
        if cfg.stream and not self.supports_streaming:
            raise ConfigError(f"{self.model_type} models do not stream; drop stream=true")
        self._transport = transport
        """Built on first use, with a pool that fits the concurrency (see size_pool)."""
        self._owns_transport = transport is None
        self._concurrency = cfg.concurrency
        self._timeouts = HttpTimeouts(connect=cfg.connect_timeout, read=cfg.timeout)
        self.retry_policy = RetryPolicy(
            max_retries=cfg.max_retries, max_elapsed_s=cfg.max_retry_time
        )
        self._budgets = budgets if budgets is not None else Budgets()
        self._budget: ProviderBudget | None = None
        self._inflight = BytesInFlight(cfg.max_inflight_bytes)
        """Answer bytes held by this adapter's calls: one budget for the run it serves."""
        self._slots: anyio.Semaphore | None = None
        self._sleep = sleep
        root = self.tokenizer_root()
        self._tokenizer = (
            None
            if root is None
            else ServerTokenizer(self._post_json, root, cfg.model, self._reported_prompt_tokens)
        )

    # -- identity, keys and budgets -------------------------------------------------

    def _base_url_from(self, env: Mapping[str, str]) -> str | None:
        """The base URL the environment gives (``base_url_env``), checked; None when the
        variable is unset or empty. Read from ``env`` only: an application that builds
        adapters for others passes an empty mapping, and they see none of its own."""
        value = env.get(self.base_url_env, "").strip() if self.base_url_env else ""
        if not value:
            return None
        try:
            return check_base_url(value)
        except ValueError as exc:
            raise ConfigError(f"{self.base_url_env}: {exc}") from None

    def _resolve_key(self, env: Mapping[str, str]) -> str | None:
        if self.config.api_key is not None:
            return self.config.api_key.get_secret_value()
        name = self.config.api_key_env or self.default_key_env
        key = env.get(name) if name else None
        if key is None and (self.requires_key or self.config.api_key_env):
            raise ConfigError(
                f"{self.model_type}:{self.config.model} needs an API key: set the environment "
                f"variable {name} (or choose another with --model-arg api_key_env=NAME)"
            )
        return key

    def url_for(self, path: str) -> str:
        """``path`` under base_url, before base_url's query (``?api-version=...``)."""
        base, sep, query = self.base_url.partition("?")
        return f"{base.rstrip('/')}{path}{sep}{query}"

    def cache_identity(self) -> Mapping[str, Any]:
        """The model, the base URL (credentials masked) and every argument that shapes
        an answer; never the key, limits, timeouts or prices."""
        shaping = {
            name: value
            for name, value in self.config.model_dump(exclude=set(_NOT_SHAPING_ANSWERS)).items()
            if not isinstance(value, SecretStr)
        }
        return {
            **super().cache_identity(),
            "base_url": redact_url(self.base_url),
            "arguments": shaping,
        }

    def connection_key(self) -> str:
        """Adapters with the same key share one rate budget (same API, same key)."""
        secrets = "\n".join(self._scrub.secrets + ((self._api_key,) if self._api_key else ()))
        key_id = hashlib.sha256(secrets.encode()).hexdigest()[:12] if secrets else "-"
        return f"{self.model_type}|{redact_url(self.base_url)}|{key_id}"

    def share_budgets(self, budgets: Budgets) -> None:
        """Share rate budgets with the other adapters of an application.

        The budget is resolved now, before any call, so the stricter limits of two
        adapters sharing a key are settled before either starts using them.
        """
        self._budgets = budgets
        self._budget = None
        self.budget()

    def size_pool(self, concurrency: int) -> None:
        """Take the application's concurrency as this adapter's cap and pool size,
        unless ``concurrency`` was set in its arguments.

        Raises:
            RuntimeError: a call has already been made (the cap is in use).
        """
        if "concurrency" in self.config.model_fields_set:
            return
        if self._slots is not None:
            raise RuntimeError("size_pool() must come before the first call")
        self._concurrency = concurrency

    def budget(self) -> ProviderBudget:
        if self._budget is None:
            limits = BudgetLimits(rpm=self.config.rpm, tpm=self.config.tpm)
            self._budget = self._budgets.get(self.connection_key(), limits)
        return self._budget

    def bytes_in_flight(self) -> InflightStatistics:
        """The answer bytes this adapter's calls hold now, at most so far, and the limit
        (``max_inflight_bytes``)."""
        return self._inflight.statistics()

    def default_max_tokens(self) -> int:
        """What a call may produce when a turn sets no max_tokens (for token budgets)."""
        return self.config.max_tokens or 256

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    # -- the adapter protocol -------------------------------------------------------

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            model_id=f"{self.provider}/{self.config.model}",
            model_type=self.model_type,
            provider=self.provider,
            capabilities=("text_generation", "chat"),
            context_length=self.config.context_length,
            supports_streaming=self.supports_streaming,
        )

    def default_config(self) -> GenerationParams:
        c = self.config
        return GenerationParams(
            temperature=c.temperature,
            max_tokens=c.max_tokens,
            top_p=c.top_p,
            frequency_penalty=c.frequency_penalty,
            presence_penalty=c.presence_penalty,
        )

    def rate_limits(self) -> RateLimits:
        return RateLimits(
            requests_per_minute=self.config.rpm,
            tokens_per_minute=self.config.tpm,
            requests_per_day=self.config.rpd,
            concurrency=self._concurrency,
        )

    def price(self) -> Price | None:
        """What this adapter's model costs: the arguments' prices over the price table's;
        None when the input or output price is not known."""
        c = self.config
        listed = self._prices.price_of(self.provider, c.model)
        input_price, output_price = c.input_price, c.output_price
        if input_price is None and listed is not None:
            input_price = listed.input_per_mtok
        if output_price is None and listed is not None:
            output_price = listed.output_per_mtok
        if input_price is None or output_price is None:
            return None
        cached = c.cached_input_price
        if cached is None and c.input_price is None and listed is not None:
            cached = listed.cached_input_per_mtok  # a given input price is not mixed with it
        return Price(input_price, output_price, cached)

    def usage_cost(self, usage: Usage) -> Cost | None:
        price = self.price()
        if price is None:
            return None
        cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        cached_rate = (
            price.input_per_mtok
            if price.cached_input_per_mtok is None
            else price.cached_input_per_mtok
        )
        prompt = (
            (usage.prompt_tokens - cached) * price.input_per_mtok + cached * cached_rate
        ) / 1e6
        completion = usage.completion_tokens * price.output_per_mtok / 1e6
        return Cost(prompt_cost=prompt, completion_cost=completion, total_cost=prompt + completion)

    async def aclose(self) -> None:
        """Close the connections; a pool the adapter built itself is built afresh on the
        next call (the sync ``generate_response`` closes it after each)."""
        transport = self._transport
        if transport is not None:
            if self._owns_transport:
                self._transport = None
            await transport.aclose()

    def _http(self) -> HttpTransport:
        """The transport, built at the first call (in the event loop it will run on)."""
        if self._transport is None:
            running = default_http_library()
            # an egress policy is checked by convsim's aiohttp resolver: never dropped
            library = self.config.http or ("aiohttp" if self.egress is not None else running)
            if library == "aiohttp" and running != "aiohttp":
                raise ConfigError(
                    "an egress policy needs aiohttp, which runs under asyncio only: run "
                    "under asyncio"
                    if self.egress is not None
                    else "http=aiohttp runs under asyncio only; under trio drop it "
                    "(httpx is the default there)"
                )
            if library == "lean":
                self._transport = self._lean_transport(running)
            elif library == "aiohttp":
                self._transport = AiohttpTransport(pool_size=self._concurrency, egress=self.egress)
            else:
                self._transport = HttpxTransport(pool_size=self._concurrency)
        return self._transport

    def _lean_transport(self, running: HttpLibrary) -> HttpTransport:
        """The lean HTTP/1.1 seam; aiohttp where the environment names a proxy for the
        base URL or the URL holds credentials (the lean seam speaks to servers directly,
        and sends only the adapter's headers)."""
        if running != "aiohttp":
            raise ConfigError("http=lean runs under asyncio only; under trio drop it")
        if self.egress is not None:
            raise ConfigError("an egress policy needs aiohttp: drop http=lean")
        from ._lean_http import LeanTransport, needs_aiohttp

        if needs_aiohttp(self.url_for("")):
            return AiohttpTransport(pool_size=self._concurrency)
        return LeanTransport(pool_size=self._concurrency)

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """One model call: wait for the budget, send, retry what may be retried."""
        return await self._call(messages, params, on_text=None)

    async def stream(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        on_text: Callable[[str], None],
    ) -> Completion:
        """Like :meth:`generate`, streaming: ``on_text`` gets each piece as it arrives.

        Failures before the first piece are retried as usual; once text has been
        delivered a failure is final (the pieces cannot be taken back).

        Raises:
            ConfigError: the backend does not stream (:attr:`supports_streaming`).
        """
        if not self.supports_streaming:
            return await super().stream(messages, params, on_text)  # the refusal
        return await self._call(messages, params, on_text=on_text)

    # -- one call -------------------------------------------------------------------

    async def _call(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        on_text: Callable[[str], None] | None,
        *,
        exchange: Exchange | None = None,
    ) -> Completion:
        """One call through budgets, the concurrency cap and retries.

        ``messages`` and ``params`` size the token claim (and a usage estimate should
        the server send none); an ``exchange``, when given, is sent instead of
        :meth:`request`.
        """
        if self._slots is None:
            # fast_acquire: a free slot is taken without a trip through the event loop
            self._slots = anyio.Semaphore(self._concurrency, fast_acquire=True)
        cap = self.config.max_tokens_cap
        if cap is not None and (params.max_tokens is None or params.max_tokens > cap):
            params = params.model_copy(update={"max_tokens": cap})
        budget = self.budget()
        stream = exchange is None and (on_text is not None or self.config.stream)
        # only a token budget needs the estimate of what the call will use
        claim = (
            _prompt_tokens(messages) + (params.max_tokens or self.default_max_tokens())
            if budget.limits.tpm
            else 0
        )
        delivered = False
        budget_wait = 0.0
        ids: list[RequestIds] = []
        """Each attempt's ids, in order."""
        telemetry = current_telemetry()

        def deliver(text: str) -> None:
            nonlocal delivered
            delivered = True
            assert on_text is not None
            on_text(text)

        max_retry_after = self.config.max_retry_after

        async def refuse(refusal: Refusal) -> NoReturn:
            # a checkpoint, so that a caller failing in a loop still lets others run
            await anyio.lowlevel.checkpoint()
            raise refused_call(
                refusal.asked_s, refusal.remaining_s, max_retry_after, model=self.config.model
            )

        async def attempt(number: int) -> _Answer:
            nonlocal budget_wait
            refusal = budget.refusal()
            if refusal is not None:  # a quota is used up: fail now, do not wait for it
                await refuse(refusal)
            permit = await budget.acquire(claim, sleep=self._sleep)
            budget_wait += permit.queue_wait_s
            refusal = budget.refusal()
            if refusal is not None:  # refused while this call waited for the budget
                budget.release(permit, 0, ok=False)
                await refuse(refusal)
            used = 0  # a failed call gives its whole token claim back
            ok = False
            try:
                answer = await self._identified_attempt(
                    number,
                    ids,
                    telemetry,
                    messages,
                    params,
                    stream,
                    deliver if on_text is not None else None,
                    exchange,
                )
                usage = answer.usage or self._estimated(
                    messages, answer.text + tool_calls_text(answer.tool_calls)
                )
                used, ok = usage.total_tokens, True
                return answer
            except AdapterError as exc:
                failure: AdapterError = exc
                if isinstance(exc, RateLimited):
                    exc.paused_s = budget.rate_limited(
                        exc.retry_after, permit, max_pause=max_retry_after
                    )
                    failure = quota_exhausted(exc, max_retry_after, exc.paused_s) or exc
                if delivered:  # text already reached the caller: it cannot be taken back
                    failure.retryable = False
                failure.request_ids = tuple(ids)
                self._scrub_error(failure)
                if failure is exc:
                    raise
                raise failure from exc
            finally:
                budget.release(permit, used, ok=ok)

        queued = time.perf_counter()
        usage, count_s = None, 0.0
        async with self._slots:
            started = time.perf_counter()
            answer, attempts = await self.retry_policy.call(
                attempt,
                sleep=functools.partial(budget.retry_wait, self._sleep),
                should_retry=self.should_retry,
            )
            spent = time.perf_counter() - started
            usage = answer.usage
            if usage is None:  # the server sent none: its tokenizer counts, or an estimate
                # within the slot: counting calls the server too, under the same cap
                streamed = None if answer.ttft_s is None else len(answer.inter_token_s) + 1
                said = answer.text + tool_calls_text(answer.tool_calls)
                usage = await self._counted_usage(messages, said, exchange, streamed)
                count_s = time.perf_counter() - started - spent
        if answer.replaced_chars:
            log.warning(
                "model_answer_repaired",
                model=self.config.model,
                replaced_chars=answer.replaced_chars,
                reason="lone UTF-16 surrogates replaced with U+FFFD",
            )
        text, reasoning, calls = answer.text, answer.reasoning, answer.tool_calls
        if self._scrub.secrets:  # a server that echoes the key must not get it recorded
            text = self._scrub(text)
            reasoning = None if reasoning is None else self._scrub(reasoning)
            calls = tuple(
                ToolCall(id=c.id, name=c.name, arguments=self._scrub(c.arguments)) for c in calls
            )
        # every part is checked (text repaired, usage validated where it was read): the
        # answer is assembled without validating it again on this hot path
        return Completion.model_construct(
            text=text,
            finish_reason=answer.finish_reason,
            usage=usage,
            timings=CallTimings.model_construct(
                queue_wait_s=(started - queued) + budget_wait,
                retry_wait_s=max(0.0, spent - budget_wait - answer.total_s),
                ttft_s=answer.ttft_s,
                ttfot_s=answer.ttfot_s,
                total_s=answer.total_s,
                inter_token_s=answer.inter_token_s,
                count_s=count_s,
            ),
            attempts=attempts,
            model=self.config.model,
            replaced_chars=answer.replaced_chars,
            reasoning=reasoning,
            reasoning_tokens=answer.reasoning_tokens,
            tool_calls=calls,
            request_ids=tuple(ids),
        )

    async def _identified_attempt(
        self,
        number: int,
        ids: list[RequestIds],
        telemetry: Telemetry | None,
        messages: Sequence[Message],
        params: GenerationParams,
        stream: bool,
        on_text: Callable[[str], None] | None,
        exchange: Exchange | None,
    ) -> _Answer:
        """Attempt ``number`` of a call, its ids added to ``ids`` however it ends: the
        one sent (``request_id_header``), the server's and the answer's. With telemetry,
        inside a span of its own whose trace context goes to the server."""
        header = self.config.request_id_header
        sent = uuid.uuid4().hex if header is not None else None
        headers = self._headers
        if header is not None and sent is not None:
            headers = {**headers, header: sent}
        seen = _Seen()
        if telemetry is None:
            try:
                answer = await self._attempt(
                    messages, params, stream, on_text, exchange=exchange, headers=headers, seen=seen
                )
            except AdapterError:
                self._keep_ids(ids, sent, seen, None)
                raise
            self._keep_ids(ids, sent, seen, answer.response_id)
            return answer
        with telemetry.attempt(
            model=self.config.model, url=redact_url(self.base_url), number=number, sent_id=sent
        ) as span:
            traced = {**headers, **span.headers()}
            try:
                answer = await self._attempt(
                    messages, params, stream, on_text, exchange=exchange, headers=traced, seen=seen
                )
            except AdapterError:
                span.answered(seen.status, self._keep_ids(ids, sent, seen, None))
                raise
            span.answered(seen.status, self._keep_ids(ids, sent, seen, answer.response_id))
            return answer

    def _keep_ids(
        self, ids: list[RequestIds], sent: str | None, seen: _Seen, response: str | None
    ) -> RequestIds | None:
        """Add an attempt's ids to ``ids`` (none when it learnt none); what was added."""
        server = seen.server
        if sent is None and server is None and response is None:
            return None
        if self._scrub.secrets:  # an id is the server's text: it must not carry the key
            server = None if server is None else self._scrub(server)
            response = None if response is None else self._scrub(response)
        entry = RequestIds.of(sent, server, response)
        ids.append(entry)
        return entry

    async def _attempt(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        stream: bool,
        on_text: Callable[[str], None] | None,
        *,
        exchange: Exchange | None = None,
        headers: Mapping[str, str] | None = None,
        seen: _Seen | None = None,
    ) -> _Answer:
        """One attempt; sent again at once (once) without an optional field the
        server refused, where the adapter can leave it out (:meth:`drop_refused_option`)."""
        try:
            return await self._send(
                messages, params, stream, on_text, exchange=exchange, headers=headers, seen=seen
            )
        except BadRequest as exc:
            if exchange is not None or not self.drop_refused_option(exc):
                raise
            log.warning(
                "model_option_dropped",
                model=self.config.model,
                reason=self._scrub(str(exc))[:200],  # no key, no credentials of the URL
            )
        return await self._send(messages, params, stream, on_text, headers=headers, seen=seen)

    def drop_refused_option(self, error: BadRequest) -> bool:
        """Whether ``error`` refused an optional field of the request that this adapter
        can do without; if so the adapter leaves it out from now on and the call is
        sent again. Default: no such field."""
        return False

    async def _send(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        stream: bool,
        on_text: Callable[[str], None] | None,
        *,
        exchange: Exchange | None = None,
        headers: Mapping[str, str] | None = None,
        seen: _Seen | None = None,
    ) -> _Answer:
        """Send one request and read its answer; ``seen`` learns the status and the
        server's request id as soon as the answer starts, also when it then fails."""
        if exchange is not None:
            call = exchange.request()
            stream = False  # an exchange is one JSON answer
        else:
            call = self.request(messages, params, stream)
        url = self.url_for(call.path)
        payload = call.body
        if headers is None:
            headers = self._headers
        t0 = time.perf_counter()
        what = f"the answer from {url}"
        async with self._http().stream(url, payload, headers, self._timeouts) as response:
            if seen is not None:
                seen.status, seen.server = response.status, _server_request_id(response.headers)
            # the bytes read are held until the answer is parsed, and given back before
            # the connection is closed (a refused call must not hold them meanwhile)
            with self._inflight.holding(what) as holding:
                if response.status >= 300:
                    body = await read_limited(
                        response, _ERROR_BODY_BYTES, truncate=True, take=holding.take
                    )
                    raise error_for_status(
                        response.status,
                        response.headers,
                        body,
                        model=self.config.model,
                        url=url,
                        secret=self._api_key,
                    )
                if stream:
                    return await self._read_stream(
                        response, messages, url, t0, on_text, holding.take
                    )
                body = await read_limited(
                    response, self.config.max_body_bytes, what=what, take=holding.take
                )
                try:
                    data = json.loads(body)
                    parse = exchange.parse if exchange is not None else self.parse_response
                    answer = parse(data)
                    text = repair_text(_optional_text(answer.text, "the answer's text") or "")
                    finish = _optional_text(answer.finish_reason, "the finish reason")
                    usage = _valid_usage(answer.usage)
                    thought = _optional_text(answer.reasoning, "the reasoning")
                    thought_tokens = _reasoning_tokens(answer.reasoning_tokens)
                    calls = _checked_tool_calls(answer.tool_calls)
                except AdapterError:
                    raise
                except Exception as exc:  # any misshapen answer, whatever the parser met
                    raise MalformedResponse(
                        f"unreadable response from {url}: {exc}",
                        snippet=self._scrub(body[:400].decode("utf-8", "replace"))[:200],
                        model=self.config.model,
                    ) from exc
        reasoning = repair_text(thought) if thought else None
        return _Answer(
            text.text,
            _finish_reason(finish),
            usage,
            time.perf_counter() - t0,
            replaced_chars=text.replaced + (reasoning.replaced if reasoning else 0),
            reasoning=reasoning.text if reasoning else None,
            reasoning_tokens=thought_tokens,
            tool_calls=calls,
            response_id=_response_id(answer.response_id),
        )

    async def _read_stream(
        self,
        response: StreamResponse,
        messages: Sequence[Message],
        url: str,
        t0: float,
        on_text: Callable[[str], None] | None,
        hold: Callable[[int], None],
    ) -> _Answer:
        """Read a stream; ``hold`` counts its bytes in the adapter's bytes in flight."""
        decoder = SSEDecoder(max_event_bytes=self.config.max_event_bytes)
        limit = self.config.max_body_bytes
        received = 0
        answer = StreamedAnswer(t0, on_text)
        finish_reason: str | None = None
        usage: Usage | None = None
        reasoning_tokens: int | None = None
        response_id: str | None = None
        done = False
        events = 0
        opening = b""
        """The stream's first bytes, shown should no event ever come."""

        def take(event: SSEEvent) -> None:
            nonlocal finish_reason, usage, reasoning_tokens, done, events, response_id
            events += 1
            try:
                delta = self.parse_event(event)
                piece = _optional_text(delta.text, "a streamed piece of text")
                thought = _optional_text(delta.reasoning, "a streamed piece of reasoning")
                finish = _optional_text(delta.finish_reason, "the finish reason")
                reported = _valid_usage(delta.usage)
                thought_tokens = _reasoning_tokens(delta.reasoning_tokens)
                for call_piece in delta.tool_calls:
                    answer.feed_tool_call(call_piece)
            except AdapterError:
                raise
            except Exception as exc:  # any misshapen answer, whatever the parser tripped on
                raise MalformedResponse(
                    f"unreadable stream event from {url}: {exc}",
                    snippet=self._scrub(event.data)[:200],
                    model=self.config.model,
                ) from exc
            if thought:
                answer.feed_reasoning(thought)
            if piece:
                answer.feed(piece)  # may hold back half an emoji for the next event
            if thought_tokens is not None:
                reasoning_tokens = thought_tokens
            finish_reason = finish or finish_reason
            usage = _merge_usage(usage, reported)
            done = done or delta.done
            if response_id is None and delta.response_id is not None:
                response_id = _response_id(delta.response_id)

        async for chunk in response.chunks():
            received += len(chunk)
            if received > limit:
                raise too_large(f"the stream from {url}", "max_body_bytes", limit)
            hold(len(chunk))
            if len(opening) < 200:
                opening += chunk[: 200 - len(opening)]
            for event in decoder.feed(chunk):
                take(event)
        for event in decoder.flush():
            take(event)
        answer.close()
        try:
            calls = answer.tool_calls
        except ValueError as exc:
            raise MalformedResponse(
                f"unreadable stream from {url}: {exc}",
                snippet=self._scrub(opening.decode("utf-8", "replace")),
                model=self.config.model,
            ) from exc
        if not done:
            if not events:  # not a stream cut short: no stream at all (a proxy's page?)
                raise MalformedResponse(
                    f"the answer from {url} carried no server-sent events",
                    snippet=self._scrub(opening.decode("utf-8", "replace")),
                    model=self.config.model,
                )
            raise ServerError(
                f"the stream from {url} ended before it was complete", model=self.config.model
            )
        return _Answer(
            answer.text,
            _finish_reason(finish_reason),
            usage,
            time.perf_counter() - t0,
            answer.ttft_s,
            tuple(answer.gaps),
            answer.replaced_chars,
            answer.reasoning,
            reasoning_tokens,
            answer.ttfot_s,
            calls,
            response_id,
        )

    def _scrub_error(self, exc: AdapterError) -> None:
        """Blank the API key and the URL's credentials out of an error (a server may echo
        the key, and a connection error names the URL), and replace lone surrogates (from
        an error message in JSON) in its text."""
        message = str(exc)
        clean = repair_text(self._scrub(message)).text
        if clean != message:
            exc.args = (clean,)
        if isinstance(exc, ProtocolError) and exc.snippet:
            exc.snippet = repair_text(self._scrub(exc.snippet)).text

    @staticmethod
    def _estimated(messages: Sequence[Message], text: str, chunks: int | None = None) -> Usage:
        """A client-side estimate: four characters a token, except that a streamed
        answer's output is its chunks (one token each on vLLM, llama.cpp, OpenAI)."""
        prompt = _prompt_tokens(messages)
        completion = chunks if chunks is not None else estimate_tokens(text) if text else 0
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            source="estimate",
        )

    async def _counted_usage(
        self,
        messages: Sequence[Message],
        text: str,
        exchange: Exchange | None,
        chunks: int | None,
    ) -> Usage:
        """The usage of an answer that came without: counted by the model's tokenizer
        (:meth:`count_tokens`) where there is one, else estimated (``chunks``: how many
        pieces a streamed answer came in)."""
        if exchange is None:
            prompt = await self.count_prompt_tokens(messages)
            completion = await self.count_tokens(text) if prompt is not None else None
            if prompt is not None and completion is not None:
                return Usage(
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    total_tokens=prompt + completion,
                    source="tokenizer",
                )
        return self._estimated(messages, text, chunks)

    # -- counting tokens where the server sends no usage ----------------------------

    def tokenizer_root(self) -> str | None:
        """Where the server's tokenize endpoints live (``/tokenize``,
        ``/extras/tokenize``), or None when it has none (the default)."""
        return None

    async def count_tokens(self, text: str) -> int | None:
        """The tokens of ``text`` by the server's tokenizer; None without one."""
        if self._tokenizer is None:
            return None
        return await self._tokenizer.count(text)

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        """The prompt tokens of ``messages`` by the server's tokenizer (see
        :meth:`ServerTokenizer.count_prompt`); None without one."""
        if self._tokenizer is None:
            return None
        return await self._tokenizer.count_prompt(messages)

    async def _reported_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        """The server's own prompt count of ``messages``: a one-token answer, not
        streamed, sent once per probe outside the budgets and retries (it measures what
        a chat template adds, for :class:`ServerTokenizer`)."""
        answer = await self._send(messages, GenerationParams(max_tokens=1), False, None)
        return None if answer.usage is None else answer.usage.prompt_tokens

    async def _post_json(self, url: str, body: Mapping[str, Any]) -> Any:
        """POST ``body`` on this adapter's pool (its headers, timeouts and egress
        policy); the decoded answer of a 200, None for any other status."""
        async with self._http().stream(url, body, self._headers, self._timeouts) as response:
            if response.status != 200:
                return None
            data = await read_limited(response, self.config.max_body_bytes, what=url)
        return json.loads(data)

    # -- what a backend defines -----------------------------------------------------

    @abstractmethod
    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> HttpRequest:
        """The path (after base_url) and JSON body of a call."""

    @abstractmethod
    def parse_response(self, data: Any) -> ParsedAnswer:
        """Text, finish reason and usage (None if the server sent none) of an answer."""

    @abstractmethod
    def parse_event(self, event: SSEEvent) -> Delta:
        """What one streamed event adds."""

    # -- the check before a run -------------------------------------------------------

    def listing_path(self) -> str | None:
        """Where a GET lists the models, after base_url: the cheapest check (no tokens);
        None when the API has no such listing."""
        return None

    def base_url_hint(self) -> str:
        """What to check when the generation path answers 404."""
        return "check base_url"

    async def preflight(self) -> None:
        """One cheap call, no retries: the model listing when the API has one, else (or
        when the listing does not answer 2xx) a generation of one token. Raises
        EndpointError on a refused connection, an unknown host, a refused key (401/403)
        or a 404 from the generation path; any other answer passes (the run's retries
        and circuit breaker handle those).
        """
        listing = self.listing_path()
        # convsim's transports can GET; another transport is checked by a generation
        get = getattr(self._http(), "get", None)
        if listing is not None and get is not None:
            try:
                response = await get(self.url_for(listing), self._headers, self._timeouts)
            except Exception as exc:
                self._raise_unreachable(exc)
                return  # inconclusive (a timeout, a dropped connection): let the run try
            if response.status < 300:
                return
        call = self.request(
            [Message(role="user", content="Hi")], GenerationParams(max_tokens=1), False
        )
        url = self.url_for(call.path)
        try:
            async with self._http().stream(
                url, call.body, self._headers, self._timeouts
            ) as response:
                body = await read_limited(response, PROBE_BODY_LIMIT, truncate=True)
        except Exception as exc:
            self._raise_unreachable(exc)
            return  # inconclusive: a check never fails a run it cannot judge
        said = _server_message(self._scrub(body.decode("utf-8", "replace")))
        url = redact_url(url)
        if response.status in (401, 403):
            raise EndpointError(
                f"{response.status} from {url}: {self._key_advice()}{said}",
                url=url,
                status_code=response.status,
            )
        if response.status == 404:
            raise EndpointError(
                f"404 from {url} — {self.base_url_hint()}{said}", url=url, status_code=404
            )

    def _key_advice(self) -> str:
        """What to check when the server refuses the key (or wants one)."""
        if self.config.api_key is not None:
            return "the API key was refused — check api_key"
        name = self.config.api_key_env or self.default_key_env
        if self._api_key:
            return f"the API key was refused — check {name} / api_key_env"
        if self.default_key_env:
            return (
                f"no API key was sent — set api_key_env=NAME (or api_key, or "
                f"{self.default_key_env})"
            )
        return "no API key was sent — set api_key_env=NAME (or api_key)"

    def _raise_unreachable(self, exc: Exception) -> None:
        """Raise EndpointError when ``exc`` shows the endpoint cannot be reached."""
        if isinstance(exc, EgressRefused):
            raise EndpointError(str(exc), url=redact_url(self.base_url)) from exc
        what = _unreachable(exc, self.base_url)
        if what is not None:
            shown = redact_url(self.base_url)
            raise EndpointError(f"{shown}: {what}", url=shown) from exc


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and all(cause is not c for c in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def _unreachable(exc: BaseException, base_url: str) -> str | None:
    """What a failed connection means, when it means the endpoint cannot be reached
    (a refused connection, an unknown host, no route); None otherwise."""
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            host = urlsplit(base_url).hostname or base_url
            return f"cannot resolve host {host} — check base_url"
        if not isinstance(cause, OSError):
            continue
        if isinstance(cause, ConnectionRefusedError) or cause.errno == errno.ECONNREFUSED:
            return "connection refused — is the server running?"
        if cause.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to the host — check base_url and the network"
    return None


def _server_message(body: str) -> str:
    """The server's own words about an error, short, to append to a message."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python goes
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message.strip():
        return ""
    message = " ".join(message.split())
    return f" (server: {message[:120]})"
