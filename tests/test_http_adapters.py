"""The HTTP adapters on the wire: OpenAI(-compatible), Anthropic, the guide's /generate.

Every handler answers in the API's documented wire format and records what the adapter
sent, so each test checks both directions. Most tests run over ``httpx.MockTransport``;
the core suite also runs against a real aiohttp server on 127.0.0.1 through the default
aiohttp seam, so both implementations of the seam pass the same adapter tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
import structlog
from aiohttp import web
from click.testing import CliRunner
from conftest import write_pack

from convsim import (
    AuthError,
    BadRequest,
    ConfigError,
    JsonlSink,
    MalformedResponse,
    ProtocolError,
    RateLimited,
    RegistryError,
    ServerError,
    Simulator,
    Status,
    Timeout,
)
from convsim.adapters import (
    ADAPTERS,
    GenerationParams,
    Message,
    Usage,
    create_adapter,
    parse_model_args,
)
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._budget import BudgetLimits, Budgets, ProviderBudget
from convsim.adapters._custom_http import CustomHttpAdapter
from convsim.adapters._http import HttpxTransport
from convsim.adapters._http_adapter import HttpModelAdapter
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter
from convsim.cli import main

pytestmark = pytest.mark.anyio

SECRET = "sk-secret-123"
HI = [Message(role="user", content="Hello?")]


# -- a neutral server: the same handlers behind httpx.MockTransport and aiohttp.web ---


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it."""

    url: str
    path: str
    headers: Mapping[str, str]
    """Lower-cased names."""
    body: Any
    raw: httpx.Request | None = None
    """The httpx request (MockTransport only), for raising httpx errors."""


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None
    """A JSON-able object, or bytes sent as they are."""
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: list[bytes] | None = None
    """Sent as a server-sent-events stream, one write per chunk."""

    def content(self) -> bytes:
        if self.chunks is not None:
            return b"".join(self.chunks)
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()

    def content_type(self) -> str:
        if self.chunks is not None:
            return "text/event-stream"
        return "text/plain" if isinstance(self.body, bytes) else "application/json"


Handler = Callable[[Seen], Reply]


def sequence(*replies: Reply | Callable[[Seen], Reply]) -> Handler:
    """Answer the n-th request with the n-th reply (the last one repeats)."""
    calls = 0

    def handler(seen: Seen) -> Reply:
        nonlocal calls
        reply = replies[min(calls, len(replies) - 1)]
        calls += 1
        return reply(seen) if callable(reply) else reply

    return handler


class FakeClock:
    """Monotonic time that only moves when something sleeps on it; records the sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()


class ClockedBudgets(Budgets):
    """Budgets on the test's clock (``Budgets`` takes none itself): a 429 pause ends once
    the fake time slept in retry waits has passed it, as it would in real time."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def get(self, key: str, limits: BudgetLimits) -> ProviderBudget:
        budget = super().get(key, limits)
        budget.clock, budget.sleep = self.clock, self.clock.sleep
        return budget


