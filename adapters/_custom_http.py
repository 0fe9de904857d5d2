"""The custom HTTP backend of the original developer guide: POST {api_endpoint}/generate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from convsim._secrets import redact_url
from convsim._types import GenerationParams, Message, ModelInfo

from ._http import SSEEvent
from ._http_adapter import (
    Delta,
    HttpAdapterConfig,
    HttpModelAdapter,
    HttpRequest,
    ParsedAnswer,
)
from ._openai import _usage as openai_usage
from ._openai_tools import openai_messages, openai_tool_calls, openai_tool_fields
from ._prompt import render_prompt

__all__ = ["CustomHttpConfig", "CustomHttpAdapter", "GuideCustomAdapter"]


class CustomHttpConfig(HttpAdapterConfig):
    """The guide's fields (``api_endpoint``, ``model_name``) are accepted as well, as
    by every HTTP adapter."""


class CustomHttpAdapter(HttpModelAdapter):
    """``http:MODEL``: the guide's request {model, prompt, max_tokens, temperature,
    top_p, stop} with a Bearer key (CONVSIM_HTTP_API_KEY), answered by
    ``choices[0].text``, ``usage`` and ``finish_reason``. It does not stream, and
    sends no penalties (the guide's request has no such fields).

    Tools pass through in OpenAI's shapes: a call that offers tools, or whose
    conversation holds tool calls or results, also sends ``tools``, ``tool_choice``,
    ``parallel_tool_calls`` and the ``messages`` (with their ``tool_calls`` and
    ``tool`` messages) beside the prompt; an answer's ``choices[0].tool_calls`` (or
    ``choices[0].message.tool_calls``) are read back. A text-only call is as before.
    """

    model_type: ClassVar[str] = "http"
    provider: ClassVar[str] = "custom_provider"
    default_key_env: ClassVar[str | None] = "CONVSIM_HTTP_API_KEY"
    supports_streaming: ClassVar[bool] = False
    Config: ClassVar[type[HttpAdapterConfig]] = CustomHttpConfig

    def model_info(self) -> ModelInfo:
        info = super().model_info()
        return info.model_copy(
            update={
                "model_id": f"custom/{self.config.model}",
                "capabilities": ("text_generation", "code_generation"),
            }
        )

    def base_url_hint(self) -> str:
        where = redact_url(self.url_for("/generate"))
        return f"check base_url (api_endpoint): requests go to {where}"

    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> HttpRequest:
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": render_prompt(messages),
            "max_tokens": params.max_tokens or 1024,
            "temperature": 0.7 if params.temperature is None else params.temperature,
            "top_p": 1.0 if params.top_p is None else params.top_p,
            "stop": list(params.stop or ()),
        }
        if params.tools or not all(m.plain for m in messages):
            body["messages"] = openai_messages(messages)
            body.update(openai_tool_fields(params))
        return HttpRequest("/generate", body)

    def parse_response(self, data: Any) -> ParsedAnswer:
        choice = data["choices"][0]
        message = choice.get("message")
        calls = openai_tool_calls(message if isinstance(message, dict) else choice)
        text = choice.get("text")
        if text is None and calls:  # a reply of tool calls alone may carry no text
            text = ""
        if not isinstance(text, str):
            raise TypeError(f"choices[0].text is {type(text).__name__}, not a string")
        return ParsedAnswer(
            text,
            choice.get("finish_reason", "stop"),
            openai_usage(data.get("usage")),
            tool_calls=calls,
        )

    def parse_event(self, event: SSEEvent) -> Delta:
        raise ValueError("the custom backend does not stream")


class GuideCustomAdapter(CustomHttpAdapter):
    """``custom:MODEL``: the same backend under the type name the guide gives it
    (``get_model_adapter("custom", config)``), reporting ``model_type`` ``custom``."""

    model_type: ClassVar[str] = "custom"
