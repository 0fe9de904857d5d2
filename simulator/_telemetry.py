"""Tracing hooks: what a run tells an observer as it goes, when one is listening.

The runtime (conversations, turns, model calls, tool calls, scoring), the load driver
(one request each) and the HTTP adapters (one attempt each) report to a
:class:`Telemetry`, each through a context manager around the work whose handle takes
the outcome. With no telemetry (the default) every place that could report tests one
value against None and does nothing else, so tracing costs nothing when it is off.

:class:`convsim.OpenTelemetry` (``convsim._otel``, the extra ``otel``) is the
implementation, and the one module that imports OpenTelemetry. The runtime holds its
telemetry explicitly; an adapter, shared by every conversation, reads the one of the
call it serves from a context variable the runtime sets in each conversation's task
(:func:`using_telemetry`), as OpenTelemetry itself carries its current span.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Protocol

from ._records import ConversationResult, Score, ToolErrorKind, TurnRecord
from ._types import Completion, GenerationParams, RequestIds, ToolCall

__all__ = [
    "AttemptSpan",
    "CallSpan",
    "ConversationSpan",
    "ScoringSpan",
    "Telemetry",
    "ToolSpan",
    "TurnSpan",
    "current_telemetry",
    "using_telemetry",
]


class ConversationSpan(Protocol):
    def finish(self, result: ConversationResult) -> None:
        """The conversation ended with ``result`` (also when it was cancelled)."""


class TurnSpan(Protocol):
    def finish(self, record: TurnRecord) -> None:
        """The turn ended with ``record``."""


class CallSpan(Protocol):
    def finish(self, completion: Completion) -> None:
        """The call answered ``completion``; a failure is the exception leaving the block."""


class AttemptSpan(Protocol):
    def headers(self) -> Mapping[str, str]:
        """Headers that carry the trace to the server (W3C ``traceparent``)."""

    def answered(self, status: int | None, ids: RequestIds | None) -> None:
        """The server answered with HTTP ``status`` (None: no answer) and these ids."""


class ToolSpan(Protocol):
    def finish(self, error: ToolErrorKind | None) -> None:
        """The tool call ended: answered (None) or with an error of this kind."""


class ScoringSpan(Protocol):
    def finish(self, scores: Mapping[str, Score]) -> None:
        """The conversation's metrics were scored."""


class Telemetry(Protocol):
    """An observer of runs. Each method opens a span around the work in its block (the
    enclosing one is its parent) and ends it when the block ends, however it ends: an
    exception leaving the block marks it failed with the exception as its cause."""

    def conversation(
        self, *, run_id: str, conversation_id: str, scenario_id: str, model: str
    ) -> AbstractContextManager[ConversationSpan]: ...

    def turn(
        self, *, conversation_id: str, turn_index: int, turn_id: str, role: str
    ) -> AbstractContextManager[TurnSpan]: ...

    def model_call(
        self, *, model: str, provider: str, role: str, params: GenerationParams
    ) -> AbstractContextManager[CallSpan]:
        """One model call, its retries included (``role``: ``assistant``, ``user`` or
        ``extra`` for a task's own question)."""
        ...

    def attempt(
        self, *, model: str, url: str, number: int, sent_id: str | None
    ) -> AbstractContextManager[AttemptSpan]:
        """One HTTP attempt of a model call (``number`` from 1)."""
        ...

    def tool_call(self, *, call: ToolCall) -> AbstractContextManager[ToolSpan]: ...

    def scoring(self, *, conversation_id: str) -> AbstractContextManager[ScoringSpan]: ...

    def load_request(
        self, *, model: str, provider: str, session_id: str, turn_index: int, tool_round: int
    ) -> AbstractContextManager[CallSpan]:
        """One request of a load run (a trace of its own)."""
        ...


# The one module-level variable of the hooks: a context variable, so each task sees the
# telemetry of the run it belongs to (None outside any), as OpenTelemetry's own context.
_CURRENT: ContextVar[Telemetry | None] = ContextVar("convsim_telemetry", default=None)


def current_telemetry() -> Telemetry | None:
    """The telemetry of the run the calling task belongs to; None when tracing is off."""
    return _CURRENT.get()


@contextmanager
def using_telemetry(telemetry: Telemetry | None) -> Iterator[None]:
    """Make ``telemetry`` the current one in this task (and the tasks it starts) for
    the block."""
    token = _CURRENT.set(telemetry)
    try:
        yield
    finally:
        _CURRENT.reset(token)
