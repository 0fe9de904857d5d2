"""Applications under test that use the pack's tools: what they are given (the turn's
tools, the calls and results in OpenAI shapes), how they ask for calls, and the shapes
refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from conftest import write_pack

import convsim
from convsim import ConversationResult, ProtocolError, Simulator, Status, TurnStatus
from convsim.adapters import AppReply, GenerationParams, Message, ToolCall, ToolSpec
from convsim.scenarios import ToolDefinition

pytestmark = pytest.mark.anyio

ORDERS = {"orders": {"A-1": {"status": "open"}, "A-2": {"status": "shipped"}}}
CANCEL_TOOL: dict[str, Any] = {
    "name": "cancel_order",
    "description": "Cancel an open order.",
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
LOOK_UP_TOOL: dict[str, Any] = {
    "name": "look_up_order",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    "operations": [{"op": "get", "path": "orders.{order_id}"}],
}
CANCEL = ToolDefinition.model_validate(CANCEL_TOOL)
LOOK_UP = ToolDefinition.model_validate(LOOK_UP_TOOL)


def tools_pack(
    folder: Path,
    *tools: dict[str, Any],
    scenarios: list[dict[str, Any]] | None = None,
    thanks: bool = True,
) -> Path:
    """A pack with ``tools`` (tools.yml) on the ``ORDERS`` document: ask to cancel an
    order, then say thanks."""
    turns: list[dict[str, Any]] = [
        {"turn_id": "ask", "prompt_template": "Please cancel order {order}."}
    ]
    if thanks:
        turns.append({"turn_id": "thanks", "depends_on": ["ask"], "prompt_template": "Thanks."})
    write_pack(
        folder,
        {"default": {"turns": turns}},
        scenarios
        or [{"scenario_id": "s0", "scenario_description": "c", "variables": {"order": "A-1"}}],
    )
    (folder / "tools.yml").write_text(
        yaml.safe_dump({"environment": ORDERS, "tools": list(tools or (CANCEL_TOOL,))}),
        encoding="utf-8",
    )
    return folder


async def run_all(model: Any, pack: Path, **settings: Any) -> dict[str, ConversationResult]:
    async with Simulator(model, **settings) as sim:
        return {r.conversation_id: r async for r in sim.run(pack)}


class Agent:
    """An agent written for the OpenAI API: asks for ``cancel_order`` on the order the
    user names, then answers with what the tool said. Keeps what it was given."""

    def __init__(self, call: Any = None) -> None:
        self.seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
        self.call = call

    async def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.seen.append((messages, tools))
        last = messages[-1]
        if last["role"] == "tool":
            return f"Done: {last['content']}"
        if last["content"].startswith("Please cancel"):
            order = last["content"].split()[-1].rstrip(".")
            return AppReply(tool_calls=[self.call or _cancel(order)])
        return "You're welcome."


def _cancel(order: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": "cancel_order", "arguments": json.dumps({"order_id": order})},
    }


async def test_an_app_calls_the_packs_tool_and_answers_with_the_result(tmp_path: Path) -> None:
    agent = Agent()
    results = await run_all(convsim.app(agent), tools_pack(tmp_path / "pack"))
    result = results["s0"]
    assert result.status is Status.DONE
    ask = result.turns[0]
    assert ask.response == 'Done: {"ok": true}'
    (call,) = ask.tool_calls
    assert (call.id, call.name, call.arguments) == (
        "call_1_0",
        "cancel_order",
        '{"order_id": "A-1"}',
    )
    assert call.error is None and ask.tool_rounds == 1
    assert ask.environment["orders"]["A-1"]["status"] == "cancelled"
    # offered the pack's tool as the OpenAI API offers it
    messages, tools = agent.seen[0]
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "cancel_order",
                "description": "Cancel an open order.",
                "parameters": CANCEL.parameters,
            },
        }
    ]
    assert messages == [{"role": "user", "content": "Please cancel order A-1."}]
    # called again with its call and the tool's result, as OpenAI messages
    assert agent.seen[1][0][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "cancel_order", "arguments": '{"order_id": "A-1"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1_0",
            "name": "cancel_order",
            "content": '{"ok": true}',
        },
    ]
    # the next turn's history holds the tool traffic; a text message stays {role, content}
    later, _ = agent.seen[2]
    assert [m["role"] for m in later] == ["user", "assistant", "tool", "assistant", "user"]
    assert later[3] == {"role": "assistant", "content": 'Done: {"ok": true}'}
    assert result.turns[1].response == "You're welcome." and result.turns[1].tool_calls == ()
    assert ConversationResult.model_validate_json(result.model_dump_json()) == result


async def test_a_refused_call_reaches_the_app_as_the_tools_error(tmp_path: Path) -> None:
    agent = Agent(_cancel("A-2"))  # shipped: the precondition refuses it
    result = (await run_all(convsim.app(agent), tools_pack(tmp_path / "pack")))["s0"]
    (call,) = result.turns[0].tool_calls
    assert call.error == "precondition"
    tool_message = agent.seen[1][0][-1]
    assert tool_message["role"] == "tool" and "not open" in tool_message["content"]
    assert result.turns[0].environment is None  # nothing changed


@pytest.mark.parametrize(
    "reply",
    [
        AppReply(
            tool_calls=[ToolCall(id="", name="cancel_order", arguments='{"order_id": "A-1"}')]
        ),
        AppReply(tool_calls=[{"name": "cancel_order", "arguments": {"order_id": "A-1"}}]),
        {"content": None, "tool_calls": [_cancel("A-1")]},
    ],
    ids=["ToolCall", "flat dict, arguments a dict", "OpenAI message dict"],
)
async def test_calls_may_be_toolcalls_or_dicts(reply: Any) -> None:
    async def agent(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return reply

    history = [Message(role="user", content="hi"), Message(role="assistant", content="hello")]
    completion = await convsim.app(agent).generate(
        [*history, Message(role="user", content="cancel A-1")], offering(CANCEL)
    )
    assert completion.tool_calls == (
        ToolCall(id="call_3_0", name="cancel_order", arguments='{"order_id": "A-1"}'),
    )
    assert completion.text == "" and completion.finish_reason == "tool_calls"
    assert completion.usage.source == "estimate" and completion.usage.completion_tokens > 1


async def test_the_openai_sdks_message_may_be_returned_as_it_came() -> None:
    chat = pytest.importorskip("openai.types.chat")
    message = chat.ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", **_cancel("A-1")}]}
    )

    async def agent(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return message  # an agent passing on its model's answer

    completion = await convsim.app(agent).generate(
        [Message(role="user", content="cancel A-1")], offering(CANCEL)
    )
    assert completion.tool_calls == (
        ToolCall(id="c1", name="cancel_order", arguments='{"order_id": "A-1"}'),
    )


def offering(*tools: ToolDefinition, choice: str | None = None) -> GenerationParams:
    return GenerationParams(
        tools=tuple(
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters) for t in tools
        ),
        tool_choice=choice,
    )


async def test_ids_are_made_up_per_reply_and_given_ones_kept() -> None:
    async def agent(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return {
            "tool_calls": [
                {"id": "mine", "function": {"name": "look_up_order", "arguments": "{}"}},
                {"function": {"name": "cancel_order"}},
            ]
        }

    app = convsim.app(agent)
    asked = [Message(role="user", content="q")]
    first = await app.generate(asked, offering(CANCEL, LOOK_UP))
    again = await app.generate(asked, offering(CANCEL, LOOK_UP))
    assert [c.id for c in first.tool_calls] == ["mine", "call_1_1"]
    assert first.tool_calls[1].arguments == "{}"  # no arguments: the empty object
    assert again.tool_calls == first.tool_calls  # the same on every run


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ("cancel_order", "tool_calls is str, not a list of calls"),
        ({"name": "cancel_order"}, "tool_calls is dict, not a list of calls"),
        ([3], "tool_calls[0] is int: give a ToolCall or a dict"),
        ([{"function": {"arguments": "{}"}}], "tool_calls[0].function.name is None"),
        ([{"name": "  "}], "tool_calls[0].name is '  '"),
        ([ToolCall(id="a", name="", arguments="{}")], "tool_calls[0].name is empty"),
        ([{"function": "cancel_order"}], "tool_calls[0].function is str, not a dict"),
        ([{"type": "retrieval", "name": "x"}], "tool_calls[0].type is 'retrieval'"),
        ([{"name": "x", "arguments": [1]}], "tool_calls[0].arguments is list"),
        ([{"function": {"name": "x", "arguments": 7}}], "tool_calls[0].function.arguments is int"),
        ([{"name": "x", "arguments": {"at": {1, 2}}}], "tool_calls[0].arguments cannot be written"),
        ([{"id": 5, "name": "x"}], "tool_calls[0].id is int"),
        (
            [{"id": "a", "name": "x"}, {"id": "a", "name": "y"}],
            "tool_calls[1].id 'a' is tool_calls[0]'s",
        ),
        ({"content": 3}, "its content is int"),
    ],
)
async def test_a_bad_call_shape_is_refused_naming_the_field(calls: Any, message: str) -> None:
    async def agent(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return calls if isinstance(calls, dict) and "content" in calls else {"tool_calls": calls}

    with pytest.raises(ProtocolError, match="unusable reply") as caught:
        await convsim.app(agent, name="python:m:agent").generate(
            [Message(role="user", content="q")], offering(CANCEL)
        )
    assert message in str(caught.value) and "python:m:agent" in str(caught.value)


async def test_calls_when_the_turn_offers_no_tools_are_refused() -> None:
    seen: list[list[dict[str, Any]]] = []

    async def agent(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        seen.append(tools)
        return AppReply(tool_calls=[_cancel("A-1")])

    app = convsim.app(agent)
    for params in (GenerationParams(), offering(CANCEL, choice="none")):
        with pytest.raises(ProtocolError, match="this turn offers no tools"):
            await app.generate([Message(role="user", content="q")], params)
    assert seen == [[], []]  # tool_choice none: the app is offered nothing


async def test_a_bad_call_fails_the_turn_and_the_conversation_ends_as_after_any_failure(
    tmp_path: Path,
) -> None:
    agent = Agent({"type": "function", "function": {"arguments": "{}"}})
    result = (await run_all(convsim.app(agent), tools_pack(tmp_path / "pack")))["s0"]
    turn = result.turns[0]
    assert turn.status is TurnStatus.FAILED and turn.error is not None
    assert (
        turn.error.type == "ProtocolError" and "tool_calls[0].function.name" in turn.error.message
    )
    assert turn.tool_calls == () and len(agent.seen) == 1  # not retried, nothing run


async def test_the_app_may_not_change_the_packs_tools(tmp_path: Path) -> None:
    async def meddler(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        tools[0]["function"]["parameters"]["properties"].clear()
        messages.clear()
        return "ok"

    params = offering(CANCEL)
    await convsim.app(meddler).generate([Message(role="user", content="q")], params)
    assert params.tools is not None and params.tools[0].parameters == CANCEL.parameters


class ToolCrowd:
    """A tool-using app counting its calls in flight: each conversation looks its
    order up, then the answers wait until ``expected`` are in flight together."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.in_flight = self.peak = self.calls = 0
        self.full: anyio.Event | None = None

    async def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.calls += 1
        last = messages[-1]
        if last["role"] == "user":
            order = last["content"].split()[-1].rstrip(".")
            return AppReply(
                tool_calls=[{"name": "look_up_order", "arguments": {"order_id": order}}]
            )
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.full = self.full or anyio.Event()
        if self.in_flight >= self.expected:
            self.full.set()
        try:
            with anyio.move_on_after(5):
                await self.full.wait()
            return f"It is {json.loads(last['content'])['status']}."
        finally:
            self.in_flight -= 1


async def test_a_tool_using_app_runs_64_conversations_at_once(tmp_path: Path) -> None:
    scenarios = [
        {
            "scenario_id": f"s{n}",
            "scenario_description": "c",
            "variables": {"order": f"A-{1 + n % 2}"},
        }
        for n in range(64)
    ]
    pack = tools_pack(tmp_path / "pack", LOOK_UP_TOOL, scenarios=scenarios, thanks=False)
    crowd = ToolCrowd(64)
    results = await run_all(convsim.app(crowd), pack, concurrency=64)
    assert {r.status for r in results.values()} == {Status.DONE}
    assert crowd.peak == 64
    assert results["s0"].turns[0].response == "It is open."
    assert results["s1"].turns[0].response == "It is shipped."
    assert all(len(r.turns[0].tool_calls) == 1 for r in results.values())
