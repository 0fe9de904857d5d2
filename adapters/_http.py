"""The HTTP seam: post JSON, stream server-sent events; aiohttp under asyncio, httpx under trio.

Adapters never touch an HTTP library directly. Two implementations of the same small
protocol exist: :class:`AiohttpTransport` (the default under asyncio: measured several
times faster than httpx's default transport at high concurrency; asyncio only) and
:class:`HttpxTransport` (the default under trio, and for httpx transports, proxies and
auth, and for tests with ``httpx.MockTransport``); :func:`default_http_library` picks
one for the running event loop. Both
translate their library's failures into convsim's errors at this boundary: a timeout
becomes :class:`~convsim.Timeout`, a refused or dropped connection a
:class:`~convsim.ServerError` without a status code, and a connection that cannot be
opened for want of file descriptors a :class:`~convsim.LocalResourceError`.

Answers are read within size limits (:func:`read_limited`, :class:`SSEDecoder`), counted
in the bytes the libraries hand over, that is after decompression: an endless body, an
endless event or a compression bomb stops at the limit with
:class:`~convsim.ResponseTooLarge`. aiohttp decompresses in bounded pieces and stops
reading while its buffer is full; httpx decompresses one network read (up to 64 KiB
compressed) at a time, so past the limit it may hold one read's worth more.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import anyio
import sniffio

from convsim import _sse as sse
from convsim._errors import (
    EgressRefused,
    LocalResourceError,
    ResponseTooLarge,
    ServerError,
    Timeout,
)
from convsim._plural import counted
from convsim._sse import SSEEvent

from ._egress import EgressBlocked, EgressPolicy

E = TypeVar("E", bound=BaseException)

__all__ = [
    "HttpTimeouts",
    "HttpResponse",
    "SSEEvent",
    "SSEDecoder",
    "read_limited",
    "too_large",
    "StreamResponse",
    "HttpTransport",
    "AiohttpTransport",
    "HttpxTransport",
    "HttpLibrary",
    "default_http_library",
    "JSON_HEADERS",
]

HttpLibrary = Literal["aiohttp", "httpx", "lean"]
"""``lean`` is :class:`~convsim.adapters._lean_http.LeanTransport` (HTTP/1.1 for load
tests; asyncio only)."""


def default_http_library() -> HttpLibrary:
    """The seam for the running event loop: aiohttp under asyncio (the fastest there),
    httpx under trio (aiohttp runs on asyncio only). Outside a loop: aiohttp."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return "aiohttp"
    return "httpx" if library == "trio" else "aiohttp"


@dataclass(frozen=True)
class HttpTimeouts:
    """Seconds; None waits forever (the runtime's deadlines still apply)."""

    connect: float | None = 10.0
    """To open a connection, including the wait for a free one in the pool."""
    read: float | None = 60.0
    """Between two reads of the response (for streams: between two chunks)."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]
    """Case-insensitive."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return counted(n, "byte")


def too_large(what: str, setting: str, limit: int) -> ResponseTooLarge:
    """The error for ``what`` going past ``limit`` bytes (set by ``setting``)."""
    return ResponseTooLarge(
        f"{what} went past {setting}={limit} ({_size(limit)}, counted after "
        f"decompression); reading stopped there. If the answer is genuine, raise the limit "
        f"with --model-arg {setting}=BYTES",
        limit=limit,
        setting=setting,
    )


class SSEDecoder(sse.SSEDecoder):
    """convsim's one server-sent-events decoder (:mod:`convsim._sse`), its size limit
    named as the adapter argument that sets it."""

    __slots__ = ()

    def _too_large(self) -> ResponseTooLarge:
        assert self.max_event_bytes is not None
        return too_large("a server-sent event", "max_event_bytes", self.max_event_bytes)


