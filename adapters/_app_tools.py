"""What an application under test reads and writes of tools, in the OpenAI chat shapes.

An agent written for the OpenAI API is given what that API would give it and may
answer as that API answers:

- the messages as dicts: a text message ``{role, content}`` (as before tools), an
  assistant message that called tools ``{role: assistant, content, tool_calls: [{id,
  type: function, function: {name, arguments}}]}``, a tool's answer ``{role: tool,
  tool_call_id, name, content}``; content is always a string (empty beside tool calls),
  and reasoning is never given back;
- the turn's tools as ``[{type: function, function: {name, description,
  parameters}}]``;
- calls back as :class:`~convsim.adapters.ToolCall` objects, OpenAI-style dicts (or
  the OpenAI SDK's call objects) or flat ``{id, name, arguments}`` dicts; arguments as
  JSON text or a dict.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from convsim._types import GenerationParams, Message, ToolCall

from ._openai_tools import openai_message, openai_tool_fields
from ._text import repair_text

__all__ = ["app_messages", "app_tools", "app_tool_calls"]


def app_message(message: Message) -> dict[str, Any]:
    """One message as an application is given it: as the chat completions API takes it,
    and a tool message also names its tool (``name``)."""
    data = openai_message(message)
    if message.role == "tool":
        data["name"] = message.name or ""
    return data


def app_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as an application is given it: a fresh list of fresh dicts."""
    return [app_message(m) for m in messages]


def app_tools(params: GenerationParams) -> list[dict[str, Any]]:
    """The tools the call offers, as OpenAI ``tools`` entries (copies: an application
    that changes them changes nothing of the pack's); none when the turn offers none or
    forbids their use (``tool_choice: none``)."""
    if params.tool_choice == "none":
        return []
    tools: list[dict[str, Any]] = openai_tool_fields(params).get("tools", [])
    return copy.deepcopy(tools)


def app_tool_calls(value: Any, position: int) -> tuple[ToolCall, ...]:
    """An application's ``tool_calls``, checked. A call without an id is given
    ``call_<position>_<index>`` (``position``: where the reply stands in the
    conversation), the same on every run and unique in the conversation.

    Raises:
        TypeError: a shape that is no list of calls, naming the field at fault.
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TypeError(f"tool_calls is {type(value).__name__}, not a list of calls")
    calls: list[ToolCall] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(value):
        call = _call(entry, f"tool_calls[{index}]", f"call_{position}_{index}")
        if call.id in seen:
            raise TypeError(
                f"tool_calls[{index}].id {call.id!r} is tool_calls[{seen[call.id]}]'s too: "
                "each call needs its own id"
            )
        seen[call.id] = index
        calls.append(call)
    return tuple(calls)


def _call(entry: Any, where: str, default_id: str) -> ToolCall:
    if isinstance(entry, BaseModel):  # the OpenAI SDK's own call objects
        entry = entry.model_dump()
    if isinstance(entry, ToolCall):
        call_id, name, arguments = entry.id or default_id, entry.name, entry.arguments
        if not name.strip():
            raise TypeError(f"{where}.name is empty: each call needs the tool's name")
    elif isinstance(entry, Mapping):
        kind = entry.get("type", "function")
        if kind != "function":
            raise TypeError(f"{where}.type is {kind!r}, not 'function'")
        function: Any = entry
        if "function" in entry:
            function = entry["function"]
            if not isinstance(function, Mapping):
                raise TypeError(f"{where}.function is {type(function).__name__}, not a dict")
            where = f"{where}.function"
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"{where}.name is {name!r}: each call needs the tool's name")
        arguments = _arguments(function.get("arguments"), f"{where}.arguments")
        given = entry.get("id")
        if given is not None and not isinstance(given, str):
            raise TypeError(f"{where.split('.')[0]}.id is {type(given).__name__}, not a string")
        call_id = given or default_id
    else:
        raise TypeError(
            f"{where} is {type(entry).__name__}: give a ToolCall or a dict "
            "{id, type: function, function: {name, arguments}}"
        )
    return ToolCall(
        id=repair_text(call_id).text,
        name=repair_text(name).text,
        arguments=repair_text(arguments).text,
    )


def _arguments(value: Any, where: str) -> str:
    """Arguments as JSON text: a string kept as written (text that is no JSON object
    is the tool's to refuse, as a model's would be), a dict dumped, none as ``{}``."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{where} cannot be written as JSON: {exc}") from None
    raise TypeError(f"{where} is {type(value).__name__}: give JSON text or a dict")
