"""Reasoning models on the wire: their thoughts read apart from the answer, streamed
and not, for each server shape (vLLM, llama.cpp, newer vLLM, Anthropic thinking), with
the time to the first token of any kind and to the first answer token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest

from convsim import ConfigError, MalformedResponse
from convsim.adapters import GenerationParams, Message
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter

pytestmark = pytest.mark.anyio

HI = [Message(role="user", content="Is 91 prime?")]


class _Bytes(httpx.AsyncByteStream):
    """A body sent in the pieces given (one byte each, to split every event)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


def _transport(body: bytes, *, stream: bool, split: bool) -> HttpxTransport:
    def respond(request: httpx.Request) -> httpx.Response:
        kind = "text/event-stream" if stream else "application/json"
        pieces = [body[i : i + 1] for i in range(len(body))] if split else [body]
        return httpx.Response(200, headers={"content-type": kind}, stream=_Bytes(pieces))

    return HttpxTransport(transport=httpx.MockTransport(respond))


def _sse(*payloads: Mapping[str, Any], done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(p)}\n\n" for p in payloads]
    return "".join([*lines, "data: [DONE]\n\n" if done else ""]).encode()


def _named(*items: Mapping[str, Any]) -> bytes:
    return "".join(f"event: {i['type']}\ndata: {json.dumps(i)}\n\n" for i in items).encode()


def _chunk(delta: Mapping[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-af430a941c7a2bf7",
        "object": "chat.completion.chunk",
        "created": 1779347167,
        "model": "qwen3",
        "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}],
        **extra,
    }


_USAGE = {
    "prompt_tokens": 14,
    "completion_tokens": 9,
    "total_tokens": 23,
    "completion_tokens_details": {"reasoning_tokens": 6},
}


def _vllm_stream(key: str) -> bytes:
    """vLLM with ``--reasoning-parser`` (``reasoning_content``; ``reasoning`` on newer
    builds, as in guidellm#737): thoughts first, then the answer, then usage."""
    return _sse(
        _chunk({"role": "assistant", "content": ""}),
        _chunk({key: "Okay"}),
        _chunk({key: ", 91 = 7"}),
        _chunk({key: " * 13 🧮"}),
        _chunk({"content": "\n\nNo"}),
        _chunk({"content": ": 7 * 13 🧮"}),
        _chunk({}, finish="stop"),
        {**_chunk({}), "choices": [], "usage": _USAGE},
    )


def _llama_cpp_stream() -> bytes:
    """llama.cpp's server (``--reasoning-format deepseek``): every delta names both
    fields, the one not in use null."""
    return _sse(
        _chunk({"role": "assistant", "content": None}),
        _chunk({"content": None, "reasoning_content": "Okay"}),
        _chunk({"content": None, "reasoning_content": ", 91 = 7 * 13 🧮"}),
        _chunk({"content": "\n\nNo", "reasoning_content": None}),
        _chunk({"content": ": 7 * 13 🧮", "reasoning_content": None}),
        _chunk({}, finish="stop", usage={"prompt_tokens": 14, "completion_tokens": 9}),
    )


async def _openai(body: bytes, *, stream: bool, split: bool = False) -> Any:
    adapter = OpenAICompatibleAdapter(
        {"model": "qwen3", "base_url": "http://llm.test/v1", "stream": stream},
        transport=_transport(body, stream=stream, split=split),
        env={},
    )
    try:
        return await adapter.generate(HI, GenerationParams())
    finally:
        await adapter.aclose()


@pytest.mark.parametrize(
    "body",
    [_vllm_stream("reasoning_content"), _vllm_stream("reasoning"), _llama_cpp_stream()],
    ids=["vllm-reasoning_content", "vllm-reasoning", "llama.cpp"],
)
@pytest.mark.parametrize("split", [False, True], ids=["whole", "every-byte"])
async def test_streamed_reasoning_is_kept_apart_from_the_answer(body: bytes, split: bool) -> None:
    completion = await _openai(body, stream=True, split=split)
    assert completion.text == "\n\nNo: 7 * 13 🧮"
    assert completion.reasoning == "Okay, 91 = 7 * 13 🧮"
    timings = completion.timings
    assert timings.ttft_s is not None and timings.ttfot_s is not None
    assert timings.ttft_s < timings.ttfot_s  # the thoughts came first
    # every piece is a token: two reasoning, two answer at least, gaps between them all
    assert len(timings.inter_token_s) >= 3


async def test_streamed_reasoning_tokens_come_from_the_usage_details() -> None:
    completion = await _openai(_vllm_stream("reasoning"), stream=True)
    assert completion.reasoning_tokens == 6
    assert completion.usage.completion_tokens == 9  # reasoning included, as servers count
    assert (await _openai(_llama_cpp_stream(), stream=True)).reasoning_tokens is None


async def test_a_stream_without_reasoning_has_ttfot_equal_to_ttft() -> None:
    body = _sse(_chunk({"content": "No."}), _chunk({}, finish="stop"))
    completion = await _openai(body, stream=True)
    assert completion.reasoning is None and completion.reasoning_tokens is None
    assert completion.timings.ttfot_s == completion.timings.ttft_s is not None


async def test_a_stream_that_only_reasons_has_a_ttft_and_no_ttfot() -> None:
    body = _sse(_chunk({"reasoning": "Hmm"}), _chunk({}, finish="length"))
    completion = await _openai(body, stream=True)
    assert completion.text == "" and completion.reasoning == "Hmm"
    assert completion.timings.ttft_s is not None and completion.timings.ttfot_s is None


async def test_a_chunk_with_reasoning_and_answer_times_both_at_once() -> None:
    body = _sse(_chunk({"reasoning": "Hmm.", "content": "No."}), _chunk({}, finish="stop"))
    completion = await _openai(body, stream=True)
    assert (completion.reasoning, completion.text) == ("Hmm.", "No.")


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
async def test_non_streamed_reasoning(key: str) -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "qwen3",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "No: 7 * 13 🧮", key: "91 = 7 * 13 🧮"},
                "finish_reason": "stop",
            }
        ],
        "usage": _USAGE,
    }
    completion = await _openai(json.dumps(body).encode(), stream=False)
    assert completion.text == "No: 7 * 13 🧮"
    assert completion.reasoning == "91 = 7 * 13 🧮"
    assert completion.reasoning_tokens == 6
    assert completion.timings.ttft_s is None and completion.timings.ttfot_s is None


