"""A deterministic stand-in for a tool-using model: which tool it calls, with what.

The ``scripted`` model and ``convsim mock-server`` follow this policy, so that tool
packs run offline with a model whose behaviour is known (right where the user names
what to do, wrong where the task needs more than that):

- It acts only when the call offers tools and ``tool_choice`` is not ``none``. The turn
  is everything after the last user message.
- A tool is *named* by that message when every word of its name (split on ``_`` and
  ``-``) occurs in it as a whole word, in any case (``look_up_order`` is named by
  "Can you look up my order?"); named tools go in the order their first word first
  occurs.
- Each model call makes at most one call: the first named tool not yet called in this
  turn. With ``tool_choice=required`` and no call made yet in the turn, an unnamed
  first offered tool is called; with ``tool_choice`` a tool's name, that tool is called
  once, and nothing else.
- Once every named tool was called (or none is named) it answers with text: the turn's
  reference answer when given, else a line ``name: result`` per tool result of the
  turn, else (None) the model's own default answer.
- Arguments come from the message, for each property of the tool's schema in order:
  ``name=value`` or ``name: value`` (a value is a double-quoted string, or the run of
  characters up to whitespace, a comma or the end, a trailing ``.``, ``?`` or ``!``
  dropped); else the first match of the property's ``pattern`` (anchors dropped); else
  the first of its ``enum`` values found in the message as a word. Values take the
  property's type (integer, number, boolean, string); a property not found is left out
  (a required one is then missing, which the tool answers as invalid arguments).
- Call ids are ``call_<turn>_<n>``: the turn's place among the user messages and the
  call's place in the turn, both from 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from convsim._types import Message, ToolCall, ToolChoice, ToolSpec

__all__ = ["next_tool_step", "named_tools", "tool_arguments"]


def _word(word: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", re.IGNORECASE)


def named_tools(message: str, tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    """The tools ``message`` names, in the order their first word first occurs."""
    found: list[tuple[int, int, ToolSpec]] = []
    for order, tool in enumerate(tools):
        words = [w for w in re.split(r"[_-]+", tool.name) if w]
        if not words:
            continue
        places = [_word(w).search(message) for w in words]
        if all(places):
            first = places[0]
            assert first is not None
            found.append((first.start(), order, tool))
    return [tool for _, _, tool in sorted(found, key=lambda f: (f[0], f[1]))]


def _given(message: str, name: str) -> str | None:
    """The value written as ``name=value`` or ``name: value``; None when absent."""
    pattern = rf'(?<![A-Za-z0-9_]){re.escape(name)}\s*[=:]\s*(?:"([^"]*)"|([^\s,]+))'
    match = re.search(pattern, message, re.IGNORECASE)
    if match is None:
        return None
    if match.group(1) is not None:
        return match.group(1)
    value = match.group(2).rstrip(".?!")
    return value or None


def _unanchored(pattern: str) -> str:
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    return pattern


def _found(message: str, schema: Mapping[str, Any]) -> str | None:
    """A value for a property not given by name: its pattern's first match, else the
    first of its enum values that occurs as a word."""
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            match = re.search(_unanchored(pattern), message)
        except re.error:
            match = None
        if match is not None:
            return match.group(0)
    for value in schema.get("enum") or ():
        if isinstance(value, str) and _word(value).search(message):
            return value
    return None


def _type_of(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def _typed(value: str, kind: str | None) -> Any:
    """``value`` as the property's type; left a string when it is not of that type
    (the tool's schema check then says so)."""
    if kind == "integer":
        try:
            return int(value)
        except ValueError:
            return value
    if kind == "number":
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and re.fullmatch(r"-?\d+", value) else number
    if kind == "boolean":
        return {"true": True, "yes": True, "false": False, "no": False}.get(value.lower(), value)
    return value


def tool_arguments(message: str, tool: ToolSpec) -> dict[str, Any]:
    """The arguments ``message`` gives ``tool`` (see the module's rules)."""
    properties = tool.parameters.get("properties")
    if not isinstance(properties, dict):
        return {}
    arguments: dict[str, Any] = {}
    for name, schema in properties.items():
        schema = schema if isinstance(schema, dict) else {}
        value = _given(message, name)
        if value is None:
            value = _found(message, schema)
        if value is not None:
            arguments[name] = _typed(value, _type_of(schema))
    return arguments


def _results(turn: Sequence[Message]) -> list[str]:
    """``name: result`` for each tool result of the turn."""
    names = {c.id: c.name for m in turn for c in m.tool_calls}
    return [
        f"{m.name or names.get(m.tool_call_id or '', 'tool')}: {m.content}"
        for m in turn
        if m.role == "tool"
    ]


def next_tool_step(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] | None,
    tool_choice: ToolChoice | None = None,
    reference: str | None = None,
) -> ToolCall | str | None:
    """What the policy does next: a tool call, an answer's text, or None for the
    model's own default answer (also when no tools are in play)."""
    if not tools or tool_choice == "none":
        return None
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        return None
    message = messages[last_user].content
    turn = messages[last_user + 1 :]
    called = [c.name for m in turn if m.role == "assistant" for c in m.tool_calls]
    position = sum(1 for m in messages[:last_user] if m.role == "user")
    choice: ToolSpec | None = None
    if tool_choice in (None, "auto", "required"):
        choice = next((t for t in named_tools(message, tools) if t.name not in called), None)
        if choice is None and tool_choice == "required" and not called:
            choice = tools[0]
    else:
        forced = next((t for t in tools if t.name == tool_choice), None)
        if forced is not None and forced.name not in called:
            choice = forced
    if choice is not None:
        return ToolCall(
            id=f"call_{position}_{len(called)}",
            name=choice.name,
            arguments=json.dumps(tool_arguments(message, choice), ensure_ascii=False),
        )
    if reference is not None:
        return reference
    lines = _results(turn)
    return "\n".join(lines) if lines else None
