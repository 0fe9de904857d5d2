"""Running a pack's tools for one conversation: the calls a model makes, answered.

A :class:`ToolBox` holds one conversation's environment document (a deep copy of the
scenario's or the pack's) and answers each call the way its tool is declared: from
``responses``, by ``operations`` on the document, or, only with ``allow_code``, by a
Python function. Whatever goes wrong with a call becomes a :class:`ToolOutcome` with
an error kind, told to the model as the tool's result; only cancellation escapes.
A call that fails changes nothing: operations run on a copy that replaces the
document only when all of them succeeded, and a Python tool gets a copy too.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
import anyio.to_thread

from convsim._plural import counted
from convsim._records import ToolErrorKind
from convsim._registry import import_object
from convsim._types import ToolCall

from ._criteria import CODE_REFUSED
from ._json_schema import ArgumentsValidator, arguments_validator, first_problem
from ._schema import Scenario
from ._state_checks import (
    MISSING,
    PLACEHOLDER,
    check_state,
    fill_placeholders,
    resolve_path,
    same_json,
)
from ._tool_schema import ToolDefinition, ToolOperation
from ._toolset import ToolSet

__all__ = ["ToolOutcome", "ToolBox", "MAX_RESULT_BYTES"]

MAX_RESULT_BYTES = 64 * 1024
"""The longest result a model is told (UTF-8 bytes); a longer one is cut, with a note."""


@dataclass(frozen=True)
class ToolOutcome:
    """What one call came to: the tool message's content, and why it is an error."""

    result: str
    """The tool message's content (JSON text, unless the tool answered with text)."""
    error: ToolErrorKind | None = None
    changed: bool = False
    """The call changed the environment document."""


