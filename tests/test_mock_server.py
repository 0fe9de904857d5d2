"""The mock model server: wire format, the deterministic model, timing, limits, faults, CLI."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from convsim import ConfigError
from convsim.adapters import Message
from convsim.adapters._recall import recall_reply
from convsim.adapters.mock import Delay, MockModelServer, MockServerConfig
from convsim.adapters.mock._faults import FAULT_KINDS
from convsim.adapters.mock._tokens import (
    MOCK_ALTERNATIVE,
    MOCK_GREEDY_MIN,
    mock_token_logprob,
    mock_tokens,
)
from convsim.cli import main

pytestmark = pytest.mark.anyio

USER = "Hi, I'm Dana and my order A-1042 for 59 dollars is late. Where is it?"
CHAT = {"model": "mock-model", "messages": [{"role": "user", "content": USER}]}


class Sleeps:
    """An injected sleep that records its durations and returns at once."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@asynccontextmanager
async def serve(
    sleep: Any = None, clock: Any = None, **config: Any
) -> AsyncIterator[tuple[MockModelServer, httpx.AsyncClient]]:
    kwargs: dict[str, Any] = {"sleep": sleep or Sleeps()}
    if clock is not None:
        kwargs["clock"] = clock
    async with (
        MockModelServer(MockServerConfig(**config), **kwargs) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        yield server, client


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block
        events.append("\n".join(line[len("data: ") :] for line in lines))
    return events


def chunks(text: str) -> list[dict[str, Any]]:
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def expected_reply(*users: str, memory_turns: int | None = None, seed: int = 0) -> str:
    messages = [Message(role="user", content=u) for u in users]
    return recall_reply(messages, memory_turns=memory_turns, seed=seed)


# --------------------------------------------------------------------------- endpoints


async def test_models_lists_the_configured_model() -> None:
    async with serve(model="tiny") as (_, client):
        response = await client.get("/v1/models")
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "data": [{"id": "tiny", "object": "model", "created": 0, "owned_by": "convsim"}],
    }


async def test_chat_completion_in_openai_format() -> None:
    async with serve() as (server, client):
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert server.base_url == server.url + "/v1"
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    text = expected_reply(USER)
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert isinstance(body["created"], int)
    assert body["model"] == "mock-model"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    prompt = len(USER.split())
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": len(text.split()),
        "total_tokens": prompt + len(text.split()),
        "prompt_tokens_details": {"cached_tokens": 0},  # a first prompt: nothing cached
    }


async def test_chat_stream_sends_role_then_one_chunk_per_word() -> None:
    async with serve() as (_, client):
        plain = (await client.post("/v1/chat/completions", json=CHAT)).json()
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    parts = chunks(response.text)
    assert {c["object"] for c in parts} == {"chat.completion.chunk"}
    assert len({c["id"] for c in parts}) == 1
    assert parts[0]["choices"][0]["delta"] == {"role": "assistant"}
    pieces = [c["choices"][0]["delta"]["content"] for c in parts[1:-1]]
    text = plain["choices"][0]["message"]["content"]
    assert pieces == [w if i == 0 else " " + w for i, w in enumerate(text.split())]
    assert "".join(pieces) == text
    assert all(c["choices"][0]["finish_reason"] is None for c in parts[:-1])
    assert parts[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert all("usage" not in c for c in parts)


async def test_chat_stream_include_usage_adds_a_usage_chunk() -> None:
    async with serve() as (_, client):
        plain = (await client.post("/v1/chat/completions", json=CHAT)).json()
        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        response = await client.post("/v1/chat/completions", json=body)
    parts = chunks(response.text)
    assert parts[-1]["choices"] == []
    assert parts[-1]["usage"] == plain["usage"]
    assert parts[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["usage"] is None for c in parts[:-1])


async def test_legacy_completions_plain_and_streamed() -> None:
    prompt = "Please tell me a story about a dragon."
    async with serve() as (_, client):
        plain = await client.post("/v1/completions", json={"model": "m", "prompt": prompt})
        listed = await client.post("/v1/completions", json={"model": "m", "prompt": [prompt]})
        body = {"model": "m", "prompt": prompt, "stream": True, "stream_options": {}}
        streamed = await client.post("/v1/completions", json=body)
        usage_body = {**body, "stream_options": {"include_usage": True}}
        with_usage = await client.post("/v1/completions", json=usage_body)
    result = plain.json()
    text = expected_reply(prompt)
    assert result["object"] == "text_completion"
    assert result["id"].startswith("cmpl-")
    assert result["model"] == "m"
    assert result["choices"][0]["text"] == text
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["usage"]["prompt_tokens"] == len(prompt.split())
    assert result["usage"]["completion_tokens"] == len(text.split())
    assert listed.json()["choices"] == result["choices"]
    parts = chunks(streamed.text)
    assert {c["object"] for c in parts} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in parts) == text
    assert len(parts) == len(text.split()) + 1
    assert parts[-1]["choices"][0]["finish_reason"] == "stop"
    usage_parts = chunks(with_usage.text)
    assert usage_parts[-1]["choices"] == [] and usage_parts[-1]["usage"] == result["usage"]


