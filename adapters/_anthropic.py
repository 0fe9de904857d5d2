"""The Anthropic Messages API, tools included.

Tools go as ``tools`` (``[{name, description, input_schema}]``) with ``tool_choice``
(``auto``, ``required`` as ``any``, ``none``, a name as ``{type: tool, name}``;
``parallel_tool_calls=false`` as ``disable_parallel_tool_use``). An assistant message
that called tools becomes ``tool_use`` blocks after its text; tool answers become
``tool_result`` blocks, all those answering one assistant message in the one user
message that follows it, as the API requires. Arguments that are not a JSON object
(a malformed call, answered with a tool error) cannot be a ``tool_use`` block's
``input``: the block carries ``{}`` and the call keeps its text in the results.
Answers are read from ``tool_use`` blocks (their ``input`` as JSON text), streamed as
``content_block_start`` and ``input_json_delta`` pieces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field, field_validator

from convsim._errors import AuthError, BadRequest, ConfigError, RateLimited, ServerError
from convsim._types import GenerationParams, Message, ToolCall, Usage

from ._http import SSEEvent
from ._http_adapter import (
    Delta,
    HttpAdapterConfig,
    HttpModelAdapter,
    HttpRequest,
    ParsedAnswer,
)
from ._tool_stream import ToolCallPiece

__all__ = ["AnthropicConfig", "AnthropicAdapter"]


class AnthropicConfig(HttpAdapterConfig):
    anthropic_version: str = "2023-06-01"
    default_max_tokens: int = 1024
    """The API requires max_tokens; used when a turn sets none."""
    thinking_budget: int | None = Field(default=None, ge=1024)
    """Turn on extended thinking with this many tokens for it (the API's least is
    1024; max_tokens must be larger). The thinking is recorded on the turn, apart from
    the answer; None leaves thinking off."""

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalties(cls, value: float | None) -> float | None:
        if value is not None:
            raise ValueError("the Messages API has no such setting; drop it")
        return value


def _usage(data: Any) -> Usage | None:
    if not isinstance(data, dict) or ("input_tokens" not in data and "output_tokens" not in data):
        return None
    # input_tokens leaves out the tokens read from (or written to) the prompt cache
    reported = data.get("cache_read_input_tokens")
    cached = max(int(reported or 0), 0)
    written = max(int(data.get("cache_creation_input_tokens") or 0), 0)
    prompt = int(data.get("input_tokens") or 0) + cached + written
    completion = int(data.get("output_tokens") or 0)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cached_prompt_tokens=cached,
        cached_tokens=None if reported is None else cached,
    )


def _input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as a ``tool_use`` input: ``{}`` when they are not an object."""
    try:
        return call.parsed_arguments()
    except ValueError:
        return {}


def _blocks(message: Message) -> list[dict[str, Any]]:
    """A message as content blocks (a tool call's or answer's, or text beside them)."""
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
        if message.content:
            block["content"] = message.content
        return [block]
    blocks: list[dict[str, Any]] = []
    if message.content.strip():
        blocks.append({"type": "text", "text": message.content})
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)}
        for c in message.tool_calls
    )
    return blocks