class _Failed(Exception):
    """A call that ends in an error outcome."""

    def __init__(self, kind: ToolErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Ran(NamedTuple):
    """A call that ran: its result, and the document it leaves (None: unchanged)."""

    result: str
    document: dict[str, Any] | None


class ToolBox:
    """One conversation's tools: runs the calls its model makes on its own document.

    Args:
        tools: the pack's tools.
        scenario: the conversation's scenario (its ``environment``, if it has one,
            replaces the pack's).
        allow_code: Python tools may run (the pack was loaded with ``allow_code``);
            without it they answer with an error.
    """

    def __init__(self, tools: ToolSet, scenario: Scenario, *, allow_code: bool) -> None:
        self._tools = tools
        self._allow_code = allow_code
        self._document = tools.initial_environment(scenario)
        self._validators: dict[str, ArgumentsValidator] = {}

    @property
    def environment(self) -> dict[str, Any]:
        """The live environment document (copy it to keep a snapshot)."""
        return self._document

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Answer ``call``; never raises but for cancellation."""
        try:
            ran = await self._run(call)
        except _Failed as failed:
            return ToolOutcome(_bounded(failed.message), failed.kind)
        changed = ran.document is not None and not same_json(ran.document, self._document)
        if ran.document is not None:
            self._document = ran.document
        return ToolOutcome(_bounded(ran.result), None, changed)

    async def _run(self, call: ToolCall) -> _Ran:
        tool = self._tools.get(call.name)
        if tool is None:
            names = ", ".join(self._tools.names)
            raise _Failed("unknown_tool", f"no tool named {call.name!r}; tools: {names}")
        try:
            arguments = call.parsed_arguments()
        except ValueError as exc:
            raise _Failed("invalid_arguments", f"{tool.name}: {exc}") from None
        problem = first_problem(self._validator(tool), arguments)
        if problem is not None:
            raise _Failed("invalid_arguments", f"{tool.name}: invalid arguments: {problem}")
        if tool.responses is not None:
            return _Ran(_respond(tool, arguments), None)
        if tool.operations is not None:
            return _operate(tool, tool.operations, arguments, self._document)
        return await self._call_python(tool, arguments)

    def _validator(self, tool: ToolDefinition) -> ArgumentsValidator:
        validator = self._validators.get(tool.name)
        if validator is None:
            validator = self._validators[tool.name] = arguments_validator(tool.parameters)
        return validator

    async def _call_python(self, tool: ToolDefinition, arguments: dict[str, Any]) -> _Ran:
        reference = str(tool.python)
        if not self._allow_code:
            raise _Failed("tool_error", f"tool {tool.name!r} runs {reference!r}: {CODE_REFUSED}")
        try:
            function: Any = import_object(reference)
        except Exception as exc:  # importing runs the module: anything can go wrong
            raise _Failed("tool_error", f"cannot import {reference!r}: {_described(exc)}") from None
        document = None
        if _takes_environment(function):
            document = copy.deepcopy(self._document)  # replaces the live one if the call ends
            arguments = {**arguments, "environment": document}
        with anyio.move_on_after(tool.timeout) as scope:
            try:
                if inspect.iscoroutinefunction(function):
                    value = await function(**arguments)
                else:
                    bound = functools.partial(function, **arguments)
                    value = await anyio.to_thread.run_sync(bound, abandon_on_cancel=True)
            except Exception as exc:
                raise _Failed("raised", _described(exc)) from None
        if scope.cancelled_caught:
            raise _Failed("timeout", f"tool {tool.name!r} took longer than {tool.timeout:g}s")
        return _Ran(_as_result(value), document)


def _takes_environment(function: Any) -> bool:
    try:
        return "environment" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def _described(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _as_result(value: Any) -> str:
    """A tool's answer as the tool message's content: text as it is, else JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _Failed("tool_error", f"the tool's result is not JSON: {exc}") from None


def _bounded(text: str) -> str:
    """``text``, cut to :data:`MAX_RESULT_BYTES` with a note when it is longer."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_RESULT_BYTES:
        return text
    kept = data[:MAX_RESULT_BYTES].decode("utf-8", "ignore")
    whole = counted(len(data), "byte", grouped=True)
    return f"{kept}\n[result cut: {whole}, the first {MAX_RESULT_BYTES:,} shown]"


def _respond(tool: ToolDefinition, arguments: Mapping[str, Any]) -> str:
    """The declared answer whose ``match`` the arguments meet (else the default)."""
    responses = tool.responses or []
    response = next(
        (
            r
            for r in responses
            if all(k in arguments and same_json(arguments[k], v) for k, v in r.match.items())
        ),
        tool.default,
    )
    if response is None:
        raise _Failed("tool_error", f"{tool.name}: no declared answer matches these arguments")
    if response.error is not None:
        raise _Failed("tool_error", response.error)
    return _as_result(response.result)


def _filled(value: Any, arguments: Mapping[str, Any]) -> Any:
    """``value`` with placeholders filled: a string that is one ``{name}`` alone takes
    the argument as it is (a number stays a number), others take it as text."""
    if isinstance(value, str):
        alone = PLACEHOLDER.fullmatch(value)
        if alone is not None:
            return copy.deepcopy(arguments[alone.group(1)])
        return fill_placeholders(value, arguments)
    if isinstance(value, list):
        return [_filled(v, arguments) for v in value]
    if isinstance(value, dict):
        return {fill_placeholders(k, arguments): _filled(v, arguments) for k, v in value.items()}
    return value


def _operate(
    tool: ToolDefinition,
    operations: list[ToolOperation],
    arguments: Mapping[str, Any],
    document: dict[str, Any],
) -> _Ran:
    """Check every precondition, then run the operations on a copy of ``document``."""
    for operation in operations:
        for check in operation.preconditions:
            verdict = check_state(document, check, arguments)
            if not verdict.held:
                message = verdict.message
                if check.error is not None:
                    try:
                        message = fill_placeholders(check.error, arguments)
                    except KeyError:
                        message = check.error
                raise _Failed("precondition", message)
    writes = any(op.op != "get" for op in operations)
    working = copy.deepcopy(document) if writes else document
    read: Any = MISSING
    try:
        for operation in operations:
            path = fill_placeholders(operation.path, arguments)
            if operation.op == "get":
                read = resolve_path(working, path)
                if read is MISSING:
                    raise _Failed("tool_error", f"{tool.name}: nothing at {path}")
                read = copy.deepcopy(read)
            else:
                _write(working, operation, path, _filled(operation.value, arguments))
        if tool.result is not None or "result" in tool.model_fields_set:
            result = _as_result(_filled(tool.result, arguments))
        elif read is not MISSING:
            result = _as_result(read)
        else:
            result = _as_result({"ok": True})
    except KeyError as exc:
        needed = f"{tool.name}: needs argument {exc.args[0]!r}, which was not passed"
        raise _Failed("invalid_arguments", needed) from None
    return _Ran(result, working if writes else None)


def _write(document: dict[str, Any], operation: ToolOperation, path: str, value: Any) -> None:
    """Run a set, append or remove at ``path``; a missing place is a tool error."""
    if operation.op == "append":
        target = resolve_path(document, path)
        if not isinstance(target, list):
            found = "nothing" if target is MISSING else f"a {type(target).__name__}"
            raise _Failed("tool_error", f"cannot append to {path}: {found} is there, not a list")
        target.append(value)
        return
    parent_path, _, key = path.rpartition(".")
    parent = resolve_path(document, parent_path) if parent_path else document
    if isinstance(parent, dict):
        if operation.op == "set":
            parent[key] = value
        elif key in parent:
            del parent[key]
        else:
            raise _Failed("tool_error", f"cannot remove {path}: nothing is there")
        return
    if isinstance(parent, list) and re.fullmatch(r"-?\d+", key):
        index = int(key)
        if -len(parent) <= index < len(parent):
            if operation.op == "set":
                parent[index] = value
            else:
                del parent[index]
            return
    verb = "set" if operation.op == "set" else "remove"
    if parent is MISSING:
        raise _Failed("tool_error", f"cannot {verb} {path}: {parent_path} does not exist")
    kind = "item" if isinstance(parent, list) else "place"
    raise _Failed("tool_error", f"cannot {verb} {path}: {parent_path} has no {kind} {key!r}")
