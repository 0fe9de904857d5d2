"""A tiny backend of the guide's custom adapter on 127.0.0.1: ``POST /generate`` answers
``{"choices": [{"text", "finish_reason"}], "usage": {...}}``, as the guide's
``CustomModelAdapter`` reads it; statuses queued in ``faults`` are answered first, one
request each."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FALLBACK = "I do not know."


@dataclass
class Backend:
    """What the server answers and what it heard."""

    answers: Mapping[tuple[str, ...], str] = field(default_factory=dict)
    """The answer to give when the prompt contains every text of the key (else
    FALLBACK)."""
    faults: list[int] = field(default_factory=list)
    """Statuses to answer the next requests with, in order (503, 429, ...)."""
    retry_after: str | None = None
    """Sent with a fault, when set."""
    send_usage: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Each request's JSON body, with its Authorization header under ``_auth``."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, prompt: str) -> str:
        return next(
            (a for key, a in self.answers.items() if all(part in prompt for part in key)),
            FALLBACK,
        )


class _Handler(BaseHTTPRequestHandler):
    backend: Backend

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        backend = self.backend
        with backend.lock:
            backend.requests.append({**body, "_auth": self.headers.get("Authorization")})
            fault = backend.faults.pop(0) if backend.faults else None
        if self.path != "/generate":
            self._send(404, {"error": "no such path"})
        elif fault is not None:
            self._send(fault, {"error": "injected"})
        else:
            text = backend.answer(body["prompt"])
            answer: dict[str, Any] = {"choices": [{"text": text, "finish_reason": "stop"}]}
            if backend.send_usage:
                prompt_tokens, completion_tokens = len(body["prompt"].split()), len(text.split())
                answer["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
            self._send(200, answer)

    def _send(self, status: int, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if status >= 400 and self.backend.retry_after is not None:
            self.send_header("Retry-After", self.backend.retry_after)
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return None


@contextmanager
def serving(backend: Backend) -> Iterator[str]:
    """Serve ``backend`` on 127.0.0.1; yields the base URL (the guide's api_endpoint)."""
    handler = type("Handler", (_Handler,), {"backend": backend})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
