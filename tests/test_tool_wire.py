"""Tools on the wire: what each adapter sends for tools, tool calls and tool results,
and the tool calls it reads back from recorded real-API shapes (OpenAI, vLLM,
Anthropic), streamed (split at every byte) and not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest

from convsim import MalformedResponse, MissingExtra
from convsim._types import Completion, GenerationParams, Message, ToolCall, ToolSpec
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._cache import ResponseCache, cache_key
from convsim.adapters._custom_http import CustomHttpAdapter
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._scripted import ScriptedAdapter
from convsim.adapters._tool_policy import named_tools, tool_arguments
from convsim.adapters._tool_stream import ToolCallJoiner, ToolCallPiece
from convsim.adapters.mock import MockModelServer

pytestmark = pytest.mark.anyio

ASK = [Message(role="user", content="Look up order A-1001 please")]

ORDER_TOOL = ToolSpec(
    name="look_up_order",
    description="Find an order by its id",
    parameters={
        "type": "object",
        "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]-\\d{4}$"}},
        "required": ["order_id"],
    },
)
CANCEL_TOOL = ToolSpec(
    name="cancel_order",
    description="Cancel an order",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)
TOOLS = GenerationParams(tools=(ORDER_TOOL, CANCEL_TOOL))


class _Bytes(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


class _Server:
    """A recorded answer, sent whole or a byte at a time; keeps the request bodies."""

    def __init__(self, body: bytes, *, stream: bool, split: bool = False) -> None:
        self.body, self.stream, self.split = body, stream, split
        self.requests: list[dict[str, Any]] = []

    def transport(self) -> HttpxTransport:
        def respond(request: httpx.Request) -> httpx.Response:
            self.requests.append(json.loads(request.content))
            kind = "text/event-stream" if self.stream else "application/json"
            body = self.body
            pieces = [body[i : i + 1] for i in range(len(body))] if self.split else [body]
            return httpx.Response(200, headers={"content-type": kind}, stream=_Bytes(pieces))

        return HttpxTransport(transport=httpx.MockTransport(respond))


def _sse(*payloads: Mapping[str, Any]) -> bytes:
    return "".join([*(f"data: {json.dumps(p)}\n\n" for p in payloads), "data: [DONE]\n\n"]).encode()


def _named(*items: Mapping[str, Any]) -> bytes:
    return "".join(f"event: {i['type']}\ndata: {json.dumps(i)}\n\n" for i in items).encode()


async def _openai(
    server: _Server,
    messages: list[Message] = ASK,
    params: GenerationParams = TOOLS,
) -> Completion:
    adapter = OpenAICompatibleAdapter(
        # no retries: a malformed answer fails at once
        {"model": "m", "base_url": "http://llm.test/v1", "stream": server.stream, "max_retries": 0},
        transport=server.transport(),
        env={},
    )
    try:
        return await adapter.generate(messages, params)
    finally:
        await adapter.aclose()


async def _anthropic(
    server: _Server,
    messages: list[Message] = ASK,
    params: GenerationParams = TOOLS,
) -> Completion:
    adapter = AnthropicAdapter(
        {"model": "claude", "api_key": "k", "stream": server.stream},
        transport=server.transport(),
        env={},
    )
    try:
        return await adapter.generate(messages, params)
    finally:
        await adapter.aclose()


# -- OpenAI: recorded shapes (platform.openai.com/docs/guides/function-calling) ------

_OPENAI_ANSWER = {
    "id": "chatcmpl-abc123",
    "object": "chat.completion",
    "created": 1699896916,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_abc123",
                        "type": "function",
                        "function": {
                            "name": "look_up_order",
                            "arguments": '{\n"order_id": "A-1001"\n}',
                        },
                    },
                    {
                        "id": "call_def456",
                        "type": "function",
                        "function": {"name": "cancel_order", "arguments": '{"order_id":"A-1001"}'},
                    },
                ],
                "refusal": None,
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99},
}

EXPECTED = (
    ToolCall(id="call_abc123", name="look_up_order", arguments='{\n"order_id": "A-1001"\n}'),
    ToolCall(id="call_def456", name="cancel_order", arguments='{"order_id":"A-1001"}'),
)


def _chunk(delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-9lvQqJzr",
        "object": "chat.completion.chunk",
        "created": 1721210000,
        "model": "gpt-4o-2024-05-13",
        "system_fingerprint": "fp_c4e5b6fa31",
        "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}],
    }


def _call_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


def _openai_stream() -> bytes:
    """OpenAI's streamed parallel calls: id, type and name with empty arguments first,
    then the arguments in pieces, each under its call's index."""
    first, second = EXPECTED
    pieces = ['{\n"', "order", '_id": "', "A-1001", '"\n}']
    return _sse(
        _chunk(
            {
                "role": "assistant",
                "content": None,
                **_call_delta(
                    0,
                    id=first.id,
                    type="function",
                    function={"name": first.name, "arguments": ""},
                ),
                "refusal": None,
            }
        ),
        *(_chunk(_call_delta(0, function={"arguments": p})) for p in pieces),
        _chunk(_call_delta(1, id=second.id, type="function", function={"name": second.name})),
        _chunk(_call_delta(1, function={"arguments": '{"order_id":'})),
        _chunk(_call_delta(1, function={"arguments": None})),
        _chunk(_call_delta(1, function={"arguments": '"A-1001"}'})),
        _chunk({}, finish="tool_calls"),
    )


