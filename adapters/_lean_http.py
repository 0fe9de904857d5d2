"""A lean HTTP/1.1 seam for load tests: an asyncio protocol, httptools' parser, a pool
of keep-alive connections.

aiohttp spends about as much CPU on a small request as all of a load client's own work
(request building, parsing, timing, records); at zero server latency the client is the
bottleneck, so that share caps the rate one process can drive. This seam does only what
an adapter's call needs: one POST (or a check's GET) on a pooled connection, the answer's
status and headers, then its body as it arrives. It honours the same
:class:`~convsim.adapters._http.HttpTimeouts` (connect, including the wait for a free
connection; read, between two reads), decompresses gzip and deflate in bounded pieces,
stops reading while the adapter has not taken what arrived (so a body never piles up in
memory), and translates its failures as the other seams do (a timeout becomes
:class:`~convsim.Timeout`, a refused or dropped connection a
:class:`~convsim.ServerError`, want of file descriptors a
:class:`~convsim.LocalResourceError`).

What it leaves to aiohttp: proxies and egress policies (an adapter with either keeps
aiohttp), redirects (an answer is taken as it comes), HTTP/2, and cookies. asyncio only.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from convsim._errors import ConfigError

from ._http import PROBE_BODY_LIMIT, HttpResponse, HttpTimeouts, _translation

__all__ = ["LeanTransport", "LeanProtocolError", "needs_aiohttp"]

_PAUSE_AT = 256 * 1024
"""Bytes held unread before the socket is paused (the adapter reads in pieces)."""
_PIECE = 64 * 1024
"""The largest piece a compressed body is decompressed into at a time."""
_MAX_HEADER_BYTES = 64 * 1024
"""An answer's header names and values together at most (aiohttp caps a line at 8 KiB):
bytes that keep coming as headers would otherwise be held without end."""
_FORBIDDEN = frozenset("\r\n\0")
_HEADS_KEPT = 64
"""Request heads kept built: an adapter's few URLs and header sets. Headers that differ
on every request (a fresh request id, a trace context) are built each time instead."""


def needs_aiohttp(url: str) -> bool:
    """Whether ``url`` needs what only aiohttp does here: a proxy the environment names
    for it (HTTP(S)_PROXY less NO_PROXY), or credentials in the URL."""
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return True
    if parts.scheme not in getproxies():
        return False
    return not proxy_bypass(parts.hostname or "")


class LeanProtocolError(ConnectionError):
    """The server broke HTTP/1.1, or closed the connection before the answer ended."""


@dataclass(frozen=True)
class _Target:
    """A URL split once: where to connect, and the request line's start."""

    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    path: bytes
    host_header: bytes


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{url}: the lean HTTP seam speaks http:// and https:// only")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        shown = f"{shown}:{parts.port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c <= " " or c == "\x7f" for c in path):
        raise ConfigError(f"{url}: a space or control character in the path (percent-encode it)")
    return _Target((parts.scheme, host, port), host, port, tls, path.encode(), shown.encode())