def _lp(token: str, seed: int = 0) -> float:
    """The documented logprob of the mock model (see ``mock_token_logprob``)."""
    digest = hashlib.sha256(f"{seed}:{token}".encode()).digest()
    return -(1 + int.from_bytes(digest[:4], "big") % 800) / 100


def test_mock_tokenizer_splits_words_and_punctuation() -> None:
    text = "Question: What is 2+2?\nAnswer: four  "
    pieces = mock_tokens(text)
    assert [t.text for t in pieces] == [
        "Question",
        ":",
        " What",
        " is",
        " 2",
        "+",
        "2",
        "?",
        "\nAnswer",
        ":",
        " four",
        "  ",
    ]
    assert "".join(t.text for t in pieces) == text
    assert all(text.startswith(t.text, t.offset) for t in pieces)
    assert mock_tokens("Answer: Paris") == [("Answer", 0), (":", 6), (" Paris", 7)]
    assert mock_tokens("") == []
    assert mock_token_logprob(" four", 0) == _lp(" four") == -0.35
    assert mock_token_logprob(" four", 1) == _lp(" four", 1) != -0.35


@pytest.mark.parametrize("seed", [0, 7])
async def test_legacy_completions_echo_with_logprobs(seed: int) -> None:
    prompt = "Answer: Paris four"
    body = {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 0}
    async with serve(seed=seed) as (_, client):
        scored = (await client.post("/v1/completions", json=body)).json()
        generated = (
            await client.post("/v1/completions", json={**body, "max_tokens": 3, "logprobs": 1})
        ).json()
    choice = scored["choices"][0]
    assert choice["text"] == prompt
    assert choice["finish_reason"] == "length"
    tokens = ["Answer", ":", " Paris", " four"]
    values = [_lp(t, seed) for t in tokens[1:]]
    assert choice["logprobs"] == {
        "tokens": tokens,
        "token_logprobs": [None, *values],
        "top_logprobs": [
            None,
            *(
                {t: v} if v >= MOCK_GREEDY_MIN else {MOCK_ALTERNATIVE[0]: -0.5, t: v}
                for t, v in zip(tokens[1:], values, strict=True)
            ),
        ],
        "text_offset": [0, 6, 7, 13],
    }
    # with generated words: the prompt's tokens, then the completion's, all greedy
    completion = " ".join(expected_reply(prompt, seed=seed).split()[:3])
    choice = generated["choices"][0]
    assert choice["text"] == prompt + completion
    lp = choice["logprobs"]
    assert lp["tokens"][:4] == tokens and "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"][4] == len(prompt)
    assert lp["token_logprobs"][1:] == [_lp(t, seed) for t in lp["tokens"][1:]]
    assert all(len(top) == 1 for top in lp["top_logprobs"][1:])  # logprobs=1: the top one
    assert all(
        lp["top_logprobs"][i] == {lp["tokens"][i]: lp["token_logprobs"][i]}
        for i in range(4, len(lp["tokens"]))
    )