def _vllm_stream(*, repeat_id: bool) -> bytes:
    """vLLM (hermes/llama3_json parsers): each call whole in one delta, ``index``
    present; some builds repeat the id on a later delta of the same call."""
    first, second = EXPECTED
    deltas = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk(
            _call_delta(
                0,
                id=first.id,
                type="function",
                function={"name": first.name, "arguments": first.arguments},
            )
        ),
        _chunk(
            _call_delta(
                1,
                id=second.id,
                type="function",
                function={"name": second.name, "arguments": second.arguments},
            )
        ),
    ]
    if repeat_id:
        deltas.append(_chunk(_call_delta(1, id=second.id, function={"arguments": ""})))
    usage = {"prompt_tokens": 82, "completion_tokens": 30, "total_tokens": 112}
    return _sse(
        *deltas,
        _chunk({"content": ""}, finish="tool_calls"),
        {**_chunk({}), "choices": [], "usage": usage},
    )


async def test_openai_answer_with_tool_calls_and_no_text() -> None:
    completion = await _openai(_Server(json.dumps(_OPENAI_ANSWER).encode(), stream=False))
    assert completion.tool_calls == EXPECTED
    assert completion.text == ""
    assert completion.finish_reason == "tool_calls"
    assert completion.usage.completion_tokens == 17


@pytest.mark.parametrize(
    "body",
    [_openai_stream(), _vllm_stream(repeat_id=False), _vllm_stream(repeat_id=True)],
    ids=["openai", "vllm-whole-call", "vllm-repeated-id"],
)
@pytest.mark.parametrize("split", [False, True], ids=["whole", "every-byte"])
async def test_streamed_tool_call_deltas_are_joined_by_index(body: bytes, split: bool) -> None:
    completion = await _openai(_Server(body, stream=True, split=split))
    assert completion.tool_calls == EXPECTED
    assert completion.text == ""
    assert completion.finish_reason == "tool_calls"
    # a call is output: the first piece of one is the first output token
    assert completion.timings.ttfot_s is not None


async def test_streamed_tool_calls_without_usage_count_their_arguments() -> None:
    """With no usage sent, the estimate counts the calls' pieces as output tokens."""
    completion = await _openai(_Server(_openai_stream(), stream=True))
    assert completion.usage.source == "estimate"
    assert completion.usage.completion_tokens >= 8  # the calls' pieces, not 0


