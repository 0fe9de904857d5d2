"""ToolBox: a pack's tools answering a conversation's calls, every outcome kind."""

from __future__ import annotations

import copy
import json
from typing import Any

import anyio
import pytest
from _tool_functions import GATES
from conftest import clock, manual_clock

from convsim._types import ToolCall
from convsim.scenarios import Scenario, ToolBox, ToolOutcome, ToolSet, ToolsFile

pytestmark = pytest.mark.anyio

ENVIRONMENT = {
    "orders": {
        "A-1001": {"status": "placed", "total": 120.5, "items": ["shoes"]},
        "A-1002": {"status": "shipped", "total": 40, "items": []},
    },
    "log": [],
}
ORDER_ID = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "pattern": "^A-\\d{4}$"}},
    "required": ["order_id"],
}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "look_up_order",
        "parameters": ORDER_ID,
        "operations": [
            {
                "op": "get",
                "path": "orders.{order_id}",
                "preconditions": [
                    {"path": "orders.{order_id}", "exists": True, "error": "no order {order_id}"}
                ],
            }
        ],
    },
    {
        "name": "cancel_order",
        "parameters": ORDER_ID,
        "operations": [
            {
                "op": "set",
                "path": "orders.{order_id}.status",
                "value": "cancelled",
                "preconditions": [{"path": "orders.{order_id}.status", "equals": "placed"}],
            },
            {"op": "append", "path": "log", "value": {"cancelled": "{order_id}"}},
        ],
        "result": {"order_id": "{order_id}", "status": "cancelled"},
    },
    {
        "name": "set_quantity",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1},
            },
            "required": ["order_id", "quantity"],
        },
        "operations": [
            {"op": "set", "path": "orders.{order_id}.quantity", "value": "{quantity}"},
            {"op": "set", "path": "orders.{order_id}.note", "value": "{quantity} pieces"},
        ],
    },
    {
        "name": "forget_order",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        "operations": [{"op": "remove", "path": "orders.{order_id}"}],
    },
    {
        "name": "shipping_quote",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string"}, "kg": {"type": "number"}},
        },
        "responses": [
            {"match": {"country": "UK", "kg": 2}, "result": {"price": 5}},
            {"match": {"country": "UK"}, "result": "ask for the weight"},
            {"match": {"country": "Mars"}, "error": "we do not ship to Mars"},
        ],
    },
    {
        "name": "weather",
        "responses": [{"match": {"city": "Oslo"}, "result": "snow"}],
        "default": {"result": {"forecast": "sun"}},
    },
    {"name": "slow", "python": "_tool_functions:slow", "timeout": 10},
    {
        "name": "add_note",
        "parameters": {"type": "object", "properties": {"note": {"type": "string"}}},
        "python": "_tool_functions:add_note",
    },
    {"name": "shout", "python": "_tool_functions:shout"},
    {"name": "fails", "python": "_tool_functions:fails"},
    {"name": "returns_a_set", "python": "_tool_functions:returns_a_set"},
    {"name": "big", "python": "_tool_functions:big"},
    {"name": "missing_module", "python": "no_such_module_xyz:f"},
]


def toolset(tools: list[dict[str, Any]] | None = None) -> ToolSet:
    parsed = ToolsFile.model_validate({"environment": ENVIRONMENT, "tools": tools or TOOLS})
    return ToolSet(tuple(parsed.tools), parsed.environment)


def box(*, allow_code: bool = True, **scenario: Any) -> ToolBox:
    sc = Scenario.model_validate({"scenario_id": "s", "scenario_description": "d", **scenario})
    return ToolBox(toolset(), sc, allow_code=allow_code)


def call(name: str, arguments: Any = None, raw: str | None = None) -> ToolCall:
    text = raw if raw is not None else json.dumps(arguments or {})
    return ToolCall(id="call_1", name=name, arguments=text)


# -- declared responses ---------------------------------------------------------------


async def test_responses_take_the_first_match_with_numbers_by_value() -> None:
    tools = box()
    assert await tools.run(call("shipping_quote", {"country": "UK", "kg": 2.0})) == ToolOutcome(
        '{"price": 5}'
    )
    # the first response needs kg too; the second takes the rest, text as it is
    outcome = await tools.run(call("shipping_quote", {"country": "UK", "kg": 3}))
    assert outcome == ToolOutcome("ask for the weight")