async def test_legacy_completions_logprobs_without_echo_and_echo_without_logprobs() -> None:
    prompt = "Tell me about the weather."
    async with serve() as (_, client):
        plain = (await client.post("/v1/completions", json={"prompt": prompt})).json()
        logprobs = (
            await client.post("/v1/completions", json={"prompt": prompt, "logprobs": 0})
        ).json()
        echoed = (
            await client.post("/v1/completions", json={"prompt": prompt, "echo": True})
        ).json()
    text = expected_reply(prompt)
    assert plain["choices"][0]["logprobs"] is None
    assert logprobs["choices"][0]["text"] == text
    lp = logprobs["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == text and lp["text_offset"][0] == 0  # into the text
    assert lp["token_logprobs"] == [_lp(t) for t in lp["tokens"]]  # the prompt came first
    assert lp["top_logprobs"] == [{}] * len(lp["tokens"])  # logprobs=0: no alternatives
    assert echoed["choices"][0]["text"] == prompt + text
    assert echoed["choices"][0]["logprobs"] is None
    assert echoed["usage"] == plain["usage"]


async def test_generate_endpoint_of_the_guide() -> None:
    body = {"model": "m", "prompt": USER, "max_tokens": 100, "temperature": 0.2, "top_p": 1}
    async with serve() as (_, client):
        response = await client.post("/generate", json=body)
    text = expected_reply(USER)
    assert response.status_code == 200
    assert response.json() == {
        "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": len(USER.split()),
            "completion_tokens": len(text.split()),
            "total_tokens": len(USER.split()) + len(text.split()),
        },
        "model": "m",
    }


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("/v1/chat/completions", "max_tokens", CHAT),
        ("/v1/chat/completions", "max_completion_tokens", CHAT),
        ("/v1/completions", "max_tokens", {"prompt": USER}),
        ("/generate", "max_tokens", {"prompt": USER}),
    ],
)
async def test_max_tokens_truncates_with_finish_reason_length(
    path: str, field: str, body: dict[str, Any]
) -> None:
    async with serve() as (_, client):
        response = await client.post(path, json={**body, field: 3})
    choice = response.json()["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    assert text == " ".join(expected_reply(USER).split()[:3])
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 3


async def test_max_tokens_in_a_stream() -> None:
    async with serve() as (_, client):
        body = {**CHAT, "max_tokens": 2, "stream": True}
        parts = chunks((await client.post("/v1/chat/completions", json=body)).text)
    assert [c["choices"][0]["delta"].get("content") for c in parts[1:-1]] == ["Thanks", " for"]
    assert parts[-1]["choices"][0]["finish_reason"] == "length"


async def test_stop_strings_cut_at_the_first_occurrence() -> None:
    text = expected_reply(USER)  # "Thanks for the details. You wrote: Hi, I'm Dana ..."
    async with serve() as (_, client):
        one = await client.post("/v1/chat/completions", json={**CHAT, "stop": "wrote"})
        many = await client.post(
            "/v1/chat/completions", json={**CHAT, "stop": ["Dana", "details", "absent"]}
        )
        absent = await client.post("/generate", json={"prompt": USER, "stop": ["zzz"]})
        both = await client.post(
            "/generate", json={"prompt": USER, "stop": "wrote", "max_tokens": 2}
        )
    assert one.json()["choices"][0]["message"]["content"] == text[: text.index("wrote")].strip()
    assert one.json()["choices"][0]["finish_reason"] == "stop"
    assert many.json()["choices"][0]["message"]["content"] == "Thanks for the"
    assert many.json()["usage"]["completion_tokens"] == 3
    assert absent.json()["choices"][0]["text"] == text
    assert both.json()["choices"][0] == {
        "index": 0,
        "text": "Thanks for",
        "finish_reason": "length",
    }


async def test_memory_window_forgets_older_facts() -> None:
    messages = [
        {"role": "user", "content": "My locker code is 4417."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "The weather is nice today."},
        {"role": "assistant", "content": "Indeed."},
        {"role": "user", "content": "I like tea."},
        {"role": "assistant", "content": "Good."},
        {"role": "user", "content": "What is my locker code?"},
    ]
    body = {"model": "m", "messages": messages}
    async with serve() as (_, client):
        full = (await client.post("/v1/chat/completions", json=body)).json()
    async with serve(memory_turns=1) as (_, client):
        window = (await client.post("/v1/chat/completions", json=body)).json()
    assert "4417" in full["choices"][0]["message"]["content"]
    assert "4417" not in window["choices"][0]["message"]["content"]
    assert (
        window["usage"]["prompt_tokens"]
        == full["usage"]["prompt_tokens"]
        == sum(len(m["content"].split()) for m in messages)
    )


@pytest.mark.parametrize("n", [1, 5, 200])
async def test_output_tokens_gives_exactly_n_words(n: int) -> None:
    async with serve(output_tokens=n) as (_, client):
        plain = (await client.post("/v1/chat/completions", json=CHAT)).json()
        parts = chunks(
            (await client.post("/v1/chat/completions", json={**CHAT, "stream": True})).text
        )
        generated = (await client.post("/generate", json={"prompt": USER})).json()
    words = plain["choices"][0]["message"]["content"].split()
    assert len(words) == n == plain["usage"]["completion_tokens"]
    assert words == expected_reply(USER).split()[:n] + words[len(expected_reply(USER).split()) :]
    assert plain["choices"][0]["finish_reason"] == "stop"
    assert len(parts) == n + 2  # role, n words, finish
    assert len(generated["choices"][0]["text"].split()) == n


async def test_other_roles_and_content_parts_are_accepted() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": USER}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "result one"},
        {"role": "user", "content": "Thanks."},
    ]
    async with serve() as (_, client):
        response = await client.post("/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 200
    assert response.json()["model"] == "mock-model"  # no model given: the server's
    assert response.json()["usage"]["prompt_tokens"] == 2 + len(USER.split()) + 2 + 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b"[1, 2]"),
        ("/v1/chat/completions", b"\xff\xfe"),
        ("/v1/chat/completions", {"model": "m"}),
        ("/v1/chat/completions", {"model": "m", "messages": []}),
        ("/v1/chat/completions", {"model": "m", "messages": ["hi"]}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "boss", "content": "x"}]}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": 3}]}),
        ("/v1/chat/completions", {**CHAT, "model": 7}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": True}),
        ("/v1/chat/completions", {**CHAT, "temperature": 3}),
        ("/v1/chat/completions", {**CHAT, "top_p": -0.1}),
        ("/v1/chat/completions", {**CHAT, "stop": 5}),
        ("/v1/chat/completions", {**CHAT, "stop": ["a", 1]}),
        ("/v1/chat/completions", {**CHAT, "seed": 1.5}),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
        ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": []}),
        ("/v1/chat/completions", {**CHAT, "n": 2}),
        ("/v1/completions", {"model": "m"}),
        ("/v1/completions", {"model": "m", "prompt": ["a", "b"]}),
        ("/v1/completions", {"model": "m", "prompt": [1, 2, 3]}),
        ("/v1/completions", {"prompt": "x", "echo": "yes"}),
        ("/v1/completions", {"prompt": "x", "logprobs": 6}),
        ("/v1/completions", {"prompt": "x", "logprobs": True}),
        ("/v1/completions", {"prompt": "x", "logprobs": 1, "stream": True}),
        ("/v1/completions", {"prompt": "x", "echo": True, "stream": True}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
        ("/v1/completions", {"prompt": "x", "echo": True, "max_tokens": -1}),
        ("/generate", {"prompt": 5}),
        ("/generate", {"prompt": "x", "stream": True}),
    ],
)
async def test_malformed_requests_get_400_in_openai_style(path: str, body: Any) -> None:
    async with serve() as (_, client):
        if isinstance(body, bytes):
            response = await client.post(path, content=body)
        else:
            response = await client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str) and error["message"]