class Seam:
    """Builds adapters whose requests reach ``handler``, over httpx or aiohttp."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.seen: list[Seen] = []
        self.clock = FakeClock()
        self._adapters: list[HttpModelAdapter] = []
        self._runners: list[web.AppRunner] = []

    @property
    def sleeps(self) -> list[float]:
        return self.clock.sleeps

    def mock_transport(self, handler: Handler) -> HttpxTransport:
        def respond(request: httpx.Request) -> httpx.Response:
            seen = Seen(
                url=str(request.url),
                path=request.url.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=json.loads(request.content),
                raw=request,
            )
            self.seen.append(seen)
            reply = handler(seen)
            headers = {"content-type": reply.content_type(), **reply.headers}
            return httpx.Response(reply.status, headers=headers, content=reply.content())

        return HttpxTransport(transport=httpx.MockTransport(respond))

    async def serve(self, handler: Handler) -> str:
        """Start an aiohttp server on 127.0.0.1 (a free port); return its base URL."""

        async def respond(request: web.Request) -> web.StreamResponse:
            seen = Seen(
                url=str(request.url),
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=json.loads(await request.read()),
            )
            self.seen.append(seen)
            reply = handler(seen)
            headers = {"Content-Type": reply.content_type(), **reply.headers}
            if reply.chunks is None:
                return web.Response(status=reply.status, body=reply.content(), headers=headers)
            response = web.StreamResponse(status=reply.status, headers=headers)
            await response.prepare(request)
            for chunk in reply.chunks:
                await response.write(chunk)
                await asyncio.sleep(0)
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_route("POST", "/{path:.*}", respond)
        runner = web.AppRunner(app)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def adapter(
        self,
        cls: type[HttpModelAdapter],
        handler: Handler,
        *,
        env: Mapping[str, str] | None = None,
        budgets: Budgets | None = None,
        **config: Any,
    ) -> Any:
        if "model_name" not in config:
            config.setdefault("model", "m")
        transport = None
        if self.kind == "httpx":
            transport = self.mock_transport(handler)
            if cls.default_base_url is None and "api_endpoint" not in config:
                config.setdefault("base_url", "http://llm.test/v1")
        else:  # a local server: the default seam (aiohttp), or the lean one
            config.setdefault("base_url", await self.serve(handler) + "/v1")
            if self.kind == "lean":
                config["http"] = "lean"
        adapter = cls(
            config,
            transport=transport,
            env={} if env is None else env,
            budgets=ClockedBudgets(self.clock) if budgets is None else budgets,
            sleep=self.clock.sleep,
        )
        self._adapters.append(adapter)
        return adapter

    async def aclose(self) -> None:
        for adapter in self._adapters:
            await adapter.aclose()
        for runner in self._runners:
            await runner.cleanup()


@pytest.fixture
async def http(anyio_backend: str) -> AsyncIterator[Seam]:
    """httpx.MockTransport: no sockets at all."""
    seam = Seam("httpx")
    yield seam
    await seam.aclose()


@pytest.fixture(params=["httpx", "aiohttp", "lean"])
async def seam(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[Seam]:
    """Every seam: MockTransport, and the default aiohttp client and the lean HTTP/1.1
    one (asyncio only) against a local server."""
    if request.param == "lean" and anyio_backend != "asyncio":
        pytest.skip("the lean seam runs under asyncio only")
    seam = Seam(request.param)
    yield seam
    await seam.aclose()


# -- wire-format builders -----------------------------------------------------------


def chat_reply(text: str = "Hello there.", finish: str = "stop", usage: bool = True) -> Reply:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    return Reply(body=body)


def data_lines(*payloads: Any, done: bool = True) -> list[bytes]:
    chunks = [f"data: {json.dumps(p)}\n\n".encode() for p in payloads]
    return [*chunks, b"data: [DONE]\n\n"] if done else chunks


def chat_chunk(content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def chat_stream(*pieces: str, usage: bool = True, done: bool = True) -> Reply:
    first = chat_chunk("")
    first["choices"][0]["delta"]["role"] = "assistant"
    chunks = [first, *(chat_chunk(p) for p in pieces), chat_chunk(finish="stop")]
    if usage:  # stream_options.include_usage: a last chunk with empty choices
        chunks.append(
            {
                **chat_chunk(),
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
            }
        )
    return Reply(chunks=data_lines(*chunks, done=done))


def events(*items: tuple[str, dict[str, Any]]) -> list[bytes]:
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in items]


def anthropic_stream(*pieces: str, error: str | None = None) -> Reply:
    """The documented Messages event flow (with a ping), or an error after the text."""
    items: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-3-5-haiku-20241022",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 25, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    items += [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
        )
        for p in pieces
    ]
    if error is not None:
        items.append(
            ("error", {"type": "error", "error": {"type": error, "message": "Overloaded"}})
        )
        return Reply(chunks=events(*items))
    items += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 15},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return Reply(chunks=events(*items))


def api_error(
    status: int, message: str = "nope", headers: Mapping[str, str] | None = None
) -> Reply:
    return Reply(
        status=status,
        body={"error": {"message": message, "type": "invalid_request_error"}},
        headers=headers or {},
    )


# -- the core suite, on both seams --------------------------------------------------


async def test_chat_request_and_answer(seam: Seam) -> None:
    adapter = await seam.adapter(OpenAICompatibleAdapter, sequence(chat_reply()))
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Hi"),
        Message(role="assistant", content="Hello!"),
        Message(role="user", content="How are you?"),
    ]
    params = GenerationParams(temperature=0.3, max_tokens=64, top_p=0.9, stop=("END",), seed=7)
    completion = await adapter.generate(messages, params)

    (sent,) = seam.seen
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers  # no key configured, none sent
    assert sent.body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
        ],
        "temperature": 0.3,
        "max_tokens": 64,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["END"],
    }
    assert completion.text == "Hello there."
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(prompt_tokens=9, completion_tokens=3, total_tokens=12)
    assert completion.usage.estimated is False
    assert completion.attempts == 1
    assert completion.timings.ttft_s is None and completion.timings.inter_token_s == ()


async def test_chat_stream(seam: Seam) -> None:
    adapter = await seam.adapter(
        OpenAICompatibleAdapter, sequence(chat_stream("Hel", "lo", " there.")), stream=True
    )
    completion = await adapter.generate(HI, GenerationParams())

    (sent,) = seam.seen
    assert sent.path == "/v1/chat/completions"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert completion.text == "Hello there."
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(prompt_tokens=9, completion_tokens=3, total_tokens=12)
    assert completion.timings.ttft_s is not None and completion.timings.ttft_s >= 0
    assert len(completion.timings.inter_token_s) == 2  # three pieces, two gaps
    assert completion.timings.total_s >= completion.timings.ttft_s


async def test_a_500_is_retried_then_answered(seam: Seam) -> None:
    adapter = await seam.adapter(
        OpenAICompatibleAdapter, sequence(api_error(500, "try later"), chat_reply("Recovered."))
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "Recovered."
    assert completion.attempts == 2
    assert len(seam.seen) == 2 and seam.seen[0].body == seam.seen[1].body
    assert len(seam.sleeps) == 1 and seam.sleeps[0] > 0


# -- OpenAI-compatible details ------------------------------------------------------


async def test_stream_without_usage_chunk_estimates_usage(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(chat_stream("Hello", " world", usage=False)), stream=True
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "Hello world"
    assert completion.usage.estimated is True
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    assert (
        completion.usage.total_tokens
        == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


async def test_stream_hands_each_piece_to_on_text(http: Seam) -> None:
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(chat_stream("a", "b", "c")))
    pieces: list[str] = []
    completion = await adapter.stream(HI, GenerationParams(), pieces.append)
    assert pieces == ["a", "b", "c"]
    assert completion.text == "abc"
    assert http.seen[0].body["stream"] is True  # stream() streams without stream=true


async def test_legacy_completions_endpoint(http: Seam) -> None:
    answer = Reply(
        body={
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "m",
            "choices": [
                {"text": " Paris.", "index": 0, "logprobs": None, "finish_reason": "length"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(answer), endpoint="completions")
    lone = await adapter.generate(
        [Message(role="user", content="The capital of France is")], GenerationParams(max_tokens=5)
    )
    assert lone.text == " Paris." and lone.finish_reason == "length"
    assert lone.usage.total_tokens == 7
    first = http.seen[0]
    assert first.path == "/v1/completions"
    assert first.body == {"model": "m", "prompt": "The capital of France is", "max_tokens": 5}
    assert "messages" not in first.body

    await adapter.generate(
        [
            Message(role="system", content="Answer in one word."),
            Message(role="user", content="Capital of France?"),
            Message(role="assistant", content="Paris."),
            Message(role="user", content="And of Italy?"),
        ],
        GenerationParams(),
    )
    prompt = http.seen[1].body["prompt"]
    assert prompt == (
        "System: Answer in one word.\n\nUser: Capital of France?\n\n"
        "Assistant: Paris.\n\nUser: And of Italy?\n\nAssistant:"
    )


async def test_legacy_completions_stream(http: Seam) -> None:
    chunks = [
        {"choices": [{"text": "Par", "index": 0, "finish_reason": None}]},
        {"choices": [{"text": "is", "index": 0, "finish_reason": "stop"}]},
    ]
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(Reply(chunks=data_lines(*chunks))),
        endpoint="completions",
        stream="true",
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "Paris" and completion.finish_reason == "stop"
    assert completion.usage.estimated is True
    assert len(completion.timings.inter_token_s) == 1


async def test_compatible_server_gets_a_key_only_when_one_is_configured(http: Seam) -> None:
    bare = await http.adapter(OpenAICompatibleAdapter, sequence(chat_reply()), env={})
    await bare.generate(HI, GenerationParams())
    assert "authorization" not in http.seen[-1].headers

    # OPENAI_API_KEY, when set, is the fallback, as the OpenAI SDK and vLLM's tools read it
    env = {"OPENAI_API_KEY": "sk-openai-real"}
    plain = await http.adapter(OpenAICompatibleAdapter, sequence(chat_reply()), env=env)
    await plain.generate(HI, GenerationParams())
    assert http.seen[-1].headers["authorization"] == "Bearer sk-openai-real"

    keyed = await http.adapter(OpenAICompatibleAdapter, sequence(chat_reply()), api_key="sk-local")
    await keyed.generate(HI, GenerationParams())
    assert http.seen[-1].headers["authorization"] == "Bearer sk-local"

    named = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(chat_reply()),
        env={"VLLM_KEY": "sk-vllm"},
        api_key_env="VLLM_KEY",
    )
    await named.generate(HI, GenerationParams())
    assert http.seen[-1].headers["authorization"] == "Bearer sk-vllm"

    with pytest.raises(ConfigError, match="VLLM_KEY"):
        await http.adapter(OpenAICompatibleAdapter, sequence(chat_reply()), api_key_env="VLLM_KEY")


async def test_openai_needs_its_key(http: Seam) -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        await http.adapter(OpenAIAdapter, sequence(chat_reply()), model="gpt-4o-mini", env={})
    assert http.seen == []


async def test_openai_sends_the_key_to_api_openai_com(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAIAdapter,
        sequence(chat_reply()),
        model="gpt-4o-mini",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    assert adapter.model_info().model_id == "openai/gpt-4o-mini"
    await adapter.generate(HI, GenerationParams())
    (sent,) = http.seen
    assert sent.url == "https://api.openai.com/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "gpt-4o-mini"


# -- Anthropic ----------------------------------------------------------------------


async def test_anthropic_request_and_answer(http: Seam) -> None:
    answer = Reply(
        body={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-3-5-haiku-20241022",
            "content": [{"type": "text", "text": "Hi! "}, {"type": "text", "text": "Sure."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 6},
        }
    )
    adapter = await http.adapter(
        AnthropicAdapter,
        sequence(answer),
        model="claude-3-5-haiku-20241022",
        env={"ANTHROPIC_API_KEY": "sk-ant-test"},
    )
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="system", content="Be kind."),
        Message(role="user", content="Hi."),
        Message(role="user", content="Can you help?"),
        Message(role="assistant", content="Yes."),
        Message(role="user", content="Thanks."),
    ]
    completion = await adapter.generate(
        messages, GenerationParams(temperature=0.2, top_p=0.5, stop=("\n\nHuman:",))
    )
    (sent,) = http.seen
    assert sent.url == "https://api.anthropic.com/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.body == {
        "model": "claude-3-5-haiku-20241022",
        "max_tokens": 1024,  # required by the API: the default when the turn sets none
        "system": "Be brief.\n\nBe kind.",
        "messages": [
            {"role": "user", "content": "Hi.\n\nCan you help?"},
            {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": "Thanks."},
        ],
        "temperature": 0.2,
        "top_p": 0.5,
        "stop_sequences": ["\n\nHuman:"],
    }
    assert completion.text == "Hi! Sure."
    assert completion.finish_reason == "end_turn"
    assert completion.usage == Usage(prompt_tokens=12, completion_tokens=6, total_tokens=18)

    await adapter.generate(HI, GenerationParams(max_tokens=50))
    assert http.seen[-1].body["max_tokens"] == 50
    assert "system" not in http.seen[-1].body


async def test_anthropic_needs_its_key(http: Seam) -> None:
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        await http.adapter(AnthropicAdapter, sequence(Reply(body={})), model="claude-3-haiku")


async def test_anthropic_stream(http: Seam) -> None:
    adapter = await http.adapter(
        AnthropicAdapter,
        sequence(anthropic_stream("Hello", ", ", "world")),
        env={"ANTHROPIC_API_KEY": "k"},
        stream=True,
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert http.seen[0].body["stream"] is True
    assert completion.text == "Hello, world"
    assert completion.finish_reason == "end_turn"
    # input from message_start, output from message_delta
    assert completion.usage == Usage(prompt_tokens=25, completion_tokens=15, total_tokens=40)
    assert completion.timings.ttft_s is not None
    assert len(completion.timings.inter_token_s) == 2


async def test_anthropic_overloaded_mid_stream_is_retried(http: Seam) -> None:
    adapter = await http.adapter(
        AnthropicAdapter,
        sequence(anthropic_stream("Hel", error="overloaded_error"), anthropic_stream("Hello")),
        env={"ANTHROPIC_API_KEY": "k"},
        stream=True,
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "Hello"  # nothing of the failed attempt is kept
    assert completion.attempts == 2 and len(http.sleeps) == 1


async def test_anthropic_overloaded_every_time_is_a_server_error(http: Seam) -> None:
    adapter = await http.adapter(
        AnthropicAdapter,
        sequence(anthropic_stream(error="overloaded_error")),
        env={"ANTHROPIC_API_KEY": "k"},
        stream=True,
        max_retries=2,
    )
    with pytest.raises(ServerError, match="overloaded_error") as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.attempts == 3 and len(http.seen) == 3


async def test_a_failure_after_delivered_text_is_final_and_keeps_its_cause(http: Seam) -> None:
    adapter = await http.adapter(
        AnthropicAdapter,
        sequence(anthropic_stream("Hel", error="overloaded_error"), anthropic_stream("Hello")),
        env={"ANTHROPIC_API_KEY": "k"},
    )
    pieces: list[str] = []
    with pytest.raises(ServerError) as info:
        await adapter.stream(HI, GenerationParams(), pieces.append)
    assert pieces == ["Hel"]
    assert http.sleeps == []  # final: not retried, so no back-off either
    assert info.value.attempts == 1
    assert "overloaded_error" in str(info.value)


# -- the guide's custom backend -----------------------------------------------------


async def test_custom_http_generate(http: Seam) -> None:
    answer = Reply(
        body={
            "choices": [{"text": "42", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
        }
    )
    adapter = await http.adapter(
        CustomHttpAdapter,
        sequence(answer),
        model_name="my-llm",
        api_endpoint="http://custom.test/api",
        env={"CONVSIM_HTTP_API_KEY": "custom-key"},
    )
    completion = await adapter.generate(
        [Message(role="user", content="6 times 7?")],
        GenerationParams(temperature=0.1, max_tokens=8, top_p=0.95, stop=("\n",)),
    )
    (sent,) = http.seen
    assert sent.url == "http://custom.test/api/generate"
    assert sent.headers["authorization"] == "Bearer custom-key"
    assert sent.body == {
        "model": "my-llm",
        "prompt": "6 times 7?",
        "max_tokens": 8,
        "temperature": 0.1,
        "top_p": 0.95,
        "stop": ["\n"],
    }
    assert completion.text == "42" and completion.finish_reason == "length"
    assert completion.usage == Usage(prompt_tokens=4, completion_tokens=1, total_tokens=5)
    assert adapter.model_info().model_id == "custom/my-llm"


async def test_custom_http_fills_in_the_guides_defaults(http: Seam) -> None:
    adapter = await http.adapter(
        CustomHttpAdapter,
        sequence(Reply(body={"choices": [{"text": "ok"}]})),
        base_url="http://custom.test",
    )
    completion = await adapter.generate(HI, GenerationParams())
    body = http.seen[0].body
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stop"]) == (
        1024,
        0.7,
        1.0,
        [],
    )
    assert "authorization" not in http.seen[0].headers
    assert completion.finish_reason == "stop" and completion.usage.estimated is True


async def test_custom_http_does_not_stream(http: Seam) -> None:
    with pytest.raises(ConfigError, match="stream"):
        await http.adapter(
            CustomHttpAdapter, sequence(Reply(body={})), base_url="http://c.test", stream="true"
        )
    adapter = await http.adapter(CustomHttpAdapter, sequence(Reply(body={})), base_url="http://c")
    with pytest.raises(ConfigError):
        await adapter.stream(HI, GenerationParams(), lambda text: None)
    assert http.seen == []


# -- errors: typed, classified, retried or not --------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "retried"),
    [
        (400, BadRequest, False),
        (404, BadRequest, False),
        (422, BadRequest, False),
        (401, AuthError, False),
        (403, AuthError, False),
        (408, Timeout, True),
        (409, ServerError, True),
        (500, ServerError, True),
        (502, ServerError, True),
        (503, ServerError, True),
    ],
)
async def test_status_codes_map_to_typed_errors(
    http: Seam, status: int, error: type[Exception], retried: bool
) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(api_error(status, "went wrong")), max_retries=2
    )
    with pytest.raises(error) as info:
        await adapter.generate(HI, GenerationParams())
    attempts = 3 if retried else 1
    assert type(info.value) is error
    assert info.value.attempts == attempts == len(http.seen)
    assert len(http.sleeps) == attempts - 1
    assert info.value.status_code == status
    assert "went wrong" in str(info.value)  # the API's own message is kept


async def test_429_waits_at_least_retry_after(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(api_error(429, "slow down", {"Retry-After": "2"}), chat_reply("ok")),
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "ok" and completion.attempts == 2
    assert len(http.sleeps) == 1 and http.sleeps[0] >= 2
    stats = adapter.budget().statistics()
    assert stats.rate_limited == 1


async def test_429_every_time_is_rate_limited_with_retry_after(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(api_error(429, "slow down", {"Retry-After": "3"})),
        max_retries=1,
    )
    with pytest.raises(RateLimited) as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.retry_after == 3.0 and info.value.attempts == 2
    assert http.sleeps and all(s >= 3 for s in http.sleeps)


async def test_a_429_pause_uses_the_adapters_sleep(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(api_error(429, "slow down", {"Retry-After": "2"}), chat_reply("ok")),
        budgets=Budgets(),  # what a Simulator or a plain adapter uses
    )
    with anyio.fail_after(0.3):  # Retry-After is 2 s: only a real sleep takes this long
        completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "ok"
    assert sum(http.sleeps) >= 2  # every wait went through the injected sleep


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_key_echoed_in_a_stream_error_is_scrubbed(http: Seam, api: str) -> None:
    echo = f"invalid key {SECRET}"
    if api == "openai":
        reply = Reply(chunks=data_lines({"error": {"message": echo}}))
        cls: type[HttpModelAdapter] = OpenAICompatibleAdapter
    else:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": echo}}
        reply = Reply(chunks=events(("error", error)))
        cls = AnthropicAdapter
    adapter = await http.adapter(cls, sequence(reply), api_key=SECRET, stream=True, max_retries=0)
    with pytest.raises((ProtocolError, ServerError)) as info:
        await adapter.generate(HI, GenerationParams())
    assert "invalid key" in str(info.value) + getattr(info.value, "snippet", "")
    assert SECRET not in str(info.value)
    assert SECRET not in getattr(info.value, "snippet", "")


async def test_malformed_json_is_a_retried_malformed_response(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(Reply(body=b"<html>502 Bad Gateway</html>")),
        max_retries=2,
    )
    with pytest.raises(MalformedResponse) as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.snippet == "<html>502 Bad Gateway</html>"
    assert info.value.infrastructure and isinstance(info.value, ProtocolError)
    assert info.value.attempts == 3 and len(http.seen) == 3 and len(http.sleeps) == 2


async def test_json_of_the_wrong_shape_is_a_malformed_response(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(Reply(body={"choices": []})), max_retries=0
    )
    with pytest.raises(MalformedResponse) as info:
        await adapter.generate(HI, GenerationParams())
    assert '"choices"' in info.value.snippet and info.value.attempts == 1


def failing(exc: type[httpx.TransportError]) -> Handler:
    def handler(seen: Seen) -> Reply:
        raise exc("the network is down", request=seen.raw)

    return handler


async def test_a_connection_error_is_a_retried_server_error(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, failing(httpx.ConnectError), max_retries=2
    )
    with pytest.raises(ServerError) as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.status_code is None and info.value.attempts == 3
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert len(http.sleeps) == 2


async def test_a_connection_error_then_success(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(failing(httpx.ConnectError), chat_reply("up again"))
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "up again" and completion.attempts == 2


async def test_a_read_timeout_is_a_retried_timeout(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, failing(httpx.ReadTimeout), max_retries=1, stream=True
    )
    with pytest.raises(Timeout) as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.attempts == 2 and len(http.seen) == 2


async def test_a_stream_cut_short_is_a_retried_server_error(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(chat_stream("Hel", done=False), chat_stream("Hello")),
        stream=True,
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "Hello" and completion.attempts == 2

    cut = await http.adapter(
        OpenAICompatibleAdapter, sequence(chat_stream("Hel", done=False)), stream=True
    )
    with pytest.raises(ServerError, match="ended before it was complete") as info:
        await cut.generate(HI, GenerationParams())
    assert info.value.attempts == 4  # max_retries defaults to 3


async def test_an_error_status_on_a_stream_is_typed_too(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(api_error(401, "bad key")), stream=True
    )
    with pytest.raises(AuthError, match="bad key") as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.attempts == 1


# -- secrets stay out of results and logs -------------------------------------------


@pytest.fixture
def debug_logs() -> Iterator[list[dict[str, Any]]]:
    """Every structlog event down to DEBUG, as dicts; the tests' WARNING level after."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def small_pack(tmp_path: Path, n: int = 2) -> Path:
    return write_pack(
        tmp_path / "pack",
        {
            "default": {
                "turns": [
                    {"turn_id": "ask", "prompt_template": "Tell me about {topic}."},
                    {"turn_id": "more", "depends_on": ["ask"], "prompt_template": "More."},
                ]
            }
        },
        [
            {
                "scenario_id": f"s{i}",
                "scenario_description": f"scenario {i}",
                "variables": {"topic": f"topic {i}"},
            }
            for i in range(n)
        ],
    )


