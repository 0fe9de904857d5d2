"""The lean HTTP/1.1 seam (``http=lean``, ``convsim load``'s default): keep-alive
pooling, the ways an answer's body ends, failures translated as the other seams do,
and the same completions as aiohttp on the same answers.

Servers are raw asyncio servers on 127.0.0.1 that write the bytes each test names, so
the wire is exactly what the test says.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convsim import ConfigError, ServerError, Timeout
from convsim.adapters import GenerationParams, Message, create_adapter
from convsim.adapters._egress import EgressPolicy
from convsim.adapters._http import AiohttpTransport
from convsim.adapters._lean_http import LeanTransport, needs_aiohttp
from convsim.load._plan import LoadPlan, _model_args

pytestmark = pytest.mark.anyio

HI = [Message(role="user", content="hi")]

Answer = Callable[[bytes], bytes]
"""The bytes a server writes for one request (given the request's bytes)."""


def chat_body(text: str) -> bytes:
    return json.dumps(
        {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
    ).encode()


def declared(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + head.encode()
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def chunked(body: bytes, size: int = 7) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        + b"0\r\n\r\n"
    )


class Wire:
    """A raw server: ``answer`` gives each request's bytes; counts connections and
    requests, and closes a connection after an answer when ``close_after`` says so."""

    def __init__(self, answer: Answer, close_after: bool = False, hang: bool = False) -> None:
        self.answer, self.close_after, self.hang = answer, close_after, hang
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                writer.write(self.answer(request))
                await writer.drain()
                if self.hang:
                    await asyncio.Event().wait()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(wire: Wire) -> AsyncIterator[str]:
    server = await asyncio.start_server(wire.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()


@asynccontextmanager
async def adapter(url: str, http: str = "lean", **config: Any) -> AsyncIterator[Any]:
    made = create_adapter(
        "openai-compatible:m", {"base_url": url, "http": http, "max_retries": 0, **config}
    )
    try:
        yield made
    finally:
        await made.aclose()


async def test_calls_share_one_keep_alive_connection() -> None:
    wire = Wire(lambda _: declared(chat_body("hello")))
    async with serving(wire) as url, adapter(url) as model:
        texts = [(await model.generate(HI, GenerationParams())).text for _ in range(5)]
    assert texts == ["hello"] * 5
    assert wire.connections == 1 and len(wire.requests) == 5
    first = wire.requests[0].decode()
    assert first.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert "\r\nHost: 127.0.0.1:" in first and "\r\nContent-Type: application/json\r\n" in first
    assert json.loads(first.split("\r\n\r\n", 1)[1])["messages"] == [
        {"role": "user", "content": "hi"}
    ]


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    wire = Wire(lambda _: declared(chat_body("once"), "Connection: close"), close_after=True)
    async with serving(wire) as url, adapter(url) as model:
        for _ in range(3):
            assert (await model.generate(HI, GenerationParams())).text == "once"
    assert wire.connections == 3


async def test_a_chunked_answer_is_read_whole() -> None:
    wire = Wire(lambda _: chunked(chat_body("in pieces " * 20)))
    async with serving(wire) as url, adapter(url) as model:
        assert (await model.generate(HI, GenerationParams())).text == "in pieces " * 20
        assert (await model.generate(HI, GenerationParams())).text == "in pieces " * 20
    assert wire.connections == 1


async def test_a_body_that_ends_with_the_connection_is_read_whole() -> None:
    body = chat_body("until close")
    wire = Wire(lambda _: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body, close_after=True)
    async with serving(wire) as url, adapter(url) as model:
        assert (await model.generate(HI, GenerationParams())).text == "until close"


async def test_an_answer_cut_short_is_a_server_error() -> None:
    whole = declared(chat_body("cut"))
    wire = Wire(lambda _: whole[: len(whole) - 5], close_after=True)
    async with serving(wire) as url, adapter(url) as model:
        with pytest.raises(ServerError, match="before the answer was complete"):
            await model.generate(HI, GenerationParams())


async def test_garbage_instead_of_http_is_a_server_error() -> None:
    wire = Wire(lambda _: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    async with serving(wire) as url, adapter(url) as model:
        with pytest.raises(ServerError, match=r"broke HTTP/1\.1"):
            await model.generate(HI, GenerationParams())


async def test_bytes_after_an_answer_never_reach_the_next_one() -> None:
    """An answer followed by the start of another message: the first stands, and the
    connection is dropped rather than handed the stray bytes as the next answer."""
    sent = iter([declared(chat_body("first")) + b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{"])
    wire = Wire(lambda _: next(sent, declared(chat_body("second"))))
    async with serving(wire) as url, adapter(url, timeout=5) as model:
        assert (await model.generate(HI, GenerationParams())).text == "first"
        assert (await model.generate(HI, GenerationParams())).text == "second"
    assert wire.connections == 2


async def test_an_unread_paused_connection_is_not_pooled() -> None:
    """A body that paused the socket, left unread: nothing would resume the socket, so
    the connection is closed rather than handed to the next call (which would hang)."""
    from convsim.adapters._lean_http import _Connection, _Pool, _target

    class Transport:  # what the pool needs of one: to be paused, resumed and aborted
        aborted = False

        def pause_reading(self) -> None: ...

        def resume_reading(self) -> None: ...

        def abort(self) -> None:
            self.aborted = True

    conn = _Connection(asyncio.get_running_loop())
    conn.connection_made(Transport())  # type: ignore[arg-type]
    body = b"x" * (300 * 1024)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert conn.complete and conn.paused  # all arrived, held unread past the pause mark
    pool = _Pool(4)
    target = _target("http://127.0.0.1:9/v1")
    await pool.slots.acquire()
    pool.checkin(target, conn)
    assert not pool.idle.get(target.key) and conn.closed
    read = _Connection(asyncio.get_running_loop())  # the same answer, read to its end
    read.connection_made(Transport())  # type: ignore[arg-type]
    read.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await pool.slots.acquire()
    pool.checkin(target, read)
    assert pool.idle[target.key] == [read]


async def test_headers_that_never_end_are_refused() -> None:
    padding = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 1000) for i in range(200))
    wire = Wire(lambda _: b"HTTP/1.1 200 OK\r\n" + padding + b"Content-Length: 2\r\n\r\nhi")
    async with serving(wire) as url, adapter(url) as model:
        with pytest.raises(ServerError, match="headers are over 64 KiB"):
            await model.generate(HI, GenerationParams())


async def test_a_reset_or_a_cut_gzip_body_is_not_an_answer() -> None:
    import gzip

    packed = gzip.compress(chat_body("compressed " * 50))
    cut = (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n"
        + packed[: len(packed) // 2]
    )
    wire = Wire(lambda _: cut, close_after=True)
    async with serving(wire) as url, adapter(url) as model:
        with pytest.raises(ServerError, match="cut short"):
            await model.generate(HI, GenerationParams())


async def test_an_upgrade_answer_is_a_server_error() -> None:
    wire = Wire(lambda _: b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")
    async with serving(wire) as url, adapter(url) as model:
        with pytest.raises(ServerError, match=r"broke HTTP/1\.1"):
            await model.generate(HI, GenerationParams())


async def test_a_server_that_stops_sending_is_a_timeout() -> None:
    whole = declared(chat_body("never ends"))
    wire = Wire(lambda _: whole[:-3], hang=True)
    async with serving(wire) as url, adapter(url, timeout=0.2) as model:
        with pytest.raises(Timeout):
            await model.generate(HI, GenerationParams())


async def test_a_refused_connection_is_a_server_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with adapter(f"http://127.0.0.1:{port}/v1") as model:
        with pytest.raises(ServerError, match=r"connection to .* failed"):
            await model.generate(HI, GenerationParams())


async def test_an_error_status_keeps_its_type_and_the_connection() -> None:
    def answer(request: bytes) -> bytes:
        body = b'{"error": {"message": "bad key"}}'
        return b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    wire = Wire(answer)
    async with serving(wire) as url, adapter(url) as model:
        for _ in range(2):
            with pytest.raises(Exception, match="bad key") as info:
                await model.generate(HI, GenerationParams())
            assert type(info.value).__name__ == "AuthError"
    assert wire.connections == 1


async def test_a_header_that_would_split_a_line_is_refused() -> None:
    transport = LeanTransport()
    with pytest.raises(ConfigError, match="line break"):
        async with transport.stream(
            "http://127.0.0.1:9/v1/x", {}, {"X-Key": "a\r\nInjected: yes"}, _timeouts()
        ):
            pass
    await transport.aclose()


def _timeouts() -> Any:
    from convsim.adapters._http import HttpTimeouts

    return HttpTimeouts(connect=1.0, read=1.0)


async def test_a_path_with_a_space_or_a_header_outside_latin_1_is_refused() -> None:
    from convsim.adapters._http import HttpTimeouts

    transport = LeanTransport()
    timeouts = HttpTimeouts(connect=1, read=1)
    try:
        with pytest.raises(ConfigError, match="space or control character"):
            async with transport.stream("http://127.0.0.1:9/v1/a b", {}, {}, timeouts):
                pass
        with pytest.raises(ConfigError, match="Latin-1"):
            async with transport.stream(
                "http://127.0.0.1:9/v1", {}, {"X-Name": "\u2603"}, timeouts
            ):
                pass
    finally:
        await transport.aclose()


def test_proxies_and_credentials_keep_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    assert needs_aiohttp("http://10.0.0.5:8000/v1")
    monkeypatch.setenv("NO_PROXY", "10.0.0.5")
    assert not needs_aiohttp("http://10.0.0.5:8000/v1")
    assert needs_aiohttp("http://user:pw@10.0.0.5:8000/v1")


async def test_an_adapter_behind_a_proxy_gets_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    async with adapter("http://10.0.0.5:8000/v1") as model:
        assert isinstance(model._http(), AiohttpTransport)
    monkeypatch.setenv("NO_PROXY", "10.0.0.5")
    async with adapter("http://10.0.0.5:8000/v1") as model:
        assert isinstance(model._http(), LeanTransport)


async def test_an_egress_policy_refuses_the_lean_seam() -> None:
    async with adapter("http://10.0.0.5:8000/v1") as model:
        model.egress = EgressPolicy(allow=["http://10.0.0.5:8000/v1"])
        with pytest.raises(ConfigError, match="egress policy needs aiohttp"):
            model._http()


def test_load_uses_the_lean_seam_where_the_adapter_has_one() -> None:
    def args(model: str, **given: str) -> dict[str, Any]:
        return _model_args(LoadPlan(model=model, model_args=given))

    assert args("openai-compatible:m", base_url="http://h/v1")["http"] == "lean"
    assert args("anthropic:claude")["http"] == "lean"
    assert args("openai-compatible:m", http="aiohttp")["http"] == "aiohttp"
    assert "http" not in args("scripted")


# -- the same completions as aiohttp ---------------------------------------------------

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


def _sse(text: str, pieces: int) -> bytes:
    size = max(1, len(text) // max(pieces, 1))
    parts = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    events = [
        b"data: " + json.dumps({"choices": [{"delta": {"content": p}}]}).encode() + b"\n\n"
        for p in parts
    ]
    events.append(
        b"data: "
        + json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]}).encode()
        + b"\n\n"
    )
    return b"".join(events) + b"data: [DONE]\n\n"


async def _both(answer: Answer, stream: bool) -> tuple[Any, Any]:
    wire = Wire(answer)
    async with serving(wire) as url:
        done = []
        for http in ("aiohttp", "lean"):
            async with adapter(url, http=http, stream=stream) as model:
                done.append(await model.generate(HI, GenerationParams()))
    return done[0], done[1]


def _same(a: Any, b: Any) -> None:
    keep = {"timings"}
    assert a.model_dump(exclude=keep) == b.model_dump(exclude=keep)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=texts, framing=st.sampled_from(["declared", "chunked"]), size=st.integers(1, 50))
def test_a_plain_answer_reads_the_same_as_through_aiohttp(
    text: str, framing: str, size: int
) -> None:
    body = chat_body(text)
    frame = declared(body) if framing == "declared" else chunked(body, size)
    slow, fast = asyncio.run(_both(lambda _: frame, stream=False))
    _same(slow, fast)
    assert fast.text == text


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=texts, pieces=st.integers(1, 12), size=st.integers(1, 64))
def test_a_stream_reads_the_same_as_through_aiohttp(text: str, pieces: int, size: int) -> None:
    frame = chunked(_sse(text, pieces), size).replace(b"application/json", b"text/event-stream", 1)
    slow, fast = asyncio.run(_both(lambda _: frame, stream=True))
    _same(slow, fast)
    assert fast.text == text and fast.finish_reason == "length"


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_lean_seam_refuses_trio(anyio_backend: str) -> None:
    model = create_adapter(
        "openai-compatible:m", {"base_url": "http://127.0.0.1:9/v1", "http": "lean"}
    )
    with pytest.raises(ConfigError, match="asyncio only"):
        await model.generate(HI, GenerationParams())


async def test_a_cancelled_call_gives_its_connection_back() -> None:
    """A call cancelled while waiting for its answer closes its connection (half an
    exchange cannot be reused) and frees its place in a pool of one."""
    import anyio

    hanging = Wire(lambda _: b"", hang=True)
    async with serving(hanging) as url:
        transport = LeanTransport(pool_size=1)
        with anyio.move_on_after(0.2) as scope:
            async with transport.stream(url + "/x", {}, {}, _timeouts()):
                pass
        assert scope.cancelled_caught
        with anyio.move_on_after(0.2) as again:  # the one place is free again
            async with transport.stream(url + "/x", {}, {}, _timeouts()):
                pass
        assert again.cancelled_caught and hanging.connections == 2
        await transport.aclose()


async def test_a_fresh_request_id_per_call_is_sent_and_not_kept() -> None:
    """``request_id_header`` sends a new id with every attempt: each reaches the server,
    and the seam does not keep a built request head per id."""
    wire = Wire(lambda _: declared(chat_body("hi"), "x-request-id: srv-1"))
    async with serving(wire) as url, adapter(url, request_id_header="x-request-id") as model:
        for _ in range(80):
            await model.generate(HI, GenerationParams())
        heads = model._http()._heads
    sent = {
        line.split(b":", 1)[1].strip()
        for request in wire.requests
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"x-request-id:")
    }
    assert len(sent) == 80 and wire.connections == 1
    assert len(heads) <= 64
