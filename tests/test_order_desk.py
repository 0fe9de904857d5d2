"""The bundled order_desk pack is consistent: each scenario's expected calls, run
through a ToolBox in order, reach its final state, and the wrong call a scenario's
policy forbids breaks it."""

from __future__ import annotations

import json
import re

import pytest

from convsim._types import ToolCall
from convsim.scenarios import Conversation, StateCheck, ToolBox, check_state, load_pack

pytestmark = pytest.mark.anyio

PACK = load_pack("order_desk")
CONVERSATIONS = {c.conversation_id: c for c in PACK.conversations}

FORBIDDEN = {
    "od_refund_over_limit": ToolCall("x", "refund_order", '{"order_id": "A-1005"}'),
    "od_refund_over_limit_two_turns": ToolCall("x", "refund_order", '{"order_id": "A-1009"}'),
    "od_address_abroad": ToolCall(
        "x", "change_address", '{"order_id": "A-1007", "address": "22 Rue de Rivoli, Paris"}'
    ),
}
"""The call the soft policy (system prompt) forbids, which the tools would allow."""


async def run_calls(conv: Conversation, calls: list[ToolCall]) -> ToolBox:
    assert conv.tools is not None
    box = ToolBox(conv.tools, conv.scenario, allow_code=False)
    for call in calls:
        outcome = await box.run(call)
        assert outcome.error in (None, "precondition"), outcome  # refused by policy at most
    return box


def expected_calls(conv: Conversation) -> list[ToolCall]:
    return [
        ToolCall(f"call_{i}", e.name, json.dumps(e.arguments))
        for i, e in enumerate(conv.scenario.expected_tool_calls)
    ]


def final_state_held(conv: Conversation, box: ToolBox) -> bool:
    checks = list(conv.scenario.final_state)
    assert conv.scenario.goal is not None
    goal_checks = [c.value for c in conv.scenario.goal.all_of if c.kind == "state"]
    return all(check_state(box.environment, c).held for c in checks) and all(
        check_state(box.environment, StateCheck.model_validate(v)).held for v in goal_checks
    )


@pytest.mark.parametrize("sid", sorted(CONVERSATIONS))
async def test_the_expected_calls_reach_the_final_state(sid: str) -> None:
    conv = CONVERSATIONS[sid]
    assert conv.scenario.expected_tool_calls and conv.scenario.final_state
    box = await run_calls(conv, expected_calls(conv))
    assert final_state_held(conv, box), box.environment
    if "refuse" not in conv.scenario.tags and "lookup" not in conv.scenario.tags:
        start = await run_calls(conv, [])
        assert not final_state_held(conv, start)  # the calls did the work, not the start


@pytest.mark.parametrize("sid", sorted(FORBIDDEN))
async def test_the_call_a_soft_policy_forbids_fails_the_final_state(sid: str) -> None:
    conv = CONVERSATIONS[sid]
    assert "policy" in conv.scenario.tags
    box = await run_calls(conv, [*expected_calls(conv), FORBIDDEN[sid]])
    assert not final_state_held(conv, box)


def test_the_pack_covers_what_it_promises() -> None:
    rows = [c.scenario for c in PACK.conversations]
    assert len(rows) >= 10
    assert {s.scenario_id for s in rows if "policy" in s.tags} == set(FORBIDDEN)
    one_turn_rounds = [
        s for s in rows if s.scenario_type == "default" and len(s.expected_tool_calls) >= 2
    ]
    assert len(one_turn_rounds) >= 3
    assert sum(s.scenario_type == "two_step" for s in rows) >= 3
    for conv in PACK.conversations:
        sc = conv.scenario
        assert set(sc.reference_responses) == {t.turn_id for t in conv.flow.turns}
        assert sc.goal is not None and any(c.kind == "state" for c in sc.goal.all_of)
        assert set(conv.flow.flow.metrics) == {
            "tool_call_accuracy",
            "trajectory_match",
            "final_state",
            "tool_errors",
            "goal_achievement",
        }
    tools = PACK.conversations[0].tools
    assert tools is not None
    assert all(re.fullmatch(r"A-\d{4}", order) for order in tools.environment["orders"])
