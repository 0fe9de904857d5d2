"""OpenAI and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, TGI, ...)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from convsim._errors import ServerError

from ._http import SSEEvent
from ._http_adapter import Delta, HttpAdapterConfig, HttpModelAdapter
from ._types import GenerationParams, Message, Usage

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


class OpenAICompatibleAdapter(HttpModelAdapter):
    """Chat completions (or legacy completions) over the OpenAI wire format.

    ``openai-compatible:MODEL`` needs ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``
    for vLLM, ``http://127.0.0.1:11434/v1`` for Ollama); a key is optional.
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

    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> tuple[str, dict[str, Any]]:
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
        return path, body

    #: OpenAI's reasoning models (o1, o3, o4, ...) take only the default sampling.
    _sampling_fields: tuple[str, ...] = ("temperature", "top_p", "seed")
    _max_tokens_field = "max_tokens"

    def parse_response(self, data: Any) -> tuple[str, str | None, Usage | None]:
        choice = data["choices"][0]
        if self.config.endpoint == "chat":
            text = choice["message"].get("content") or ""
        else:
            text = choice["text"]
        if not isinstance(text, str):
            raise TypeError(f"the answer's text is {type(text).__name__}, not a string")
        return text, choice.get("finish_reason"), _usage(data.get("usage"))

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

    def _resolve_key(self, env: Any) -> str | None:
        return HttpModelAdapter._resolve_key(self, env)