async def read_limited(
    response: StreamResponse,
    limit: int,
    *,
    truncate: bool = False,
    what: str = "the answer",
    take: Callable[[int], None] | None = None,
) -> bytes:
    """The body of ``response``, at most ``limit`` bytes (after decompression).

    Past the limit: :class:`~convsim.ResponseTooLarge` naming ``what`` and the setting
    ``max_body_bytes``; or with ``truncate`` the first ``limit`` bytes (for error
    bodies, where the status says what happened and the text only adds to it).
    ``take`` is told the size of each piece before it is kept (a budget shared by
    several calls); should it raise, reading stops: the error goes on, or with
    ``truncate`` the pieces kept so far are the body.
    """
    headers = response.headers
    declared = headers.get("Content-Length")
    if (
        declared is not None
        and declared.isdigit()
        and int(declared) <= limit
        and headers.get("Content-Encoding", "identity") == "identity"
    ):
        # the HTTP parser stops at the declared length, and nothing is decompressed:
        # the body cannot pass the limit, so it is read in one go
        if take is not None:
            try:
                take(int(declared))
            except ResponseTooLarge:
                if truncate:
                    return b""
                raise
        return await response.read()
    parts: list[bytes] = []
    size = 0
    async for chunk in response.chunks():
        size += len(chunk)
        over = size > limit
        if over:
            if not truncate:
                raise too_large(what, "max_body_bytes", limit)
            chunk = chunk[: len(chunk) - (size - limit)]
        if take is not None:
            try:
                take(len(chunk))
            except ResponseTooLarge:
                if truncate:
                    break
                raise
        parts.append(chunk)
        if over:
            break
    return b"".join(parts)


class StreamResponse(Protocol):
    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes:
        """The whole body (for error responses)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        ...


class HttpTransport(Protocol):
    """What adapters need from HTTP. ``headers`` are the complete request headers
    (Content-Type included: see :data:`JSON_HEADERS`)."""

    async def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse: ...

    def stream(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> Any:
        """An async context manager giving a :class:`StreamResponse`."""
        ...

    async def aclose(self) -> None: ...


def _translation(
    url: str, exc: BaseException, timeouts: type[BaseException], failures: type[BaseException]
) -> BaseException | None:
    """What a library's error becomes: its timeout Timeout, its connection failure
    ServerError (LocalResourceError when the process ran out of descriptors); None for
    an error that is not the library's."""
    if isinstance(exc, timeouts):  # checked first: some libraries' timeouts are failures too
        return Timeout(f"no response from {url} in time")
    if isinstance(exc, failures):
        blocked = _cause(exc, EgressBlocked)
        if blocked is not None:
            return EgressRefused(str(blocked).removeprefix("base_url: "))
        if _out_of_descriptors(exc):
            return LocalResourceError(
                f"cannot open a connection to {url}: too many open files in this process; "
                "raise the limit (ulimit -n) or lower --concurrency"
            )
        return ServerError(f"connection to {url} failed: {type(exc).__name__}: {exc}")
    return None


@contextmanager
def _translated(
    url: str, timeouts: type[BaseException], failures: type[BaseException]
) -> Iterator[None]:
    """A library's timeout becomes Timeout, its connection failure ServerError."""
    try:
        yield
    except (timeouts, failures) as exc:
        translated = _translation(url, exc, timeouts, failures)
        assert translated is not None
        raise translated from exc


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and its causes, each once."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def _cause(exc: BaseException, kind: type[E]) -> E | None:
    return next((c for c in _causes(exc) if isinstance(c, kind)), None)


def _out_of_descriptors(exc: BaseException) -> bool:
    """Whether a connection failed for want of a file descriptor (EMFILE, ENFILE)
    anywhere among the exception's causes: a local limit, not the server's doing."""
    return any(
        isinstance(c, OSError) and c.errno in (errno.EMFILE, errno.ENFILE) for c in _causes(exc)
    )


