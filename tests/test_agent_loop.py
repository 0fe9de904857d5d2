"""The agent loop of one assistant turn, with a stand-in model and stand-in tools."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from convsim._errors import ServerError
from convsim._records import ToolErrorKind
from convsim._runtime._agent_loop import AgentTurn, run_agent_turn
from convsim._types import Completion, GenerationParams, Message, ToolCall, ToolSpec, Usage

pytestmark = pytest.mark.anyio

TOOLS = GenerationParams(tools=(ToolSpec(name="look_up"), ToolSpec(name="cancel")))
PROMPT = (Message(role="user", content="cancel A-1"),)


@dataclass(frozen=True)
class Outcome:
    result: str
    error: ToolErrorKind | None = None
    changed: bool = False


class Tools:
    """Answers every call with its name and arguments; ``blocked`` names wait for ``go``."""

    def __init__(self, blocked: frozenset[str] = frozenset()) -> None:
        self.environment: dict[str, Any] = {"n": 0}
        self.blocked = blocked
        self.go = anyio.Event()
        self.started: list[str] = []
        self.all_started = anyio.Event()
        self.expected_starts = 2

    async def run(self, call: ToolCall) -> Outcome:
        self.started.append(call.name)
        if len(self.started) >= self.expected_starts:
            self.all_started.set()
        if call.name in self.blocked:
            await self.go.wait()
        if call.name == "cancel":
            self.environment["n"] += 1
            return Outcome(json.dumps({"cancelled": True}), changed=True)
        return Outcome(f"{call.name}:{call.arguments}")


class Model:
    """Answers from a script: each item is tool calls (names) or a final text."""

    def __init__(self, script: Sequence[Sequence[str] | str]) -> None:
        self.script = list(script)
        self.seen: list[tuple[tuple[Message, ...], GenerationParams]] = []

    async def __call__(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        self.seen.append((tuple(messages), params))
        step = self.script.pop(0)
        usage = Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12)
        if isinstance(step, str):
            return Completion(text=step, usage=usage)
        calls = tuple(
            ToolCall(id=f"c{len(self.seen)}_{i}", name=n, arguments='{"id": "A-1"}')
            for i, n in enumerate(step)
        )
        return Completion(text="", tool_calls=calls, finish_reason="tool_calls", usage=usage)


async def test_the_model_gets_each_result_and_answers() -> None:
    model, tools, turn = Model([["look_up"], ["cancel"], "Cancelled."]), Tools(), AgentTurn()
    await run_agent_turn(model, PROMPT, TOOLS, tools=tools, max_rounds=5, turn=turn)
    assert turn.final.text == "Cancelled."
    assert [c.name for c in turn.calls] == ["look_up", "cancel"]
    assert [c.round for c in turn.calls] == [0, 1]
    assert turn.rounds == 2 and not turn.round_limit
    # the third call saw the prompt, both calls and both results, in order
    sent = model.seen[2][0]
    assert [m.role for m in sent] == ["user", "assistant", "tool", "assistant", "tool"]
    assert sent[2].tool_call_id == "c1_0" and sent[2].content == 'look_up:{"id": "A-1"}'
    assert sent[4].name == "cancel"
    assert turn.usage.total_tokens == 36 and turn.attempts == 3
    assert turn.environment_after(tools) == {"n": 1}
    assert turn.environment_after(tools) is not tools.environment  # a copy


async def test_calls_of_one_answer_run_at_once_and_are_kept_in_the_order_asked() -> None:
    # look_up waits until cancel has started too: a loop running calls one by one hangs
    tools = Tools(blocked=frozenset({"look_up"}))
    model, turn = Model([["look_up", "cancel"], "done"]), AgentTurn()

    async def release() -> None:
        await tools.all_started.wait()
        tools.go.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(release)
            await run_agent_turn(model, PROMPT, TOOLS, tools=tools, max_rounds=5, turn=turn)
    assert [c.name for c in turn.calls] == ["look_up", "cancel"]
    assert [m.role for m in turn.messages] == ["assistant", "tool", "tool"]


async def test_the_round_limit_stops_a_model_that_keeps_asking() -> None:
    model, turn = Model([["look_up"], ["look_up"], ["look_up"]]), AgentTurn()
    await run_agent_turn(model, PROMPT, TOOLS, tools=Tools(), max_rounds=2, turn=turn)
    assert turn.round_limit and turn.rounds == 2
    assert len(turn.calls) == 2 and len(turn.completions) == 3
    assert turn.final.tool_calls  # the unanswered request is the turn's last answer


async def test_no_round_allowed_runs_no_tool() -> None:
    turn = AgentTurn()
    await run_agent_turn(Model([["cancel"]]), PROMPT, TOOLS, tools=Tools(), max_rounds=0, turn=turn)
    assert turn.round_limit and turn.calls == [] and turn.environment_after(Tools()) is None


async def test_a_forced_choice_holds_for_the_first_call_only() -> None:
    model = Model([["cancel"], "ok"])
    params = TOOLS.model_copy(update={"tool_choice": "cancel"})
    await run_agent_turn(model, PROMPT, params, tools=Tools(), max_rounds=3, turn=AgentTurn())
    assert [p.tool_choice for _, p in model.seen] == ["cancel", "auto"]


async def test_without_tools_offered_a_tool_request_is_the_answer() -> None:
    turn = AgentTurn()
    params = GenerationParams()
    await run_agent_turn(
        Model([["cancel"]]), PROMPT, params, tools=Tools(), max_rounds=3, turn=turn
    )
    assert len(turn.completions) == 1 and turn.calls == []


async def test_a_failing_second_call_keeps_what_the_first_round_did() -> None:
    class Failing(Model):
        async def __call__(
            self, messages: Sequence[Message], params: GenerationParams
        ) -> Completion:
            if self.seen:
                raise ServerError("upstream down", status_code=503)
            return await super().__call__(messages, params)

    tools, turn = Tools(), AgentTurn()
    with pytest.raises(ServerError):
        await run_agent_turn(
            Failing([["cancel"]]), PROMPT, TOOLS, tools=tools, max_rounds=3, turn=turn
        )
    assert [c.name for c in turn.calls] == ["cancel"]
    assert turn.environment_after(tools) == {"n": 1}
    assert turn.usage.total_tokens == 12


async def test_cancelled_mid_round_keeps_the_calls_that_finished() -> None:
    tools = Tools(blocked=frozenset({"look_up"}))
    tools.expected_starts = 2
    model, turn = Model([["look_up", "cancel"]]), AgentTurn()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def cancel_when_started() -> None:
                await tools.all_started.wait()
                await anyio.wait_all_tasks_blocked()
                group.cancel_scope.cancel()

            group.start_soon(cancel_when_started)
            await run_agent_turn(model, PROMPT, TOOLS, tools=tools, max_rounds=3, turn=turn)
    assert [c.name for c in turn.calls] == ["cancel"]  # look_up never returned
    assert turn.changed and tools.environment == {"n": 1}
