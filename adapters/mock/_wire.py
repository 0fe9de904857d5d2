"""The OpenAI wire format as the mock server reads it: the JSON body, its generation
parameters, the chat messages and the prompt, checked; and the error bodies it answers
with when something is wrong.

Every check raises :class:`BadRequest` with the message the client gets back in a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web
from pydantic import ValidationError

from convsim._types import Message, ToolCall, ToolSpec

from .._openai_tools import arguments_text
from ._delay import format_number

__all__ = [
    "BadRequest",
    "error_body",
    "error",
    "bad_request",
    "read_json",
    "Params",
    "parse_params",
    "Turn",
    "chat_messages",
    "prompt_text",
    "ToolRequest",
    "tool_request",
    "Echo",
    "NO_ECHO",
    "MAX_LOGPROBS",
    "echo_options",
]


class BadRequest(Exception):
    """The request body is invalid; the message goes back in a 400."""


def error_body(message: str, type_: str, code: str | None = None) -> bytes:
    """An OpenAI error object as JSON bytes."""
    payload = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return json.dumps(payload).encode()


def error(status: int, message: str, type_: str, code: str | None = None) -> web.Response:
    """An OpenAI error response with ``status``."""
    return web.Response(
        status=status, body=error_body(message, type_, code), content_type="application/json"
    )


def bad_request(message: str) -> web.Response:
    """A 400 ``invalid_request_error`` saying ``message``."""
    return error(400, message, "invalid_request_error")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's body, a JSON object.

    Raises:
        BadRequest: the body is not JSON, or not an object.
    """
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Params:
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


def parse_params(
    body: dict[str, Any], default_model: str, *, legacy_max: bool = False, min_tokens: int = 1
) -> Params:
    """The generation settings of ``body``.

    Args:
        body: the request's JSON object.
        default_model: the model a body without ``model`` asks for.
        legacy_max: read ``max_tokens`` only (legacy completions), not also
            ``max_completion_tokens``.
        min_tokens: the least ``max_tokens`` may be.

    Raises:
        BadRequest: a parameter has the wrong type or is out of range.
    """
    model = body.get("model", default_model)
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    max_tokens = body.get("max_tokens")
    if not legacy_max and max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= min_tokens):
        raise BadRequest(f"'max_tokens' must be an integer >= {min_tokens}")
    for name, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None and not (_is_number(value) and 0 <= value <= high):
            raise BadRequest(f"'{name}' must be a number between 0 and {format_number(high)}")
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest("'n' must be 1: the mock server returns one choice")
    stop_value = body.get("stop")
    if stop_value is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_value, str):
        stop = (stop_value,) if stop_value else ()
    elif isinstance(stop_value, list) and all(isinstance(s, str) for s in stop_value):
        stop = tuple(s for s in stop_value if s)
    else:
        raise BadRequest("'stop' must be a string or a list of strings")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest("'seed' must be an integer")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object")
        if not stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise BadRequest("'stream_options.include_usage' must be a boolean")
    least = body.get("min_tokens")
    if least is not None and not (_is_int(least) and least >= 0):
        raise BadRequest("'min_tokens' must be an integer >= 0")
    if least is not None and max_tokens is not None and least > max_tokens:
        raise BadRequest("'min_tokens' must not be above 'max_tokens'")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("'ignore_eos' must be a boolean")
    return Params(model, max_tokens, stop, seed, stream, include_usage, least or 0, ignore_eos)


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
                raise BadRequest(f"messages[{index}].content: each part needs a 'type'")
            if part["type"] == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"messages[{index}].content: a text part needs 'text'")
                texts.append(text)
        return "\n".join(texts)
    raise BadRequest(f"messages[{index}].content must be a string or a list of parts")


class Turn(NamedTuple):
    """One message as the mock model reads it (hashable: answers are cached by them)."""

    role: str
    """``system``, ``user`` or ``assistant``; empty for a tool message, which only
    counts as prompt."""
    text: str