def all_text(out: Path) -> str:
    manifest = out.with_name(out.name.removesuffix(".jsonl") + ".manifest.json")
    return out.read_text(encoding="utf-8") + manifest.read_text(encoding="utf-8")


async def test_the_api_key_never_reaches_results_or_logs(
    http: Seam, tmp_path: Path, debug_logs: list[dict[str, Any]]
) -> None:
    def handler(seen: Seen) -> Reply:
        if seen.body["messages"][-1]["content"] == "Tell me about topic 1.":
            return api_error(401, "invalid key")  # s1 fails: its error is in the results
        return chat_reply("An answer.")

    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(api_error(503, "busy"), handler),
        api_key=SECRET,
    )
    out = tmp_path / "out.jsonl"
    async with Simulator(adapter, metrics=[]) as sim:
        results = [r async for r in sim.run(small_pack(tmp_path), sink=JsonlSink(out))]

    assert http.seen and all(s.headers["authorization"] == f"Bearer {SECRET}" for s in http.seen)
    statuses = {r.conversation_id: r.status for r in results}
    assert statuses == {"s0": Status.DONE, "s1": Status.FAILED}
    assert any(e["event"] == "model_call_retry" for e in debug_logs)  # logs were captured
    assert SECRET not in repr(debug_logs)
    assert SECRET not in all_text(out)
    assert SECRET not in "".join(r.model_dump_json() for r in results)
    assert SECRET not in repr(adapter.config)