def _header_block(headers: Mapping[str, str]) -> bytes:
    """``headers`` as request lines; a name or value that would split a line is refused
    (it would let a value inject headers of its own)."""
    lines = []
    for name, value in headers.items():
        if _FORBIDDEN & set(name + value) or not name or ":" in name or " " in name:
            raise ConfigError(f"the request header {name!r} has a line break or a bad name")
        lines.append(f"{name}: {value}\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"a request header is not Latin-1 text: {exc}") from None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one exchange at a time, its answer parsed as it comes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        import httptools

        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        # an Upgrade (101) is no subclass of HttpParserError: a broken exchange all the same
        self._error_types: tuple[type[Exception], ...] = (
            httptools.HttpParserError,
            httptools.HttpParserUpgrade,
        )
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.failure: BaseException | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.excess = False
        """Bytes came after the answer ended: the connection carries no other exchange."""
        self.header_bytes = 0
        self.pieces: deque[bytes] = deque()
        self.held = 0
        self.paused = False
        self.last_read = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
        except self._error_types as exc:
            if self.complete:  # after the answer: it stands, the connection does not
                self.excess = True
                self.close()
            else:
                self._fail(LeanProtocolError(f"the server broke HTTP/1.1: {exc!r}"))
            return
        if self.excess:  # the answer stands; what followed it must not reach the next
            self.close()
            self._wake()
            return
        if self.held > _PAUSE_AT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close: a half-closed connection cannot carry another exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.failure is None:
            if exc is None and self.headers_done and self._until_close():
                self.complete = True  # a body that ends where the connection closes
            else:
                self.failure = exc or LeanProtocolError(
                    "the server closed the connection before the answer was complete"
                )
        self._wake()

    # -- httptools' callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self.excess = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.excess or self.failure is not None:
            return
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > _MAX_HEADER_BYTES:
            self._fail(LeanProtocolError("the answer's headers are over 64 KiB"))
            return
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self.excess:
            return
        self.status = self._parser.get_status_code()
        if self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers = []
            return
        self.headers_done = True
        self.keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.excess:
            return
        self.pieces.append(body)
        self.held += len(body)

    def on_message_complete(self) -> None:
        if self.headers_done and not self.excess:
            self.complete = True

    # -- the exchange -------------------------------------------------------------------

    def _until_close(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return "content-length" not in names and "transfer-encoding" not in names

    def _fail(self, exc: BaseException) -> None:
        self.failure = exc
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def reusable(self) -> bool:
        # paused: the caller left before reading all, and nothing would resume it
        return (
            self.complete
            and self.keep_alive
            and not (self.closed or self.excess or self.paused)
            and self.failure is None
        )

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self.stop_timer()
        self.status, self.headers = 0, []
        self.headers_done = self.complete = self.keep_alive = False
        self.header_bytes = 0
        self.pieces.clear()
        self.held = 0
        self.last_read = self._loop.time()
        self.transport.write(request)

    async def wait(self, read_timeout: float | None) -> None:
        """Until something arrives (or the connection ends); TimeoutError after
        ``read_timeout`` seconds without a byte. One timer serves a whole exchange: it
        is moved on only when it fires early (a stream's chunks do not each set one)."""
        if self.failure is not None:
            raise self.failure
        if self.closed:  # closed before the answer was complete
            raise LeanProtocolError("the connection was closed during the answer")
        waiter = self._waiter = self._loop.create_future()
        if read_timeout is not None and self._timer is None:
            self._timer = self._loop.call_at(
                self.last_read + read_timeout, self._check, read_timeout
            )
        try:
            await waiter
        finally:
            self._waiter = None
        if self.failure is not None:
            raise self.failure

    def _check(self, read_timeout: float) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait sets a timer of its own
        due = self.last_read + read_timeout
        if self._loop.time() >= due:
            waiter.set_exception(asyncio.TimeoutError())
        else:  # bytes came meanwhile: wait out the rest
            self._timer = self._loop.call_at(due, self._check, read_timeout)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def take(self) -> bytes:
        """What arrived and was not read yet (resuming the socket if it was paused)."""
        data = b"".join(self.pieces) if len(self.pieces) != 1 else self.pieces[0]
        self.pieces.clear()
        self.held = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        self.closed = True
        self.stop_timer()
        if self.transport is not None:
            self.transport.abort()


class _Pool:
    """Idle keep-alive connections per origin, and a cap on all connections."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self.slots = asyncio.Semaphore(size)
        self.ssl: ssl.SSLContext | None = None

    async def checkout(self, target: _Target, connect_timeout: float | None) -> _Connection:
        if self.slots.locked():
            await asyncio.wait_for(self.slots.acquire(), connect_timeout)
        else:
            await self.slots.acquire()
        try:
            idle = self.idle.get(target.key)
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn
            return await asyncio.wait_for(self._open(target), connect_timeout)
        except BaseException:
            self.slots.release()
            raise

    async def _open(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if target.tls:
            context = self.ssl = self.ssl or ssl.create_default_context()
        _, conn = await loop.create_connection(
            lambda: _Connection(loop),
            target.host,
            target.port,
            ssl=context,
            server_hostname=target.host if context is not None else None,
        )
        return conn

    def checkin(self, target: _Target, conn: _Connection) -> None:
        conn.stop_timer()
        if conn.reusable():
            self.idle.setdefault(target.key, []).append(conn)
        else:
            conn.close()
        self.slots.release()

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()


class _LeanResponse:
    """The answer of one exchange: status and headers at once, the body as it comes."""

    __slots__ = ("_conn", "_inflate", "_timeouts", "headers", "status")

    def __init__(self, conn: _Connection, timeouts: HttpTimeouts) -> None:
        from multidict import CIMultiDict

        self._conn = conn
        self._timeouts = timeouts
        self.status: int = conn.status
        self.headers: Mapping[str, str] = CIMultiDict(conn.headers)
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        self._inflate: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif encoding == "deflate":
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or raw-ish
        elif encoding != "identity":
            raise LeanProtocolError(
                f"the answer is encoded as {encoding!r}, which the lean HTTP seam does "
                "not decode (use --model-arg http=aiohttp)"
            )

    async def next_arrived(self) -> bytes | None:
        """What arrived since the last call (waiting for it); None at the body's end."""
        conn = self._conn
        while not conn.pieces:
            if conn.complete:
                return None
            await conn.wait(self._timeouts.read)
        return conn.take()

    async def read(self) -> bytes:
        if self._inflate is not None:
            return b"".join([chunk async for chunk in self.chunks()])
        parts = []
        while (data := await self.next_arrived()) is not None:
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunks(self) -> AsyncIterator[bytes]:
        return _Chunks(self)


class _Chunks:
    """The body as it arrives, decompressed in pieces of at most :data:`_PIECE` bytes.
    A class, not an async generator: the event loop registers every generator."""

    __slots__ = ("_fed", "_inflate", "_response")

    def __init__(self, response: _LeanResponse) -> None:
        self._response = response
        self._inflate: Any = response._inflate
        self._fed = False

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        inflate = self._inflate
        if inflate is None:
            data = await self._response.next_arrived()
            if data is None:
                raise StopAsyncIteration
            return data
        try:
            while True:
                if inflate.unconsumed_tail:
                    piece = inflate.decompress(inflate.unconsumed_tail, _PIECE)
                else:
                    data = await self._response.next_arrived()
                    if data is None:
                        if self._fed and not inflate.eof:
                            raise LeanProtocolError("the compressed answer was cut short")
                        raise StopAsyncIteration
                    self._fed = True
                    piece = inflate.decompress(data, _PIECE)
                if piece:
                    return bytes(piece)
        except zlib.error as exc:
            raise LeanProtocolError(f"the compressed answer is corrupt: {exc}") from exc


class _LeanExchange:
    """``async with`` one request, giving its :class:`_LeanResponse`."""

    __slots__ = ("_conn", "_headers", "_method", "_payload", "_timeouts", "_transport", "_url")

    def __init__(
        self,
        transport: LeanTransport,
        method: bytes,
        url: str,
        payload: Any,
        headers: Mapping[str, str],
        timeouts: HttpTimeouts,
    ) -> None:
        self._transport = transport
        self._method = method
        self._url = url
        self._payload = payload
        self._headers = headers
        self._timeouts = timeouts
        self._conn: _Connection | None = None

    async def __aenter__(self) -> _LeanResponse:
        transport = self._transport
        target, head = transport._head(self._method, self._url, self._headers)
        body = b"" if self._payload is None else _encode(self._payload)
        try:
            conn = self._conn = await transport._pool().checkout(target, self._timeouts.connect)
            conn.send(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
            while not conn.headers_done:
                if conn.closed and conn.failure is None:
                    raise LeanProtocolError("the server closed the connection without an answer")
                await conn.wait(self._timeouts.read)
            return _LeanResponse(conn, self._timeouts)
        except BaseException as exc:
            self._release(target, keep=False)
            translated = _translation(self._url, exc, asyncio.TimeoutError, OSError)
            if translated is not None:
                raise translated from exc
            raise

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        conn = self._conn
        target = self._transport._targets[self._url]
        # an answer read to its end leaves the connection ready for the next (an error
        # status too); a body left unread leaves it unusable
        self._release(target, keep=conn is not None and conn.complete)
        if exc is not None:
            translated = _translation(self._url, exc, asyncio.TimeoutError, OSError)
            if translated is not None:
                raise translated from exc

    def _release(self, target: _Target, *, keep: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not keep:
            conn.close()
        self._transport._pool().checkin(target, conn)


def _encode(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class LeanTransport:
    """HTTP/1.1 over pooled keep-alive connections (see the module's docstring)."""

    def __init__(self, *, pool_size: int = 100) -> None:
        self.pool_size = pool_size
        self._connections: _Pool | None = None
        self._targets: dict[str, _Target] = {}
        self._heads: dict[tuple[bytes, str, tuple[tuple[str, str], ...]], bytes] = {}

    def _pool(self) -> _Pool:
        if self._connections is None:
            self._connections = _Pool(self.pool_size)
        return self._connections

    def _head(self, method: bytes, url: str, headers: Mapping[str, str]) -> tuple[_Target, bytes]:
        """The request's line and headers but its length, built once per URL and
        headers."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
        key = (method, url, tuple(headers.items()))
        head = self._heads.get(key)
        if head is None:
            names = {name.lower() for name in headers}
            extra = {"Host": target.host_header.decode()}
            if "accept-encoding" not in names:
                extra["Accept-Encoding"] = "gzip, deflate"
            if "user-agent" not in names:
                extra["User-Agent"] = "convsim"
            head = method + b" " + target.path + b" HTTP/1.1\r\n"
            head += _header_block({**extra, **headers})
            if len(self._heads) < _HEADS_KEPT:
                self._heads[key] = head
        return target, head

    def stream(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> _LeanExchange:
        return _LeanExchange(self, b"POST", url, payload, headers, timeouts)

    async def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse:
        async with self.stream(url, payload, headers, timeouts) as response:
            body = await response.read()
            return HttpResponse(response.status, response.headers, body)

    async def get(
        self, url: str, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse:
        """A GET for a check: the body is cut at :data:`PROBE_BODY_LIMIT` bytes."""
        async with _LeanExchange(self, b"GET", url, None, headers, timeouts) as response:
            body = b""
            async for chunk in response.chunks():
                body += chunk
                if len(body) >= PROBE_BODY_LIMIT:
                    break
            return HttpResponse(response.status, response.headers, body[:PROBE_BODY_LIMIT])

    async def aclose(self) -> None:
        if self._connections is not None:
            self._connections.close()
            self._connections = None