async def test_unknown_paths_404_and_wrong_methods_405() -> None:
    async with serve() as (server, client):
        missing = await client.post("/v1/embeddings", json={})
        wrong = await client.get("/v1/chat/completions")
        stats = server.statistics()
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "invalid_request_error"
    assert wrong.status_code == 405
    assert stats.requests == 2
    assert sum(stats.by_endpoint.values()) == 0


# --------------------------------------------------------------------------- determinism


async def test_same_seed_same_answers_and_request_seed_overrides() -> None:
    bodies = [
        CHAT,
        {**CHAT, "seed": 1},
        {**CHAT, "seed": 2},
        {**CHAT, "messages": [*CHAT["messages"], {"role": "user", "content": "And?"}]},
    ]

    async def answers(seed: int) -> list[str]:
        async with serve(seed=seed, fault_rate=0.3, faults={"500": 1}) as (_, client):
            out = []
            for body in bodies * 3:
                response = await client.post("/v1/chat/completions", json=body)
                out.append(
                    response.text
                    if response.status_code != 200
                    else str(response.json()["choices"])
                )
            return out

    first, again, other = await answers(7), await answers(7), await answers(8)
    assert first == again
    assert first != other  # the fault pattern follows the server seed
    async with serve() as (_, client):
        texts = [
            (await client.post("/v1/chat/completions", json=b)).json()["choices"][0]["message"][
                "content"
            ]
            for b in bodies[:3]
        ]
    assert texts[0] == expected_reply(USER, seed=0)
    assert texts[1] == expected_reply(USER, seed=1) != texts[0]


# --------------------------------------------------------------------------- timing


