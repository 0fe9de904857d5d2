"""An OpenAI-compatible mock model server with controllable latency, limits and faults.

The server speaks the wire format of the OpenAI chat and legacy completions APIs (and the
``/generate`` backend of the developer guide) and answers with the deterministic
rule-based model of :mod:`convsim.adapters._recall`. It runs inside the caller's asyncio
event loop (aiohttp), so tests and benchmarks can point real HTTP clients at it.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /generate``, and vLLM's ``POST /tokenize``. Chat and completion requests honour
``min_tokens`` and ``ignore_eos`` (filler words up to the length asked), as vLLM does.
Per request, in this order: the API key (401), the ``rpm`` window
(429), the body (400), an injected fault (``fault_rate``), then the answer after the
configured time to first token and inter-token latency.

``/v1/completions`` honours ``echo`` and ``logprobs`` with a deterministic tokenizer and
per-token logprobs (:func:`mock_tokens`, :func:`mock_token_logprob`,
:func:`mock_logprobs`), so a test can work out the exact loglikelihood lm-eval gets.

The hot path is plain ``json`` and string templates; replies are cached per
conversation (validated ``Message`` objects are built only on a cache miss), and a zero
delay never reaches the sleep function. One core answers well over 10,000 small chat
completions per second (``tests/bench/bench_mock_server.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import math
import random
import re
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import TracebackType
from typing import Any, Literal, NamedTuple, get_args

from aiohttp import web
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    field_validator,
)
from pydantic_core import core_schema

from convsim._errors import parse_config
from convsim._log import get_logger
from convsim._types import Message

from ._recall import recall_reply

__all__ = [
    "Delay",
    "FaultKind",
    "MockServerConfig",
    "MockServerStatistics",
    "MockModelServer",
    "MockToken",
    "mock_tokens",
    "mock_token_logprob",
    "mock_logprobs",
    "MOCK_GREEDY_MIN",
    "MOCK_ALTERNATIVE",
]

log = get_logger("convsim.mock_server")

FaultKind = Literal[
    "429",
    "500",
    "drop",
    "malformed",
    "html",
    "truncated_sse",
    "stream_error",
    "stream_drop",
    "lone_surrogate",
    "split_surrogate",
]
"""What an injected fault does:

- ``429``: a rate-limit error with Retry-After (``retry_after_s``);
- ``500``: a server error;
- ``drop``: the connection closes without an answer;
- ``malformed``: a 200 whose JSON is cut short (streaming: an event of broken JSON);
- ``html``: a 200 carrying a proxy's HTML error page instead of the answer;
- ``truncated_sse``: a couple of words, then the stream ends cleanly, without finish
  reason or ``[DONE]``;
- ``stream_error``: a couple of words, then an ``{"error": ...}`` event ends the stream;
- ``stream_drop``: a couple of words, then the connection drops mid-stream;
- ``lone_surrogate``: the answer ends in half an emoji (``"\\ud83d"`` escaped in JSON);
- ``split_surrogate``: an emoji whose two UTF-16 halves come in two stream events, as
  JavaScript gateways send them.