async def test_manifest_redacts_a_key_given_as_a_model_arg(http: Seam, tmp_path: Path) -> None:
    registry = ADAPTERS.copy()
    transport = http.mock_transport(sequence(chat_reply()))
    registry.register(
        "openai-compatible",
        lambda config: OpenAICompatibleAdapter(config, transport=transport, env={}),
        replace=True,
    )
    out = tmp_path / "out.jsonl"
    async with Simulator(
        "openai-compatible:m",
        model_args={"base_url": "http://llm.test/v1", "api_key": SECRET},
        adapter_registry=registry,
        metrics=[],
    ) as sim:
        handle = sim.run(small_pack(tmp_path, n=1), sink=JsonlSink(out))
        (result,) = [r async for r in handle]
    assert result.status is Status.DONE
    assert http.seen[0].headers["authorization"] == f"Bearer {SECRET}"
    assert handle.manifest is not None
    assert handle.manifest.settings["model_args"] == {
        "api_key": "***",
        "base_url": "http://llm.test/v1",
    }
    assert SECRET not in all_text(out)


async def test_a_key_echoed_by_the_server_is_scrubbed(
    http: Seam, tmp_path: Path, debug_logs: list[dict[str, Any]]
) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(api_error(503, f"key {SECRET} is over quota")),
        api_key=SECRET,
        max_retries=1,
    )
    out = tmp_path / "out.jsonl"
    async with Simulator(adapter, metrics=[]) as sim:
        (result,) = [r async for r in sim.run(small_pack(tmp_path, n=1), sink=JsonlSink(out))]
    assert result.status is Status.FAILED
    assert SECRET not in repr(debug_logs)
    assert SECRET not in all_text(out)