async def test_non_streamed_usage_estimate_counts_tool_calls() -> None:
    answer = {**_OPENAI_ANSWER, "usage": None}
    completion = await _openai(_Server(json.dumps(answer).encode(), stream=False))
    assert completion.usage.source == "estimate"
    assert completion.usage.completion_tokens >= 10


async def test_malformed_arguments_are_kept_as_sent() -> None:
    broken = '{"order_id": "A-10'
    answer = json.loads(json.dumps(_OPENAI_ANSWER))
    answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = broken
    completion = await _openai(_Server(json.dumps(answer).encode(), stream=False))
    assert completion.tool_calls[0].arguments == broken
    with pytest.raises(ValueError, match="not valid JSON"):
        completion.tool_calls[0].parsed_arguments()
    streamed = _sse(
        _chunk(_call_delta(0, id="c1", function={"name": "look_up_order", "arguments": broken})),
        _chunk({}, finish="tool_calls"),
    )
    completion = await _openai(_Server(streamed, stream=True, split=True))
    assert completion.tool_calls == (ToolCall(id="c1", name="look_up_order", arguments=broken),)


async def test_a_streamed_call_without_a_name_is_a_malformed_response() -> None:
    body = _sse(_chunk(_call_delta(0, id="c1", function={"arguments": "{}"})), _chunk({}, "stop"))
    with pytest.raises(MalformedResponse, match="no name"):
        await _openai(_Server(body, stream=True))


async def test_a_tool_call_of_the_wrong_shape_is_a_malformed_response() -> None:
    answer = json.loads(json.dumps(_OPENAI_ANSWER))
    answer["choices"][0]["message"]["tool_calls"] = [{"id": "c", "function": {"name": 3}}]
    with pytest.raises(MalformedResponse, match="no function name"):
        await _openai(_Server(json.dumps(answer).encode(), stream=False))


def test_joiner_places_pieces_without_an_index_by_id() -> None:
    joiner = ToolCallJoiner()
    for piece in (
        ToolCallPiece(None, id="a", name="one", arguments="{"),
        ToolCallPiece(None, arguments="}"),
        ToolCallPiece(None, id="b", name="two", arguments="[]"),
        ToolCallPiece(None, id="a", arguments=""),
    ):
        joiner.feed(piece)
    assert joiner.calls() == (
        ToolCall(id="a", name="one", arguments="{}"),
        ToolCall(id="b", name="two", arguments="[]"),
    )
    with pytest.raises(TypeError, match="index"):
        joiner.feed(ToolCallPiece("0", name="x"))  # type: ignore[arg-type]


# -- what OpenAI-compatible requests carry ----------------------------------------

HISTORY = [
    Message(role="system", content="You run the order desk."),
    Message(role="user", content="Look up order A-1001 and cancel it"),
    Message(
        role="assistant",
        content="",
        tool_calls=EXPECTED,
        reasoning="the user wants both: look up, then cancel",
    ),
    Message(role="tool", content='{"status": "open"}', tool_call_id="call_abc123", name="x"),
    Message(role="tool", content='{"cancelled": true}', tool_call_id="call_def456", name="y"),
]


