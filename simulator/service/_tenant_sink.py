"""A job's results as its tenant may read them, and what they cost.

What a model server says when a call fails is not the tenant's to read: an endpoint
the tenant points at may be an internal service it wants to read back, and an
operator's endpoint may name its hosts and keys. Failures are written as a type, a
status and a short reason of convsim's own. Counts and cost are recorded for the job
(and its key) as results arrive, so reading a job's state never reads its file.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from convsim._errors import ResultsError
from convsim._plural import counted
from convsim._records import ConversationResult, ErrorInfo
from convsim.results._sinks import JsonlSink, RunManifest

from ._store import JobProgress

__all__ = ["TenantSink", "sanitized", "file_progress", "result_rows"]

_REASONS = {
    "Timeout": "no answer in time",
    "ServerError": "the connection failed or was dropped",
    "LocalResourceError": "the service ran out of connections",
    "MalformedResponse": "the answer could not be read",
    "ProtocolError": "the answer could not be read",
    "AuthError": "the key was refused",
    "RateLimited": "rate limited",
    "BadRequest": "the request was refused",
    "QuotaExhausted": "the quota is used up (a 429 asking to wait too long)",
    "ResponseTooLarge": "the answer passed a size limit (response_bytes, inflight_bytes)",
}
_OWN_WORDS = ("EgressRefused", "TranscriptTooLong", "ResultsError")
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


def file_progress(path: Path) -> JobProgress:
    """Counts and cost of the results already in a job's file (a conversation's last
    line is the one that counts)."""
    last: dict[str, dict[str, Any]] = {}
    for row in result_rows(path):
        last[str(row.get("conversation_id"))] = {
            "status": row.get("status"),
            "cost": (row.get("cost_usd") or 0.0) + (row.get("user_cost_usd") or 0.0),
        }
    statuses = [r["status"] for r in last.values()]
    return JobProgress(
        done=statuses.count("DONE"),
        failed=statuses.count("FAILED") + statuses.count("TIMED_OUT"),
        cost_usd=sum(r["cost"] for r in last.values()),
    )


class TenantSink:
    """A :class:`JsonlSink` that writes sanitized errors, stops the job when its file
    would pass ``max_bytes``, and records the job's progress and cost through
    ``record`` (off the event loop, at most once a second, and at the end)."""

    def __init__(
        self,
        inner: JsonlSink,
        *,
        max_bytes: int,
        record: Callable[[JobProgress], None],
    ) -> None:
        self.inner = inner
        self.max_bytes = max_bytes
        self._record = record
        self._progress = JobProgress()
        self._recorded_at = 0.0

    async def open(self, manifest: RunManifest) -> set[str]:
        self._progress = await anyio.to_thread.run_sync(file_progress, self.inner.path)
        seen: set[str] = await self.inner.open(manifest)
        return seen

    async def write(self, result: ConversationResult) -> None:
        result = _sanitized_result(result)
        written = self.inner.path.stat().st_size if self.inner.path.exists() else 0
        if written >= self.max_bytes:
            raise ResultsError(
                f"the job's results reached {counted(written, 'byte', grouped=True)}: at most "
                f"{self.max_bytes:,} "
                "for this key (results_bytes)"
            )
        await self.inner.write(result)
        status = result.status.value
        self._progress = JobProgress(
            done=self._progress.done + (status == "DONE"),
            failed=self._progress.failed + (status in ("FAILED", "TIMED_OUT")),
            cost_usd=self._progress.cost_usd + _cost(result),
        )
        if time.monotonic() - self._recorded_at >= _RECORD_EVERY_S:
            await self._save()

    async def close(self, manifest: RunManifest) -> None:
        await self.inner.close(manifest)
        await self._save()

    async def _save(self) -> None:
        self._recorded_at = time.monotonic()
        await anyio.to_thread.run_sync(self._record, self._progress)