PATH_KEY = "pk9f8e7d6c5b4a3f2e1d0"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_key_echoed_in_an_answer_is_not_recorded(
    http: Seam, tmp_path: Path, stream: bool
) -> None:
    """The API key, and a key inside base_url, repeated by the model in a successful
    answer are blanked from the completion and so from the results file."""
    said = f"Your key is {SECRET}, and the URL key {PATH_KEY}; bye."
    reply = chat_stream(said[:20], said[20:]) if stream else chat_reply(said)
    adapter = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(reply),
        base_url=f"http://llm.test/v1/{PATH_KEY}",
        api_key=SECRET,
        stream=stream,
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "Your key is ***, and the URL key ***; bye."
    out = tmp_path / "out.jsonl"
    async with Simulator(adapter, metrics=[]) as sim:
        (result,) = [r async for r in sim.run(small_pack(tmp_path, n=1), sink=JsonlSink(out))]
    assert result.status is Status.DONE and "Your key is ***" in all_text(out)
    assert SECRET not in all_text(out) and PATH_KEY not in all_text(out)


async def test_an_answer_without_known_secrets_is_left_as_it_is(http: Seam) -> None:
    text = "sk-secret-12 is close to the key, but not it"
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(chat_reply(text)), api_key=SECRET
    )
    assert (await adapter.generate(HI, GenerationParams())).text == text