async def test_openai_request_carries_tools_calls_and_results() -> None:
    server = _Server(json.dumps(_OPENAI_ANSWER).encode(), stream=False)
    params = TOOLS.model_copy(update={"tool_choice": "required", "parallel_tool_calls": False})
    await _openai(server, HISTORY, params)
    body = server.requests[0]
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "look_up_order",
            "description": "Find an order by its id",
            "parameters": ORDER_TOOL.parameters,
        },
    }
    assert body["tool_choice"] == "required"
    assert body["parallel_tool_calls"] is False
    assert body["messages"][2] == {
        "role": "assistant",
        "content": "",  # llama-cpp-python's server refuses null
        "tool_calls": [
            {
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "look_up_order", "arguments": EXPECTED[0].arguments},
            },
            {
                "id": "call_def456",
                "type": "function",
                "function": {"name": "cancel_order", "arguments": EXPECTED[1].arguments},
            },
        ],
    }
    assert body["messages"][3:] == [
        {"role": "tool", "tool_call_id": "call_abc123", "content": '{"status": "open"}'},
        {"role": "tool", "tool_call_id": "call_def456", "content": '{"cancelled": true}'},
    ]
    assert "reasoning" not in json.dumps(body)  # never sent back
    assert body["messages"][0] == {"role": "system", "content": "You run the order desk."}


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("cancel_order", {"type": "function", "function": {"name": "cancel_order"}}),
    ],
)
async def test_openai_tool_choice(choice: str, sent: Any) -> None:
    server = _Server(json.dumps(_OPENAI_ANSWER).encode(), stream=False)
    await _openai(server, ASK, TOOLS.model_copy(update={"tool_choice": choice}))
    assert server.requests[0]["tool_choice"] == sent


async def test_no_tool_fields_without_tools() -> None:
    server = _Server(json.dumps(_OPENAI_ANSWER).encode(), stream=False)
    await _openai(server, ASK, GenerationParams(tool_choice="auto", parallel_tool_calls=True))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(server.requests[0])


# -- Anthropic: recorded shapes (docs.anthropic.com, tool use) -------------------------

_ANTHROPIC_ANSWER = {
    "id": "msg_01Aq9w938a90dw8q",
    "type": "message",
    "model": "claude-3-5-sonnet-20241022",
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "role": "assistant",
    "content": [
        {"type": "text", "text": "I'll look that order up."},
        {
            "type": "tool_use",
            "id": "toolu_01A09q90qw90lq917835lq9",
            "name": "look_up_order",
            "input": {"order_id": "A-1001"},
        },
    ],
    "usage": {"input_tokens": 472, "output_tokens": 89},
}

ANTHROPIC_CALL = ToolCall(
    id="toolu_01A09q90qw90lq917835lq9", name="look_up_order", arguments='{"order_id": "A-1001"}'
)


def _anthropic_stream() -> bytes:
    pieces = ["", '{"order_id', '": "A-', '1001"}']
    return _named(
        {
            "type": "message_start",
            "message": {
                "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
                "type": "message",
                "role": "assistant",
                "model": "claude-3-haiku-20240307",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 472, "output_tokens": 2},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "I'll look that order up."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {
                "type": "tool_use",
                "id": ANTHROPIC_CALL.id,
                "name": ANTHROPIC_CALL.name,
                "input": {},
            },
        },
        *(
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 89},
        },
        {"type": "message_stop"},
    )


async def test_anthropic_tool_use_block_is_read() -> None:
    completion = await _anthropic(_Server(json.dumps(_ANTHROPIC_ANSWER).encode(), stream=False))
    assert completion.tool_calls == (ANTHROPIC_CALL,)
    assert completion.text == "I'll look that order up."
    assert completion.finish_reason == "tool_use"


@pytest.mark.parametrize("split", [False, True], ids=["whole", "every-byte"])
async def test_anthropic_streamed_input_json_delta_is_joined(split: bool) -> None:
    completion = await _anthropic(_Server(_anthropic_stream(), stream=True, split=split))
    assert completion.tool_calls == (ANTHROPIC_CALL,)
    assert completion.text == "I'll look that order up."
    assert completion.finish_reason == "tool_use"
    assert completion.usage.completion_tokens == 89


