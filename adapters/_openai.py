"""OpenAI and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, TGI, ...).

Two siblings over one wire format::

    HttpModelAdapter
    └── OpenAIWireAdapter          requests, answers and stream events, both endpoints
        ├── OpenAIAdapter          openai: api.openai.com (or OPENAI_BASE_URL), key
        │                          required, max_completion_tokens, reasoning-model
        │                          sampling
        └── OpenAICompatibleAdapter  openai-compatible: base_url (or OPENAI_BASE_URL)
                                   required, OPENAI_API_KEY sent when set, prompt
                                   logprobs by echo

``openai-compatible`` models with ``endpoint=completions`` can also score prompts
(:meth:`OpenAICompatibleAdapter.prompt_logprobs`, for lm-eval's loglikelihood): an echo
request with logprobs, sent through the same budgets, retries and error mapping as
every other call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import anyio.to_thread

from convsim._errors import BadRequest, ConfigError, ProtocolError, ServerError
from convsim._plural import counted
from convsim._types import GenerationParams, Message, ToolCall, Usage

from ._http import SSEEvent
from ._http_adapter import (
    Delta,
    HttpAdapterConfig,
    HttpModelAdapter,
    HttpRequest,
    ParsedAnswer,
)
from ._openai_tools import (
    openai_messages,
    openai_tool_calls,
    openai_tool_fields,
    openai_tool_pieces,
)
from ._prompt import render_prompt, tool_calls_text
from ._protocol import LogprobsUnsupported, PromptLogprobs
from ._tokenizer import TokenCounter, tiktoken_counter, tokenizer_root
from ._tool_stream import ToolCallPiece

__all__ = [
    "OpenAIConfig",
    "OpenAIWireAdapter",
    "OpenAIAdapter",
    "OpenAICompatibleAdapter",
    "SamplingField",
    "render_prompt",
]


class OpenAIConfig(HttpAdapterConfig):
    """Arguments of the OpenAI wire format (``openai`` and ``openai-compatible``)."""

    endpoint: Literal["chat", "completions"] = "chat"
    """``chat`` for /chat/completions, ``completions`` for the legacy /completions."""
    stream_usage: bool = True
    """Ask a stream for its usage (``stream_options.include_usage``). A server that
    refuses the option (a 400 naming it) is asked again without it, and not asked for
    it again; usage is then counted by its tokenizer, or estimated."""


def _usage(data: Any) -> Usage | None:
    if not isinstance(data, dict):
        return None
    prompt = int(data.get("prompt_tokens") or 0)
    completion = int(data.get("completion_tokens") or 0)
    details = data.get("prompt_tokens_details")
    reported = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = None if reported is None else min(max(int(reported), 0), prompt)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=int(data.get("total_tokens") or prompt + completion),
        cached_prompt_tokens=cached or 0,
        cached_tokens=cached,
    )


_REASONING_KEYS = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers put a reasoning model's thoughts, in a message or a
streamed delta: ``reasoning_content`` (vLLM's reasoning parsers, SGLang, DeepSeek,
llama.cpp), ``reasoning`` (newer vLLM, OpenRouter)."""


def _reasoning(message: Mapping[str, Any]) -> str | None:
    """The reasoning text of a message or delta; None when it carries none."""
    for key in _REASONING_KEYS:
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"{key} is {type(value).__name__}, not a string")
            return value or None
    return None