# -- cost -----------------------------------------------------------------------------


async def test_estimate_cost_from_the_pricing_file(http: Seam) -> None:
    env = {"OPENAI_API_KEY": "sk-test"}
    mini = await http.adapter(OpenAIAdapter, sequence(chat_reply()), model="gpt-4o-mini", env=env)
    cost = mini.estimate_cost(Usage(prompt_tokens=1_000_000, completion_tokens=2_000_000))
    assert cost is not None
    assert cost.prompt_cost == pytest.approx(0.15)
    assert cost.completion_cost == pytest.approx(1.2)
    assert cost.total_cost == pytest.approx(1.35) and cost.currency == "USD"

    # a dated snapshot takes its family's price (the longest listed prefix)
    snapshot = await http.adapter(
        OpenAIAdapter, sequence(chat_reply()), model="gpt-4o-mini-2024-07-18", env=env
    )
    dated = snapshot.estimate_cost(Usage(prompt_tokens=1_000_000))
    assert dated is not None and dated.total_cost == pytest.approx(0.15)

    haiku = await http.adapter(
        AnthropicAdapter,
        sequence(chat_reply()),
        model="claude-3-5-haiku-20241022",
        env={"ANTHROPIC_API_KEY": "k"},
    )
    priced = haiku.estimate_cost(Usage(prompt_tokens=500_000, completion_tokens=100_000))
    assert priced is not None and priced.total_cost == pytest.approx(0.4 + 0.4)