async def test_zero_delays_never_sleep() -> None:
    sleeps = Sleeps()
    async with serve(sleep=sleeps) as (_, client):
        await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await client.post("/generate", json={"prompt": USER})
    assert sleeps.calls == []
    sleeps = Sleeps()
    async with serve(sleep=sleeps, ttft_ms="uniform:0,0", itl_ms="normal:0,0") as (_, client):
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert sleeps.calls == []


async def test_non_streaming_waits_ttft_plus_itl_per_later_token() -> None:
    sleeps = Sleeps()
    async with serve(sleep=sleeps, ttft_ms=40, itl_ms="fixed:5") as (_, client):
        response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
    assert response.json()["usage"]["completion_tokens"] == 4
    assert sleeps.calls == pytest.approx([0.040, 0.015])


async def test_streaming_waits_ttft_then_itl_between_chunks() -> None:
    sleeps = Sleeps()
    async with serve(sleep=sleeps, ttft_ms=30, itl_ms=2) as (_, client):
        body = {**CHAT, "max_tokens": 4, "stream": True}
        response = await client.post("/v1/chat/completions", json=body)
    assert len(chunks(response.text)) == 6
    assert sleeps.calls == pytest.approx([0.030, 0.002, 0.002, 0.002])


async def test_sampled_delays_follow_the_seed() -> None:
    async def run(seed: int) -> list[float]:
        sleeps = Sleeps()
        async with serve(sleep=sleeps, seed=seed, ttft_ms="exp:20") as (_, client):
            for _ in range(5):
                await client.post("/generate", json={"prompt": USER})
        return sleeps.calls

    first = await run(3)
    assert len(first) == 5 and len(set(first)) == 5
    assert first == await run(3)
    assert first != await run(4)


async def test_real_streaming_delays_reach_the_client_in_pieces() -> None:
    async with (
        MockModelServer(MockServerConfig(ttft_ms=2, itl_ms=1, output_tokens=3)) as server,
        httpx.AsyncClient(base_url=server.url) as client,
        client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        assert "content-length" not in response.headers  # sent as it goes
        text = "".join([piece async for piece in response.aiter_text()])
    assert len(chunks(text)) == 5


async def test_client_leaving_mid_stream_leaves_the_server_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = MockServerConfig(itl_ms=1, output_tokens=200)
    server = MockModelServer(config, shutdown_timeout=5)
    async with server, httpx.AsyncClient(base_url=server.url) as client:
        body = {**CHAT, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if '"content"' in line:
                    break  # leave after the first word; the server is still sending
        assert (await client.post("/generate", json={"prompt": USER})).status_code == 200
        with anyio.fail_after(3):  # the abandoned stream ends instead of running on
            await server.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize("stream", [False, True])
async def test_fault_429_has_retry_after(stream: bool) -> None:
    config = {"fault_rate": 1, "faults": {"429": 1}, "retry_after_s": 2.5}
    async with serve(**config) as (server, client):
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        stats = server.statistics()
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2.5"
    assert response.headers["retry-after-ms"] == "2500"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert stats.faults_injected["429"] == 1 and stats.rate_limited == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
async def test_fault_500_is_an_openai_error(path: str) -> None:
    async with serve(fault_rate=1, faults={"500": 1}) as (_, client):
        response = await client.post(path, json={**CHAT, "prompt": USER})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [False, True])
async def test_fault_drop_closes_the_connection_without_a_response(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve(fault_rate=1, faults={"drop": 1}) as (server, client):
        with pytest.raises(httpx.TransportError):
            await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await client.post("/generate", json={"prompt": USER})
        assert (await client.get("/v1/models")).status_code == 200  # still serving
        assert server.statistics().faults_injected["drop"] == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_fault_malformed_body_is_not_json() -> None:
    async with serve(fault_rate=1, faults={"malformed": 1}) as (_, client):
        response = await client.post("/v1/chat/completions", json=CHAT)
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.text)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    with pytest.raises(json.JSONDecodeError):
        for event in events[:-1]:
            json.loads(event)


async def test_fault_truncated_stream_lacks_done() -> None:
    async with serve(fault_rate=1, faults={"truncated_sse": 1}) as (server, client):
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        legacy = await client.post("/v1/completions", json={"prompt": USER, "stream": True})
        plain = await client.post("/v1/chat/completions", json=CHAT)
        stats = server.statistics()
    events = sse_events(streamed.text)
    assert "[DONE]" not in events
    parts = [json.loads(e) for e in events]
    assert parts[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert len(parts) == 3  # the role, then two words; no finish_reason
    assert all(p["choices"][0]["finish_reason"] is None for p in parts)
    assert "[DONE]" not in sse_events(legacy.text) and len(sse_events(legacy.text)) == 2
    with pytest.raises(json.JSONDecodeError):  # not streaming: falls back to malformed
        json.loads(plain.text)
    assert stats.faults_injected == {
        **dict.fromkeys(FAULT_KINDS, 0),
        "malformed": 1,
        "truncated_sse": 2,
    }


async def test_fault_html_is_a_proxy_page_with_status_200() -> None:
    async with serve(fault_rate=1, faults={"html": 1}) as (server, client):
        plain = await client.post("/v1/chat/completions", json=CHAT)
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        stats = server.statistics()
    for response in (plain, streamed):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert "502 Bad Gateway" in response.text
    assert stats.faults_injected["html"] == 2


async def test_fault_stream_error_reports_an_error_after_some_words() -> None:
    async with serve(fault_rate=1, faults={"stream_error": 1}) as (server, client):
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        plain = await client.post("/v1/chat/completions", json=CHAT)
        stats = server.statistics()
    events = [json.loads(e) for e in sse_events(streamed.text)]
    assert "error" in events[-1] and events[-1]["error"]["type"] == "server_error"
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-1]] != []
    assert plain.status_code == 500  # not streaming: the closest thing, a 500
    assert (stats.faults_injected["stream_error"], stats.faults_injected["500"]) == (1, 1)


