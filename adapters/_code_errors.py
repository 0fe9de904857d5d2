"""What an exception from an adapter's own code means: the typed error convsim records,
retries or not.

An adapter written in the guide's style makes its calls itself (``requests``, httpx,
urllib, a vendor SDK) and raises whatever they raise, often wrapped: the guide's own
example re-raises every ``requests`` error as ``Exception("Custom model API error:
...")``. The exception and the ones it was raised from or while handling are read,
outermost first, and the first that says something decides:

=========================================================  ==========================
found in the chain                                          recorded as (retried?)
=========================================================  ==========================
a convsim :class:`~convsim.AdapterError`                    itself (as it declares)
an HTTP status: ``.response.status_code`` (requests,        as convsim's HTTP adapters
httpx), ``.status_code``, ``.status`` (aiohttp), ``.code``  map it: 408, 409, 429 and
(urllib's HTTPError); a 429's Retry-After is honoured       5xx retried; 400, 401, 403,
                                                            404, 422 not
a timeout (``TimeoutError``, httpx's, a class named         :class:`~convsim.Timeout`
``*Timeout*`` such as requests')                            (retried)
a failed connection (``ConnectionError``, urllib's          :class:`~convsim.ServerError`
``URLError``, ``http.client`` errors, httpx's transport     without a status (retried)
errors, a class named ``*ConnectionError*``)
anything else (KeyError, TypeError, a bare Exception)       :class:`~convsim.AdapterCodeError`
                                                            (not retried)
=========================================================  ==========================
"""

from __future__ import annotations

import http.client
import sys
import urllib.error
from collections.abc import Callable, Mapping
from typing import Any

from convsim._errors import AdapterCodeError, AdapterError, ServerError, Timeout

from ._retry import error_for_status

__all__ = ["adapter_error_for", "exception_chain"]


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``) or while handling
    (``__context__``, unless suppressed with ``from None``), outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return chain


def _status(exc: BaseException) -> tuple[int, Mapping[str, str], str | None] | None:
    """The HTTP status an exception carries, with the answer's headers and URL."""
    response = getattr(exc, "response", None)
    if isinstance(exc, urllib.error.HTTPError):
        candidates: list[tuple[Any, Any, Any]] = [(exc.code, exc.headers, exc.url)]
    else:
        candidates = [
            (
                getattr(response, "status_code", None),
                getattr(response, "headers", None),
                getattr(response, "url", None),
            ),
            (getattr(exc, "status_code", None), getattr(exc, "headers", None), None),
            (getattr(exc, "status", None), getattr(exc, "headers", None), None),
        ]
    for status, headers, url in candidates:
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
            shown_url = None if url is None else str(url)
            return status, headers if isinstance(headers, Mapping) else {}, shown_url
    return None


def _named(exc: BaseException, part: str) -> bool:
    return any(part in cls.__name__ for cls in type(exc).__mro__)


def _httpx_error(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is httpx's ``name`` error (httpx, if nobody imported it, raised
    nothing: it is not imported here for the question)."""
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(exc, getattr(httpx, name))


def _timed_out(exc: BaseException) -> bool:
    return (
        isinstance(exc, TimeoutError)
        or _httpx_error(exc, "TimeoutException")
        or _named(exc, "Timeout")
    )


def _connection_failed(exc: BaseException) -> bool:
    return (
        isinstance(exc, (ConnectionError, urllib.error.URLError, http.client.HTTPException))
        or _httpx_error(exc, "TransportError")
        or _named(exc, "ConnectionError")
    )


def adapter_error_for(
    exc: Exception, *, model: str | None, scrub: Callable[[str], str] = str
) -> AdapterError:
    """The typed error for ``exc``, raised by an adapter's own code (see the module's
    table); ``scrub`` blanks secrets out of the message, which names the original
    exception. The caller chains it: ``raise adapter_error_for(exc, ...) from exc``."""
    message = scrub(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    for cause in exception_chain(exc):
        if isinstance(cause, AdapterError):
            return cause
        found = _status(cause)
        if found is not None:
            status, headers, url = found
            return error_for_status(
                status,
                headers,
                message.encode("utf-8", "replace"),
                model=model,
                url=scrub(url) if url else "the adapter's backend",
            )
        if _timed_out(cause):
            return Timeout(f"the call timed out: {message}", model=model)
        if _connection_failed(cause):
            return ServerError(f"the connection failed: {message}", model=model)
    return AdapterCodeError(
        f"the adapter's code raised {message}", model=model, cause=type(exc).__name__
    )