async def test_anthropic_request_merges_tool_results_into_one_user_message() -> None:
    server = _Server(json.dumps(_ANTHROPIC_ANSWER).encode(), stream=False)
    broken = ToolCall(id="call_x", name="cancel_order", arguments="{not json")
    history = [
        *HISTORY[:2],
        Message(role="assistant", content="Checking.", tool_calls=(EXPECTED[0], broken)),
        Message(role="tool", content='{"status": "open"}', tool_call_id="call_abc123"),
        Message(role="tool", content="invalid arguments", tool_call_id="call_x"),
        Message(role="user", content="Thanks"),
    ]
    await _anthropic(server, history, TOOLS)
    body = server.requests[0]
    assert body["system"] == "You run the order desk."
    assert body["tools"][0] == {
        "name": "look_up_order",
        "description": "Find an order by its id",
        "input_schema": ORDER_TOOL.parameters,
    }
    assert "tool_choice" not in body
    assert body["messages"] == [
        {"role": "user", "content": "Look up order A-1001 and cancel it"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "call_abc123",
                    "name": "look_up_order",
                    "input": {"order_id": "A-1001"},
                },
                # arguments that are not an object cannot be an input
                {"type": "tool_use", "id": "call_x", "name": "cancel_order", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_abc123",
                    "content": '{"status": "open"}',
                },
                {"type": "tool_result", "tool_use_id": "call_x", "content": "invalid arguments"},
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]


async def test_anthropic_request_without_tools_is_unchanged() -> None:
    server = _Server(json.dumps(_ANTHROPIC_ANSWER).encode(), stream=False)
    history = [
        Message(role="user", content="a"),
        Message(role="user", content="b"),
        Message(role="assistant", content=" "),
    ]
    await _anthropic(server, history, GenerationParams())
    assert server.requests[0]["messages"] == [
        {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "(no reply)"},
    ]
    assert "tools" not in server.requests[0]


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("auto", None, {"type": "auto"}),
        ("required", None, {"type": "any"}),
        ("none", None, {"type": "none"}),
        ("cancel_order", None, {"type": "tool", "name": "cancel_order"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
    ],
)
async def test_anthropic_tool_choice(choice: str | None, parallel: bool | None, sent: Any) -> None:
    server = _Server(json.dumps(_ANTHROPIC_ANSWER).encode(), stream=False)
    params = TOOLS.model_copy(update={"tool_choice": choice, "parallel_tool_calls": parallel})
    await _anthropic(server, ASK, params)
    assert server.requests[0]["tool_choice"] == sent


# -- the response cache ----------------------------------------------------------------

IDENTITY = {"model_type": "openai-compatible", "model": "m"}


def test_cache_keys_differ_with_tools_and_tool_choice() -> None:
    plain = cache_key(IDENTITY, ASK, GenerationParams())
    offered = cache_key(IDENTITY, ASK, TOOLS)
    required = cache_key(IDENTITY, ASK, TOOLS.model_copy(update={"tool_choice": "required"}))
    fewer = cache_key(IDENTITY, ASK, GenerationParams(tools=(ORDER_TOOL,)))
    assert len({plain, offered, required, fewer}) == 4


def test_cache_keys_differ_with_tool_calls_and_results() -> None:
    call = Message(role="assistant", content="", tool_calls=EXPECTED[:1])
    other = Message(
        role="assistant",
        content="",
        tool_calls=(ToolCall(id="call_abc123", name="look_up_order", arguments="{}"),),
    )
    result = Message(role="tool", content="{}", tool_call_id="call_abc123")
    to_other = Message(role="tool", content="{}", tool_call_id="call_zzz")
    keys = {
        cache_key(IDENTITY, [*ASK, call, result], TOOLS),
        cache_key(IDENTITY, [*ASK, other, result], TOOLS),
        cache_key(IDENTITY, [*ASK, call, to_other], TOOLS),
    }
    assert len(keys) == 3
    # what a model never sees (its reasoning) does not change a key
    thought = Message(role="assistant", content="", tool_calls=EXPECTED[:1], reasoning="hmm")
    assert cache_key(IDENTITY, [*ASK, thought, result], TOOLS) in keys