async def test_fault_stream_drop_breaks_the_stream_after_some_words() -> None:
    async with serve(fault_rate=1, faults={"stream_drop": 1}) as (server, client):
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream(
                "POST", "/v1/chat/completions", json={**CHAT, "stream": True}
            ) as response:
                async for chunk in response.aiter_bytes():
                    received += chunk
        with pytest.raises(httpx.TransportError):  # not streaming: dropped at once
            await client.post("/v1/chat/completions", json=CHAT)
        stats = server.statistics()
    assert b'"content"' in received and b"[DONE]" not in received
    assert (stats.faults_injected["stream_drop"], stats.faults_injected["drop"]) == (1, 1)


async def test_fault_surrogates_put_half_an_emoji_in_the_answer() -> None:
    async with serve(fault_rate=1, faults={"lone_surrogate": 1}) as (_, client):
        plain = await client.post("/v1/chat/completions", json=CHAT)
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert plain.json()["choices"][0]["message"]["content"].endswith("\ud83d")
    assert '\\ud83d"' in plain.text  # escaped in the JSON, as the fault intends
    pieces = [
        json.loads(e)["choices"][0]["delta"].get("content") for e in sse_events(streamed.text)[:-1]
    ]
    assert "".join(p for p in pieces if p).endswith("\ud83d")

    async with serve(fault_rate=1, faults={"split_surrogate": 1}) as (server, client):
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        plain = await client.post("/v1/chat/completions", json=CHAT)
        stats = server.statistics()
    pieces = [
        json.loads(e)["choices"][0]["delta"].get("content") for e in sse_events(streamed.text)[:-1]
    ]
    halves = [i for i, p in enumerate(pieces) if p and ("\ud83d" in p or "\ude00" in p)]
    assert len(halves) == 2 and halves[1] == halves[0] + 1  # one half per event, in a row
    assert pieces[halves[0]].endswith("\ud83d") and pieces[halves[1]].startswith("\ude00")
    assert plain.json()["choices"][0]["message"]["content"].endswith("\ud83d")
    assert (stats.faults_injected["split_surrogate"], stats.faults_injected["lone_surrogate"]) == (
        1,
        1,
    )


async def test_fault_mix_follows_rate_and_weights() -> None:
    config = {"fault_rate": 0.5, "faults": {"500": 3, "429": 1, "drop": 0}, "seed": 11}
    async with serve(**config) as (server, client):
        codes = [
            (await client.post("/generate", json={"prompt": USER})).status_code for _ in range(400)
        ]
        stats = server.statistics()
    assert set(codes) == {200, 429, 500}
    assert 150 < codes.count(200) < 250
    assert codes.count(500) > 2 * codes.count(429)
    assert stats.faults_injected["500"] == codes.count(500)
    assert stats.faults_injected["429"] == codes.count(429)
    assert stats.faults_injected["drop"] == 0


async def test_no_faults_on_the_model_list() -> None:
    async with serve(fault_rate=1, faults={"500": 1}) as (_, client):
        assert (await client.get("/v1/models")).status_code == 200


