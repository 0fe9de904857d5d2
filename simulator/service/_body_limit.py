"""A limit on request bodies however they are sent: declared, chunked or neither.

Counted as the body arrives, so a body sent with ``Transfer-Encoding: chunked`` (no
``Content-Length``) stops at the limit like a declared one; reading stops there and the
request is answered 413, whatever the application made of the cut body.
"""

from __future__ import annotations

import json
from typing import Any

from convsim._plural import counted

__all__ = ["BodyLimit"]

Scope = dict[str, Any]
Message = dict[str, Any]


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_bytes):
                await self._refuse(send)
                return
        received = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, over
            message: Message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:
                return  # the application's answer to a cut body is not sent
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(
            {"detail": f"request body too large: at most {counted(self.max_bytes, 'byte')}"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