Stream-only kinds in a non-streaming call do what comes closest and count as that:
``truncated_sse`` as ``malformed``, ``stream_error`` as ``500``, ``stream_drop`` as
``drop``, ``split_surrogate`` as ``lone_surrogate``.
"""
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
_NOT_STREAMED: dict[FaultKind, FaultKind] = {
    "truncated_sse": "malformed",
    "stream_error": "500",
    "stream_drop": "drop",
    "split_surrogate": "lone_surrogate",
}
_HALF_EMOJI, _OTHER_HALF = "\ud83d", "\ude00"
_PROXY_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)

ENDPOINTS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/generate", "/tokenize")

# Words appended after the model's reply when ``output_tokens`` asks for a longer answer.
_FILLER = tuple(
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua".split()
)


# --------------------------------------------------------------------------- delays


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"delay {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"delay {spec!r}: {text!r} is not a finite number")
    return value


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


_DELAY_FORMS = '"MS", "fixed:MS", "uniform:LO:HI", "exp:MEAN" or "normal:MEAN:SD"'


@dataclass(frozen=True, slots=True)
class Delay:
    """A delay in milliseconds, fixed or drawn from a distribution.

    Build one with :meth:`parse` from a number (fixed milliseconds) or a string:
    ``"fixed:MS"``, ``"uniform:LO:HI"``, ``"exp:MEAN"`` (exponential) or
    ``"normal:MEAN:SD"`` (draws below zero count as zero). Draws come from the
    ``random.Random`` passed to :meth:`sample`, so a seeded server repeats its timings.
    """

    kind: Literal["fixed", "uniform", "exp", "normal"] = "fixed"
    params: tuple[float, ...] = (0.0,)

    @classmethod
    def parse(cls, value: Delay | float | str) -> Delay:
        """A delay from a number of milliseconds or one of the string forms.

        Raises:
            ValueError: the value is not one of the forms, or a bound is negative.
        """
        if isinstance(value, Delay):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"a delay is a number of milliseconds or {_DELAY_FORMS}")
        if not isinstance(value, str):
            spec = str(value)
            if not math.isfinite(value):
                raise ValueError(f"delay {spec!r} is not a finite number")
            return cls._checked("fixed", (float(value),), spec)
        spec = value.strip()
        kind, _, rest = spec.partition(":")
        if not rest:
            try:
                ms = float(spec)
            except ValueError:
                raise ValueError(f"delay {value!r}: expected {_DELAY_FORMS}") from None
            return cls._checked("fixed", (ms,), value)
        arity = {"fixed": 1, "uniform": 2, "exp": 1, "normal": 2}
        if kind not in arity:
            raise ValueError(f"delay {value!r}: unknown kind {kind!r}; expected {_DELAY_FORMS}")
        parts = rest.split(":")
        if len(parts) != arity[kind]:
            raise ValueError(f"delay {value!r}: {kind} takes {arity[kind]} number(s)")
        return cls._checked(kind, tuple(_number(p, value) for p in parts), value)  # type: ignore[arg-type]

    @classmethod
    def _checked(
        cls,
        kind: Literal["fixed", "uniform", "exp", "normal"],
        params: tuple[float, ...],
        spec: str,
    ) -> Delay:
        if not all(math.isfinite(p) for p in params):
            raise ValueError(f"delay {spec!r} is not a finite number")
        if kind in ("fixed", "exp") and params[0] < 0:
            raise ValueError(f"delay {spec!r} is negative")
        if kind == "uniform" and not 0 <= params[0] <= params[1]:
            raise ValueError(f"delay {spec!r}: uniform needs 0 <= LO <= HI")
        if kind == "normal" and params[1] < 0:
            raise ValueError(f"delay {spec!r}: the standard deviation is negative")
        return cls(kind, params)

    @property
    def is_zero(self) -> bool:
        """True when every draw is zero (then the server never sleeps for it)."""
        if self.kind == "uniform":
            return self.params[1] == 0
        if self.kind == "normal":
            return self.params[0] <= 0 and self.params[1] == 0
        return self.params[0] == 0

    @property
    def is_fixed(self) -> bool:
        """True when every draw is the same."""
        return self.kind == "fixed" or self.is_zero

    def sample(self, rng: random.Random) -> float:
        """One draw in milliseconds (never negative)."""
        p = self.params
        if self.kind == "fixed":
            return p[0]
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1])
        if self.kind == "exp":
            return rng.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0
        return max(0.0, rng.gauss(p[0], p[1]))

    def __str__(self) -> str:
        return ":".join([self.kind, *map(_fmt, self.params)])

    @classmethod
    def __get_pydantic_core_schema__(
        cls, _source: Any, _handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )


# --------------------------------------------------------------------------- config


class MockServerConfig(BaseModel):
    """How the mock server listens, answers, waits and fails."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port; 0 picks a free one (read it from ``MockModelServer.url``)."""
    ttft_ms: Delay = Delay()
    """Time to the first token: a number of ms or a Delay form such as ``"uniform:20:80"``."""
    itl_ms: Delay = Delay()
    """Inter-token latency: the gap between streamed tokens (same forms as ``ttft_ms``)."""
    output_tokens: int | None = Field(default=None, gt=0)
    """Every answer has exactly this many words: the reply, then filler (None: the reply)."""
    fault_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of generation requests that get an injected fault (decided by the seed)."""
    faults: dict[FaultKind, float] = Field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 1.0))
    """Relative weight of each fault kind; kinds left out never happen."""
    retry_after_s: float = Field(default=1.0, ge=0.0)
    """Retry-After of an injected 429, in seconds."""
    rpm: int | None = Field(default=None, ge=1)
    """Generation requests allowed per sliding 60 s window; more get 429 (None: no limit)."""
    memory_turns: int | None = Field(default=None, ge=1)
    """The model sees only the last K user messages, so it forgets older facts."""
    seed: int = 0
    """Seeds the delays, the faults, and answers of requests that give no seed."""
    model: str = "mock-model"
    """The model id listed by ``/v1/models`` (answers echo the requested model)."""
    message_overhead_tokens: int = Field(default=0, ge=0)
    """Tokens a chat template adds per message, counted in chat prompts' usage (and by
    ``/tokenize`` for messages): a server whose prompt count is more than the words."""
    api_key: str | None = Field(default=None, repr=False)
    """When set, requests need ``Authorization: Bearer <api_key>`` or get 401."""

    @field_validator("faults")
    @classmethod
    def _some_fault_weight(cls, value: dict[FaultKind, float]) -> dict[FaultKind, float]:
        if any(w < 0 or not math.isfinite(w) for w in value.values()):
            raise ValueError("fault weights must be finite and >= 0")
        if not any(value.values()):
            raise ValueError(f"give at least one fault kind a positive weight: {FAULT_KINDS}")
        return value


@dataclass(frozen=True, slots=True)
class MockServerStatistics:
    """A snapshot of what a :class:`MockModelServer` has served."""

    requests: int
    """Every request received, including refused ones and unknown paths."""
    by_endpoint: dict[str, int]
    """Requests per known endpoint path."""
    faults_injected: dict[str, int]
    """Injected faults by kind (a stream-only kind in a non-streaming call counts as what
    it got instead: see :data:`FaultKind`)."""
    rate_limited: int
    """429s from the ``rpm`` limit (injected 429s are under ``faults_injected``)."""
    unauthorized: int
    """401s for a missing or wrong API key."""


# --------------------------------------------------------------------------- helpers


class _BadRequest(Exception):
    """The request body is invalid; the message goes back in a 400."""


def _error_body(message: str, type_: str, code: str | None = None) -> bytes:
    payload = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return json.dumps(payload).encode()


def _error(status: int, message: str, type_: str, code: str | None = None) -> web.Response:
    return web.Response(
        status=status, body=_error_body(message, type_, code), content_type="application/json"
    )


def _bad_request(message: str) -> web.Response:
    return _error(400, message, "invalid_request_error")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class _Params:
    """The generation settings of one request, checked."""

    model: str
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    min_tokens: int = 0
    """Pad the answer with filler to at least this many words (vLLM's ``min_tokens``)."""
    ignore_eos: bool = False
    """Answer with exactly ``max_tokens`` words (vLLM's ``ignore_eos``)."""


def _params(
    body: dict[str, Any], default_model: str, *, legacy_max: bool = False, min_tokens: int = 1
) -> _Params:
    model = body.get("model", default_model)
    if not isinstance(model, str):
        raise _BadRequest("'model' must be a string")
    max_tokens = body.get("max_tokens")
    if not legacy_max and max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= min_tokens):
        raise _BadRequest(f"'max_tokens' must be an integer >= {min_tokens}")
    for name, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None and not (_is_number(value) and 0 <= value <= high):
            raise _BadRequest(f"'{name}' must be a number between 0 and {_fmt(high)}")
    n = body.get("n")
    if n is not None and n != 1:
        raise _BadRequest("'n' must be 1: the mock server returns one choice")
    stop_value = body.get("stop")
    if stop_value is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_value, str):
        stop = (stop_value,) if stop_value else ()
    elif isinstance(stop_value, list) and all(isinstance(s, str) for s in stop_value):
        stop = tuple(s for s in stop_value if s)
    else:
        raise _BadRequest("'stop' must be a string or a list of strings")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _BadRequest("'seed' must be an integer")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _BadRequest("'stream' must be a boolean")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _BadRequest("'stream_options' must be an object")
        if not stream:
            raise _BadRequest("'stream_options' is only allowed when 'stream' is true")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _BadRequest("'stream_options.include_usage' must be a boolean")
    least = body.get("min_tokens")
    if least is not None and not (_is_int(least) and least >= 0):
        raise _BadRequest("'min_tokens' must be an integer >= 0")
    if least is not None and max_tokens is not None and least > max_tokens:
        raise _BadRequest("'min_tokens' must not be above 'max_tokens'")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _BadRequest("'ignore_eos' must be a boolean")
    return _Params(model, max_tokens, stop, seed, stream, include_usage, least or 0, ignore_eos)


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_OTHER_ROLES = frozenset({"tool", "function"})


