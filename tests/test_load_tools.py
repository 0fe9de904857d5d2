"""Tool turns in ``convsim load``: a turn's requests offer tools, the model's calls are
answered with the results the workload gives (no tool runs) and sent in the turn's next
request; each request is measured, and the tool-call replies counted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from convsim._errors import ConfigError
from convsim._types import CallTimings, Completion, GenerationParams, Message, ToolCall, ToolSpec
from convsim.adapters import ModelAdapter
from convsim.load import LoadShape, SessionScript, TurnScript, Window, drive, point_result
from convsim.load._requests_file import write_requests
from convsim.load._workloads import ShareGPTSessions, read_sharegpt

pytestmark = pytest.mark.anyio

LOOKUP = ToolSpec(name="look_up_order", description="An order's status.")
GIVEN = '{"status": "shipped"}'


class ToolModel(ModelAdapter):
    """Calls ``calls`` (one tool each) while the turn's last message is not a tool
    result, or always with ``always``; answers in text otherwise."""

    def __init__(self, *names: str, always: bool = False) -> None:
        self.names = names or ("look_up_order",)
        self.always = always
        self.sent: list[tuple[tuple[Message, ...], GenerationParams]] = []

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        self.sent.append((tuple(messages), params))
        timings = CallTimings(ttft_s=0.0, total_s=0.0)
        if params.tools and (self.always or messages[-1].role != "tool"):
            calls = tuple(
                ToolCall(id=f"call_{len(self.sent)}_{k}", name=name, arguments='{"id": "A-1"}')
                for k, name in enumerate(self.names)
            )
            return Completion(
                text="", tool_calls=calls, finish_reason="tool_calls", timings=timings
            )
        return Completion(text="It shipped.", timings=timings)


class OneSession:
    size = 1

    def __init__(self, *turns: TurnScript) -> None:
        self.turns = turns

    def session(self, index: int) -> SessionScript:
        return SessionScript(f"s{index}", None, self.turns)


TOOL_TURN = TurnScript(
    user="Where is order A-1?", tools=(LOOKUP,), tool_results=(("look_up_order", GIVEN),)
)


async def test_a_tool_call_is_answered_with_the_given_result_in_the_next_request() -> None:
    model = ToolModel()
    workload = OneSession(TOOL_TURN, TurnScript(user="Thanks."))
    outcome = await drive(model, workload, LoadShape(concurrency=1))
    first, second, third = model.sent
    assert first[1].tools == (LOOKUP,) and third[1].tools is None  # the plain turn offers none
    *_, asked, answered = second[0]
    assert asked.role == "assistant" and asked.tool_calls[0].name == "look_up_order"
    assert answered == Message(
        role="tool", content=GIVEN, tool_call_id="call_1_0", name="look_up_order"
    )
    assert [m.role for m in third[0]] == ["user", "assistant", "tool", "assistant", "user"]
    assert third[0][3].content == "It shipped."
    records = sorted(outcome.records, key=lambda r: r.sent_s)
    assert [(r.turn_index, r.tool_round, r.tool_calls, r.offered_tools) for r in records] == [
        (0, 0, 1, True),
        (0, 1, 0, True),
        (1, 0, 0, False),
    ]
    (session,) = outcome.sessions
    assert session.turns_done == 2 and not session.failed
    point = point_result(outcome.records, Window(0.0, outcome.window.end_s + 1.0))
    assert point.tools is not None
    assert point.tools.model_dump() == {
        "requests": 2,
        "replies_with_tool_calls": 1,
        "tool_calls": 1,
        "tool_rounds": 1,
        "failed": 0,
    }
    assert point.requests.completed == 3
    assert point.achieved_rate * point.duration_s == 1  # one session started, not two


async def test_the_round_limit_ends_the_turn_and_a_tool_without_a_result_gets_an_error() -> None:
    model = ToolModel("look_up_order", "refund", always=True)
    turn = TurnScript(
        user="Refund A-1.",
        tools=(LOOKUP, ToolSpec(name="refund")),
        tool_results=(("look_up_order", GIVEN),),
        max_tool_rounds=2,
    )
    outcome = await drive(model, OneSession(turn), LoadShape(concurrency=1))
    assert len(model.sent) == 3  # two rounds answered, the third reply ends the turn
    last = model.sent[-1][0]
    refund = [m for m in last if m.role == "tool" and m.name == "refund"]
    assert refund and json.loads(refund[0].content) == {"error": "unknown tool 'refund'"}
    assert [r.tool_round for r in sorted(outcome.records, key=lambda r: r.sent_s)] == [0, 1, 2]
    (session,) = outcome.sessions
    assert session.turns_done == 1


async def test_without_tools_a_reply_with_calls_is_a_plain_answer() -> None:
    model = ToolModel()
    outcome = await drive(model, OneSession(TurnScript(user="hi")), LoadShape(concurrency=1))
    assert len(model.sent) == 1 and model.sent[0][1].tools is None
    assert point_result(outcome.records, Window(0.0, 10.0)).tools is None


async def test_the_requests_file_says_each_requests_round_and_calls(tmp_path: Path) -> None:
    outcome = await drive(ToolModel(), OneSession(TOOL_TURN), LoadShape(concurrency=1))
    path = tmp_path / "r.jsonl"
    write_requests(path, [(0, r) for r in outcome.records])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["tool_round"], r["tool_calls"]) for r in rows] == [(0, 1), (1, 0)]


def _dataset(tmp_path: Path, *items: Any) -> Path:
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


RECORDED = {
    "id": "desk",
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "look_up_order",
                "description": "An order's status.",
                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
            },
        },
        {"name": "refund"},
    ],
    "messages": [
        {"role": "user", "content": "Where is A-1?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look_up_order"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": GIVEN},
        {"role": "assistant", "content": "It shipped yesterday."},
        {"role": "user", "content": "Refund it."},
        {"role": "tool", "name": "refund", "content": '{"refunded": true}'},
        {"role": "assistant", "content": "Done."},
    ],
}


def test_a_recorded_conversation_with_tools_becomes_tool_turns(tmp_path: Path) -> None:
    (conv,) = read_sharegpt(_dataset(tmp_path, RECORDED))
    script = ShareGPTSessions((conv,)).session(0)
    first, second = script.turns
    assert [t.name for t in first.tools] == ["look_up_order", "refund"]
    assert first.tools[0].parameters["properties"] == {"id": {"type": "string"}}
    # each turn: the results recorded in it, else the first recorded in the conversation
    both = {"look_up_order": GIVEN, "refund": '{"refunded": true}'}
    assert dict(first.tool_results) == dict(second.tool_results) == both
    assert first.max_tokens == 3 and not first.exact_output  # "It shipped yesterday."


def test_a_conversation_without_tools_has_no_tool_turns(tmp_path: Path) -> None:
    plain = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    (conv,) = read_sharegpt(_dataset(tmp_path, plain))
    (turn,) = ShareGPTSessions((conv,)).session(0).turns
    assert turn.tools == () and turn.tool_results == () and turn.exact_output


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tools": {"name": "x"}}, "tools: expected a list of tools"),
        ({"tools": [{"description": "no name"}]}, "tools.0.name: expected the tool's name"),
        ({"tools": [{"name": "bad name!"}]}, "tools.0.name: 'bad name!' is not a tool name"),
        ({"tools": [{"name": "x", "parameters": []}]}, "tools.0.parameters: expected a JSON"),
        ({"tools": None}, "records tool results but offers no tools"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}]},
            "conversations.1.tool_call_id: answers no earlier tool call",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "tool_calls": [{"id": "c"}]},
                ]
            },
            "conversations.1.tool_calls.0.function.name",
        ),
    ],
)
def test_bad_tool_data_is_named_by_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _dataset(tmp_path, {**RECORDED, **change})
    with pytest.raises(ConfigError, match=f"{path.name}:1: .*{message}".replace("(", r"\(")):
        read_sharegpt(path)