async def test_responses_fall_back_to_the_default_else_say_none_matches() -> None:
    tools = box()
    assert (await tools.run(call("weather", {"city": "Oslo"}))).result == "snow"
    assert (await tools.run(call("weather", {"city": "Rome"}))).result == '{"forecast": "sun"}'
    outcome = await tools.run(call("shipping_quote", {"country": "FR"}))
    assert outcome.error == "tool_error"
    assert "no declared answer matches" in outcome.result


async def test_a_declared_error_is_a_tool_error() -> None:
    outcome = await box().run(call("shipping_quote", {"country": "Mars"}))
    assert outcome == ToolOutcome("we do not ship to Mars", "tool_error")


# -- what the model sent --------------------------------------------------------------


async def test_an_unknown_tool_lists_the_tools() -> None:
    outcome = await box().run(call("launch_rocket", {}))
    assert outcome.error == "unknown_tool"
    assert outcome.result.startswith("no tool named 'launch_rocket'; tools: look_up_order, ")


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ('{"order_id": ', "not valid JSON"),
        ('["A-1001"]', "a JSON list, not an object"),
        ('{"order_id": "B-1"}', "order_id: 'B-1' does not match '^A-\\\\d{4}$'"),
        ('{"order_id": 1001}', "order_id: 1001 is not of type 'string'"),
        ("{}", "'order_id' is a required property"),
    ],
)
async def test_arguments_that_are_not_an_object_or_fail_the_schema_say_why(
    raw: str, said: str
) -> None:
    tools = box()
    outcome = await tools.run(call("cancel_order", raw=raw))
    assert outcome.error == "invalid_arguments"
    assert said in outcome.result
    assert tools.environment == ENVIRONMENT


async def test_schema_patterns_run_on_re2() -> None:
    # (a+)+$ takes exponential time on a backtracking engine; RE2 answers at once
    tools = [
        {
            "name": "t",
            "parameters": {"type": "object", "properties": {"x": {"pattern": "^(a+)+$"}}},
            "responses": [],
            "default": {"result": "ok"},
        }
    ]
    sc = Scenario(scenario_id="s", scenario_description="d")
    outcome = await ToolBox(toolset(tools), sc, allow_code=False).run(
        call("t", {"x": "a" * 5000 + "!"})
    )
    assert outcome.error == "invalid_arguments"


# -- operations -----------------------------------------------------------------------


async def test_a_get_answers_with_the_value_it_read() -> None:
    outcome = await box().run(call("look_up_order", {"order_id": "A-1001"}))
    assert outcome == ToolOutcome(json.dumps(ENVIRONMENT["orders"]["A-1001"]))


async def test_operations_change_the_document_and_answer_with_the_result() -> None:
    tools = box()
    outcome = await tools.run(call("cancel_order", {"order_id": "A-1001"}))
    assert outcome == ToolOutcome('{"order_id": "A-1001", "status": "cancelled"}', changed=True)
    assert tools.environment["orders"]["A-1001"]["status"] == "cancelled"
    assert tools.environment["log"] == [{"cancelled": "A-1001"}]


async def test_a_failed_precondition_says_why_and_leaves_the_document_unchanged() -> None:
    tools = box()
    before = copy.deepcopy(tools.environment)
    outcome = await tools.run(call("cancel_order", {"order_id": "A-1002"}))
    assert outcome.error == "precondition"
    assert outcome.result == "orders.A-1002.status: expected 'placed', found 'shipped'"
    assert not outcome.changed
    assert tools.environment == before  # the append after it did not run either
    missing = await tools.run(call("look_up_order", {"order_id": "A-9999"}))
    assert missing == ToolOutcome("no order A-9999", "precondition")


async def test_a_placeholder_alone_keeps_the_arguments_type() -> None:
    tools = box()
    outcome = await tools.run(call("set_quantity", {"order_id": "A-1001", "quantity": 3}))
    assert outcome == ToolOutcome('{"ok": true}', changed=True)
    order = tools.environment["orders"]["A-1001"]
    assert order["quantity"] == 3 and isinstance(order["quantity"], int)
    assert order["note"] == "3 pieces"


async def test_a_set_under_a_missing_parent_creates_nothing() -> None:
    tools = box()
    outcome = await tools.run(call("set_quantity", {"order_id": "A-7777", "quantity": 1}))
    assert outcome.error == "tool_error"
    assert outcome.result == "cannot set orders.A-7777.quantity: orders.A-7777 does not exist"
    assert tools.environment == ENVIRONMENT


