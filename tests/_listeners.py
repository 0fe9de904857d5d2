"""Loopback listeners that stand in for other hosts: each records every byte it hears
and answers as told (an OpenAI-compatible model, a redirect, an internal page, an
endless body)."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any

Answer = Callable[[bytes], bytes]


def _http(
    status: str, body: bytes, content_type: str = "application/json", extra: str = ""
) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


def openai_model(request: bytes) -> bytes:
    """A model that answers every chat call with one short sentence."""
    line = request.split(b"\r\n", 1)[0]
    if b"GET" in line and b"/models" in line:
        return _http("200 OK", json.dumps({"data": [{"id": "m"}]}).encode())
    answer = {
        "choices": [{"message": {"role": "assistant", "content": "Happy to help with that."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16},
    }  # fmt: skip
    return _http("200 OK", json.dumps(answer).encode())


def redirect_to(location: str) -> Answer:
    def answer(request: bytes) -> bytes:
        return _http("307 Temporary Redirect", b"", extra=f"Location: {location}\r\n")

    return answer


def internal_page(text: str, status: str = "200 OK") -> Answer:
    def answer(request: bytes) -> bytes:
        return _http(status, text.encode(), content_type="text/html")

    return answer


class Listener:
    """A TCP listener on 127.0.0.1: ``requests`` holds the raw bytes of each request."""

    def __init__(self, answer: Answer = openai_model, *, endless: bool = False) -> None:
        self.answer = answer
        self.endless = endless
        self.requests: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with outer._lock:
                    outer.connections += 1
                request = _read_request(self.request)
                with outer._lock:
                    outer.requests.append(request)
                try:
                    if outer.endless:
                        _endless(self.request)
                    else:
                        self.request.sendall(outer.answer(request))
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def heard(self, text: str | bytes) -> bool:
        needle = text.encode() if isinstance(text, str) else text
        with self._lock:
            return any(needle in r for r in self.requests)


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(5)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body
    except OSError:
        return data


def _endless(conn: socket.socket) -> None:
    """A 200 whose JSON body never ends."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    piece = b'{"choices": [{"message": {"content": "' + b"x" * 65536
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    filler = b"x" * 65536
    more = b"%x\r\n%s\r\n" % (len(filler), filler)
    conn.sendall(chunk)
    while True:
        conn.sendall(more)