def _reasoning_tokens(usage: Any) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens``; None when not reported."""
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    return details.get("reasoning_tokens") if isinstance(details, dict) else None


def _sequence(logprobs: Mapping[str, Any], name: str, count: int) -> list[Any]:
    values = logprobs.get(name)
    if not isinstance(values, list) or len(values) != count:
        raise ValueError(f"logprobs.{name} is not a list of {counted(count, 'entry', 'entries')}")
    return values


def _logprob(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a logprob is {type(value).__name__}, not a number")
    return float(value)


def _read_prompt_logprobs(prompt: str, logprobs: Mapping[str, Any]) -> PromptLogprobs:
    """The prompt's part of an echo answer's ``logprobs``: the tokens that start before
    the prompt ends (later ones are what the server generated after it)."""
    tokens = logprobs.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError("logprobs.tokens is not a list of strings")
    offsets = _sequence(logprobs, "text_offset", len(tokens))
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise ValueError("logprobs.text_offset is not a list of integers")
    values = [_logprob(v) for v in _sequence(logprobs, "token_logprobs", len(tokens))]
    tops: list[Any] | None = None
    if logprobs.get("top_logprobs") is not None:
        tops = _sequence(logprobs, "top_logprobs", len(tokens))
        for top in tops:
            if top is not None and not isinstance(top, dict):
                raise ValueError("logprobs.top_logprobs holds something other than objects")
    keep = sum(1 for offset in offsets if offset < len(prompt))
    if not keep:
        raise ValueError("no token starts inside the prompt")
    if offsets[:keep] != sorted(offsets[:keep]) or any(o >= len(prompt) for o in offsets[:keep]):
        raise ValueError("logprobs.text_offset does not run through the prompt in order")
    return PromptLogprobs(
        tokens=tuple(tokens[:keep]),
        token_logprobs=tuple(values[:keep]),
        text_offset=tuple(offsets[:keep]),
        top_logprobs=None
        if tops is None
        else tuple(
            None if top is None else {str(k): float(v) for k, v in top.items()}
            for top in tops[:keep]
        ),
        usage=Usage(),
    )


@dataclass(slots=True)
class _EchoScoring:
    """The :class:`Exchange` that scores one prompt: lm-eval's ``local-completions``
    request, and the prompt's logprobs once an answer has been read."""

    prompt: str
    model: str
    url: str
    """Where the request goes, for error messages."""
    scrub: Callable[[str], str]
    """Blanks the API key out of a snippet of the answer."""
    result: PromptLogprobs | None = None
    """The prompt's logprobs from the answer read (usage not yet filled in)."""

    def request(self) -> HttpRequest:
        # some servers refuse max_tokens=0
        return HttpRequest(
            "/completions",
            {
                "model": self.model,
                "prompt": self.prompt,
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": 1,
                "echo": True,
            },
        )

    def parse(self, data: Any) -> ParsedAnswer:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
            raise ProtocolError(
                f"{self.url} answered an echo request without logprobs: the server "
                "does not support echo with logprobs (vLLM does)",
                snippet=self.scrub(json.dumps(choice))[:200],
                model=self.model,
            )
        text = choice.get("text")
        if not isinstance(text, str) or not text.startswith(self.prompt):
            raise ProtocolError(
                f"{self.url} did not echo the prompt back: the server does not support "
                "echo, so its logprobs are not the prompt's",
                snippet=self.scrub(json.dumps(choice))[:200],
                model=self.model,
            )
        try:
            self.result = _read_prompt_logprobs(self.prompt, logprobs)
        except ValueError as exc:  # the server's logprobs, not the transfer: no retry helps
            raise ProtocolError(
                f"{self.url} answered an echo request with unusable logprobs: {exc}",
                snippet=self.scrub(json.dumps(choice))[:200],
                model=self.model,
            ) from exc
        return ParsedAnswer(text, choice.get("finish_reason"), _usage(data.get("usage")))


SamplingField = Literal["temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"]
"""A sampling setting of :class:`GenerationParams` that goes into the body as it is."""

_SAMPLING_FIELDS: tuple[SamplingField, ...] = (
    *("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"),
)

_REASONING_MODEL = re.compile(r"o\d")
"""OpenAI's reasoning models: o1, o3-mini, o4-mini, ..."""


def _sampling_values(params: GenerationParams) -> dict[SamplingField, float | int | None]:
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
    }


