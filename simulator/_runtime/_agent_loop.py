"""The agent loop of one assistant turn: the model, the tools it asks for, the model again.

A turn that offers tools calls the model under test; while its answer asks for tools
and the turn has rounds left, the calls run (concurrently, each within its tool's
timeout; an error is the model's to read, as a tool message) and the model is called
again with the calls and their results. The turn ends with an answer, or at its round
limit with the model still asking. Everything runs inside the conversation's task: its
deadline and its cancellation cover every model call and every tool.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from convsim._records import ToolCallRecord, ToolErrorKind
from convsim._types import Completion, GenerationParams, Message, ToolCall, Usage

__all__ = ["ToolOutcome", "ToolRunner", "ToolRun", "AgentTurn", "run_agent_turn"]


class ToolOutcome(Protocol):
    @property
    def result(self) -> str: ...

    @property
    def error(self) -> ToolErrorKind | None: ...

    @property
    def changed(self) -> bool: ...


class ToolRunner(Protocol):
    """One conversation's tools (:class:`convsim.scenarios.ToolBox`)."""

    @property
    def environment(self) -> Any: ...

    async def run(self, call: ToolCall) -> ToolOutcome: ...


@dataclass
class AgentTurn:
    """What a turn's loop has done so far; filled in as it goes, so a turn that fails or
    is cancelled part-way still records every call made and the environment it left."""

    completions: list[Completion] = field(default_factory=list)
    """Every model call's answer, in order; the last one is the turn's answer."""
    messages: list[Message] = field(default_factory=list)
    """The messages the loop added after the turn's prompt: each tool-asking answer and
    the tool results that followed it (the final answer is not among them)."""
    calls: list[ToolCallRecord] = field(default_factory=list)
    rounds: int = 0
    """Model calls that asked for tools and had them run."""
    round_limit: bool = False
    """The turn stopped at its round limit with the model still asking for tools."""
    changed: bool = False
    """A tool call changed the environment document."""

    @property
    def final(self) -> Completion:
        return self.completions[-1]

    @property
    def usage(self) -> Usage:
        """Tokens of the calls actually made (cached answers cost nothing)."""
        total = Usage()
        for completion in self.completions:
            if not completion.cached:
                total = total + completion.usage
        return total

    @property
    def attempts(self) -> int:
        return sum(c.attempts for c in self.completions)

    @property
    def cached(self) -> bool:
        """Every model call of the turn came from the response cache."""
        return bool(self.completions) and all(c.cached for c in self.completions)

    @property
    def latency_s(self) -> float:
        """The model calls' time, tools left out."""
        return sum(c.timings.total_s for c in self.completions if not c.cached)

    def environment_after(self, tools: ToolRunner | None) -> Any:
        """A copy of the environment document when a call of this turn changed it."""
        if tools is None or not self.changed:
            return None
        return copy.deepcopy(tools.environment)


Generate = Callable[[Sequence[Message], GenerationParams], Awaitable[Completion]]


async def run_agent_turn(
    generate: Generate,
    messages: Sequence[Message],
    params: GenerationParams,
    *,
    tools: ToolRunner | None,
    max_rounds: int,
    turn: AgentTurn,
    clock: Callable[[], float] = time.perf_counter,
) -> AgentTurn:
    """Run one assistant turn's loop into ``turn`` (which the caller keeps, so that
    what was done survives a failure) and return it.

    ``params`` offers the tools; a ``tool_choice`` that forces a call (``required`` or
    a tool's name) holds for the first call only, later ones are ``auto``: the model
    must be free to answer once it has its results.
    """
    forced = params.tool_choice not in (None, "auto", "none")
    while True:
        completion = await generate((*messages, *turn.messages), params)
        turn.completions.append(completion)
        if not completion.tool_calls or tools is None or not params.tools:
            return turn
        if turn.rounds >= max_rounds:
            turn.round_limit = True
            return turn
        turn.messages.append(
            Message(
                role="assistant",
                content=completion.text,
                tool_calls=completion.tool_calls,
                reasoning=completion.reasoning,
            )
        )
        await _run_calls(tools, completion.tool_calls, turn, clock)
        turn.rounds += 1
        if forced:
            params = params.model_copy(update={"tool_choice": "auto"})
            forced = False


@dataclass(frozen=True)
class ToolRun:
    """One call's record, and whether it changed the environment."""

    record: ToolCallRecord
    changed: bool


async def _run_calls(
    tools: ToolRunner, calls: Sequence[ToolCall], turn: AgentTurn, clock: Callable[[], float]
) -> None:
    """Run every call of one answer at once, and add each call that finished (also when
    the others were cancelled) to ``turn`` with its result message, in the order asked."""
    done: list[ToolRun | None] = [None] * len(calls)

    async def one(index: int, call: ToolCall) -> None:
        started = clock()
        outcome = await tools.run(call)
        done[index] = ToolRun(
            ToolCallRecord(
                round=turn.rounds,
                id=call.id,
                name=call.name,
                arguments=call.arguments,
                result=outcome.result,
                error=outcome.error,
                latency_s=clock() - started,
            ),
            outcome.changed,
        )

    try:
        if len(calls) == 1:
            await one(0, calls[0])
        else:
            async with anyio.create_task_group() as group:
                for index, call in enumerate(calls):
                    group.start_soon(one, index, call)
    finally:
        for run in done:
            if run is None:
                continue
            record = run.record
            turn.calls.append(record)
            turn.changed = turn.changed or run.changed
            turn.messages.append(
                Message(
                    role="tool", content=record.result, tool_call_id=record.id, name=record.name
                )
            )
