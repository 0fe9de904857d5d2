"""The mock model's answer on the wire: the JSON bodies of chat, legacy and
``/generate`` completions, and the server-sent events of a streamed answer.

The hot path is string templates around JSON fragments encoded once (the model id, the
usage, each streamed word), not ``json.dumps`` of whole objects.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import NamedTuple

from convsim._types import ToolCall

from ._faults import HALF_EMOJI, OTHER_HALF, FaultKind
from ._tokens import mock_logprobs
from ._wire import Echo, error_body

__all__ = [
    "Reply",
    "usage_json",
    "reasoning_words",
    "argument_pieces",
    "TOOL_PIECES",
    "chat_body",
    "completion_body",
    "generate_body",
    "echo_body",
    "stream_events",
    "DONE",
]

DONE = "data: [DONE]\n\n"
"""The event that ends a stream."""


class Reply(NamedTuple):
    """An answer ready to encode: its words and the JSON fragments sent with them."""

    words: tuple[str, ...]
    finish_reason: str
    usage: str
    """The usage object, as JSON text."""
    model: str
    """The model id, as a JSON string."""
    reasoning: tuple[str, ...] = ()
    """Reasoning words sent before the answer (chat only), as ``reasoning_content``."""
    tool_call: ToolCall | None = None
    """A tool the answer calls (chat only; ``words`` are then empty)."""


TOOL_PIECES = 3
"""How many stream events a tool call's arguments are split over (at most)."""


