"""Faults the mock server injects: their kinds, and the responses that carry them.

Which request gets a fault is drawn by the server (``fault_rate``, ``faults``); here is
what each kind looks like on the wire. Faults that cut a stream short are applied where
the stream is written (:func:`convsim.adapters.mock._replies.stream_events`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, get_args

from aiohttp import web

from ._delay import format_number
from ._wire import error

__all__ = [
    "FaultKind",
    "FAULT_KINDS",
    "TOOL_FAULTS",
    "DEFAULT_FAULTS",
    "NOT_STREAMED",
    "HALF_EMOJI",
    "OTHER_HALF",
    "MALFORMED_BODY",
    "Dropped",
    "fault_response",
]

FaultKind = Literal[
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
]
"""What an injected fault does:

- ``429``: a rate-limit error with Retry-After (``retry_after_s``);
- ``500``: a server error;
- ``drop``: the connection closes without an answer;
- ``malformed``: a 200 whose JSON is cut short (streaming: an event of broken JSON);
- ``html``: a 200 carrying a proxy's HTML error page instead of the answer;
- ``truncated_sse``: a couple of words, then the stream ends cleanly, without finish
  reason or ``[DONE]``;
- ``stream_error``: a couple of words, then an ``{"error": ...}`` event ends the stream;
- ``stream_drop``: a couple of words, then the connection drops mid-stream;
- ``lone_surrogate``: the answer ends in half an emoji (``"\\ud83d"`` escaped in JSON);
- ``split_surrogate``: an emoji whose two UTF-16 halves come in two stream events, as
  JavaScript gateways send them;
- ``malformed_tool_args``: a tool call whose arguments are cut short (not valid JSON),
  as small models write them. Only an answer that calls a tool gets it (others are
  answered as usual, and no fault is counted), and only when named in ``faults``: the
  default mix leaves it out.

Stream-only kinds in a non-streaming call do what comes closest and count as that:
``truncated_sse`` as ``malformed``, ``stream_error`` as ``500``, ``stream_drop`` as
``drop``, ``split_surrogate`` as ``lone_surrogate``.
"""
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
TOOL_FAULTS: frozenset[FaultKind] = frozenset({"malformed_tool_args"})
"""Kinds that change a tool call, left out of the default mix."""
DEFAULT_FAULTS: tuple[FaultKind, ...] = tuple(k for k in FAULT_KINDS if k not in TOOL_FAULTS)
"""The kinds of the default mix, equally likely."""
NOT_STREAMED: Mapping[FaultKind, FaultKind] = MappingProxyType(
    {
        "truncated_sse": "malformed",
        "stream_error": "500",
        "stream_drop": "drop",
        "split_surrogate": "lone_surrogate",
    }
)
"""What a stream-only kind becomes in a call that does not stream."""
HALF_EMOJI, OTHER_HALF = "\ud83d", "\ude00"
"""The two UTF-16 halves of an emoji (``lone_surrogate``, ``split_surrogate``)."""
MALFORMED_BODY = b'{"id": "malformed", "choices": [{"index": 0, "mess'
"""The answer of a non-streamed ``malformed`` fault: JSON cut short."""
_PROXY_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


class Dropped(web.StreamResponse):
    """A "response" that closes the connection instead of answering.

    aiohttp treats a connection that fails while the response is prepared as a client
    that went away: it writes nothing and logs nothing.
    """

    def __init__(self, request: web.Request) -> None:
        super().__init__()
        transport = request.transport
        if transport is not None:
            transport.close()

    async def prepare(self, request: web.BaseRequest) -> Any:
        raise ConnectionResetError("connection dropped (injected fault)")


def fault_response(
    request: web.Request, kind: FaultKind, retry_after_s: float
) -> web.StreamResponse | None:
    """The response of a fault, or None when the answer itself carries it."""
    if kind == "429":
        response = error(
            429, "Rate limit reached (injected fault).", "requests", "rate_limit_exceeded"
        )
        response.headers["Retry-After"] = format_number(retry_after_s)
        response.headers["retry-after-ms"] = format_number(round(retry_after_s * 1000))
        return response
    if kind == "500":
        return error(
            500,
            "The server had an error while processing your request (injected fault).",
            "server_error",
        )
    if kind == "drop":
        return Dropped(request)
    if kind == "html":
        return web.Response(body=_PROXY_PAGE, content_type="text/html")
    return None