async def test_estimate_cost_overrides_and_unknown_models(http: Seam) -> None:
    unknown = await http.adapter(OpenAICompatibleAdapter, sequence(chat_reply()), model="local")
    assert unknown.estimate_cost(Usage(prompt_tokens=10, completion_tokens=10)) is None
    half = await http.adapter(
        OpenAICompatibleAdapter, sequence(chat_reply()), model="local", input_price="1"
    )
    assert half.estimate_cost(Usage(prompt_tokens=10)) is None  # no output price: no guess

    priced = await http.adapter(
        OpenAICompatibleAdapter,
        sequence(chat_reply()),
        model="local",
        input_price=2.0,
        output_price=8.0,
    )
    cost = priced.estimate_cost(Usage(prompt_tokens=250_000, completion_tokens=500_000))
    assert cost is not None
    assert (cost.prompt_cost, cost.completion_cost) == (pytest.approx(0.5), pytest.approx(4.0))

    overridden = await http.adapter(
        OpenAIAdapter,
        sequence(chat_reply()),
        model="gpt-4o-mini",
        env={"OPENAI_API_KEY": "k"},
        input_price=0,
        output_price=0,
    )
    free = overridden.estimate_cost(Usage(prompt_tokens=10**6, completion_tokens=10**6))
    assert free is not None and free.total_cost == 0.0


async def test_conversation_cost_is_filled_by_the_simulator(http: Seam, tmp_path: Path) -> None:
    answer = Reply(
        body={
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500},
        }
    )
    adapter = await http.adapter(
        OpenAIAdapter, sequence(answer), model="gpt-4o-mini", env={"OPENAI_API_KEY": "k"}
    )
    async with Simulator(adapter, metrics=[]) as sim:
        (result,) = [r async for r in sim.run(small_pack(tmp_path, n=1))]
    assert result.status is Status.DONE
    assert result.usage.total_tokens == 3000
    assert result.cost_usd == pytest.approx(2 * (1000 * 0.15 + 500 * 0.6) / 1e6)
    assert result.user_cost_usd is None


# -- configuration --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"no_such_setting": 1}, "no_such_setting"),
        ({"concurrency": 0}, "concurrency"),
        ({"stream": "maybe"}, "stream"),
        ({"top_p": 0}, "top_p"),
        ({"http": "curl"}, "http"),
        ({"model": ""}, "model"),
    ],
)
async def test_bad_config_is_refused_before_any_request(
    http: Seam, config: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        await http.adapter(OpenAICompatibleAdapter, sequence(chat_reply()), **config)
    assert http.seen == []


async def test_cli_strings_are_accepted(http: Seam) -> None:
    args = parse_model_args(["stream=true", "temperature=0.5", "max_tokens=20", "max_retries=0"])
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(chat_stream("hi")), **args)
    assert adapter.config.stream is True and adapter.config.max_retries == 0
    assert adapter.default_config() == GenerationParams(temperature=0.5, max_tokens=20)
    completion = await adapter.generate(HI, adapter.default_config())
    assert completion.text == "hi"
    assert http.seen[0].body["stream"] is True
    assert (http.seen[0].body["temperature"], http.seen[0].body["max_tokens"]) == (0.5, 20)


