"""Assistant turns that call tools, run by the conversation actor: what is recorded,
what the model and the simulated user see, and the edges (timeouts, cancellation)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
import yaml
from conftest import clock, manual_clock, write_pack

from convsim import ConversationResult, Status, TerminationReason, TurnStatus, load_pack
from convsim._runtime._actor import ActorSettings, ConversationActor
from convsim._runtime._call_settings import CallSettings
from convsim.adapters import (
    Completion,
    GenerationParams,
    Message,
    ModelAdapter,
    ModelInfo,
    ToolCall,
    Usage,
)
from convsim.scenarios import Conversation, ToolDefinition, ToolSet

pytestmark = pytest.mark.anyio

ORDERS = {"orders": {"A-1": {"status": "open"}, "A-2": {"status": "shipped"}}}
CANCEL = ToolDefinition.model_validate(
    {
        "name": "cancel_order",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
        "operations": [
            {
                "op": "set",
                "path": "orders.{order_id}.status",
                "value": "cancelled",
                "preconditions": [
                    {"path": "orders.{order_id}.status", "equals": "open", "error": "not open"}
                ],
            }
        ],
    }
)
WAIT = ToolDefinition.model_validate(
    {"name": "wait_forever", "python": "_agent_tools:wait_forever", "timeout": 600}
)


class ToolModel(ModelAdapter):
    """Asks for the calls its script gives for each model call, then answers."""

    def __init__(self, script: Sequence[Sequence[tuple[str, dict[str, Any]]] | str]) -> None:
        self.script = list(script)
        self.calls: list[tuple[tuple[Message, ...], GenerationParams]] = []

    def model_info(self) -> ModelInfo:
        return ModelInfo(model_id="tool-model", model_type="fake", provider="tests")

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        self.calls.append((tuple(messages), params))
        step = self.script.pop(0) if self.script else "nothing more"
        usage = Usage(prompt_tokens=5, completion_tokens=1, total_tokens=6)
        if isinstance(step, str):
            return Completion(text=step, usage=usage)
        calls = tuple(
            ToolCall(id=f"call{len(self.calls)}_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(step)
        )
        return Completion(text="", tool_calls=calls, finish_reason="tool_calls", usage=usage)


def conversation(
    tmp_path: Path, *tools: ToolDefinition, flow: dict[str, Any] | None = None
) -> Conversation:
    """The first conversation of a pack whose tools.yml declares ``tools``."""
    turns = [
        {"turn_id": "ask", "prompt_template": "Please cancel order A-1."},
        {"turn_id": "thanks", "depends_on": ["ask"], "prompt_template": "Thanks."},
    ]
    folder = write_pack(
        tmp_path / "pack",
        {"default": {"turns": turns, **(flow or {})}},
        [{"scenario_id": "s0", "scenario_description": "cancel"}],
    )
    declared = [t.model_dump(mode="json", exclude_unset=True) for t in tools or (CANCEL,)]
    (folder / "tools.yml").write_text(yaml.safe_dump({"environment": ORDERS, "tools": declared}))
    return load_pack(folder, allow_code=True).conversations[0]


def actor(conv: Conversation, model: ModelAdapter, **settings: Any) -> ConversationActor:
    return ConversationActor(
        conv,
        model=model,
        settings=ActorSettings(
            run_id="r",
            pack_name="pack",
            pack_hash="h",
            model_name="tool-model",
            assistant=CallSettings(defaults=GenerationParams(), side="assistant"),
            **settings,
        ),
    )


async def test_a_tool_turn_is_recorded_and_reads_back_equal(tmp_path: Path) -> None:
    model = ToolModel([[("cancel_order", {"order_id": "A-1"})], "Order A-1 is cancelled.", "Bye"])
    result = await actor(conversation(tmp_path), model).run()
    assert result.status is Status.DONE
    ask = result.turns[0]
    assert ask.response == "Order A-1 is cancelled."
    assert ask.tool_rounds == 1 and not ask.tool_round_limit
    (call,) = ask.tool_calls
    assert (call.name, call.error, json.loads(call.result)) == ("cancel_order", None, {"ok": True})
    assert ask.environment["orders"]["A-1"]["status"] == "cancelled"
    assert ask.usage is not None and ask.usage.total_tokens == 12 and ask.attempts == 2
    assert result.usage.total_tokens == 18  # two calls for the first turn, one for the second
    roles = [m.role for m in result.transcript]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    # the model was offered the tool, and its second call carried the call and its result
    (_first, params), (second, _) = model.calls[0], model.calls[1]
    assert [t.name for t in params.tools or ()] == ["cancel_order"]
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert second[2].tool_call_id == "call1_0"
    # the second turn's model saw the whole history, tools included; no environment change
    assert [m.role for m in result.turns[1].messages][:3] == ["user", "assistant", "tool"]
    assert result.turns[1].environment is None and result.turns[1].tool_calls == ()
    line = result.model_dump_json()
    assert json.loads(line)["schema_version"] == 5
    assert ConversationResult.model_validate_json(line) == result


async def test_a_refused_call_changes_nothing_and_the_model_is_told_why(tmp_path: Path) -> None:
    model = ToolModel([[("cancel_order", {"order_id": "A-2"})], "Sorry, it has shipped."])
    result = await actor(conversation(tmp_path), model).run()
    (call,) = result.turns[0].tool_calls
    assert call.error == "precondition" and "not open" in call.result
    assert result.turns[0].environment is None  # nothing changed
    told = model.calls[1][0][-1]
    assert told.role == "tool" and "not open" in told.content


async def test_malformed_arguments_are_a_tool_error_and_the_turn_goes_on(tmp_path: Path) -> None:
    class Broken(ToolModel):
        async def generate(
            self, messages: Sequence[Message], params: GenerationParams
        ) -> Completion:
            if not self.calls:
                self.calls.append((tuple(messages), params))
                call = ToolCall(id="c", name="cancel_order", arguments='{"order_id": "A-')
                return Completion(text="", tool_calls=(call,), finish_reason="tool_calls")
            return await super().generate(messages, params)

    result = await actor(conversation(tmp_path), Broken(["I could not do that."])).run()
    (call,) = result.turns[0].tool_calls
    assert call.error == "invalid_arguments" and call.arguments == '{"order_id": "A-'
    assert result.turns[0].status is TurnStatus.COMPLETED


async def test_the_round_limit_ends_the_turn_with_a_valid_transcript(tmp_path: Path) -> None:
    again = [("cancel_order", {"order_id": "A-9"})]
    model = ToolModel([again, again, again, "Bye"])
    conv = conversation(tmp_path, flow={"max_tool_rounds": 2})
    result = await actor(conv, model).run()
    ask = result.turns[0]
    assert ask.tool_round_limit and ask.tool_rounds == 2 and len(ask.tool_calls) == 2
    # every call in the transcript is answered: the unanswered request is not kept
    asked = {c.id for m in result.transcript for c in m.tool_calls}
    answered = {m.tool_call_id for m in result.transcript if m.role == "tool"}
    assert asked == answered


async def test_a_turn_may_offer_no_tools_or_force_one(tmp_path: Path) -> None:
    model = ToolModel(["fine", "fine"])
    turns = [
        {"turn_id": "ask", "prompt_template": "hi", "tools": [], "max_tool_rounds": 1},
        {"turn_id": "go", "prompt_template": "go", "tool_choice": "cancel_order"},
    ]
    conv = conversation(tmp_path)
    flow = conv.flow.flow.model_copy(
        update={"turns": [conv.flow.flow.turns[0].model_validate(t) for t in turns]}
    )
    prepared = tuple(
        dataclasses.replace(p, config=flow.turns[i]) for i, p in enumerate(conv.flow.turns)
    )
    conv = dataclasses.replace(conv, flow=dataclasses.replace(conv.flow, flow=flow, turns=prepared))
    await actor(conv, model).run()
    assert model.calls[0][1].tools is None
    assert model.calls[1][1].tool_choice == "cancel_order"


async def test_a_conversation_cancelled_mid_tool_keeps_the_round_so_far(tmp_path: Path) -> None:
    model = ToolModel([[("cancel_order", {"order_id": "A-1"}), ("wait_forever", {})]])
    running = actor(conversation(tmp_path, CANCEL, WAIT), model)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:

            async def cancel_once_blocked() -> None:
                while len(model.calls) < 1:
                    await anyio.lowlevel.checkpoint()
                await anyio.wait_all_tasks_blocked()
                group.cancel_scope.cancel()

            group.start_soon(cancel_once_blocked)
            await running.run()
    result = running.result
    assert result is not None and result.status is Status.CANCELLED
    ask = result.turns[0]
    assert ask.status is TurnStatus.FAILED
    assert [c.name for c in ask.tool_calls] == ["cancel_order"]  # wait_forever never returned
    assert ask.environment["orders"]["A-1"]["status"] == "cancelled"
    assert result.usage.total_tokens == 6  # the model call made was spent


async def test_the_simulated_user_sees_no_tool_traffic(tmp_path: Path) -> None:
    from convsim._runtime._user import SimulatedUser

    class Echo(ModelAdapter):
        sent: ClassVar[list[Message]] = []

        def model_info(self) -> ModelInfo:
            return ModelInfo(model_id="u", model_type="fake", provider="tests")

        async def generate(
            self, messages: Sequence[Message], params: GenerationParams
        ) -> Completion:
            type(self).sent = list(messages)
            return Completion(text="ok")

    transcript = [
        Message(role="user", content="cancel A-1"),
        Message(
            role="assistant", content="", tool_calls=(ToolCall(id="c", name="x", arguments="{}"),)
        ),
        Message(role="tool", content='{"ok": true}', tool_call_id="c", name="x"),
        Message(role="assistant", content="Cancelled."),
    ]
    conv = conversation(tmp_path)
    await SimulatedUser(Echo(), conv.scenario).reply("next", transcript, GenerationParams())
    assert [(m.role, m.content) for m in Echo.sent[1:]] == [
        ("assistant", "cancel A-1"),
        ("user", "Cancelled."),
    ]


@manual_clock
async def test_the_conversation_deadline_ends_a_tool_that_never_answers(tmp_path: Path) -> None:
    model = ToolModel([[("wait_forever", {})]])
    running = actor(conversation(tmp_path, WAIT), model, conversation_timeout=30)

    async def pass_the_deadline() -> None:
        while not model.calls:
            await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        clock().advance(31)

    async with anyio.create_task_group() as group:
        group.start_soon(pass_the_deadline)
        result = await running.run()
    assert result.status is Status.TIMED_OUT
    assert result.termination_reason is TerminationReason.CONVERSATION_TIMEOUT
    assert result.turns[0].status is TurnStatus.FAILED and result.turns[0].tool_calls == ()
    assert result.usage.total_tokens == 6


async def test_a_simulated_user_stops_once_the_state_goal_holds(tmp_path: Path) -> None:
    class User(ModelAdapter):
        def model_info(self) -> ModelInfo:
            return ModelInfo(model_id="user", model_type="fake", provider="tests")

        async def generate(
            self, messages: Sequence[Message], params: GenerationParams
        ) -> Completion:
            return Completion(text="Please cancel order A-1.")

    pack = load_pack(
        write_pack(
            tmp_path / "pack",
            {
                "default": {
                    "turns": [
                        {"turn_id": "talk", "role": "user", "prompt_template": "go", "repeat": 3}
                    ]
                }
            },
            [
                {
                    "scenario_id": "s0",
                    "scenario_description": "cancel",
                    "user": {"persona": "a customer"},
                    "goal": {
                        "description": "A-1 cancelled",
                        "all_of": [
                            {
                                "kind": "state",
                                "value": {"path": "orders.A-1.status", "equals": "cancelled"},
                            }
                        ],
                    },
                }
            ],
        )
    )
    conv = dataclasses.replace(
        pack.conversations[0], tools=ToolSet(definitions=(CANCEL,), environment=ORDERS)
    )
    model = ToolModel(["Let me check.", [("cancel_order", {"order_id": "A-1"})], "Done."])
    running = ConversationActor(
        conv,
        model=model,
        user_model=User(),
        settings=ActorSettings(
            run_id="r",
            pack_name="pack",
            pack_hash="h",
            model_name="tool-model",
            assistant=CallSettings(defaults=GenerationParams(), side="assistant"),
            user=CallSettings(defaults=GenerationParams(), side="user"),
        ),
    )
    result = await running.run()
    assert result.termination_reason is TerminationReason.GOAL_REACHED
    # the first answer changed nothing; the second cancelled the order and ended it
    assert [t.status for t in result.turns] == [
        TurnStatus.COMPLETED,
        TurnStatus.COMPLETED,
        TurnStatus.SKIPPED,
    ]