def argument_pieces(arguments: str) -> tuple[str, ...]:
    """A call's arguments in up to :data:`TOOL_PIECES` pieces, as servers stream them."""
    size = max(1, -(-len(arguments) // TOOL_PIECES))
    return tuple(arguments[i : i + size] for i in range(0, len(arguments), size))


def _tool_calls_json(call: ToolCall) -> str:
    entry = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    return json.dumps([entry])


def reasoning_words(count: int) -> tuple[str, ...]:
    """``count`` words of a reasoning model's thoughts (one token each)."""
    return tuple("Thinking" if i == 0 else "step" for i in range(count))


def usage_json(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int = 0,
    cached_tokens: int | None = None,
) -> str:
    """The usage object of an answer, as JSON text; ``completion_tokens`` include the
    ``reasoning_tokens``, reported apart in ``completion_tokens_details`` as OpenAI's
    API and vLLM do; ``cached_tokens`` (None: not reported) of the prompt tokens in
    ``prompt_tokens_details``."""
    details = (
        f',"completion_tokens_details":{{"reasoning_tokens":{reasoning_tokens}}}'
        if reasoning_tokens
        else ""
    )
    if cached_tokens is not None:
        details += f',"prompt_tokens_details":{{"cached_tokens":{cached_tokens}}}'
    return (
        f'{{"prompt_tokens":{prompt_tokens},"completion_tokens":{completion_tokens},'
        f'"total_tokens":{prompt_tokens + completion_tokens}{details}}}'
    )


def chat_body(reply: Reply, number: int, created: int) -> bytes:
    """A ``chat.completion`` (``number`` makes its id)."""
    text = json.dumps(" ".join(reply.words))
    if reply.tool_call is not None:
        text = 'null,"tool_calls":' + _tool_calls_json(reply.tool_call)
    if reply.reasoning:
        text += ',"reasoning_content":' + json.dumps(" ".join(reply.reasoning))
    return (
        f'{{"id":"chatcmpl-mock{number:x}","object":"chat.completion",'
        f'"created":{created},"model":{reply.model},"choices":[{{"index":0,'
        f'"message":{{"role":"assistant","content":{text}}},"logprobs":null,'
        f'"finish_reason":"{reply.finish_reason}"}}],"usage":{reply.usage}}}'
    ).encode()


def completion_body(reply: Reply, number: int, created: int) -> bytes:
    """A legacy ``text_completion`` (``number`` makes its id)."""
    text = json.dumps(" ".join(reply.words))
    return (
        f'{{"id":"cmpl-mock{number:x}","object":"text_completion",'
        f'"created":{created},"model":{reply.model},"choices":[{{"index":0,'
        f'"text":{text},"logprobs":null,"finish_reason":"{reply.finish_reason}"}}],'
        f'"usage":{reply.usage}}}'
    ).encode()


def generate_body(reply: Reply) -> bytes:
    """The answer of the developer guide's ``/generate`` backend."""
    text = json.dumps(" ".join(reply.words))
    return (
        f'{{"choices":[{{"index":0,"text":{text},"finish_reason":"{reply.finish_reason}"}}],'
        f'"usage":{reply.usage},"model":{reply.model}}}'
    ).encode()


def echo_body(
    reply: Reply, number: int, created: int, prompt: str, options: Echo, seed: int
) -> bytes:
    """A legacy completion with the prompt echoed and/or logprobs (off the hot path)."""
    completion = " ".join(reply.words)
    logprobs = (
        None
        if options.logprobs is None
        else mock_logprobs(prompt, completion, echo=options.echo, top=options.logprobs, seed=seed)
    )
    choice = {
        "index": 0,
        "text": prompt + completion if options.echo else completion,
        "logprobs": logprobs,
        "finish_reason": reply.finish_reason,
    }
    body = {
        "id": f"cmpl-mock{number:x}",
        "object": "text_completion",
        "created": created,
        "model": json.loads(reply.model),
        "choices": [choice],
        "usage": json.loads(reply.usage),
    }
    return json.dumps(body).encode()


@lru_cache(maxsize=2048)
def _json_pieces(words: tuple[str, ...]) -> tuple[str, ...]:
    """One streamed piece per word as a JSON string; each but the first has its leading
    space. Cached: encoding every word dominated the cost of a streamed answer."""
    return tuple(json.dumps(w if i == 0 else " " + w) for i, w in enumerate(words))


def _tool_events(call: ToolCall, head: str, after: str) -> list[str]:
    """A tool call as OpenAI streams it: id, type and name with empty arguments, then
    the arguments in pieces, each under the call's index."""
    opening = {
        "index": 0,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    events = [head + '"delta":{"tool_calls":' + json.dumps([opening]) + after]
    for piece in argument_pieces(call.arguments):
        entry = {"index": 0, "function": {"arguments": piece}}
        events.append(head + '"delta":{"tool_calls":' + json.dumps([entry]) + after)
    return events


def stream_events(
    reply: Reply,
    *,
    chat: bool,
    number: int,
    created: int,
    include_usage: bool,
    fault: FaultKind | None,
) -> list[str]:
    """The answer as server-sent events, one per word, sent with a delay between them.

    The role event (chat) goes with the first word, the finish event (then the usage
    event when asked, and ``[DONE]``) with the last. A stream fault (``truncated_sse``,
    ``stream_drop``, ``stream_error``, ``malformed``, ``split_surrogate``) changes the
    events as :data:`~convsim.adapters.mock.FaultKind` says; dropping the connection is
    left to the server.
    """
    kind = "chat.completion.chunk" if chat else "text_completion"
    cid = f"{'chatcmpl' if chat else 'cmpl'}-mock{number:x}"
    model, finish = reply.model, reply.finish_reason
    head = (
        f'data: {{"id":"{cid}","object":"{kind}","created":{created},"model":{model},'
        '"choices":[{"index":0,'
    )
    more = ',"usage":null}' if include_usage else "}"
    pieces = _json_pieces(reply.words)
    if fault == "split_surrogate":  # an emoji after the first word, its halves apart
        halves = (json.dumps(" " + HALF_EMOJI), json.dumps(OTHER_HALF))
        pieces = (*pieces[:1], *halves, *pieces[1:])
    if chat:
        role = f'{head}"delta":{{"role":"assistant"}},"logprobs":null,"finish_reason":null}}]'
        before = head + '"delta":{"content":'
        after = '},"logprobs":null,"finish_reason":null}]' + more + "\n\n"
        events = [before + p + after for p in pieces]
        if reply.tool_call is not None:
            events = _tool_events(reply.tool_call, head, after)
        if reply.reasoning:  # a reasoning model's thoughts come first, one event a word
            thinking = head + '"delta":{"reasoning_content":'
            thoughts = [thinking + p + after for p in _json_pieces(reply.reasoning)]
            events = [*thoughts, *events]
        end = f'{head}"delta":{{}},"logprobs":null,"finish_reason":"{finish}"}}]{more}\n\n'
    else:
        role = ""
        before = head + '"text":'
        after = ',"logprobs":null,"finish_reason":null}]' + more + "\n\n"
        events = [before + p + after for p in pieces]
        end = f'{head}"text":"","logprobs":null,"finish_reason":"{finish}"}}]{more}\n\n'
    if fault in ("truncated_sse", "stream_drop"):
        events = events[:2]  # a couple of words, then the stream ends: no finish, no [DONE]
    elif fault == "stream_error":
        error = error_body(
            "The server had an error while streaming the answer (injected fault).",
            "server_error",
        )
        events = [*events[:2], f"data: {error.decode()}\n\n"]
    elif fault == "malformed":
        events = [f'{head}"delta":{{"content":"oops"}},"finish_reas\n\n{DONE}']
    else:
        if include_usage:
            end += (
                f'data: {{"id":"{cid}","object":"{kind}","created":{created},'
                f'"model":{model},"choices":[],"usage":{reply.usage}}}\n\n'
            )
        # The finish event follows the last word at once.
        if events:
            events[-1] += end + DONE
        else:
            events = [end + DONE]
    if role:
        role += more + "\n\n"
        events = [role + events[0], *events[1:]] if events else [role]
    return events