def test_a_compatible_server_needs_a_base_url() -> None:
    with pytest.raises(ConfigError, match="base_url"):
        OpenAICompatibleAdapter({"model": "m"}, env={})


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("127.0.0.1:8000/v1", "has no scheme (http:// or https://): did you mean "
         "http://127.0.0.1:8000/v1?"),
        ("localhost:8000/v1", "did you mean http://localhost:8000/v1?"),
        ("http//localhost:8000/v1", "has no scheme"),
        ("http://localhost:99999/v1", "has an invalid port '99999' (a number from 1 to 65535)"),
        ("http://localhost:0/v1", "has port 0"),
        ("http://localhost:80a/v1", "has an invalid port '80a'"),
        ("file:///tmp/model.sock", "uses file:// where convsim speaks http:// or https:// only"),
        ("unix:///var/run/llm.sock", "uses unix://"),
        ("http:///v1", "has no host"),
        ("http://[::1/v1", "is not a URL"),
        ("http://my host/v1", "has an invalid host 'my host'"),
    ],
)  # fmt: skip
def test_a_base_url_no_request_could_reach_is_refused_naming_the_field(
    url: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        create_adapter("openai-compatible:m", {"base_url": url})
    message = str(info.value)
    assert message.startswith(f"invalid openai-compatible model: base_url: {url!r} ")
    assert problem in message and "http://HOST:PORT/v1" in message
    # the guide's custom backend checks its api_endpoint the same way, under that name
    with pytest.raises(ConfigError, match=f"api_endpoint: {re.escape(repr(url))} "):
        create_adapter("http:m", {"api_endpoint": url})


def test_a_refused_base_url_shows_no_credentials() -> None:
    with pytest.raises(ConfigError) as info:
        create_adapter("openai-compatible:m", {"base_url": "http://u:sk-inurl-1@h:99999/v1"})
    assert "sk-inurl-1" not in str(info.value) and "'http://***@h:99999/v1'" in str(info.value)


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("  http://127.0.0.1:8000/v1 ", "http://127.0.0.1:8000/v1"),
        ("HTTP://[::1]:8000/v1", "HTTP://[::1]:8000/v1"),
        ("https://u:pw@h.example:443/openai?api-version=2024-06", None),
    ],
)
def test_good_base_urls_pass(url: str, kept: str | None) -> None:
    adapter = create_adapter("openai-compatible:m", {"base_url": url})
    assert adapter.base_url == (kept if kept is not None else url)


def test_convsim_run_refuses_a_base_url_without_a_scheme_before_any_conversation(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run", "customer_support", "--model", "openai-compatible:x",
            "--model-arg", "base_url=127.0.0.1:8000/v1", "--out", str(tmp_path / "r.jsonl"),
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "base_url" in lines[0]
    assert "did you mean http://127.0.0.1:8000/v1?" in lines[0]
    assert not (tmp_path / "r.jsonl").exists()


# -- the registry ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "args", "cls"),
    [
        ("openai-compatible:m", {"base_url": "http://127.0.0.1:9/v1"}, OpenAICompatibleAdapter),
        ("openai:gpt-4o-mini", {"api_key": "sk-test"}, OpenAIAdapter),
        ("anthropic:claude-3-5-haiku", {"api_key": "k"}, AnthropicAdapter),
        ("http:my-llm", {"api_endpoint": "http://127.0.0.1:9"}, CustomHttpAdapter),
    ],
)
async def test_create_adapter_builds_the_registered_class(
    spec: str, args: dict[str, str], cls: type[HttpModelAdapter]
) -> None:
    adapter = create_adapter(spec, args)
    try:
        assert type(adapter) is cls
        assert isinstance(adapter, HttpModelAdapter)
        assert adapter.config.model == spec.partition(":")[2]
    finally:
        await adapter.aclose()


def test_an_unknown_model_type_lists_the_known_ones() -> None:
    with pytest.raises(RegistryError) as info:
        create_adapter("no-such-type:m")
    for name in ("openai", "openai-compatible", "anthropic", "http", "scripted"):
        assert name in info.value.known


async def test_anthropic_stream_keeps_the_cache_reads_of_message_start(http: Seam) -> None:
    """message_delta's usage has no cache fields: merging it keeps message_start's."""
    reply = anthropic_stream("Hello")
    assert isinstance(reply.chunks, list)
    reply.chunks[0] = reply.chunks[0].replace(
        b'"input_tokens": 25', b'"input_tokens": 5, "cache_read_input_tokens": 20'
    )
    adapter = await http.adapter(
        AnthropicAdapter, sequence(reply), env={"ANTHROPIC_API_KEY": "k"}, stream=True
    )
    completion = await adapter.generate(HI, GenerationParams())
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (25, 15)
    assert (usage.cached_tokens, usage.cached_prompt_tokens) == (20, 20)