class OpenAIWireAdapter(HttpModelAdapter):
    """The OpenAI wire format: chat completions (or legacy completions with
    ``endpoint=completions``), answers and server-sent events.

    What :class:`OpenAIAdapter` and :class:`OpenAICompatibleAdapter` share. A subclass
    says where the API is and what key it takes (the class attributes of
    :class:`HttpModelAdapter`), and may narrow what a request carries with
    :meth:`sampling_fields` and :meth:`max_tokens_field`.
    """

    Config: ClassVar[type[HttpAdapterConfig]] = OpenAIConfig
    config: OpenAIConfig

    def __init__(self, config: HttpAdapterConfig | Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._stream_usage = self.config.stream_usage
        """Whether streams ask for usage: off once the server refused the option."""

    def drop_refused_option(self, error: BadRequest) -> bool:
        """A server that does not know ``stream_options`` (it names it in its 400) is
        asked without it from now on."""
        if "stream_options" not in str(error):
            return False
        self._stream_usage = False
        return True

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        if self.config.endpoint == "completions":  # the one text the server reads
            return await self.count_tokens(render_prompt(messages))
        return await super().count_prompt_tokens(messages)

    def sampling_fields(self) -> tuple[SamplingField, ...]:
        """The sampling settings this model takes; each is sent when a call sets it."""
        return _SAMPLING_FIELDS

    def max_tokens_field(self) -> str:
        """The body field that carries ``max_tokens``."""
        return "max_tokens"

    def listing_path(self) -> str | None:
        """``GET /models``: OpenAI, vLLM, Ollama, llama.cpp and TGI list their models."""
        return "/models"

    def base_url_hint(self) -> str:
        return f"does base_url end in /v1, and does the server serve model {self.config.model!r}?"

    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> HttpRequest:
        body: dict[str, Any] = {"model": self.config.model}
        if self.config.endpoint == "chat":
            path = "/chat/completions"
            body["messages"] = openai_messages(messages)
            body.update(openai_tool_fields(params))
        else:
            if params.tools:
                raise ConfigError(
                    f"{self.model_type}:{self.config.model}: tools need the chat endpoint; "
                    "drop endpoint=completions"
                )
            path = "/completions"
            body["prompt"] = render_prompt(messages)
        sampling = _sampling_values(params)
        for name in self.sampling_fields():
            value = sampling[name]
            if value is not None:
                body[name] = value
        if params.max_tokens is not None:
            body[self.max_tokens_field()] = params.max_tokens
        if params.stop:
            body["stop"] = list(params.stop)
        # server extensions for exact output lengths (vLLM, SGLang; llama.cpp reads
        # ignore_eos): sent only when asked, as OpenAI itself refuses unknown fields
        if params.min_tokens is not None:
            body["min_tokens"] = params.min_tokens
        if params.ignore_eos is not None:
            body["ignore_eos"] = params.ignore_eos
        if stream:
            body["stream"] = True
            if self._stream_usage:
                body["stream_options"] = {"include_usage": True}
        return HttpRequest(path, body)

    def parse_response(self, data: Any) -> ParsedAnswer:
        choice = data["choices"][0]
        reasoning = None
        calls: tuple[ToolCall, ...] = ()
        if self.config.endpoint == "chat":
            message = choice["message"]
            text = message.get("content") or ""
            reasoning = _reasoning(message)
            calls = openai_tool_calls(message)
        else:
            text = choice["text"]
        if not isinstance(text, str):
            raise TypeError(f"the answer's text is {type(text).__name__}, not a string")
        usage = data.get("usage")
        return ParsedAnswer(
            text,
            choice.get("finish_reason"),
            _usage(usage),
            reasoning,
            _reasoning_tokens(usage),
            calls,
            data.get("id"),
        )

    def parse_event(self, event: SSEEvent) -> Delta:
        raw = event.data
        if raw[:1] != "{" and raw.strip() == "[DONE]":
            return Delta(done=True)
        data = json.loads(raw)
        if "error" in data:  # vLLM and others report failures mid-stream this way
            raise ServerError(
                f"the stream reported an error: {data['error']}", model=self.config.model
            )
        reported = data.get("usage")
        usage = _usage(reported)
        thought_tokens = _reasoning_tokens(reported)
        choices = data.get("choices") or []
        if not choices:
            return Delta(usage=usage, reasoning_tokens=thought_tokens, response_id=data.get("id"))
        choice = choices[0]
        reasoning = None
        pieces: tuple[ToolCallPiece, ...] = ()
        if self.config.endpoint == "chat":
            delta = choice.get("delta") or {}
            text = delta.get("content")
            reasoning = _reasoning(delta)
            pieces = openai_tool_pieces(delta)
        else:
            text = choice.get("text")
        return Delta(
            text=text or None,
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            reasoning=reasoning,
            reasoning_tokens=thought_tokens,
            tool_calls=pieces,
            response_id=data.get("id"),
        )


class OpenAIAdapter(OpenAIWireAdapter):
    """``openai:MODEL``: api.openai.com (or ``OPENAI_BASE_URL`` when set) with the key
    from OPENAI_API_KEY (required), as the OpenAI SDK reads them.

    Sends ``max_completion_tokens`` to the chat endpoint (reasoning models refuse
    ``max_tokens``; legacy completions take only ``max_tokens``), and to reasoning
    models (o1, o3, o4, ...) only ``seed`` among the sampling settings, as they take no
    other. api.openai.com returns no logprobs for a prompt, so it scores none.
    """

    model_type: ClassVar[str] = "openai"
    provider: ClassVar[str] = "openai"
    default_base_url: ClassVar[str | None] = "https://api.openai.com/v1"
    base_url_env: ClassVar[str | None] = "OPENAI_BASE_URL"
    default_key_env: ClassVar[str | None] = "OPENAI_API_KEY"
    requires_key: ClassVar[bool] = True

    def __init__(self, config: HttpAdapterConfig | Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._tiktoken_loaded = False
        self._tiktoken_counter: TokenCounter | None = None

    def sampling_fields(self) -> tuple[SamplingField, ...]:
        if _REASONING_MODEL.match(self.config.model):
            return ("seed",)
        return _SAMPLING_FIELDS

    def max_tokens_field(self) -> str:
        # chat takes max_completion_tokens (reasoning models refuse max_tokens there);
        # the legacy completions endpoint only ever knew max_tokens
        return "max_completion_tokens" if self.config.endpoint == "chat" else "max_tokens"

    def no_prompt_logprobs_reason(self) -> str:
        return f"openai:{self.config.model}: api.openai.com returns no logprobs for a prompt"

    async def _tiktoken(self) -> TokenCounter | None:
        """tiktoken's tokenizer for the model, loaded once (in a thread: its first use
        may read or fetch a vocabulary); None without tiktoken or for a model it does
        not know."""
        if not self._tiktoken_loaded:
            counter = await anyio.to_thread.run_sync(tiktoken_counter, self.config.model)
            self._tiktoken_counter, self._tiktoken_loaded = counter, True
        return self._tiktoken_counter

    async def count_tokens(self, text: str) -> int | None:
        """api.openai.com has no tokenize endpoint: tiktoken counts, where installed."""
        counter = await self._tiktoken()
        return None if counter is None else counter(text)

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        counter = await self._tiktoken()
        if counter is None:
            return None
        if self.config.endpoint == "completions":
            return counter(render_prompt(messages))
        # OpenAI's chat format (its cookbook's count): each message is its role, its
        # content and 3 tokens of framing; the answer is primed with 3 more
        return (
            sum(
                counter(m.role) + counter(m.content + tool_calls_text(m.tool_calls)) + 3
                for m in messages
            )
            + 3
        )


class OpenAICompatibleAdapter(OpenAIWireAdapter):
    """``openai-compatible:MODEL``: any server that speaks the OpenAI wire format.

    It needs ``base_url`` (e.g. ``http://127.0.0.1:8000/v1`` for vLLM,
    ``http://127.0.0.1:11434/v1`` for Ollama), or ``OPENAI_BASE_URL`` set. The key is
    ``api_key``, else the variable ``api_key_env`` names (which must be set), else
    ``OPENAI_API_KEY`` when it is set, as the OpenAI SDK and vLLM's benchmark read it;
    with none of them, no key is sent. With ``endpoint=completions`` it also scores
    prompts (:meth:`prompt_logprobs`).
    """

    model_type: ClassVar[str] = "openai-compatible"
    provider: ClassVar[str] = "openai-compatible"
    base_url_env: ClassVar[str | None] = "OPENAI_BASE_URL"
    default_key_env: ClassVar[str | None] = "OPENAI_API_KEY"

    def tokenizer_root(self) -> str:
        """vLLM, SGLang, llama.cpp and llama-cpp-python serve their tokenizer beside
        ``/v1`` (see :class:`~convsim.adapters._tokenizer.ServerTokenizer`)."""
        return tokenizer_root(self.base_url)

    @property
    def supports_prompt_logprobs(self) -> bool:
        """Only the legacy completions endpoint echoes a prompt with its logprobs."""
        return self.config.endpoint == "completions"

    def no_prompt_logprobs_reason(self) -> str:
        return (
            f"{self.model_type}:{self.config.model} uses endpoint={self.config.endpoint}, "
            "which cannot echo a prompt with its logprobs"
        )

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs:
        """Score ``prompt``: the logprob of each of its tokens given those before it.

        Sends lm-eval's ``local-completions`` request (``echo``, ``logprobs=1``,
        ``max_tokens=1``, ``temperature=0``) to ``/completions`` through the adapter's
        one call path: rate budgets, the concurrency cap, bounded retries, error
        mapping and key redaction as for :meth:`generate`. The generated token is
        dropped from the result. Never streamed.

        Raises:
            LogprobsUnsupported: the adapter uses the chat endpoint, which cannot echo.
            ProtocolError: the server answered without usable logprobs.
            AdapterError: the call failed (after retries where they apply).
        """
        if not self.supports_prompt_logprobs:
            raise LogprobsUnsupported(
                f"{self.no_prompt_logprobs_reason()}: prompt logprobs need "
                "openai-compatible:MODEL with endpoint=completions against a server that "
                "supports echo with logprobs, such as vLLM"
            )
        if not prompt:
            # nothing to score (and servers refuse an empty prompt)
            return PromptLogprobs((), (), (), (), usage=Usage(), attempts=0)
        scoring = _EchoScoring(prompt, self.config.model, self.url_for("/completions"), self._scrub)
        # the message and params only size the token claim (and a usage estimate)
        completion = await self._call(
            [Message(role="user", content=prompt)],
            GenerationParams(temperature=0.0, max_tokens=1),
            on_text=None,
            exchange=scoring,
        )
        assert scoring.result is not None  # parse read them, or the call raised
        return replace(scoring.result, usage=completion.usage, attempts=completion.attempts)