def _content_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _BadRequest(f"messages[{index}].content: each part needs a 'type'")
            if part["type"] == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _BadRequest(f"messages[{index}].content: a text part needs 'text'")
                texts.append(text)
        return "\n".join(texts)
    raise _BadRequest(f"messages[{index}].content must be a string or a list of parts")


class _Turn(NamedTuple):
    """One message as the mock model reads it (hashable: answers are cached by them)."""

    role: str
    """``system``, ``user`` or ``assistant``; empty for a tool message, which only
    counts as prompt."""
    text: str


def _chat_messages(body: dict[str, Any]) -> tuple[_Turn, ...]:
    """The messages the model reads; tool messages count only as prompt."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _BadRequest(f"messages[{i}] must be an object")
        role = message.get("role")
        text = _content_text(message.get("content"), i)
        if role in _ROLES:
            turns.append(_Turn(_ROLES[role], text))
        elif role in _OTHER_ROLES:
            turns.append(_Turn("", text))
        else:
            raise _BadRequest(
                f"messages[{i}].role must be one of system, developer, user, assistant, tool"
            )
    return tuple(turns)


def _prompt_text(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _BadRequest("'prompt' must be a string (or a list of one string)")
    return prompt


@dataclass(frozen=True, slots=True)
class _Echo:
    """What a legacy completions request asks beyond the answer: the prompt echoed in
    front of it, and logprobs of its tokens."""

    echo: bool
    logprobs: int | None
    """How many top alternatives to list per token (None: no logprobs)."""


_NO_ECHO = _Echo(False, None)
"""A plain request: the answer alone, no logprobs."""
MAX_LOGPROBS = 5
"""The most top alternatives a request may ask for (as OpenAI's legacy API)."""


def _echo_options(body: dict[str, Any]) -> _Echo:
    echo = body.get("echo", False)
    if echo is None:
        echo = False
    if not isinstance(echo, bool):
        raise _BadRequest("'echo' must be a boolean")
    logprobs = body.get("logprobs")
    if logprobs is not None and not (_is_int(logprobs) and 0 <= logprobs <= MAX_LOGPROBS):
        raise _BadRequest(f"'logprobs' must be an integer between 0 and {MAX_LOGPROBS}")
    if (echo or logprobs is not None) and body.get("stream"):
        raise _BadRequest("the mock server does not stream 'echo' or 'logprobs' answers")
    return _Echo(echo, logprobs) if echo or logprobs is not None else _NO_ECHO


# --------------------------------------------------------------------------- logprobs

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")
"""A word or a single punctuation mark, each with the whitespace before it; whitespace
at the very end is a token of its own. The tokens of a text join back to the text."""

MOCK_GREEDY_MIN = -2.0
"""A token whose logprob is at least this is the model's top choice at its position."""
MOCK_ALTERNATIVE = ("<alt>", -0.5)
"""The top choice (token, logprob) wherever the actual token is not. No text splits
into this token, so it never collides with a real one."""


class MockToken(NamedTuple):
    """One token of the mock tokenizer and where it starts."""

    text: str
    offset: int
    """Character offset of the token in the text it was read from."""


def mock_tokens(text: str) -> list[MockToken]:
    """The mock tokenizer: the tokens covering ``text``, each with its offset.

    ``"Answer: Paris"`` is ``[("Answer", 0), (":", 6), (" Paris", 7)]``.
    """
    return [MockToken(m.group(), m.start()) for m in _TOKEN.finditer(text)]


@lru_cache(maxsize=16384)
def mock_token_logprob(token: str, seed: int) -> float:
    """The mock model's logprob of ``token``, whatever came before it:
    ``-(1 + H % 800) / 100`` where ``H`` is the first 4 bytes (big-endian) of
    ``sha256(f"{seed}:{token}")``; so between -8.00 and -0.01, in steps of 0.01."""
    digest = hashlib.sha256(f"{seed}:{token}".encode()).digest()
    return -(1 + int.from_bytes(digest[:4], "big") % 800) / 100


def mock_logprobs(
    prompt: str, completion: str, *, echo: bool, top: int, seed: int
) -> dict[str, Any]:
    """The ``choices[0].logprobs`` object the mock server answers with.

    The prompt and the completion are tokenized apart (:func:`mock_tokens`), as a
    server reads a prompt and then generates; with ``echo`` the prompt's tokens come
    first, otherwise only the completion's are listed. ``text_offset`` counts characters
    into the answer's ``text`` (which starts with the prompt when echoed). The very
    first token of prompt + completion has no context: its ``token_logprobs`` and
    ``top_logprobs`` entries are None. Every other token has
    :func:`mock_token_logprob`; its ``top_logprobs`` lists the ``top`` most likely of:
    the token itself if its logprob is at least :data:`MOCK_GREEDY_MIN` (a completion
    token always, as generation is greedy), otherwise :data:`MOCK_ALTERNATIVE` and then
    the token.
    """
    pieces = [(t.text, t.offset, False) for t in mock_tokens(prompt)]
    pieces += [(t.text, len(prompt) + t.offset, True) for t in mock_tokens(completion)]
    start = 0 if echo else len(prompt)
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for index, (token, offset, generated) in enumerate(pieces):
        if echo or generated:
            tokens.append(token)
            offsets.append(offset - start)
            if index == 0:
                values.append(None)
                tops.append(None)
                continue
            value = mock_token_logprob(token, seed)
            values.append(value)
            if generated or value >= MOCK_GREEDY_MIN:
                choices = [(token, value)]
            else:
                choices = [MOCK_ALTERNATIVE, (token, value)]
            tops.append(dict(choices[:top]))
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


class _Answer(NamedTuple):
    """The mock model's answer to a conversation."""

    words: tuple[str, ...]
    """The reply, a word a token."""
    prompt_tokens: int
    """The conversation's length in tokens (words)."""


@lru_cache(maxsize=2048)
def _answer(
    turns: tuple[_Turn, ...], memory_turns: int | None, seed: int, length: int | None
) -> _Answer:
    """The reply to ``turns``; conversations repeat, so cached."""
    messages = [Message(role=t.role, content=t.text) for t in turns if t.role]  # type: ignore[arg-type]
    words = recall_reply(messages, memory_turns=memory_turns, seed=seed).split()
    if length is not None:
        words = [
            *words[:length],
            *itertools.islice(itertools.cycle(_FILLER), max(0, length - len(words))),
        ]
    prompt_tokens = sum(len(t.text.split()) for t in turns)
    return _Answer(tuple(words), prompt_tokens)


class _Cut(NamedTuple):
    """The reply as sent: cut at a stop string or max_tokens."""

    words: tuple[str, ...]
    finish_reason: Literal["stop", "length"]


def _cut(words: tuple[str, ...], params: _Params) -> _Cut:
    """Apply stop strings (cut at the first) and max_tokens (then ``length``); pad with
    filler up to ``min_tokens``, or to ``max_tokens`` with ``ignore_eos``."""
    least = params.max_tokens if params.ignore_eos and params.max_tokens else params.min_tokens
    if least and len(words) < least:
        words = (*words, *itertools.islice(itertools.cycle(_FILLER), least - len(words)))
    if params.stop:
        text = " ".join(words)
        cut = min((i for i in map(text.find, params.stop) if i >= 0), default=-1)
        if cut >= 0:
            words = tuple(text[:cut].split())
    if params.max_tokens is not None and (
        len(words) > params.max_tokens or (params.ignore_eos and len(words) == params.max_tokens)
    ):
        return _Cut(words[: params.max_tokens], "length")
    return _Cut(words, "stop")


@lru_cache(maxsize=2048)
def _json_pieces(words: tuple[str, ...]) -> tuple[str, ...]:
    """One streamed piece per word as a JSON string; each but the first has its leading
    space. Cached: encoding every word dominated the cost of a streamed answer."""
    return tuple(json.dumps(w if i == 0 else " " + w) for i, w in enumerate(words))


# --------------------------------------------------------------------------- server

Sleep = Callable[[float], Awaitable[Any]]
Clock = Callable[[], float]

_SSE_HEADERS = {"Cache-Control": "no-cache"}
_DONE = "data: [DONE]\n\n"


class MockModelServer:
    """An OpenAI-compatible HTTP server answering with a deterministic model.

    ``async with MockModelServer(config) as server:`` listens in the running asyncio
    loop until the block ends; point clients at ``server.base_url``.

    Args:
        config: A :class:`MockServerConfig` or a mapping of its fields.
        clock: Monotonic seconds for the ``rpm`` window (injectable for tests).
        sleep: Awaited with seconds for every non-zero delay (injectable for tests).
        shutdown_timeout: Seconds in-flight requests get when the server stops.

    Raises:
        ConfigError: ``config`` is a mapping with invalid fields.
    """

    def __init__(
        self,
        config: MockServerConfig | Mapping[str, Any] | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        shutdown_timeout: float = 1.0,
    ) -> None:
        cfg = self.config = parse_config(MockServerConfig, config, "mock server config")
        self._clock = clock
        self._sleep = sleep
        self._shutdown_timeout = shutdown_timeout
        self._delay_rng = random.Random(f"{cfg.seed}:delays")
        self._fault_rng = random.Random(f"{cfg.seed}:faults")
        self._fault_kinds = [k for k, w in cfg.faults.items() if w > 0]
        self._fault_weights = [cfg.faults[k] for k in self._fault_kinds]
        self._auth = None if cfg.api_key is None else f"Bearer {cfg.api_key}".encode()
        self._window: deque[float] = deque()
        self._ids = itertools.count(1)
        self._model_json = json.dumps(cfg.model)
        self._models_body = json.dumps(
            {
                "object": "list",
                "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "convsim"}],
            }
        ).encode()
        self._requests = 0
        self._by_endpoint: dict[str, int] = dict.fromkeys(ENDPOINTS, 0)
        self._faults: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        self._rate_limited = 0
        self._unauthorized = 0
        self._runner: web.AppRunner | None = None
        self.url = ""
        """``http://HOST:PORT`` once started."""
        self.base_url = ""
        """``url + "/v1"``: the base URL OpenAI clients take."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen on the configured address in the running asyncio event loop.

        Raises:
            RuntimeError: no asyncio loop is running, or the server was started already.
            OSError: the address cannot be bound.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "MockModelServer runs in an asyncio event loop (aiohttp); start it from "
                "asyncio code or anyio with the asyncio backend"
            ) from None
        if self._runner is not None:
            raise RuntimeError("this MockModelServer is already started")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.config.host, self.config.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        host = f"[{host}]" if ":" in host else host
        self.url = f"http://{host}:{port}"
        self.base_url = self.url + "/v1"
        log.info("mock_server_started", url=self.url, model=self.config.model)

    async def stop(self) -> None:
        """Stop listening; in-flight requests get ``shutdown_timeout`` to finish."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            log.info("mock_server_stopped", url=self.url, requests=self._requests)

    async def __aenter__(self) -> MockModelServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def statistics(self) -> MockServerStatistics:
        """What the server has served so far."""
        return MockServerStatistics(
            requests=self._requests,
            by_endpoint=dict(self._by_endpoint),
            faults_injected=dict(self._faults),
            rate_limited=self._rate_limited,
            unauthorized=self._unauthorized,
        )

    # ------------------------------------------------------------------ checks

    def _refuse(self, request: web.Request, path: str) -> web.Response | None:
        """Count the request and check the key (all endpoints)."""
        self._requests += 1
        self._by_endpoint[path] += 1
        if self._auth is not None:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, self._auth):
                self._unauthorized += 1
                return _error(
                    401,
                    "Incorrect API key provided. Send 'Authorization: Bearer <key>'.",
                    "invalid_request_error",
                    "invalid_api_key",
                )
        return None

    def _over_limit(self) -> web.Response | None:
        """Admit the request into the sliding 60 s window, or answer 429."""
        limit = self.config.rpm
        if limit is None:
            return None
        now = self._clock()
        window = self._window
        while window and window[0] <= now - 60.0:
            window.popleft()
        if len(window) < limit:
            window.append(now)
            return None
        self._rate_limited += 1
        wait = max(1, math.ceil(window[0] + 60.0 - now))
        response = _error(
            429,
            f"Rate limit reached: {limit} requests per minute. Retry in {wait} s.",
            "requests",
            "rate_limit_exceeded",
        )
        response.headers["Retry-After"] = str(wait)
        return response

    def _draw_fault(self) -> FaultKind | None:
        if not self.config.fault_rate or self._fault_rng.random() >= self.config.fault_rate:
            return None
        if len(self._fault_kinds) == 1:
            return self._fault_kinds[0]
        return self._fault_rng.choices(self._fault_kinds, self._fault_weights)[0]

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("the request body must be a JSON object")
        return body

    async def _delay(self, delay: Delay, times: int = 1) -> None:
        """Sleep for ``times`` draws of ``delay``; a zero delay never sleeps."""
        if times <= 0 or delay.is_zero:
            return
        if delay.is_fixed:
            ms = delay.params[0] * times
        else:
            ms = sum(delay.sample(self._delay_rng) for _ in range(times))
        if ms > 0:
            await self._sleep(ms / 1000.0)

    # ------------------------------------------------------------------ faults

    def _injected(self, kind: FaultKind, stream: bool) -> FaultKind:
        """The fault a call gets (a stream-only kind falls back when not streaming),
        counted."""
        if not stream:
            kind = _NOT_STREAMED.get(kind, kind)
        self._faults[kind] += 1
        return kind

    def _fault_response(self, request: web.Request, kind: FaultKind) -> web.StreamResponse | None:
        """The response of a fault, or None when the answer itself carries it."""
        if kind == "429":
            response = _error(
                429, "Rate limit reached (injected fault).", "requests", "rate_limit_exceeded"
            )
            response.headers["Retry-After"] = _fmt(self.config.retry_after_s)
            response.headers["retry-after-ms"] = _fmt(round(self.config.retry_after_s * 1000))
            return response
        if kind == "500":
            return _error(
                500,
                "The server had an error while processing your request (injected fault).",
                "server_error",
            )
        if kind == "drop":
            return _Dropped(request)
        if kind == "html":
            return web.Response(body=_PROXY_PAGE, content_type="text/html")
        return None

    # ------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse(request, "/v1/models")
        if refused is not None:
            return refused
        return web.Response(body=self._models_body, content_type="application/json")

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        self._requests += 1
        if request.path in ENDPOINTS:
            return _error(
                405, f"{request.method} is not allowed on {request.path}", "invalid_request_error"
            )
        return _error(404, f"Unknown path {request.path}", "invalid_request_error", "unknown_url")

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """vLLM's ``POST /tokenize``: the count the usage of the same input reports."""
        refused = self._refuse(request, "/tokenize")
        if refused is not None:
            return refused
        try:
            body = await self._body(request)
            if "messages" in body:
                turns = _chat_messages(body)
                overhead = self.config.message_overhead_tokens * len(turns)
            else:
                turns = (_Turn("user", _prompt_text(body)),)
                overhead = 0
        except _BadRequest as exc:
            return _bad_request(str(exc))
        words = [w for t in turns for w in t.text.split()]
        tokens = [*(zlib.crc32(w.encode()) & 0xFFFF for w in words), *([0] * overhead)]
        return web.json_response({"count": len(tokens), "max_model_len": 32768, "tokens": tokens})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "/v1/chat/completions")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "/v1/completions")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "/generate")

    async def _serve(self, request: web.Request, path: str) -> web.StreamResponse:
        refused = self._refuse(request, path) or self._over_limit()
        if refused is not None:
            return refused
        cfg = self.config
        echo = _NO_ECHO
        try:
            body = await self._body(request)
            if path == "/v1/chat/completions":
                turns = _chat_messages(body)
                params = _params(body, cfg.model)
            else:
                turns = (_Turn("user", _prompt_text(body)),)
                if path == "/v1/completions":
                    echo = _echo_options(body)
                # an echo may ask for no generated token (max_tokens=0), as vLLM allows
                params = _params(body, cfg.model, legacy_max=True, min_tokens=0 if echo.echo else 1)
                if path == "/generate" and params.stream:
                    raise _BadRequest("/generate does not stream")
        except _BadRequest as exc:
            return _bad_request(str(exc))
        fault = self._draw_fault() if cfg.fault_rate else None
        if fault is not None:
            fault = self._injected(fault, params.stream)
            response = self._fault_response(request, fault)
            if response is not None:
                return response
        seed = cfg.seed if params.seed is None else params.seed
        answer = _answer(turns, cfg.memory_turns, seed, cfg.output_tokens)
        cut = _cut(answer.words, params)
        words, finish, prompt_tokens = cut.words, cut.finish_reason, answer.prompt_tokens
        if cfg.message_overhead_tokens and path == "/v1/chat/completions":
            prompt_tokens += cfg.message_overhead_tokens * len(turns)
        if fault == "lone_surrogate":  # the last word ends in half an emoji
            words = (*words[:-1], (words[-1] if words else "") + _HALF_EMOJI)
        n = len(words)
        usage = (
            f'{{"prompt_tokens":{prompt_tokens},"completion_tokens":{n},'
            f'"total_tokens":{prompt_tokens + n}}}'
        )
        model = self._model_json if params.model == cfg.model else json.dumps(params.model)
        if params.stream:
            chat = path == "/v1/chat/completions"
            return await self._stream(request, chat, words, finish, usage, model, params, fault)
        await self._delay(cfg.ttft_ms)
        await self._delay(cfg.itl_ms, n - 1)
        if fault == "malformed":
            return web.Response(
                body=b'{"id": "malformed", "choices": [{"index": 0, "mess',
                content_type="application/json",
            )
        if echo is not _NO_ECHO:
            return self._echo_response(
                turns[0].text, " ".join(words), finish, usage, model, echo, seed
            )
        text = json.dumps(" ".join(words))
        if path == "/v1/chat/completions":
            body_text = (
                f'{{"id":"chatcmpl-mock{next(self._ids):x}","object":"chat.completion",'
                f'"created":{int(time.time())},"model":{model},"choices":[{{"index":0,'
                f'"message":{{"role":"assistant","content":{text}}},"logprobs":null,'
                f'"finish_reason":"{finish}"}}],"usage":{usage}}}'
            )
        elif path == "/v1/completions":
            body_text = (
                f'{{"id":"cmpl-mock{next(self._ids):x}","object":"text_completion",'
                f'"created":{int(time.time())},"model":{model},"choices":[{{"index":0,'
                f'"text":{text},"logprobs":null,"finish_reason":"{finish}"}}],"usage":{usage}}}'
            )
        else:
            body_text = (
                f'{{"choices":[{{"index":0,"text":{text},"finish_reason":"{finish}"}}],'
                f'"usage":{usage},"model":{model}}}'
            )
        return web.Response(body=body_text.encode(), content_type="application/json")

    def _echo_response(
        self,
        prompt: str,
        completion: str,
        finish: str,
        usage: str,
        model: str,
        options: _Echo,
        seed: int,
    ) -> web.Response:
        """A legacy completion with the prompt echoed and/or logprobs (off the hot path)."""
        logprobs = (
            None
            if options.logprobs is None
            else mock_logprobs(
                prompt, completion, echo=options.echo, top=options.logprobs, seed=seed
            )
        )
        choice = {
            "index": 0,
            "text": prompt + completion if options.echo else completion,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        body = {
            "id": f"cmpl-mock{next(self._ids):x}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": json.loads(model),
            "choices": [choice],
            "usage": json.loads(usage),
        }
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        chat: bool,
        words: tuple[str, ...],
        finish: str,
        usage: str,
        model: str,
        params: _Params,
        fault: FaultKind | None,
    ) -> web.StreamResponse:
        """Send the answer as server-sent events, one event per word."""
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        cid = f"{'chatcmpl' if chat else 'cmpl'}-mock{next(self._ids):x}"
        head = (
            f'data: {{"id":"{cid}","object":"{kind}","created":{created},"model":{model},'
            '"choices":[{"index":0,'
        )
        more = ',"usage":null}' if params.include_usage else "}"
        pieces = _json_pieces(words)
        if fault == "split_surrogate":  # an emoji after the first word, its halves apart
            halves = (json.dumps(" " + _HALF_EMOJI), json.dumps(_OTHER_HALF))
            pieces = (*pieces[:1], *halves, *pieces[1:])
        if chat:
            role = f'{head}"delta":{{"role":"assistant"}},"logprobs":null,"finish_reason":null}}]'
            before = head + '"delta":{"content":'
            after = '},"logprobs":null,"finish_reason":null}]' + more + "\n\n"
            events = [before + p + after for p in pieces]
            end = f'{head}"delta":{{}},"logprobs":null,"finish_reason":"{finish}"}}]{more}\n\n'
        else:
            role = ""
            before = head + '"text":'
            after = ',"logprobs":null,"finish_reason":null}]' + more + "\n\n"
            events = [before + p + after for p in pieces]
            end = f'{head}"text":"","logprobs":null,"finish_reason":"{finish}"}}]{more}\n\n'
        if fault in ("truncated_sse", "stream_drop"):
            events = events[:2]  # a couple of words, then the stream ends: no finish, no [DONE]
        elif fault == "stream_error":
            error = _error_body(
                "The server had an error while streaming the answer (injected fault).",
                "server_error",
            )
            events = [*events[:2], f"data: {error.decode()}\n\n"]
        elif fault == "malformed":
            events = [f'{head}"delta":{{"content":"oops"}},"finish_reas\n\n{_DONE}']
        else:
            if params.include_usage:
                end += (
                    f'data: {{"id":"{cid}","object":"{kind}","created":{created},'
                    f'"model":{model},"choices":[],"usage":{usage}}}\n\n'
                )
            # The finish event follows the last word at once.
            if events:
                events[-1] += end + _DONE
            else:
                events = [end + _DONE]
        if role:
            role += more + "\n\n"
            events = [role + events[0], *events[1:]] if events else [role]
        cfg = self.config
        await self._delay(cfg.ttft_ms)
        if fault != "stream_drop" and (cfg.itl_ms.is_zero or len(events) == 1):
            return web.Response(
                body="".join(events).encode(),
                content_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        response = web.StreamResponse(headers=_SSE_HEADERS)
        response.content_type = "text/event-stream"
        try:
            await response.prepare(request)
            for i, event in enumerate(events):
                if i:
                    await self._delay(cfg.itl_ms)
                await response.write(event.encode())
            if fault == "stream_drop" and request.transport is not None:
                request.transport.abort()  # mid-stream: the chunked body never ends
                return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away; nothing to tell it
        return response


class _Dropped(web.StreamResponse):
    """A "response" that closes the connection instead of answering.

    aiohttp treats a connection that fails while the response is prepared as a client
    that went away: it writes nothing and logs nothing.
    """

    def __init__(self, request: web.Request) -> None:
        super().__init__()
        transport = request.transport
        if transport is not None:
            transport.close()

    async def prepare(self, request: web.BaseRequest) -> Any:
        raise ConnectionResetError("connection dropped (injected fault)")