def test_cached_tool_calls_come_back(tmp_path: Any) -> None:
    cache = ResponseCache(tmp_path)
    try:
        cache.store("k", Completion(text="", finish_reason="tool_calls", tool_calls=EXPECTED))
        hit = cache.lookup("k")
    finally:
        cache.close()
    assert hit is not None and hit.tool_calls == EXPECTED


# -- the naming policy and the scripted model -------------------------------------------

DESK = (
    ToolSpec(
        name="look_up_order",
        parameters={
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]-\\d{4}$"}},
            "required": ["order_id"],
        },
    ),
    ToolSpec(
        name="cancel_order",
        parameters={
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "pattern": "^[A-Z]-\\d{4}$"},
                "reason": {"type": "string", "enum": ["damaged", "late", "changed_mind"]},
                "quantity": {"type": "integer"},
                "refund": {"type": "boolean"},
                "amount": {"type": "number"},
            },
            "required": ["order_id", "reason"],
        },
    ),
    ToolSpec(name="refund-payment", parameters={"type": "object", "properties": {}}),
)


def test_tools_are_named_by_every_word_in_order_of_first_word() -> None:
    names = [t.name for t in named_tools("Please CANCEL my order; look up nothing", DESK)]
    assert names == ["cancel_order", "look_up_order"]
    assert named_tools("Can you look up my order?", DESK)[0].name == "look_up_order"
    # a whole word each: "ordered" and "looking" name nothing, "payment" alone neither
    assert named_tools("I ordered it while looking; refund payment", DESK) == [DESK[2]]
    assert named_tools("the order is late", DESK) == []


def test_arguments_are_taken_from_the_message() -> None:
    cancel = DESK[1]
    assert tool_arguments("Cancel order B-2002, it came late.", cancel) == {
        "order_id": "B-2002",
        "reason": "late",
    }
    said = 'cancel order_id=A-1001 reason: "changed_mind" quantity=3, refund=yes amount: 2.5!'
    assert tool_arguments(said, cancel) == {
        "order_id": "A-1001",
        "reason": "changed_mind",
        "quantity": 3,
        "refund": True,
        "amount": 2.5,
    }
    # a value not of the property's type is left as written (the schema check says so)
    assert tool_arguments("quantity=many amount=7", cancel) == {"quantity": "many", "amount": 7}


def _round(messages: list[Message], completion: Completion, result: str) -> None:
    messages.append(
        Message(role="assistant", content=completion.text, tool_calls=completion.tool_calls)
    )
    for call in completion.tool_calls:
        messages.append(Message(role="tool", content=result, tool_call_id=call.id, name=call.name))


async def test_scripted_model_looks_up_then_cancels_then_answers() -> None:
    model = ScriptedAdapter()
    params = GenerationParams(tools=DESK)
    messages = [
        Message(role="user", content="Hello"),
        Message(role="assistant", content="Hi, how can I help?"),
        Message(role="user", content="Look up order A-1001 and cancel it, it is damaged."),
    ]
    first = await model.generate(messages, params)
    assert first.finish_reason == "tool_calls" and first.text == ""
    assert first.tool_calls == (
        ToolCall(id="call_1_0", name="look_up_order", arguments='{"order_id": "A-1001"}'),
    )
    _round(messages, first, '{"status": "open"}')
    second = await model.generate(messages, params)
    assert second.tool_calls == (
        ToolCall(
            id="call_1_1",
            name="cancel_order",
            arguments='{"order_id": "A-1001", "reason": "damaged"}',
        ),
    )
    _round(messages, second, '{"status": "cancelled"}')
    third = await model.generate(messages, params)
    assert third.tool_calls == () and third.finish_reason == "stop"
    assert third.text == 'look_up_order: {"status": "open"}\ncancel_order: {"status": "cancelled"}'
    assert third.usage.prompt_tokens > first.usage.prompt_tokens
    # with a reference answer for the turn, the final answer is the reference
    done = await model.generate(messages, params.model_copy(update={"reference": "Cancelled."}))
    assert done.text == "Cancelled."


