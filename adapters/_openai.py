"""OpenAI and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, TGI, ...).

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

from convsim._errors import ConfigError, ProtocolError, ServerError
from convsim._types import GenerationParams, Message, Usage

from ._http import SSEEvent
from ._http_adapter import (
    Delta,
    HttpAdapterConfig,
    HttpModelAdapter,
    HttpRequest,
    ParsedAnswer,
)
from ._protocol import PromptLogprobs

__all__ = ["OpenAIConfig", "OpenAIAdapter", "OpenAICompatibleAdapter", "render_prompt"]


class OpenAIConfig(HttpAdapterConfig):
    endpoint: Literal["chat", "completions"] = "chat"
    """``chat`` for /chat/completions, ``completions`` for the legacy /completions."""
    stream_usage: bool = True
    """Ask a stream for its usage (``stream_options.include_usage``); turn off for
    servers that reject the option (usage is then estimated)."""


def render_prompt(messages: Sequence[Message]) -> str:
    """A conversation as one prompt: a lone user message as itself, otherwise a
    role-prefixed transcript that ends where the assistant speaks next."""
    if len(messages) == 1 and messages[0].role == "user":
        return messages[0].content
    lines = [f"{m.role.capitalize()}: {m.content}" for m in messages]
    return "\n\n".join([*lines, "Assistant:"])


def _usage(data: Any) -> Usage | None:
    if not isinstance(data, dict):
        return None
    prompt = int(data.get("prompt_tokens") or 0)
    completion = int(data.get("completion_tokens") or 0)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=int(data.get("total_tokens") or prompt + completion),
    )


def _sequence(logprobs: Mapping[str, Any], name: str, count: int) -> list[Any]:
    values = logprobs.get(name)
    if not isinstance(values, list) or len(values) != count:
        raise ValueError(f"logprobs.{name} is not a list of {count} entries")
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
        # a misshapen part raises here, inside the attempt: a ProtocolError with a snippet
        self.result = _read_prompt_logprobs(self.prompt, logprobs)
        return ParsedAnswer(text, choice.get("finish_reason"), _usage(data.get("usage")))


class OpenAICompatibleAdapter(HttpModelAdapter):
    """Chat completions (or legacy completions) over the OpenAI wire format.

    ``openai-compatible:MODEL`` needs ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``
    for vLLM, ``http://127.0.0.1:11434/v1`` for Ollama); a key is optional. With
    ``endpoint=completions`` it also scores prompts (:meth:`prompt_logprobs`).
    """

    model_type: ClassVar[str] = "openai-compatible"
    provider: ClassVar[str] = "openai-compatible"
    default_key_env: ClassVar[str | None] = "OPENAI_API_KEY"
    Config: ClassVar[type[HttpAdapterConfig]] = OpenAIConfig
    config: OpenAIConfig

    def _resolve_key(self, env: Any) -> str | None:
        # a compatible server usually needs no key: only use one that was asked for
        if self.config.api_key is None and self.config.api_key_env is None:
            return None
        return super()._resolve_key(env)

    # -- prompt scoring ------------------------------------------------------------

    @property
    def supports_prompt_logprobs(self) -> bool:
        """Only the legacy completions endpoint echoes a prompt with its logprobs."""
        return self.config.endpoint == "completions"

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs:
        """Score ``prompt``: the logprob of each of its tokens given those before it.

        Sends lm-eval's ``local-completions`` request (``echo``, ``logprobs=1``,
        ``max_tokens=1``, ``temperature=0``) to ``/completions`` through the adapter's
        one call path: rate budgets, the concurrency cap, bounded retries, error
        mapping and key redaction as for :meth:`generate`. The generated token is
        dropped from the result. Never streamed.

        Raises:
            ConfigError: the adapter uses the chat endpoint, which cannot echo.
            ProtocolError: the server answered without usable logprobs.
            AdapterError: the call failed (after retries where they apply).
        """
        if not self.supports_prompt_logprobs:
            raise ConfigError(
                f"{self.no_prompt_logprobs_reason()}: prompt logprobs need "
                "openai-compatible:MODEL with endpoint=completions against a server that "
                "supports echo with logprobs, such as vLLM"
            )
        if not prompt:
            # nothing to score (and servers refuse an empty prompt)
            return PromptLogprobs((), (), (), (), usage=Usage(), attempts=0)
        scoring = _EchoScoring(
            prompt, self.config.model, f"{self.base_url}/completions", self._scrub
        )
        # the message and params only size the token claim (and a usage estimate)
        completion = await self._call(
            [Message(role="user", content=prompt)],
            GenerationParams(temperature=0.0, max_tokens=1),
            on_text=None,
            exchange=scoring,
        )
        assert scoring.result is not None  # parse read them, or the call raised
        return replace(scoring.result, usage=completion.usage, attempts=completion.attempts)

    def no_prompt_logprobs_reason(self) -> str:
        """Why this adapter, as configured, cannot score prompts."""
        return (
            f"{self.model_type}:{self.config.model} uses endpoint={self.config.endpoint}, "
            "which cannot echo a prompt with its logprobs"
        )

    # -- the wire format -----------------------------------------------------------

    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> HttpRequest:
        body: dict[str, Any] = {"model": self.config.model}
        if self.config.endpoint == "chat":
            path = "/chat/completions"
            body["messages"] = [{"role": m.role, "content": m.content} for m in messages]
        else:
            path = "/completions"
            body["prompt"] = render_prompt(messages)
        for name in self._sampling_fields:
            value = getattr(params, name)
            if value is not None:
                body[name] = value
        if params.max_tokens is not None:
            body[self._max_tokens_field] = params.max_tokens
        if params.stop:
            body["stop"] = list(params.stop)
        if stream:
            body["stream"] = True
            if self.config.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return HttpRequest(path, body)

    #: OpenAI's reasoning models (o1, o3, o4, ...) take only the default sampling.
    _sampling_fields: tuple[str, ...] = ("temperature", "top_p", "seed")
    _max_tokens_field = "max_tokens"

    def parse_response(self, data: Any) -> ParsedAnswer:
        choice = data["choices"][0]
        if self.config.endpoint == "chat":
            text = choice["message"].get("content") or ""
        else:
            text = choice["text"]
        if not isinstance(text, str):
            raise TypeError(f"the answer's text is {type(text).__name__}, not a string")
        return ParsedAnswer(text, choice.get("finish_reason"), _usage(data.get("usage")))

    def parse_event(self, event: SSEEvent) -> Delta:
        if event.data.strip() == "[DONE]":
            return Delta(done=True)
        data = json.loads(event.data)
        if "error" in data:  # vLLM and others report failures mid-stream this way
            raise ServerError(
                f"the stream reported an error: {data['error']}", model=self.config.model
            )
        usage = _usage(data.get("usage"))
        choices = data.get("choices") or []
        if not choices:
            return Delta(usage=usage)
        choice = choices[0]
        if self.config.endpoint == "chat":
            text = (choice.get("delta") or {}).get("content")
        else:
            text = choice.get("text")
        return Delta(text=text or None, finish_reason=choice.get("finish_reason"), usage=usage)


class OpenAIAdapter(OpenAICompatibleAdapter):
    """``openai:MODEL``: api.openai.com with the key from OPENAI_API_KEY."""

    model_type: ClassVar[str] = "openai"
    provider: ClassVar[str] = "openai"
    default_base_url: ClassVar[str | None] = "https://api.openai.com/v1"
    requires_key: ClassVar[bool] = True

    # api.openai.com: max_completion_tokens (max_tokens is refused by reasoning models)
    _max_tokens_field = "max_completion_tokens"

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if re.match(r"o\d", self.config.model):
            self._sampling_fields = ("seed",)

    @property
    def supports_prompt_logprobs(self) -> bool:
        """api.openai.com no longer returns logprobs for an echoed prompt."""
        return False

    def no_prompt_logprobs_reason(self) -> str:
        return f"openai:{self.config.model}: api.openai.com returns no logprobs for a prompt"

    def _resolve_key(self, env: Any) -> str | None:
        return HttpModelAdapter._resolve_key(self, env)
