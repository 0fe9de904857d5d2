"""A job's results as its tenant may read them, and what they cost.

A tenant's own endpoint may be a host the tenant does not control the answers of (an
internal service it points at to read it back): its failures are written as a type, a
status and a short reason of convsim's own, never the server's words. The cost of
every result is added up and recorded for the key as results arrive.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from convsim._records import ConversationResult, ErrorInfo
from convsim._sinks import JsonlSink, RunManifest

__all__ = ["TenantSink", "sanitized", "file_cost", "result_rows"]

_REASONS = {
    "Timeout": "no answer in time",
    "ServerError": "the connection failed or was dropped",
    "LocalResourceError": "the service ran out of connections",
    "MalformedResponse": "the answer could not be read",
    "ProtocolError": "the answer could not be read",
    "AuthError": "the key was refused",
    "RateLimited": "rate limited",
    "BadRequest": "the request was refused",
}
_OWN_WORDS = ("EgressRefused", "ResponseTooLarge")
"""Errors whose message is convsim's alone (limits and policy), kept whole."""

_RECORD_EVERY_S = 1.0


def sanitized(error: ErrorInfo | None) -> ErrorInfo | None:
    """``error`` with nothing a server said: its type, status and a reason of ours."""
    if error is None or error.type in _OWN_WORDS:
        return error
    reason = _REASONS.get(error.type, "the call failed")
    if error.status_code is not None:
        reason = f"HTTP {error.status_code}: {reason}"
    return error.model_copy(update={"message": reason, "snippet": None})


def _sanitized_result(result: ConversationResult) -> ConversationResult:
    turns = tuple(
        dataclasses.replace(t, error=sanitized(t.error)) if t.error is not None else t
        for t in result.turns
    )
    return result.model_copy(update={"error": sanitized(result.error), "turns": turns})


def _cost(result: ConversationResult) -> float:
    return (result.cost_usd or 0.0) + (result.user_cost_usd or 0.0)


def result_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The whole lines of a job's results file, as JSON objects (blocking)."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # a line still being written
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if isinstance(row, dict):
                yield row


def file_cost(path: Path) -> float:
    """The cost of the results already in a job's file."""
    return sum(
        (row.get("cost_usd") or 0.0) + (row.get("user_cost_usd") or 0.0)
        for row in result_rows(path)
    )


class TenantSink:
    """A :class:`JsonlSink` that writes sanitized errors (``sanitize``) and records the
    job's cost through ``record`` (called off the event loop, at most once a second,
    and at the end)."""

    def __init__(
        self, inner: JsonlSink, *, sanitize: bool, record: Callable[[float], None]
    ) -> None:
        self.inner = inner
        self.sanitize = sanitize
        self._record = record
        self._cost = 0.0
        self._recorded_at = 0.0

    async def open(self, manifest: RunManifest) -> set[str]:
        self._cost = await anyio.to_thread.run_sync(file_cost, self.inner.path)
        seen: set[str] = await self.inner.open(manifest)
        return seen

    async def write(self, result: ConversationResult) -> None:
        if self.sanitize:
            result = _sanitized_result(result)
        await self.inner.write(result)
        self._cost += _cost(result)
        if time.monotonic() - self._recorded_at >= _RECORD_EVERY_S:
            await self._save()

    async def close(self, manifest: RunManifest) -> None:
        await self.inner.close(manifest)
        await self._save()

    async def _save(self) -> None:
        self._recorded_at = time.monotonic()
        await anyio.to_thread.run_sync(self._record, self._cost)