async def test_scripted_model_tool_choice() -> None:
    model = ScriptedAdapter()
    ask = [Message(role="user", content="What can you do?")]
    auto = await model.generate(ask, GenerationParams(tools=DESK))
    assert auto.tool_calls == ()
    required = await model.generate(ask, GenerationParams(tools=DESK, tool_choice="required"))
    assert [c.name for c in required.tool_calls] == ["look_up_order"]
    assert required.tool_calls[0].arguments == "{}"  # nothing to take: schema check fails
    forced = GenerationParams(tools=DESK, tool_choice="refund-payment")
    named = [Message(role="user", content="look up order A-1001")]
    call = await model.generate(named, forced)
    assert [c.name for c in call.tool_calls] == ["refund-payment"]
    _round(named, call, "ok")
    after = await model.generate(named, forced)
    assert after.tool_calls == () and after.text == "refund-payment: ok"  # called once
    none = GenerationParams(tools=DESK, tool_choice="none")
    assert (await model.generate(named[:1], none)).tool_calls == ()
    # no tools offered: the model answers as it always did
    plain = await model.generate(named[:1], GenerationParams())
    assert plain.tool_calls == () and plain.text


# -- the mock server --------------------------------------------------------------------


async def _desk_rounds(
    base_url: str, *, stream: bool, rounds: int = 3
) -> tuple[list[Completion], list[Message]]:
    """Up to ``rounds`` model calls of one turn against the mock, each call's tools
    answered with a fixed result."""
    adapter = OpenAICompatibleAdapter(
        {"model": "mock-model", "base_url": base_url, "stream": stream, "max_retries": 0},
        env={},
    )
    messages = [Message(role="user", content="Look up order A-1001 and cancel it, it is late.")]
    completions = []
    try:
        for _ in range(rounds):
            completion = await adapter.generate(messages, GenerationParams(tools=DESK))
            completions.append(completion)
            if not completion.tool_calls:
                break
            _round(messages, completion, '{"ok": true}')
    finally:
        await adapter.aclose()
    return completions, messages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
async def test_mock_server_follows_the_policy(stream: bool) -> None:
    async with MockModelServer() as server:
        completions, messages = await _desk_rounds(server.base_url, stream=stream)
    expected = [
        await ScriptedAdapter().generate(messages[: i * 2 + 1], GenerationParams(tools=DESK))
        for i in range(3)
    ]
    assert [c.tool_calls for c in completions] == [e.tool_calls for e in expected]
    assert [c.tool_calls[0].name for c in completions[:2]] == ["look_up_order", "cancel_order"]
    assert json.loads(completions[1].tool_calls[0].arguments) == {
        "order_id": "A-1001",
        "reason": "late",
    }
    assert [c.finish_reason for c in completions] == ["tool_calls", "tool_calls", "stop"]
    assert completions[2].text == 'look_up_order: {"ok": true}\ncancel_order: {"ok": true}'
    assert completions[0].usage.source == "server"


async def test_mock_server_streams_a_call_over_several_events() -> None:
    body = {
        "model": "mock-model",
        "stream": True,
        "messages": [{"role": "user", "content": "look up order A-1001"}],
        "tools": [{"type": "function", "function": d.model_dump()} for d in DESK],
    }
    async with MockModelServer() as server, httpx.AsyncClient() as client:
        answer = await client.post(server.base_url + "/chat/completions", json=body)
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: {")]
    pieces = [
        json.loads(e)["choices"][0]["delta"]["tool_calls"][0]
        for e in events
        if "tool_calls" in json.loads(e)["choices"][0]["delta"]
    ]
    assert pieces[0]["id"] == "call_0_0" and pieces[0]["function"]["arguments"] == ""
    assert len(pieces) >= 3  # the arguments come in pieces after the name
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"order_id": "A-1001"}'


