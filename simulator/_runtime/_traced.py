"""A conversation's tools and scoring, traced: the actor uses these in their place when
its run traces, so that the untraced path has no tracing code at all."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from convsim._types import ToolCall
from convsim.metrics import ScoringSession

from .._telemetry import Telemetry
from ._agent_loop import ToolOutcome, ToolRunner

__all__ = ["TracedScoring", "TracedTools"]


class TracedTools:
    """A conversation's tools, each call in a span of its own."""

    def __init__(self, tools: ToolRunner, telemetry: Telemetry) -> None:
        self.tools = tools
        self.telemetry = telemetry

    @property
    def environment(self) -> Any:
        return self.tools.environment

    async def run(self, call: ToolCall) -> ToolOutcome:
        with self.telemetry.tool_call(call=call) as span:
            outcome = await self.tools.run(call)
            span.finish(outcome.error)
            return outcome


class TracedScoring:
    """A scoring session whose end (where conversation metrics are scored, judges
    awaited) is a span of its own, with each metric's value."""

    def __init__(self, session: ScoringSession, telemetry: Telemetry) -> None:
        self.session = session
        self.telemetry = telemetry

    async def __aenter__(self) -> ScoringSession:
        return await self.session.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cid = self.session.conversation.conversation_id
        with self.telemetry.scoring(conversation_id=cid) as span:
            try:
                await self.session.__aexit__(exc_type, exc, tb)
            finally:
                try:
                    scores = self.session.scored.scores
                except RuntimeError:  # scoring itself broke: the exception says how
                    scores = {}
                span.finish(scores)
