"""Answers are read within size limits: an endless body, an endless server-sent line or
event, and a gzip bomb each fail their call at the limit, with an error that names the
setting to raise, and the adapter never holds much more than the limit.

A local aiohttp server on 127.0.0.1 sends them; every HTTP seam (aiohttp, httpx and
the lean one) reads them. How much was read is counted in the bytes each seam hands over (after
decompression), not timed.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import pytest
from aiohttp import web

from convsim import ConfigError, ResponseTooLarge
from convsim.adapters import GenerationParams, Message, create_adapter
from convsim.adapters._http import (
    AiohttpTransport,
    HttpTimeouts,
    HttpTransport,
    HttpxTransport,
    SSEDecoder,
    StreamResponse,
)
from convsim.adapters._lean_http import LeanTransport
from convsim.adapters._openai import OpenAICompatibleAdapter

pytestmark = pytest.mark.anyio

HI = [Message(role="user", content="hi")]
MIB = 2**20
BODY_LIMIT = MIB
EVENT_LIMIT = 64 * 1024
SENT_AT_MOST = 256 * MIB
"""The server gives up after this much, so a client that never stops fails the test
instead of hanging it."""


@functools.cache
def gzip_bomb(size: int = 32 * MIB) -> bytes:
    """``size`` zero bytes, gzip-compressed (about a thousandth of that)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(MIB)
    return b"".join(compressor.compress(zeros) for _ in range(size // MIB)) + compressor.flush()


Writer = Callable[[web.StreamResponse], Awaitable[None]]


async def forever(response: web.StreamResponse, piece: bytes, head: bytes = b"") -> None:
    sent = 0
    if head:
        await response.write(head)
    while sent < SENT_AT_MOST:
        await response.write(piece)
        sent += len(piece)


ANSWERS: dict[str, tuple[Mapping[str, str], Writer]] = {
    "endless body": (
        {"Content-Type": "application/json"},
        lambda r: forever(r, b"x" * 65536, head=b'{"choices": [{"message": {"content": "'),
    ),
    "endless SSE line": (
        {"Content-Type": "text/event-stream"},
        lambda r: forever(r, b"x" * 4096, head=b'data: {"choices": [{"delta": {"content": "'),
    ),
    "endless SSE event": (
        {"Content-Type": "text/event-stream"},
        lambda r: forever(r, b"data: " + b"x" * 1000 + b"\n"),
    ),
    "endless stream": (
        {"Content-Type": "text/event-stream"},
        lambda r: forever(
            r, b'data: {"choices": [{"delta": {"content": "' + b"word " * 400 + b'"}}]}\n\n'
        ),
    ),
}


async def send_bomb(response: web.StreamResponse) -> None:
    bomb = gzip_bomb()
    for start in range(0, len(bomb), 4096):
        await response.write(bomb[start : start + 4096])


ANSWERS["gzip bomb"] = (
    {"Content-Type": "application/json", "Content-Encoding": "gzip"},
    send_bomb,
)
ANSWERS["gzip bomb, streamed"] = (
    {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"},
    send_bomb,
)


@asynccontextmanager
async def listening(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1; yields its URL."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serving() -> AsyncIterator[str]:
    """Each answer of ANSWERS at /<index>/v1/chat/completions; yields the server's URL."""

    async def respond(request: web.Request) -> web.StreamResponse:
        await request.read()
        headers, write = list(ANSWERS.values())[int(request.match_info["index"])]
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        with suppress(ConnectionError):  # the client stopped reading and hung up
            await write(response)
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{index}/v1/chat/completions", respond)
    async with listening(app) as url:
        yield url


class _Counted:
    def __init__(self, response: StreamResponse, counter: Counting) -> None:
        self._response, self._counter = response, counter
        self.status, self.headers = response.status, response.headers

    async def read(self) -> bytes:
        return await self._response.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.chunks():
            self._counter.read += len(chunk)
            self._counter.largest = max(self._counter.largest, len(chunk))
            yield chunk


class Counting:
    """A seam around another that counts the body bytes it hands to the adapter."""

    def __init__(self, inner: HttpTransport) -> None:
        self.inner = inner
        self.read = 0
        self.largest = 0

    async def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> Any:
        raise AssertionError("adapters read every answer as a stream, within limits")

    @asynccontextmanager
    async def stream(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> AsyncIterator[StreamResponse]:
        async with self.inner.stream(url, payload, headers, timeouts) as response:
            yield _Counted(response, self)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def server(anyio_backend: str) -> AsyncIterator[str]:
    async with serving() as url:
        yield url


SEAMS: dict[str, Callable[..., HttpTransport]] = {
    "aiohttp": AiohttpTransport,
    "httpx": HttpxTransport,
    "lean": LeanTransport,
}


@pytest.mark.parametrize("seam", list(SEAMS))
@pytest.mark.parametrize("answer", list(ANSWERS))
async def test_an_oversized_answer_fails_its_call_at_the_limit(
    server: str, seam: str, answer: str
) -> None:
    index = list(ANSWERS).index(answer)
    counting = Counting(SEAMS[seam]())
    adapter = OpenAICompatibleAdapter(
        {
            "model": "m",
            "base_url": f"{server}/{index}/v1",
            "stream": "stream" in answer or "SSE" in answer,
            "max_body_bytes": BODY_LIMIT,
            "max_event_bytes": EVENT_LIMIT,
            "max_retries": 2,
        },
        transport=counting,
        env={},
    )
    try:
        with anyio.fail_after(20):  # a guard against a hang, not the measure
            with pytest.raises(ResponseTooLarge) as info:
                await adapter.generate(HI, GenerationParams())
    finally:
        await adapter.aclose()
    error = info.value
    setting = "max_event_bytes" if "SSE" in answer else "max_body_bytes"
    if answer == "gzip bomb, streamed" and counting.largest <= BODY_LIMIT:
        setting = "max_event_bytes"  # zeros in small pieces: one endless line
    limit = EVENT_LIMIT if setting == "max_event_bytes" else BODY_LIMIT
    assert (error.setting, error.limit) == (setting, limit)
    assert f"--model-arg {setting}=" in str(error) and f"{setting}={limit}" in str(error)
    assert error.attempts == 1 and error.infrastructure and not error.retryable
    # read: the limit and at most the piece that crossed it
    assert counting.read <= limit + counting.largest
    if seam != "httpx":  # it decompresses in pieces, and stops reading when it holds a few
        assert counting.largest <= 2 * MIB
    assert counting.read < 40 * MIB  # never the whole bomb (32 MiB) twice, nor the stream


async def test_an_error_body_is_read_only_in_part(server: str) -> None:
    calls: list[int] = []

    async def endless_error(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        response = web.StreamResponse(status=503, headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        with suppress(ConnectionError):  # the client stopped reading and hung up
            await forever(response, b"overloaded " * 1000)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless_error)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    counting = Counting(AiohttpTransport())
    adapter = OpenAICompatibleAdapter(
        {
            "model": "m",
            "base_url": f"http://127.0.0.1:{runner.addresses[0][1]}/v1",
            "max_retries": 0,
        },
        transport=counting,
        env={},
    )
    try:
        with anyio.fail_after(20):
            with pytest.raises(Exception, match="503") as info:
                await adapter.generate(HI, GenerationParams())
    finally:
        await adapter.aclose()
        await runner.cleanup()
    assert type(info.value).__name__ == "ServerError"  # the status, not the size
    assert counting.read <= 64 * 1024 + counting.largest


def test_sse_decoder_limits_a_line_and_an_event() -> None:
    decoder = SSEDecoder(max_event_bytes=1024)
    assert decoder.feed(b"data: " + b"x" * 1000 + b"\n\n")[0].data == "x" * 1000
    for _ in range(3):  # a line arriving in pieces is counted as a whole
        decoder.feed(b"y" * 300)
    with pytest.raises(ResponseTooLarge, match="max_event_bytes=1024"):
        decoder.feed(b"y" * 300)

    decoder = SSEDecoder(max_event_bytes=1024)
    decoder.feed(b"data: " + b"x" * 600 + b"\n")
    with pytest.raises(ResponseTooLarge):  # two data lines of one event, 1200 bytes
        decoder.feed(b"data: " + b"x" * 600 + b"\n")


def test_sse_decoder_still_parses_events_split_anywhere() -> None:
    stream = b"\xef\xbb\xbfevent: a\r\ndata: 1\n\n: keep-alive\n\ndata: 2\ndata: 3\n\n"
    for size in (1, 2, 3, 7, len(stream)):
        decoder = SSEDecoder(max_event_bytes=1024)
        events = []
        for start in range(0, len(stream), size):
            events += decoder.feed(stream[start : start + size])
        assert [(e.event, e.data) for e in events] == [("a", "1"), (None, "2\n3")]


def test_the_limits_are_adapter_arguments() -> None:
    adapter = create_adapter(
        "openai-compatible:m",
        {"base_url": "http://127.0.0.1:9/v1", "max_body_bytes": "2048", "max_event_bytes": "4096"},
    )
    assert (adapter.config.max_body_bytes, adapter.config.max_event_bytes) == (2048, 4096)
    default = create_adapter("openai-compatible:m", {"base_url": "http://127.0.0.1:9/v1"})
    assert default.config.max_body_bytes == 64 * MIB and default.config.max_event_bytes == MIB
    with pytest.raises(ConfigError, match="max_body_bytes"):
        create_adapter("openai-compatible:m", {"base_url": "http://x/v1", "max_body_bytes": 0})


# -- the bytes all calls of one adapter hold at once ------------------------------------

CALLS = 32
ANSWER_BYTES = MIB
INFLIGHT_LIMIT = 4 * MIB


def _answer(kind: str) -> tuple[dict[str, str], bytes]:
    """Headers and body of a 1 MiB answer: JSON (chunked or with its length declared),
    or a stream of server-sent events."""
    if kind == "stream":
        event = b'data: {"choices": [{"delta": {"content": "' + b"w" * 8000 + b'"}}]}\n\n'
        end = b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
        body = event * (ANSWER_BYTES // len(event)) + end
        return {"Content-Type": "text/event-stream"}, body
    text = b"w" * (ANSWER_BYTES - 100)
    body = b'{"choices": [{"message": {"content": "' + text + b'"}, "finish_reason": "stop"}]}'
    headers = {"Content-Type": "application/json"}
    if kind == "declared":
        headers["Content-Length"] = str(len(body))
    return headers, body


@asynccontextmanager
async def half_then_all(calls: int) -> AsyncIterator[str]:
    """Serves /{kind}/v1/chat/completions: each answer's first half at once, the second
    half only once every one of ``calls`` requests has had its first half, so every call
    is in the middle of its answer at the same time."""
    all_in = anyio.Event()
    arrived = 0

    async def respond(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        await request.read()
        headers, body = _answer(request.match_info["kind"])
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        half = len(body) // 2
        try:
            with suppress(ConnectionError):
                await response.write(body[:half])
        finally:
            arrived += 1
            if arrived == calls:
                all_in.set()
        with suppress(ConnectionError):  # a call the budget refused has hung up
            await all_in.wait()
            await response.write(body[half:])
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{kind}/v1/chat/completions", respond)
    async with listening(app) as url:
        yield url


@pytest.mark.parametrize("seam", list(SEAMS))
@pytest.mark.parametrize("kind", ["chunked", "declared", "stream"])
async def test_answers_read_at_once_stay_within_max_inflight_bytes(seam: str, kind: str) -> None:
    """32 calls each in the middle of a 1 MiB answer would hold 32 MiB; the adapter's
    budget of 4 MiB holds: the calls that would pass it fail at once, naming the
    setting, and give their bytes back."""
    async with half_then_all(CALLS) as server:
        adapter = OpenAICompatibleAdapter(
            {
                "model": "m",
                "base_url": f"{server}/{kind}/v1",
                "stream": kind == "stream",
                "concurrency": CALLS,
                "max_body_bytes": 2 * MIB,
                "max_inflight_bytes": INFLIGHT_LIMIT,
                "max_retries": 0,
            },
            transport=SEAMS[seam](pool_size=CALLS),
            env={},
        )
        answered: list[int] = []
        refused: list[ResponseTooLarge] = []

        async def call() -> None:
            try:
                completion = await adapter.generate(HI, GenerationParams())
            except ResponseTooLarge as exc:
                refused.append(exc)
            else:
                answered.append(len(completion.text))

        try:
            with anyio.fail_after(30):  # a guard against a hang, not the measure
                async with anyio.create_task_group() as tg:
                    for _ in range(CALLS):
                        tg.start_soon(call)
        finally:
            await adapter.aclose()
    held = adapter.bytes_in_flight()
    assert len(answered) + len(refused) == CALLS
    assert answered and refused  # some read their whole answer; the rest were refused
    assert all(length > ANSWER_BYTES // 2 for length in answered)
    assert held.peak <= INFLIGHT_LIMIT < CALLS * ANSWER_BYTES // 2
    assert held.peak > INFLIGHT_LIMIT - ANSWER_BYTES  # the budget was what stopped them
    assert held.held == 0 and held.refused == len(refused)
    for error in refused:
        assert (error.setting, error.limit) == ("max_inflight_bytes", INFLIGHT_LIMIT)
        assert "--model-arg max_inflight_bytes=BYTES" in str(error) and error.retryable


def test_max_inflight_bytes_is_an_adapter_argument_of_at_least_max_body_bytes() -> None:
    default = create_adapter("openai-compatible:m", {"base_url": "http://127.0.0.1:9/v1"})
    assert default.config.max_inflight_bytes == 256 * MIB
    assert default.bytes_in_flight().limit == 256 * MIB
    with pytest.raises(ConfigError, match="max_inflight_bytes=2048 is below max_body_bytes"):
        create_adapter(
            "openai-compatible:m",
            {"base_url": "http://x/v1", "max_body_bytes": "4096", "max_inflight_bytes": "2048"},
        )


def test_the_service_gives_each_jobs_adapter_its_keys_inflight_bytes() -> None:
    from convsim.service._job_model import _limited
    from convsim.service._settings import KeyLimits

    tenant = {"base_url": "http://127.0.0.1:9/v1"}
    limits = KeyLimits(inflight_bytes=8 * MIB)
    adapter = create_adapter("openai-compatible:m", _limited(tenant, limits, 4))
    assert adapter.bytes_in_flight().limit == 8 * MIB
    # a key whose one answer may be larger still gets room for that one answer
    roomy = KeyLimits(response_bytes=16 * MIB, inflight_bytes=8 * MIB)
    adapter = create_adapter("openai-compatible:m", _limited(tenant, roomy, 4))
    assert adapter.bytes_in_flight().limit == 16 * MIB