# --------------------------------------------------------------------------- limits


async def test_rpm_limit_answers_429_with_the_time_until_a_slot_frees() -> None:
    now = [1000.0]
    async with serve(rpm=2, clock=lambda: now[0]) as (server, client):
        assert (await client.post("/generate", json={"prompt": "a"})).status_code == 200
        now[0] += 20.4
        assert (await client.post("/generate", json={"prompt": "b"})).status_code == 200
        third = await client.post("/generate", json={"prompt": "c"})
        assert third.status_code == 429
        assert third.headers["retry-after"] == "40"  # 60 - 20.4, rounded up
        assert third.json()["error"]["code"] == "rate_limit_exceeded"
        now[0] += 39.0
        fourth = await client.post("/v1/chat/completions", json=CHAT)
        assert fourth.status_code == 429 and fourth.headers["retry-after"] == "1"  # min 1
        assert (await client.get("/v1/models")).status_code == 200  # not limited
        now[0] += 0.7  # the first request leaves the window
        assert (await client.post("/generate", json={"prompt": "d"})).status_code == 200
        stats = server.statistics()
    assert stats.rate_limited == 2
    assert stats.faults_injected == dict.fromkeys(stats.faults_injected, 0)


async def test_api_key_is_required_when_set() -> None:
    async with serve(api_key="sk-test") as (server, client):
        missing = await client.post("/v1/chat/completions", json=CHAT)
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        good = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-test"}
        )
        stats = server.statistics()
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert "sk-test" not in missing.text
    assert good.status_code == 200
    assert stats.unauthorized == 2
    assert "sk-test" not in repr(server.config)


async def test_statistics_count_requests_by_endpoint() -> None:
    async with serve() as (server, client):
        before = server.statistics()
        await client.get("/v1/models")
        for _ in range(3):
            await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/v1/completions", json={"prompt": "x"})
        await client.post("/generate", content=b"nope")
        after = server.statistics()
    assert before.requests == 0
    assert after.requests == 6
    assert after.by_endpoint == {
        "/v1/models": 1,
        "/v1/chat/completions": 3,
        "/v1/completions": 1,
        "/generate": 1,
        "/tokenize": 0,
        "/metrics": 0,
    }
    with pytest.raises(AttributeError):
        after.requests = 1  # type: ignore[misc]
    assert before.by_endpoint["/v1/models"] == 0  # a snapshot, not a view


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("value", "kind", "params"),
    [
        (0, "fixed", (0.0,)),
        (12.5, "fixed", (12.5,)),
        ("50", "fixed", (50.0,)),
        ("fixed:7", "fixed", (7.0,)),
        ("uniform:20,80", "uniform", (20.0, 80.0)),
        (" exp:30 ", "exp", (30.0,)),
        ("normal:50,10", "normal", (50.0, 10.0)),
        ("normal:50,10,20,60", "normal", (50.0, 10.0, 20.0, 60.0)),
        ("lognormal:50,10", "lognormal", (50.0, 10.0)),
    ],
)
def test_delay_parses_numbers_and_forms(value: Any, kind: str, params: tuple[float, ...]) -> None:
    delay = Delay.parse(value)
    assert (delay.kind, delay.params) == (kind, params)
    assert Delay.parse(str(delay)) == delay
    assert Delay.parse(delay) is delay


@pytest.mark.parametrize(
    "value",
    [
        -1,
        "-3",
        "soon",
        "fixed",
        "fixed:",
        "fixed:1:2",
        "uniform:5",
        "uniform:9:2",
        "uniform:-1:2",
        "exp:-2",
        "exp:x",
        "normal:5",
        "normal:5:-1",
        "normal:-5,1",
        "normal:5,1,9,2",
        "lognormal:0,1",
        "exp:0",
        "uniform:1,2:3,4",
        "gamma:1:2",
        "nan",
        float("inf"),
        True,
        None,
        [1],
    ],
)
def test_delay_rejects_bad_forms(value: Any) -> None:
    with pytest.raises(ValueError, match="delay"):
        Delay.parse(value)
    with pytest.raises(ValidationError):
        MockServerConfig(ttft_ms=value)