async def test_mock_server_refuses_malformed_tools() -> None:
    body = {
        "model": "mock-model",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "bad name!"}}],
    }
    async with MockModelServer() as server, httpx.AsyncClient() as client:
        answer = await client.post(server.base_url + "/chat/completions", json=body)
    assert answer.status_code == 400
    assert "tools[0].function.name" in answer.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
async def test_mock_server_malformed_tool_arguments_fault(stream: bool) -> None:
    config = {"fault_rate": 1.0, "faults": {"malformed_tool_args": 1}}
    async with MockModelServer(config) as server:
        completions, _ = await _desk_rounds(server.base_url, stream=stream, rounds=1)
        # an answer without a tool call has nothing to malform: no fault is counted
        plain = OpenAICompatibleAdapter({"model": "m", "base_url": server.base_url}, env={})
        try:
            text = await plain.generate(ASK, GenerationParams())
        finally:
            await plain.aclose()
        faults = server.statistics().faults_injected
    call = completions[0].tool_calls[0]
    assert call.name == "look_up_order" and call.arguments == '{"order_id": "A-1001"'
    with pytest.raises(ValueError, match="not valid JSON"):
        call.parsed_arguments()
    assert text.text and faults["malformed_tool_args"] == 1


# -- the custom HTTP backend and LiteLLM ----------------------------------------------


async def _custom(server: _Server, messages: list[Message], params: GenerationParams) -> Completion:
    adapter = CustomHttpAdapter(
        {"model": "m", "base_url": "http://llm.test", "max_retries": 0},
        transport=server.transport(),
        env={},
    )
    try:
        return await adapter.generate(messages, params)
    finally:
        await adapter.aclose()


async def test_custom_http_passes_tools_through_and_reads_calls_back() -> None:
    answer = {
        "choices": [{"tool_calls": _OPENAI_ANSWER["choices"][0]["message"]["tool_calls"]}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }
    server = _Server(json.dumps({**answer}).encode(), stream=False)
    params = TOOLS.model_copy(update={"tool_choice": "cancel_order"})
    completion = await _custom(server, HISTORY, params)
    assert completion.tool_calls == EXPECTED and completion.text == ""
    body = server.requests[0]
    assert body["prompt"].startswith("System: You run the order desk.")
    assert body["tools"][1]["function"]["name"] == "cancel_order"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "cancel_order"}}
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_abc123",
        "content": '{"status": "open"}',
    }


async def test_custom_http_text_calls_keep_the_guides_body() -> None:
    server = _Server(b'{"choices": [{"text": "hi"}]}', stream=False)
    completion = await _custom(server, ASK, GenerationParams())
    assert completion.text == "hi" and completion.tool_calls == ()
    assert set(server.requests[0]) == {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
    }


@pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier")
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
async def test_litellm_sends_tools_and_reads_calls(stream: bool) -> None:
    from convsim.adapters._litellm import LitellmAdapter, import_litellm

    try:  # as convsim imports it: its price table read locally, never fetched
        import_litellm()
    except MissingExtra:
        pytest.skip("the litellm extra is not installed")

    async with MockModelServer() as server:
        adapter = LitellmAdapter(
            {
                "model": "openai/mock-model",
                "base_url": server.base_url,
                "api_key": "sk-test",
                "stream": stream,
                "max_retries": 0,
            },
            env={},
        )
        messages = [Message(role="user", content="Look up order A-1001 and cancel it")]
        first = await adapter.generate(messages, GenerationParams(tools=DESK))
        _round(messages, first, '{"ok": true}')
        second = await adapter.generate(messages, GenerationParams(tools=DESK))
    assert first.tool_calls == (
        ToolCall(id="call_0_0", name="look_up_order", arguments='{"order_id": "A-1001"}'),
    )
    assert first.finish_reason == "tool_calls"
    assert [c.name for c in second.tool_calls] == ["cancel_order"]  # it saw the first round