def chat_messages(body: dict[str, Any]) -> tuple[Turn, ...]:
    """The messages the model reads; tool messages count only as prompt.

    Raises:
        BadRequest: ``messages`` is missing, empty, or has a malformed message.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object")
        role = message.get("role")
        text = _content_text(message.get("content"), i)
        if role in _ROLES:
            turns.append(Turn(_ROLES[role], text))
        elif role in _OTHER_ROLES:
            turns.append(Turn("", text))
        else:
            raise BadRequest(
                f"messages[{i}].role must be one of system, developer, user, assistant, tool"
            )
    return tuple(turns)


class ToolRequest(NamedTuple):
    """What a chat request says of tools: what it offers, its choice, and the
    conversation as messages with their tool calls and results."""

    tools: tuple[ToolSpec, ...]
    choice: str | None
    """``auto``, ``required``, ``none``, a tool's name, or None (the default)."""
    messages: tuple[Message, ...]


def _tool_specs(body: dict[str, Any]) -> tuple[ToolSpec, ...]:
    tools = body["tools"]
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list")
    specs = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
        ):
            raise BadRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        try:
            specs.append(
                ToolSpec(
                    name=str(function.get("name") or ""),
                    description=function.get("description") or "",
                    parameters=function.get("parameters") or {"type": "object", "properties": {}},
                )
            )
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise BadRequest(f"tools[{i}].function.{where}: {problem['msg']}") from None
    return tuple(specs)


def _choice(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "required", "none"):
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise BadRequest(
            "'tool_choice' must be auto, required, none or "
            "{'type': 'function', 'function': {'name': ...}}"
        )
    return name


def _history(body: dict[str, Any]) -> tuple[Message, ...]:
    """The messages with their tool calls and results (checked by chat_messages)."""
    messages = []
    for i, message in enumerate(body["messages"]):
        role = _ROLES.get(message["role"], "tool")
        text = _content_text(message.get("content"), i)
        if role == "tool":
            call_id = message.get("tool_call_id")
            messages.append(Message(role="tool", content=text, tool_call_id=str(call_id or "")))
            continue
        entries = message.get("tool_calls") or []
        if not isinstance(entries, list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list")
        calls = []
        for j, entry in enumerate(entries):
            function = entry.get("function") if isinstance(entry, dict) else None
            if not isinstance(function, dict) or not function.get("name"):
                raise BadRequest(f"messages[{i}].tool_calls[{j}] needs function.name")
            name = str(function["name"])
            try:
                arguments = arguments_text(function.get("arguments"))
            except TypeError as exc:
                raise BadRequest(f"messages[{i}].tool_calls[{j}]: {exc}") from None
            calls.append(ToolCall(id=str(entry.get("id") or ""), name=name, arguments=arguments))
        messages.append(Message(role=role, content=text, tool_calls=tuple(calls)))  # type: ignore[arg-type]
    return tuple(messages)


def tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The tools of a chat request (its messages checked by :func:`chat_messages`
    first); None when it offers none.

    Raises:
        BadRequest: ``tools``, ``tool_choice`` or a tool call is malformed.
    """
    if not body.get("tools"):
        return None
    return ToolRequest(_tool_specs(body), _choice(body), _history(body))


def prompt_text(body: dict[str, Any]) -> str:
    """The ``prompt`` of a legacy completion (a string, or a list of one string).

    Raises:
        BadRequest: the prompt is missing or of another shape.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string (or a list of one string)")
    return prompt


@dataclass(frozen=True, slots=True)
class Echo:
    """What a legacy completions request asks beyond the answer: the prompt echoed in
    front of it, and logprobs of its tokens."""

    echo: bool
    logprobs: int | None
    """How many top alternatives to list per token (None: no logprobs)."""


NO_ECHO = Echo(False, None)
"""A plain request: the answer alone, no logprobs."""
MAX_LOGPROBS = 5
"""The most top alternatives a request may ask for (as OpenAI's legacy API)."""


def echo_options(body: dict[str, Any]) -> Echo:
    """The ``echo`` and ``logprobs`` of a legacy completion (:data:`NO_ECHO` when
    neither is asked).

    Raises:
        BadRequest: either has the wrong type, or the request also streams.
    """
    echo = body.get("echo", False)
    if echo is None:
        echo = False
    if not isinstance(echo, bool):
        raise BadRequest("'echo' must be a boolean")
    logprobs = body.get("logprobs")
    if logprobs is not None and not (_is_int(logprobs) and 0 <= logprobs <= MAX_LOGPROBS):
        raise BadRequest(f"'logprobs' must be an integer between 0 and {MAX_LOGPROBS}")
    if (echo or logprobs is not None) and body.get("stream"):
        raise BadRequest("the mock server does not stream 'echo' or 'logprobs' answers")
    return Echo(echo, logprobs) if echo or logprobs is not None else NO_ECHO