@pytest.mark.parametrize(
    "delta",
    [{"reasoning_content": 7}, {"reasoning": ["x"]}],
    ids=["number", "list"],
)
async def test_misshapen_reasoning_is_a_malformed_response(delta: dict[str, Any]) -> None:
    body = _sse(_chunk(delta), _chunk({}, finish="stop"))
    adapter = OpenAICompatibleAdapter(
        {"model": "qwen3", "base_url": "http://llm.test/v1", "stream": True, "max_retries": 0},
        transport=_transport(body, stream=True, split=False),
        env={},
    )
    with pytest.raises(MalformedResponse, match="not a string"):
        await adapter.generate(HI, GenerationParams())
    await adapter.aclose()


async def test_a_bad_reasoning_token_count_is_a_malformed_response() -> None:
    usage = {**_USAGE, "completion_tokens_details": {"reasoning_tokens": -1}}
    body = _sse(_chunk({"content": "No."}), {**_chunk({}), "choices": [], "usage": usage})
    adapter = OpenAICompatibleAdapter(
        {"model": "qwen3", "base_url": "http://llm.test/v1", "stream": True, "max_retries": 0},
        transport=_transport(body, stream=True, split=False),
        env={},
    )
    with pytest.raises(MalformedResponse, match="reasoning_tokens"):
        await adapter.generate(HI, GenerationParams())
    await adapter.aclose()


async def test_only_the_answer_reaches_on_text() -> None:
    adapter = OpenAICompatibleAdapter(
        {"model": "qwen3", "base_url": "http://llm.test/v1"},
        transport=_transport(_vllm_stream("reasoning"), stream=True, split=False),
        env={},
    )
    shown: list[str] = []
    completion = await adapter.stream(HI, GenerationParams(), shown.append)
    await adapter.aclose()
    assert "".join(shown) == completion.text == "\n\nNo: 7 * 13 🧮"


# -- Anthropic: thinking blocks -------------------------------------------------------


def _anthropic_stream() -> bytes:
    """The Messages stream with extended thinking: a thinking block (thinking_delta,
    then signature_delta), then the text block."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet-4-5",
            "stop_reason": None,
            "usage": {"input_tokens": 25, "output_tokens": 1},
        },
    }

    def delta(index: int, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": dict(body)}

    return _named(
        start,
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        delta(0, {"type": "thinking_delta", "thinking": "91 = 7"}),
        delta(0, {"type": "thinking_delta", "thinking": " * 13 🧮"}),
        delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        delta(1, {"type": "text_delta", "text": "No"}),
        delta(1, {"type": "text_delta", "text": ": 7 * 13 🧮"}),
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 40},
        },
        {"type": "message_stop"},
    )


async def _anthropic(body: bytes, *, stream: bool, split: bool = False, **config: Any) -> Any:
    seen: list[dict[str, Any]] = []

    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        kind = "text/event-stream" if stream else "application/json"
        pieces = [body[i : i + 1] for i in range(len(body))] if split else [body]
        return httpx.Response(200, headers={"content-type": kind}, stream=_Bytes(pieces))

    adapter = AnthropicAdapter(
        {"model": "claude-sonnet-4-5", "stream": stream, **config},
        transport=HttpxTransport(transport=httpx.MockTransport(respond)),
        env={"ANTHROPIC_API_KEY": "k"},
    )
    try:
        completion = await adapter.generate(HI, GenerationParams(max_tokens=4096))
    finally:
        await adapter.aclose()
    return completion, seen


@pytest.mark.parametrize("split", [False, True], ids=["whole", "every-byte"])
async def test_anthropic_streamed_thinking(split: bool) -> None:
    completion, _ = await _anthropic(_anthropic_stream(), stream=True, split=split)
    assert completion.text == "No: 7 * 13 🧮"
    assert completion.reasoning == "91 = 7 * 13 🧮"
    assert completion.timings.ttft_s < completion.timings.ttfot_s


async def test_anthropic_thinking_blocks_not_streamed() -> None:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "91 = 7 * 13 🧮", "signature": "EqQBCgIYAhIM"},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
            {"type": "text", "text": "No: 7 * 13 🧮"},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 25, "output_tokens": 40},
    }
    completion, _ = await _anthropic(json.dumps(body).encode(), stream=False)
    assert completion.text == "No: 7 * 13 🧮"
    assert completion.reasoning == "91 = 7 * 13 🧮"  # the redacted block holds no text


async def test_anthropic_thinking_budget_turns_thinking_on() -> None:
    body = json.dumps(
        {
            "type": "message",
            "content": [{"type": "text", "text": "No."}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    ).encode()
    _, seen = await _anthropic(body, stream=False, thinking_budget=2048)
    assert seen[0]["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    _, seen = await _anthropic(body, stream=False)
    assert "thinking" not in seen[0]


def test_anthropic_thinking_budget_below_the_apis_least_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"thinking_budget: .* 1024"):
        AnthropicAdapter(
            {"model": "claude", "thinking_budget": 100}, env={"ANTHROPIC_API_KEY": "k"}
        )