def _encode(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


JSON_HEADERS = {"Content-Type": "application/json"}
PROBE_BODY_LIMIT = 64 * 1024
"""Bytes of a check's answer that are read (see ``get``); the rest is dropped."""


class AiohttpTransport:
    """The default seam: one aiohttp session with a pool sized to the concurrency."""

    def __init__(self, *, pool_size: int = 100, egress: EgressPolicy | None = None) -> None:
        self.pool_size = pool_size
        self.egress = egress
        """Where calls may go; with one, redirects are not followed and no proxy from
        the environment is used (see :class:`~convsim.adapters.EgressPolicy`)."""
        self._session: Any = None
        self._timeouts: dict[HttpTimeouts, Any] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self._named: set[tuple[str, int]] = set()
        """Hosts and ports of checked URLs whose allowed prefix names the host."""

    def _client(self) -> Any:
        if self._session is None or self._session.closed:
            import aiohttp

            resolver = self.egress.resolver(self._named) if self.egress is not None else None
            connector = aiohttp.TCPConnector(
                limit=self.pool_size, limit_per_host=self.pool_size, resolver=resolver
            )
            # trust_env stays off: aiohttp would then look the proxy up in a worker
            # thread on every request; _request_options() does it once per origin instead
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        return self._session

    async def _request_options(self, url: str) -> dict[str, Any]:
        """The options of a request to ``url``: under an egress policy, the URL checked
        and redirects off; otherwise the proxy the environment names for its origin
        (HTTP(S)_PROXY, NO_PROXY, credentials from the proxy URL or .netrc), as httpx
        and ``trust_env`` would pick it, looked up once per origin, off the loop (.netrc
        is a file read)."""
        known = self._options.get(url)  # the few URLs an adapter calls, not parsed again
        if known is None and self.egress is not None:
            checked = self.egress.check_url(url)  # raises EgressRefused
            if checked.named:
                self._named.add((checked.host, checked.port))
            known = self._options[url] = {"allow_redirects": False}
        if known is None:
            from yarl import URL

            target = URL(url)
            origin = str(target.origin())
            known = self._options.get(origin)
            if known is None:
                known = self._options[origin] = await anyio.to_thread.run_sync(_env_proxy, target)
            self._options[url] = known
        return known

    def _timeout(self, t: HttpTimeouts) -> Any:
        timeout = self._timeouts.get(t)
        if timeout is None:
            import aiohttp

            timeout = self._timeouts[t] = aiohttp.ClientTimeout(
                total=None, connect=t.connect, sock_read=t.read
            )
        return timeout

    async def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse:
        async with self.stream(url, payload, headers, timeouts) as response:
            body = await response.read()
            return HttpResponse(response.status, response.headers, body)

    def stream(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> _AiohttpPost:
        return _AiohttpPost(self, url, payload, headers, timeouts)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(
        self, url: str, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse:
        """A GET for a check (such as a model listing): the body is cut at
        :data:`PROBE_BODY_LIMIT` bytes, as only its start is ever shown."""
        import aiohttp

        proxy = await self._request_options(url)
        with _translated(url, asyncio.TimeoutError, aiohttp.ClientError):
            async with self._client().get(
                url, headers=headers, timeout=self._timeout(timeouts), **proxy
            ) as response:
                body = await response.content.read(PROBE_BODY_LIMIT)
                return HttpResponse(response.status, response.headers, body)


def _env_proxy(url: Any) -> dict[str, Any]:
    from aiohttp.helpers import get_env_proxy_for_url

    try:
        proxy, auth = get_env_proxy_for_url(url)
    except LookupError:  # no proxy for this scheme, or NO_PROXY covers the host
        return {}
    return {"proxy": proxy, "proxy_auth": auth}


class _AiohttpPost:
    """``async with`` one POST, giving its :class:`StreamResponse`; aiohttp's failures,
    on the way in or while reading, become convsim's. A class rather than a generator
    context manager: it is on every request's path."""

    __slots__ = ("_headers", "_payload", "_request", "_timeouts", "_transport", "_url")

    def __init__(
        self,
        transport: AiohttpTransport,
        url: str,
        payload: Any,
        headers: Mapping[str, str],
        timeouts: HttpTimeouts,
    ) -> None:
        self._transport = transport
        self._url = url
        self._payload = payload
        self._headers = headers
        self._timeouts = timeouts
        self._request: Any = None

    async def __aenter__(self) -> StreamResponse:
        import aiohttp

        transport = self._transport
        proxy = transport._options.get(self._url)
        if proxy is None:
            proxy = await transport._request_options(self._url)
        try:
            self._request = transport._client().post(
                self._url,
                data=_encode(self._payload),
                headers=self._headers,
                timeout=transport._timeout(self._timeouts),
                **proxy,
            )
            response = await self._request.__aenter__()
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            translated = _translation(self._url, exc, asyncio.TimeoutError, aiohttp.ClientError)
            assert translated is not None
            raise translated from exc
        return _AiohttpStream(response)

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        import aiohttp

        try:
            await self._request.__aexit__(exc_type, exc, tb)
        except (asyncio.TimeoutError, aiohttp.ClientError) as failure:
            exc = failure
        if exc is not None:
            translated = _translation(self._url, exc, asyncio.TimeoutError, aiohttp.ClientError)
            if translated is not None:
                raise translated from exc


class _AiohttpStream:
    def __init__(self, response: Any) -> None:
        self._response = response
        self.status: int = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        body: bytes = await self._response.read()
        return body

    def chunks(self) -> AsyncIterator[bytes]:
        iterator: AsyncIterator[bytes] = self._response.content.iter_any()
        return iterator


class HttpxTransport:
    """The seam over httpx: pass a client or a transport (e.g. ``httpx.MockTransport``)."""

    def __init__(
        self,
        *,
        client: Any = None,
        transport: Any = None,
        pool_size: int = 100,
    ) -> None:
        import httpx

        if client is not None and transport is not None:
            raise ValueError("give a client or a transport, not both")
        self._owned = client is None
        self._client = client or httpx.AsyncClient(
            transport=transport,
            limits=httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size),
        )

    @staticmethod
    def _timeout(t: HttpTimeouts) -> Any:
        import httpx

        return httpx.Timeout(connect=t.connect, read=t.read, write=t.read, pool=t.connect)

    async def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse:
        import httpx

        with _translated(url, httpx.TimeoutException, httpx.TransportError):
            response = await self._client.post(
                url,
                content=_encode(payload),
                headers=headers,
                timeout=self._timeout(timeouts),
            )
        return HttpResponse(response.status_code, response.headers, response.content)

    @asynccontextmanager
    async def stream(
        self, url: str, payload: Any, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> AsyncIterator[StreamResponse]:
        import httpx

        with _translated(url, httpx.TimeoutException, httpx.TransportError):
            async with self._client.stream(
                "POST",
                url,
                content=_encode(payload),
                headers=headers,
                timeout=self._timeout(timeouts),
            ) as response:
                yield _HttpxStream(response)

    async def aclose(self) -> None:
        if self._owned:
            await self._client.aclose()

    async def get(
        self, url: str, headers: Mapping[str, str], timeouts: HttpTimeouts
    ) -> HttpResponse:
        """A GET for a check (such as a model listing): the body is cut at
        :data:`PROBE_BODY_LIMIT` bytes, as only its start is ever shown."""
        import httpx

        with _translated(url, httpx.TimeoutException, httpx.TransportError):
            async with self._client.stream(
                "GET", url, headers=headers, timeout=self._timeout(timeouts)
            ) as response:
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) >= PROBE_BODY_LIMIT:
                        break
                return HttpResponse(response.status_code, response.headers, body[:PROBE_BODY_LIMIT])


class _HttpxStream:
    def __init__(self, response: Any) -> None:
        self._response = response
        self.status: int = response.status_code
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        body: bytes = await self._response.aread()
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_bytes():
            yield chunk
