"""Tools in the OpenAI chat completions wire format, both ways.

Sent: ``tools`` (``[{type: function, function: {name, description, parameters}}]``),
``tool_choice`` (``auto``, ``required``, ``none`` or ``{type: function, function:
{name}}``), ``parallel_tool_calls``; an assistant message that called tools as
``{role: assistant, content: text, tool_calls: [...]}`` (the empty string when it said
nothing: OpenAI and vLLM take null too, llama-cpp-python's server only a string) and
a tool's answer as ``{role: tool, tool_call_id, content}``. A message's reasoning is
never sent back.

Read: ``choices[0].message.tool_calls`` of an answer, and the ``delta.tool_calls``
entries of a stream as :class:`ToolCallPiece` s. OpenAI-compatible servers, LiteLLM
and the custom HTTP backend share these shapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from convsim._types import GenerationParams, Message, ToolCall

from ._tool_stream import ToolCallPiece

__all__ = [
    "openai_message",
    "openai_messages",
    "openai_tool_fields",
    "openai_tool_calls",
    "openai_tool_pieces",
    "arguments_text",
]

_CHOICES = frozenset({"auto", "required", "none"})


def openai_message(message: Message) -> dict[str, Any]:
    """One message as the chat completions API takes it."""
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    if message.tool_calls:
        return {
            "role": message.role,
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    # a call with no arguments at all is sent as the empty object
                    "function": {"name": call.name, "arguments": call.arguments or "{}"},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a chat completions request."""
    return [openai_message(m) for m in messages]


def openai_tool_fields(params: GenerationParams) -> dict[str, Any]:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` for a request: none of
    them when the call offers no tools (the API refuses a choice without tools)."""
    if not params.tools:
        return {}
    fields: dict[str, Any] = {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in params.tools
        ]
    }
    choice = params.tool_choice
    if choice is not None:
        fields["tool_choice"] = (
            choice if choice in _CHOICES else {"type": "function", "function": {"name": choice}}
        )
    if params.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = params.parallel_tool_calls
    return fields


def arguments_text(value: Any) -> str:
    """A call's arguments as JSON text: a string as sent (even if it is not valid
    JSON), an object (as some servers send it) dumped, null as empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"a tool call's arguments are {type(value).__name__}, not JSON text")


def _function(entry: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(entry, dict):
        raise TypeError(f"{where} is {type(entry).__name__}, not an object")
    function = entry.get("function") or {}
    if not isinstance(function, dict):
        raise TypeError(f"{where}.function is {type(function).__name__}, not an object")
    return function


def openai_tool_calls(message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    """The tool calls of an answer's ``message`` (none when it has no ``tool_calls``).

    Raises:
        TypeError, ValueError: a call is not of the API's shape (no name, say).
    """
    entries = message.get("tool_calls") or []
    if not isinstance(entries, list):
        raise TypeError(f"tool_calls is {type(entries).__name__}, not a list")
    calls = []
    for i, entry in enumerate(entries):
        function = _function(entry, f"tool_calls[{i}]")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool_calls[{i}] has no function name")
        call_id = entry.get("id") or f"call_{i}"
        if not isinstance(call_id, str):
            raise TypeError(f"tool_calls[{i}].id is {type(call_id).__name__}, not a string")
        calls.append(
            ToolCall(id=call_id, name=name, arguments=arguments_text(function.get("arguments")))
        )
    return tuple(calls)


def openai_tool_pieces(delta: Mapping[str, Any]) -> tuple[ToolCallPiece, ...]:
    """What a streamed ``delta`` adds to tool calls (none when it has no
    ``tool_calls``)."""
    entries = delta.get("tool_calls")
    if not entries:
        return ()
    if not isinstance(entries, list):
        raise TypeError(f"delta.tool_calls is {type(entries).__name__}, not a list")
    pieces = []
    for i, entry in enumerate(entries):
        function = _function(entry, f"delta.tool_calls[{i}]")
        pieces.append(
            ToolCallPiece(
                index=entry.get("index"),
                id=entry.get("id"),
                name=function.get("name"),
                arguments=arguments_text(function.get("arguments")),
            )
        )
    return tuple(pieces)