def anthropic_turns(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a request: system messages left out; consecutive messages of
    one role merged (a tool answer is the user's); text as a string where a turn is
    text only, else as content blocks."""
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        role = "user" if m.role == "tool" else m.role
        if m.plain:
            # the API refuses empty text, so an empty earlier reply is marked as such
            content: str | list[dict[str, Any]] = m.content if m.content.strip() else "(no reply)"
        else:
            content = _blocks(m)
        if not turns or turns[-1]["role"] != role:
            turns.append({"role": role, "content": content})
            continue
        last = turns[-1]
        if isinstance(last["content"], str) and isinstance(content, str):
            last["content"] += "\n\n" + content
            continue
        if isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        last["content"].extend(content)
    return turns


def anthropic_tool_fields(params: GenerationParams) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` for a request; none when no tools are offered."""
    if not params.tools:
        return {}
    fields: dict[str, Any] = {
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in params.tools
        ]
    }
    choice = params.tool_choice
    kinds = {"auto": "auto", "required": "any", "none": "none"}
    chosen: dict[str, Any] | None = None
    if choice is not None:
        chosen = {"type": kinds[choice]} if choice in kinds else {"type": "tool", "name": choice}
    if params.parallel_tool_calls is False and (chosen is None or chosen["type"] != "none"):
        chosen = {**(chosen or {"type": "auto"}), "disable_parallel_tool_use": True}
    if chosen is not None:
        fields["tool_choice"] = chosen
    return fields


class AnthropicAdapter(HttpModelAdapter):
    """``anthropic:MODEL``: POST /v1/messages with x-api-key (ANTHROPIC_API_KEY), at
    api.anthropic.com or ``ANTHROPIC_BASE_URL`` when set, as Anthropic's SDK reads them.

    System messages go to the top-level ``system`` field; consecutive messages of one
    role are merged, as the API wants user and assistant to alternate.
    """

    model_type: ClassVar[str] = "anthropic"
    provider: ClassVar[str] = "anthropic"
    default_base_url: ClassVar[str | None] = "https://api.anthropic.com"
    base_url_env: ClassVar[str | None] = "ANTHROPIC_BASE_URL"
    default_key_env: ClassVar[str | None] = "ANTHROPIC_API_KEY"
    requires_key: ClassVar[bool] = True
    Config: ClassVar[type[HttpAdapterConfig]] = AnthropicConfig
    config: AnthropicConfig

    def check_config(self, config: Any) -> GenerationParams:
        params = super().check_config(config)
        if params.temperature is not None and params.temperature > 1.0:
            raise ConfigError(
                f"anthropic:{self.config.model}: temperature {params.temperature} is out of "
                "the API's range 0-1"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(params, name) is not None:
                raise ConfigError(
                    f"anthropic:{self.config.model}: the Messages API has no {name}; "
                    "drop it for this model"
                )
        return params

    def default_max_tokens(self) -> int:
        return self.config.max_tokens or self.config.default_max_tokens

    def auth_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.config.anthropic_version}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def listing_path(self) -> str | None:
        return "/v1/models"

    def base_url_hint(self) -> str:
        return "base_url is the API's root, without /v1 (convsim adds /v1/messages)"

    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> HttpRequest:
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        body: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": params.max_tokens or self.config.default_max_tokens,
            "messages": anthropic_turns(messages),
        }
        if system:
            body["system"] = system
        if params.temperature is not None:
            body["temperature"] = params.temperature
        if params.top_p is not None:
            body["top_p"] = params.top_p
        if params.stop:
            body["stop_sequences"] = list(params.stop)
        body.update(anthropic_tool_fields(params))
        if self.config.thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self.config.thinking_budget}
        if stream:
            body["stream"] = True
        return HttpRequest("/v1/messages", body)

    def parse_response(self, data: Any) -> ParsedAnswer:
        if data.get("type") == "error":
            raise ValueError(f"the API reported an error: {data.get('error')}")
        blocks = data["content"]
        text = "".join(block["text"] for block in blocks if block.get("type") == "text")
        # a redacted_thinking block carries only ciphertext: nothing a reader can use
        thinking = "".join(block["thinking"] for block in blocks if block.get("type") == "thinking")
        calls = tuple(
            ToolCall(
                id=block["id"],
                name=block["name"],
                arguments=json.dumps(block.get("input") or {}, ensure_ascii=False),
            )
            for block in blocks
            if block.get("type") == "tool_use"
        )
        return ParsedAnswer(
            text,
            data.get("stop_reason"),
            _usage(data.get("usage")),
            thinking or None,
            tool_calls=calls,
            response_id=data.get("id"),
        )

    def parse_event(self, event: SSEEvent) -> Delta:
        data = json.loads(event.data)
        kind = data.get("type", event.event)
        if kind == "content_block_delta":
            delta = data["delta"]
            kind = delta.get("type")
            if kind == "thinking_delta":
                return Delta(reasoning=delta.get("thinking"))
            if kind == "input_json_delta":
                piece = ToolCallPiece(data["index"], arguments=delta.get("partial_json"))
                return Delta(tool_calls=(piece,))
            # signature_delta (the thinking's checksum) and others carry no text
            return Delta(text=delta.get("text") if kind == "text_delta" else None)
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") != "tool_use":
                return Delta()
            # its input is {} here: the arguments follow as input_json_delta pieces
            piece = ToolCallPiece(data["index"], id=block.get("id"), name=block.get("name"))
            return Delta(tool_calls=(piece,))
        if kind == "message_start":
            message = data["message"]
            return Delta(usage=_usage(message.get("usage")), response_id=message.get("id"))
        if kind == "message_delta":
            return Delta(
                finish_reason=data.get("delta", {}).get("stop_reason"),
                usage=_usage(data.get("usage")),
            )
        if kind == "message_stop":
            return Delta(done=True)
        if kind == "error":
            error = data.get("error", {})
            message = f"the stream reported {error.get('type')}: {error.get('message')}"
            if error.get("type") == "rate_limit_error":
                raise RateLimited(message, model=self.config.model, status_code=429)
            if error.get("type") in ("authentication_error", "permission_error"):
                raise AuthError(message, model=self.config.model)
            if error.get("type") in ("invalid_request_error", "not_found_error"):
                raise BadRequest(message, model=self.config.model)
            # overloaded_error, api_error and whatever else the server ran into
            raise ServerError(message, model=self.config.model, status_code=529)
        return Delta()  # ping, content_block_stop