async def test_remove_deletes_and_a_missing_key_is_an_error() -> None:
    tools = box()
    assert (await tools.run(call("forget_order", {"order_id": "A-1002"}))).changed
    assert "A-1002" not in tools.environment["orders"]
    again = await tools.run(call("forget_order", {"order_id": "A-1002"}))
    assert again == ToolOutcome("cannot remove orders.A-1002: nothing is there", "tool_error")
    unpassed = await tools.run(call("forget_order", {}))
    assert unpassed.error == "invalid_arguments"
    assert "needs argument 'order_id'" in unpassed.result


async def test_setting_a_value_already_there_changes_nothing() -> None:
    tools = box()
    await tools.run(call("set_quantity", {"order_id": "A-1001", "quantity": 2}))
    outcome = await tools.run(call("set_quantity", {"order_id": "A-1001", "quantity": 2}))
    assert outcome.error is None and not outcome.changed


async def test_each_box_has_a_fresh_document_and_a_scenario_may_bring_its_own() -> None:
    first, second = box(), box()
    await first.run(call("cancel_order", {"order_id": "A-1001"}))
    assert second.environment == ENVIRONMENT
    assert toolset().environment == ENVIRONMENT  # the pack's own is untouched
    own = box(environment={"orders": {"A-1001": {"status": "shipped"}}, "log": []})
    outcome = await own.run(call("cancel_order", {"order_id": "A-1001"}))
    assert outcome.error == "precondition"


# -- python tools ---------------------------------------------------------------------


async def test_a_sync_python_tool_gets_the_environment_and_changes_it() -> None:
    tools = box()
    outcome = await tools.run(call("add_note", {"note": "hello"}))
    assert outcome == ToolOutcome('{"notes": 1}', changed=True)
    assert tools.environment["notes"] == ["hello"]


async def test_an_async_python_tool_answers_text_as_it_is() -> None:
    assert await box().run(call("shout", {"text": "hi"})) == ToolOutcome("HI")


async def test_a_raise_is_reported_without_a_traceback_and_changes_nothing() -> None:
    tools = box()
    outcome = await tools.run(call("fails", {"order_id": "A-1"}))
    assert outcome == ToolOutcome("LookupError: no order A-1", "raised")
    assert "half" not in tools.environment


async def test_a_result_that_is_not_json_is_a_tool_error() -> None:
    outcome = await box().run(call("returns_a_set"))
    assert outcome.error == "tool_error"
    assert "not JSON" in outcome.result


async def test_a_long_result_is_cut_with_a_note() -> None:
    outcome = await box().run(call("big"))
    assert outcome.error is None
    head, note = outcome.result.rsplit("\n", 1)
    assert len(head.encode()) <= 64 * 1024
    assert head == "é" * (64 * 1024 // 2)
    assert note == "[result cut: 80,000 bytes, the first 65,536 shown]"


async def test_a_python_tool_needs_allow_code_and_an_importable_function() -> None:
    refused = await box(allow_code=False).run(call("shout", {"text": "hi"}))
    assert refused.error == "tool_error"
    assert "--allow-code" in refused.result
    missing = await box().run(call("missing_module"))
    assert missing.error == "tool_error"
    assert "cannot import 'no_such_module_xyz:f': ModuleNotFoundError" in missing.result


@manual_clock
async def test_a_python_tool_over_its_timeout_is_told_so() -> None:
    GATES.update(started=anyio.Event(), release=anyio.Event())
    tools = box()
    outcomes: list[ToolOutcome] = []

    async def run() -> None:
        outcomes.append(await tools.run(call("slow")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await GATES["started"].wait()
        clock().advance(10.5)
    assert outcomes == [ToolOutcome("tool 'slow' took longer than 10s", "timeout")]
    assert "touched" not in tools.environment


async def test_cancelling_mid_python_tool_propagates_and_changes_nothing() -> None:
    GATES.update(started=anyio.Event(), release=anyio.Event())
    tools = box()
    outcomes: list[ToolOutcome] = []

    async def run() -> None:
        outcomes.append(await tools.run(call("slow")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await GATES["started"].wait()
        tg.cancel_scope.cancel()
    assert outcomes == []
    assert tools.environment == ENVIRONMENT


async def test_a_python_tool_that_finishes_in_time_changes_the_document() -> None:
    GATES.update(started=anyio.Event(), release=anyio.Event())
    GATES["release"].set()
    tools = box()
    assert await tools.run(call("slow")) == ToolOutcome('{"done": true}', changed=True)
    assert tools.environment["touched"] is True