def test_delay_samples_are_seeded_and_never_negative() -> None:
    for spec in ("uniform:20,80", "exp:30", "normal:5,50", "lognormal:20,10,5,40"):
        delay = Delay.parse(spec)
        a = [delay.sample(random.Random(1)) for _ in range(3)]
        draws = [delay.sample(random.Random(1)) for _ in range(3)]
        assert a == draws
        rng = random.Random(2)
        samples = [delay.sample(rng) for _ in range(500)]
        assert min(samples) >= 0
    assert min(Delay.parse("uniform:20,80").sample(random.Random(i)) for i in range(50)) >= 20
    assert any(Delay.parse("normal:5,50").sample(random.Random(i)) == 0 for i in range(50))
    bounded = [Delay.parse("lognormal:20,10,5,40").sample(random.Random(i)) for i in range(200)]
    assert min(bounded) >= 5 and max(bounded) <= 40 and len(set(bounded)) > 100
    assert Delay.parse("fixed:0").is_zero and not Delay.parse("exp:1").is_zero


def test_config_defaults_and_validation() -> None:
    config = MockServerConfig(ttft_ms=50, itl_ms="uniform:1,3")
    assert config.ttft_ms == Delay("fixed", (50.0,))
    assert config.itl_ms.kind == "uniform"
    # every kind but the one that only changes tool calls
    assert config.faults == dict.fromkeys(FAULT_KINDS[:-1], 1)
    assert FAULT_KINDS == (
        "429",
        "500",
        "drop",
        "malformed",
        "html",
        "truncated_sse",
        "stream_error",
        "stream_drop",
        "lone_surrogate",
        "split_surrogate",
        "malformed_tool_args",
    )
    assert MockServerConfig().ttft_ms.is_zero and MockServerConfig().port == 0
    assert config.model_dump()["itl_ms"] == "uniform:1,3"
    for bad in (
        {"output_tokens": 0},
        {"fault_rate": 1.5},
        {"faults": {"teapot": 1}},
        {"faults": {"500": 0}},
        {"faults": {"500": -1}},
        {"rpm": 0},
        {"memory_turns": 0},
        {"colour": "red"},
    ):
        with pytest.raises(ValidationError):
            MockServerConfig(**bad)
    with pytest.raises(ValidationError):
        config.seed = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="rpm"):
        MockModelServer({"rpm": -1})


async def test_server_from_a_mapping_and_explicit_start_stop() -> None:
    server = MockModelServer({"model": "m2", "output_tokens": 2})
    await server.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            await server.start()
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.post("/completions", json={"prompt": "x"})
        assert response.json()["usage"]["completion_tokens"] == 2
    finally:
        await server.stop()
    await server.stop()  # a second stop does nothing
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(server.url + "/v1/models")


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    "args",
    [
        ["--ttft-ms", "soon"],
        ["--itl-ms", "uniform:3:1"],
        ["--port", "70000"],
        ["--fault-rate", "2"],
        ["--rpm", "0"],
        ["--output-tokens", "0"],
        ["--memory-turns", "0"],
        ["--faults", "teapot=1"],
        ["--faults", "500=x"],
        ["--retry-after", "-1"],
    ],
)
def test_cli_bad_values_are_usage_errors(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["mock-server", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_cli_port_in_use_exits_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["mock-server", "--port", str(port)])
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


@pytest.mark.slow
def test_cli_serves_until_sigint() -> None:
    command = [sys.executable, "-m", "convsim", "--log-format", "json", "--log-level", "info"]
    command += ["mock-server", "--port", "0", "--api-key", "sk-very-secret", "--ttft-ms", "exp:1"]
    with subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stderr is not None
        try:
            lines: list[str] = []
            url = None
            while url is None:
                line = proc.stderr.readline()
                assert line, f"the server exited: {proc.wait()} {''.join(lines)}"
                lines.append(line)
                event = json.loads(line)  # with --log-format json, every line is JSON
                if event["event"] == "cli_message":
                    found = re.fullmatch(
                        r"listening on (http://127\.0\.0\.1:\d+)", event["message"]
                    )
                    url = found.group(1) if found else None
            response = httpx.post(
                url + "/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": "Bearer sk-very-secret"},
            )
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"] == expected_reply(USER)
            proc.send_signal(signal.SIGINT)
            # Read to the end (not communicate(): it would skip what readline buffered).
            rest = proc.stderr.read()
            assert proc.wait(timeout=20) == 0, rest
        finally:
            if proc.poll() is None:
                proc.kill()
    err = "".join(lines) + rest
    assert "Traceback" not in err
    assert "sk-very-secret" not in err
    events = [json.loads(line) for line in err.splitlines()]
    listening = [e for e in events if e["event"] == "mock_server_listening"]
    assert listening and listening[0]["url"] == url, err
