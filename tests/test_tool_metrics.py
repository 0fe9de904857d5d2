"""Tool metrics: the calls a conversation made and the environment it ended with.

tool_call_accuracy, trajectory_match, final_state and tool_errors, goal criteria of
kind ``state``, pass^k over trials graded by final state, and the same scores again
from a results file written and read back (``convsim score``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import convsim
from convsim import ConversationResult, Score, TurnRecord, TurnStatus
from convsim._records import ToolCallRecord
from convsim._runtime._user import ends_on_goal
from convsim.cli import main
from convsim.metrics import METRICS, final_environment, goal_met
from convsim.metrics._goal import state_verdict
from convsim.metrics._tool_calls import MadeCall, call_matches, same_value
from convsim.results._report import summarize
from convsim.scenarios import Conversation, Goal, load_pack
from convsim.scenarios._criteria import goal_problems
from convsim.scenarios._schema import Criterion
from convsim.scenarios._tool_schema import ExpectedToolCall, StateCheck, ToolDefinition
from convsim.scenarios._toolset import ToolSet

GUIDE = Path(__file__).parent / "data" / "guide_example"
ORDERS = {"orders": {"A-1": {"status": "paid", "total": 20}}}
REFUNDED = {"orders": {"A-1": {"status": "refunded", "total": 20}}}
IS_REFUNDED = {"path": "orders.A-1.status", "equals": "refunded"}
TOOLS = ToolSet(
    (
        ToolDefinition(name="look_up_order", operations=[{"op": "get", "path": "orders"}]),
        ToolDefinition(name="refund_order", operations=[{"op": "get", "path": "orders"}]),
    ),
    environment=ORDERS,
)


@pytest.fixture(scope="module")
def base() -> Conversation:
    return load_pack(GUIDE).conversations[0]


def conv(base: Conversation, tools: ToolSet | None = None, **fields: Any) -> Conversation:
    scenario = base.scenario.model_validate({**base.scenario.model_dump(), **fields})
    return dataclasses.replace(base, scenario=scenario, tools=tools)


def call(name: str, arguments: Any = None, error: Any = None, **kw: Any) -> ToolCallRecord:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCallRecord(
        round=kw.get("round", 0), id=kw.get("id", "c"), name=name, arguments=text,
        result="{}", error=error,
    )  # fmt: skip


def turn(
    *calls: ToolCallRecord,
    turn_id: str = "t1",
    status: TurnStatus = TurnStatus.COMPLETED,
    environment: Any = None,
    limit: bool = False,
    response: str | None = "done",
) -> TurnRecord:
    return TurnRecord(
        conversation_id="c",
        turn_index=0,
        turn_id=turn_id,
        role="assistant",
        status=status,
        response=response if status is TurnStatus.COMPLETED else None,
        tool_calls=calls,
        tool_rounds=len(calls),
        tool_round_limit=limit,
        environment=environment,
    )


def score(name: str, conversation: Conversation, turns: list[TurnRecord]) -> Score:
    scorer: Any = METRICS.get(name)().scorer(conversation)
    for t in turns:
        scorer.update(t)
    result: Score = scorer.result()
    return result


def expect(*calls: tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str]) -> list[Any]:
    return [
        {"name": c[0], "arguments": c[1], **({"turn_id": c[2]} if len(c) > 2 else {})}
        for c in calls
    ]


LOOK = ("look_up_order", {"order_id": "A-1"})
REFUND = ("refund_order", {"order_id": "A-1", "amount": 20})


# -- the final environment document ------------------------------------------------------


def test_the_final_document_is_the_last_recorded_else_the_starting_one(base) -> None:
    own = {"orders": {}}
    with_tools = conv(base, TOOLS)
    assert final_environment(with_tools, []) == ORDERS  # the pack's
    assert final_environment(conv(base, TOOLS, environment=own), []) == own  # the scenario's
    assert final_environment(conv(base, environment=own), []) == own  # no tools, its own
    assert final_environment(conv(base), []) is None  # nothing at all
    turns = [turn(environment=REFUNDED), turn(), turn(status=TurnStatus.FAILED)]
    assert final_environment(with_tools, turns) == REFUNDED  # later turns left none
    # a fresh copy each time: a scorer cannot change the pack's document
    final_environment(with_tools, [])["orders"].clear()
    assert final_environment(with_tools, []) == ORDERS


# -- matching one call ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "made", "same"),
    [
        (20, 20.0, True),
        (20, "20", True),
        (20, " 20.0 ", True),
        ("20", 20, True),
        (2.5, "2.50", True),
        (1000, "1e3", True),
        (12345678901234567890, 12345678901234567891, False),  # by value, not roughly
        (20, "20 euros", False),
        (20, 20.5, False),
        (1, True, False),  # a boolean is never a number
        (True, "true", False),
        (True, True, True),
        ("A-1", " A-1\n", True),
        ("A-1", "a-1", False),  # case counts
        (None, None, True),
        (None, "null", False),
        ({"a": 1, "b": [1, "x"]}, {"b": ["1.0", " x"], "a": 1.0}, True),  # key order, nested
        ({"a": 1}, {"a": 1, "b": 2}, False),  # a nested object is a whole value
        ([1, 2], [2, 1], False),
        ([1, 2], [1], False),
    ],
)
def test_argument_values_compare_with_tolerance(expected: Any, made: Any, same: bool) -> None:
    assert same_value(expected, made) is same


def test_a_call_matches_by_name_named_arguments_and_turn() -> None:
    wanted = ExpectedToolCall(name="refund_order", arguments={"order_id": "A-1", "amount": 20})
    made = MadeCall.of("t1", call("refund_order", {"amount": "20", "order_id": "A-1", "x": 1}))
    assert call_matches(wanted, made)  # an argument it does not name is not held against it
    assert not call_matches(wanted, MadeCall.of("t1", call("refund_order", {"order_id": "A-1"})))
    assert not call_matches(wanted, MadeCall.of("t1", call("cancel_order", {"order_id": "A-1"})))
    in_turn = wanted.model_copy(update={"turn_id": "t2"})
    assert not call_matches(in_turn, made) and call_matches(
        in_turn, dataclasses.replace(made, turn_id="t2")
    )


@pytest.mark.parametrize("text", ['{"order_id": "A-1"', "[1, 2]", "null", "not json", '"x"'])
def test_malformed_arguments_never_match(text: str) -> None:
    made = MadeCall.of("t1", call("look_up_order", text))
    assert made.arguments is None
    assert not call_matches(ExpectedToolCall(name="look_up_order"), made)  # not even no args


def test_empty_arguments_are_an_empty_object() -> None:
    assert MadeCall.of("t1", call("look_up_order", "")).arguments == {}


# -- tool_call_accuracy -----------------------------------------------------------------


def test_accuracy_is_not_applicable_without_expected_calls(base) -> None:
    result = score("tool_call_accuracy", conv(base, TOOLS), [turn(call(*LOOK))])
    assert result.status == "not_applicable" and "expected_tool_calls" in (result.reason or "")
    nothing = score("tool_call_accuracy", conv(base, TOOLS, expected_tool_calls=expect(LOOK)), [])
    assert nothing.status == "not_applicable"


def test_accuracy_counts_matched_made_and_expected(base) -> None:
    scenario = conv(base, TOOLS, expected_tool_calls=expect(LOOK, REFUND))
    right = score("tool_call_accuracy", scenario, [turn(call(*LOOK)), turn(call(*REFUND))])
    assert right.value == 1.0 and right.details["matched"] == 2
    none = score("tool_call_accuracy", scenario, [turn()])
    assert none.value == 0.0 and none.details["precision"] is None
    assert none.details["recall"] == 0.0 and len(none.details["unmatched_expected"]) == 2
    extra = score(
        "tool_call_accuracy",
        scenario,
        [turn(call(*LOOK), call("cancel_order", {"order_id": "A-1"}), call(*REFUND))],
    )
    assert extra.details["precision"] == pytest.approx(2 / 3) and extra.details["recall"] == 1.0
    assert extra.value == pytest.approx(0.8)  # F1 of 2/3 and 1
    assert extra.details["unmatched_made"][0]["name"] == "cancel_order"
    swapped = score("tool_call_accuracy", scenario, [turn(call(*REFUND), call(*LOOK))])
    assert swapped.value == 1.0  # blind to order: trajectory_match judges it
    half = score(
        "tool_call_accuracy",
        scenario,
        [turn(call("refund_order", {"order_id": "A-1", "amount": "20.00"}))],
    )
    assert half.value == pytest.approx(2 / 3)  # precision 1, recall 1/2; "20.00" is 20
    wrong_amount = score(
        "tool_call_accuracy",
        scenario,
        [turn(call(*LOOK), call("refund_order", {"order_id": "A-1", "amount": 25}))],
    )
    assert wrong_amount.details["matched"] == 1
    assert wrong_amount.details["unmatched_expected"] == [
        {"name": "refund_order", "arguments": {"order_id": "A-1", "amount": 20}}
    ]


def test_accuracy_pairs_calls_one_to_one_and_respects_the_turn(base) -> None:
    twice = conv(base, TOOLS, expected_tool_calls=expect(LOOK, LOOK))
    once = score("tool_call_accuracy", twice, [turn(call(*LOOK))])
    assert once.details["matched"] == 1 and once.details["recall"] == 0.5  # one call, once
    in_turn = conv(base, TOOLS, expected_tool_calls=expect((*LOOK, "t2")))
    wrong_turn = score("tool_call_accuracy", in_turn, [turn(call(*LOOK), turn_id="t1")])
    assert wrong_turn.value == 0.0
    assert score("tool_call_accuracy", in_turn, [turn(call(*LOOK), turn_id="t2")]).value == 1.0


def test_accuracy_counts_calls_of_a_failed_turn(base) -> None:
    scenario = conv(base, TOOLS, expected_tool_calls=expect(LOOK))
    failed = turn(call(*LOOK), status=TurnStatus.FAILED)
    assert score("tool_call_accuracy", scenario, [failed]).value == 1.0


def test_a_malformed_call_is_made_but_matches_nothing(base) -> None:
    scenario = conv(base, TOOLS, expected_tool_calls=expect(LOOK))
    result = score(
        "tool_call_accuracy", scenario,
        [turn(call("look_up_order", '{"order_id": "A-1"', error="invalid_arguments"))],
    )  # fmt: skip
    assert result.value == 0.0 and result.details["made"] == 1


# -- trajectory_match -------------------------------------------------------------------

CANCEL = ("cancel_order", {"order_id": "A-1"})


@pytest.mark.parametrize(
    ("made", "strict", "unordered", "subset", "superset"),
    [
        ([LOOK, REFUND], 1, 1, 1, 1),
        ([REFUND, LOOK], 0, 1, 1, 1),  # order swapped
        ([LOOK, REFUND, CANCEL], 0, 0, 0, 1),  # an extra call
        ([LOOK], 0, 0, 1, 0),  # one missing
        ([], 0, 0, 1, 0),  # none made: a subset of any
        ([LOOK, LOOK, REFUND], 0, 0, 0, 1),  # a call made twice, expected once
        ([LOOK, ("refund_order", {"order_id": "A-1", "amount": "20"})], 1, 1, 1, 1),
    ],
)
def test_trajectory_modes(base, made, strict, unordered, subset, superset) -> None:
    records = [turn(*(call(*c) for c in made))]
    for mode, wanted in zip(
        ("strict", "unordered", "subset", "superset"),
        (strict, unordered, subset, superset),
        strict=True,
    ):
        scenario = conv(base, TOOLS, expected_tool_calls=expect(LOOK, REFUND), trajectory_mode=mode)
        result = score("trajectory_match", scenario, records)
        assert result.value == float(wanted), (mode, made, result.details)
        assert result.details["mode"] == mode
        assert result.details["expected"] == ["look_up_order", "refund_order"]
        assert result.details["made"] == [c[0] for c in made]
        assert (result.details["first_difference"] is None) == bool(wanted)


def test_trajectory_names_the_first_difference(base) -> None:
    strict = conv(base, TOOLS, expected_tool_calls=expect(LOOK, REFUND))
    swapped = score("trajectory_match", strict, [turn(call(*REFUND), call(*LOOK))])
    assert swapped.details["first_difference"].startswith("call 1: expected look_up_order(")
    short = score("trajectory_match", strict, [turn(call(*LOOK))])
    assert short.details["first_difference"].startswith("call 2: expected refund_order(")
    assert short.details["first_difference"].endswith("none made")
    superset = conv(
        base, TOOLS, expected_tool_calls=expect(LOOK, REFUND), trajectory_mode="superset"
    )
    missed = score("trajectory_match", superset, [turn(call(*LOOK))])
    assert missed.details["first_difference"].startswith("expected refund_order(")
    subset = conv(base, TOOLS, expected_tool_calls=expect(LOOK), trajectory_mode="subset")
    extra = score("trajectory_match", subset, [turn(call(*LOOK), call(*CANCEL))])
    assert extra.details["first_difference"] == (
        'made cancel_order({"order_id": "A-1"}) in turn t1 was not expected'
    )


def test_unordered_finds_a_pairing_a_greedy_one_would_miss(base) -> None:
    """The first call made fits both expected calls; only pairing it with the second
    leaves the first for the other call."""
    scenario = conv(
        base, TOOLS,
        expected_tool_calls=expect(("look_up_order", {}), ("look_up_order", {"order_id": "A-1"})),
        trajectory_mode="unordered",
    )  # fmt: skip
    made = [turn(call(*LOOK), call("look_up_order", {"order_id": "B-2"}))]
    assert score("trajectory_match", scenario, made).value == 1.0


def test_trajectory_is_not_applicable_without_expected_calls(base) -> None:
    result = score("trajectory_match", conv(base, TOOLS), [turn(call(*LOOK))])
    assert result.status == "not_applicable" and "expected_tool_calls" in (result.reason or "")


# -- final_state --------------------------------------------------------------------------


def test_final_state_checks_the_document_the_conversation_ended_with(base) -> None:
    scenario = conv(
        base, TOOLS, final_state=[IS_REFUNDED, {"path": "orders.A-1.total", "at_least": 20}]
    )
    done = score("final_state", scenario, [turn(environment=REFUNDED), turn()])
    assert done.value == 1.0 and done.details["held"] == 2 and done.details["total"] == 2
    untouched = score("final_state", scenario, [turn()])  # the starting document
    assert untouched.value == 0.0 and untouched.details["held"] == 1
    assert untouched.details["checks"][0] == {
        "held": False,
        "message": "orders.A-1.status: expected 'refunded', found 'paid'",
    }


def test_the_state_a_failed_turn_left_counts(base) -> None:
    scenario = conv(base, TOOLS, final_state=[IS_REFUNDED])
    failed = turn(call(*REFUND), status=TurnStatus.FAILED, environment=REFUNDED)
    assert score("final_state", scenario, [failed, turn(status=TurnStatus.FAILED)]).value == 1.0


def test_final_state_is_not_applicable_without_checks_or_document(base) -> None:
    no_checks = score("final_state", conv(base, TOOLS), [turn()])
    assert no_checks.status == "not_applicable" and "final_state" in (no_checks.reason or "")
    no_document = score("final_state", conv(base, final_state=[IS_REFUNDED]), [turn()])
    assert no_document.status == "not_applicable"
    assert "no environment document" in (no_document.reason or "")
    own = score(
        "final_state", conv(base, final_state=[IS_REFUNDED], environment=REFUNDED), [turn()]
    )
    assert own.value == 1.0  # a scenario's own document, no pack tools


# -- tool_errors ----------------------------------------------------------------------------


def test_tool_errors_is_lower_is_better_and_not_applicable_without_tools(base) -> None:
    metric = METRICS.get("tool_errors")()
    assert metric.higher_is_better is False
    result = score("tool_errors", conv(base), [turn(), turn()])
    assert (
        result.status == "not_applicable" and result.reason == "not applicable: no tool was called"
    )


def test_tool_errors_counts_each_kind(base) -> None:
    records = [
        turn(
            call(*LOOK),
            call("nope", {}, error="unknown_tool"),
            call("refund_order", "{bad", error="invalid_arguments"),
            call(*REFUND, error="precondition"),
        ),
        turn(call(*LOOK, error="timeout"), call(*LOOK, error="raised"), turn_id="t2"),
        turn(call(*REFUND, error="tool_error"), turn_id="t3", limit=True),
    ]
    result = score("tool_errors", conv(base, TOOLS), records)
    kinds = result.details["kinds"]
    assert kinds == {
        "unknown_tool": 1, "invalid_arguments": 1, "precondition": 1, "tool_error": 1,
        "timeout": 1, "raised": 1, "repeated": 2, "round_limit": 1,
    }  # fmt: skip
    # the timeout and the raise repeat the first successful look-up: wrong either way
    assert result.details["calls"] == 7 and result.details["wrong_calls"] == 6
    assert result.details["round_limit_turns"] == ["t3"]
    assert result.value == pytest.approx(7 / 8)  # 6 calls and 1 turn of 7 calls + 1 turn


def test_a_repeat_is_of_a_call_that_worked(base) -> None:
    same = [
        call("look_up_order", '{"order_id": "A-1", "full": true}'),
        call("look_up_order", '{"full": true, "order_id": "A-1"}'),  # key order aside
        call("refund_order", {"amount": 20}),
        call("refund_order", {"amount": 20.0}),  # 20.0 is 20
        call("refund_order", {"amount": "20"}),  # a string is another argument
    ]
    result = score("tool_errors", conv(base, TOOLS), [turn(*same)])
    assert result.details["kinds"] == {"repeated": 2}
    retried = [
        call(*LOOK, error="timeout"),
        call(*LOOK),
        call("x", "{bad", error="invalid_arguments"),
        call("x", "{bad", error="invalid_arguments"),
    ]
    again = score("tool_errors", conv(base, TOOLS), [turn(*retried)])
    # retrying a call that failed is no repeat; malformed calls are errors only
    assert again.details["kinds"] == {"timeout": 1, "invalid_arguments": 2}
    assert again.value == pytest.approx(3 / 4)
    clean = score("tool_errors", conv(base, TOOLS), [turn(call(*LOOK), call(*REFUND))])
    assert clean.value == 0.0 and clean.details["kinds"] == {}


def test_a_turn_at_the_round_limit_without_calls_is_scored(base) -> None:
    result = score("tool_errors", conv(base, TOOLS), [turn(limit=True, response=None)])
    assert result.value == 1.0 and result.details["calls"] == 0


# -- goal criteria of kind state ------------------------------------------------------------


def state(value: Any = None, **kw: Any) -> Criterion:
    return Criterion(kind="state", value=IS_REFUNDED if value is None else value, **kw)


def test_goal_met_checks_state_criteria_on_the_document_given() -> None:
    goal = Goal(description="refunded", all_of=[state(), Criterion(kind="contains", value="done")])
    assert goal_met(goal, {}, "done", REFUNDED)
    assert not goal_met(goal, {}, "done", ORDERS)
    assert not goal_met(goal, {}, "done")  # no document: not met
    assert not goal_met(goal, {}, "nope", REFUNDED)
    assert goal_met(
        Goal(description="d", any_of=[state(), state({"path": "x", "exists": True})]),
        {},
        None,
        REFUNDED,
    )


def test_a_state_criterion_says_why_it_is_not_met() -> None:
    assert state_verdict(state(), None).message.startswith("no environment document")
    assert (
        state_verdict(state(), ORDERS).message
        == "orders.A-1.status: expected 'refunded', found 'paid'"
    )
    broken = state_verdict(state({"path": "x"}), REFUNDED)
    assert not broken.held and broken.message.startswith("the criterion is no state check")


def test_ends_on_goal_keeps_its_signature_and_passes_the_document(base) -> None:
    scenario = conv(
        base, TOOLS,
        user={"stop_on_goal": True},
        goal={"description": "refunded", "all_of": [{"kind": "state", "value": IS_REFUNDED}]},
    ).scenario  # fmt: skip
    assert not ends_on_goal(scenario, {}, "done")  # as the runtime calls it today
    assert ends_on_goal(scenario, {}, "done", REFUNDED)
    assert not ends_on_goal(scenario, {}, "done", ORDERS)


def test_goal_achievement_grades_state_criteria_on_the_final_document(base) -> None:
    goal = {
        "description": "refunded and said so",
        "all_of": [
            {"kind": "state", "value": IS_REFUNDED},
            {"kind": "contains", "value": "refunded"},
        ],
    }
    scenario = conv(base, TOOLS, goal=goal)
    failed_then_told = [
        turn(call(*REFUND), status=TurnStatus.FAILED, environment=REFUNDED),
        turn(response="It is refunded."),
    ]
    met = score("goal_achievement", scenario, failed_then_told)
    assert met.value == 1.0 and met.details["turns_to_goal"] == 1
    rows = met.details["criteria"]
    assert rows[0]["kind"] == "state" and rows[0]["credit"] == 1.0
    assert rows[0]["message"] == "orders.A-1.status: expected 'refunded', found 'refunded'"
    said_only = score("goal_achievement", scenario, [turn(response="It is refunded.")])
    assert said_only.value == 0.5  # the starting document: not refunded
    no_tools = score("goal_achievement", conv(base, goal=goal), [turn(response="refunded")])
    assert no_tools.value == 0.5
    assert no_tools.details["criteria"][0]["message"].startswith("no environment document")


def test_validation_refuses_a_state_criterion_it_cannot_check() -> None:
    goal = Goal.model_validate(
        {
            "description": "d",
            "all_of": [
                {"kind": "state", "value": IS_REFUNDED},
                {"kind": "state", "value": {"path": "x"}},
                {"kind": "state", "value": "orders.A-1"},
                {"kind": "state", "value": IS_REFUNDED, "turn_id": "t1"},
            ],
        }
    )
    problems = {p.field: p.message for p in goal_problems(goal, allow_code=False)}
    assert set(problems) == {"goal.all_of.1.value", "goal.all_of.2.value", "goal.all_of.3.turn_id"}
    assert "give exactly one of equals" in problems["goal.all_of.1.value"]
    assert "needs a state check object, not str" in problems["goal.all_of.2.value"]


# -- pass^k over trials ----------------------------------------------------------------------


def _trials(
    base_result: ConversationResult, outcomes: dict[str, list[float]], metric: str
) -> list[ConversationResult]:
    return [
        base_result.model_copy(
            update={
                "conversation_id": f"{scenario}#{k}",
                "scenario_id": scenario,
                "trial": k,
                "scores": {
                    "goal_achievement": Score.not_applicable(
                        "the scenario declares no goal criteria"
                    ),
                    metric: Score(value=value),
                },
            }
        )
        for scenario, values in outcomes.items()
        for k, value in enumerate(values, start=1)
    ]


@pytest.fixture(scope="module")
def one_result() -> ConversationResult:
    (result,) = convsim.run_sync("customer_support", "scripted", limit=1)
    return result


def test_pass_hat_k_counts_final_state_where_no_goal_is_scored(one_result) -> None:
    report = summarize(_trials(one_result, {"a": [1.0, 1.0, 0.0], "b": [1.0] * 3}, "final_state"))
    assert report.trials == 3
    assert report.pass_hat_k == pytest.approx({1: (2 / 3 + 1) / 2, 2: (1 / 3 + 1) / 2, 3: 0.5})
    assert report.pass_at_k == pytest.approx({1: (2 / 3 + 1) / 2, 2: 1.0, 3: 1.0})
    assert report.trial_spread["final_state"] == pytest.approx(((2 / 9) ** 0.5) / 2)
    # tool metrics that say nothing of passing give no pass^k
    assert summarize(_trials(one_result, {"a": [1.0, 0.0]}, "tool_call_accuracy")).pass_hat_k == {}


def _desk_pack(folder: Path, *scenarios: dict[str, Any]) -> Path:
    folder.mkdir()
    (folder / "turn_configs.yml").write_text(
        "desk:\n  turns:\n    - turn_id: ask\n      role: assistant\n"
        "      prompt_template: Please refund order A-1.\n"
    )
    (folder / "scenarios.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scenarios))
    return folder


def test_a_run_with_trials_gives_pass_hat_k_by_final_state(tmp_path: Path) -> None:
    """Trials scored by final_state alone (no goal): one scenario whose document holds,
    one whose does not."""
    desk = {"scenario_type": "desk", "scenario_description": "refund", "final_state": [IS_REFUNDED]}
    pack = _desk_pack(
        tmp_path / "desk",
        {**desk, "scenario_id": "held", "environment": REFUNDED},
        {**desk, "scenario_id": "not-held", "environment": ORDERS},
    )
    out = tmp_path / "trials.jsonl"
    ran = CliRunner().invoke(
        main,
        ["run", str(pack), "--model", "scripted", "--trials", "2", "--metrics", "final_state",
         "--out", str(out), "--no-progress"],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    values = {
        (r.scenario_id, r.trial): r.scores["final_state"].value for r in convsim.read_results(out)
    }
    assert values == {
        ("held", 1): 1.0,
        ("held", 2): 1.0,
        ("not-held", 1): 0.0,
        ("not-held", 2): 0.0,
    }
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["pass_hat_k"] == {"1": 0.5, "2": 0.5}


# -- rescoring from a results file -----------------------------------------------------------

SCENARIO = {
    "scenario_id": "refund",
    "scenario_type": "desk",
    "scenario_description": "refund an order",
    "environment": ORDERS,
    "expected_tool_calls": expect(LOOK, REFUND),
    "trajectory_mode": "strict",
    "final_state": [IS_REFUNDED],
    "goal": {"description": "refunded", "all_of": [{"kind": "state", "value": IS_REFUNDED}]},
}
TOOL_METRICS = [
    "tool_call_accuracy",
    "trajectory_match",
    "final_state",
    "tool_errors",
    "goal_achievement",
]


def test_tool_scores_are_the_same_from_a_results_file_read_back(tmp_path: Path) -> None:
    pack = _desk_pack(tmp_path / "desk", SCENARIO)
    path = tmp_path / "run.jsonl"
    (run,) = convsim.run_sync(str(pack), "scripted", metrics=TOOL_METRICS, out=path)
    assert run.scores["final_state"].value == 0.0  # no tools called: the starting document
    ask = run.turns[0]
    asked = dataclasses.replace(
        ask,
        tool_calls=(
            call(*LOOK, id="call_0_0"),
            call(*REFUND, id="call_0_1", round=1),
            call(*REFUND, id="call_0_2", round=2, error="precondition"),
        ),
        tool_rounds=3,
        environment=REFUNDED,
    )
    result = run.model_copy(update={"turns": (asked, *run.turns[1:])})
    line = result.model_dump_json()
    assert json.loads(line)["schema_version"] == 5
    back = ConversationResult.model_validate_json(line)
    assert back.turns[0].tool_calls == asked.tool_calls and back.turns[0].environment == REFUNDED
    path.write_text(line + "\n")  # the run's line, as it would be with tool calls
    out = tmp_path / "scores.jsonl"
    scored = CliRunner().invoke(
        main, ["score", str(path), "--metrics", ",".join(TOOL_METRICS), "--out", str(out)]
    )
    assert scored.exit_code == 0, scored.output
    assert "note:" not in scored.output  # the pack was found, unchanged
    scores = json.loads(out.read_text().splitlines()[0])["scores"]
    assert scores["final_state"]["value"] == 1.0
    assert scores["goal_achievement"]["value"] == 1.0
    assert scores["tool_call_accuracy"]["value"] == pytest.approx(0.8)  # 2 of 3 made, 2 of 2
    assert scores["trajectory_match"]["value"] == 0.0
    assert scores["trajectory_match"]["details"]["first_difference"].startswith(
        "call 3: made refund_order("
    )
    assert scores["tool_errors"]["value"] == pytest.approx(1 / 3)
    assert scores["tool_errors"]["details"]["kinds"] == {"precondition": 1, "repeated": 1}


# -- in the live scoring session, on the agent loop's records ---------------------------------


@pytest.mark.anyio
async def test_the_live_session_scores_what_the_agent_loop_recorded(tmp_path: Path) -> None:
    """The runtime's records (calls, errors, the environment after the turn) scored as
    the conversation runs: a refund made, a repeat refused by its precondition."""
    from test_agent_turns import ToolModel, conversation  # the agent loop's harness

    from convsim._runtime._actor import ActorSettings, ConversationActor
    from convsim._runtime._call_settings import CallSettings
    from convsim.adapters import GenerationParams

    base = conversation(tmp_path)
    scenario = base.scenario.model_copy(
        update={
            "expected_tool_calls": [
                ExpectedToolCall(name="cancel_order", arguments={"order_id": "A-1"})
            ],
            "final_state": [StateCheck(path="orders.A-1.status", equals="cancelled")],
            "goal": Goal(
                description="cancelled",
                all_of=[
                    Criterion(
                        kind="state", value={"path": "orders.A-1.status", "equals": "cancelled"}
                    )
                ],
            ),
        }
    )
    cancel = ("cancel_order", {"order_id": "A-1"})
    model = ToolModel([[cancel], [cancel], "Order A-1 is cancelled.", "Bye"])
    metrics = [METRICS.get(name)() for name in TOOL_METRICS]
    settings = ActorSettings(
        run_id="r", pack_name="pack", pack_hash="h", model_name="tool-model",
        assistant=CallSettings(defaults=GenerationParams(), side="assistant"),
    )  # fmt: skip
    live = ConversationActor(
        dataclasses.replace(base, scenario=scenario),
        model=model,
        settings=settings,
        metrics=metrics,
    )
    result = await live.run()
    scores = result.scores
    assert result.turns[0].tool_calls[1].error == "precondition"  # already cancelled
    assert scores["final_state"].value == 1.0 and scores["goal_achievement"].value == 1.0
    assert scores["tool_call_accuracy"].value == pytest.approx(2 / 3)  # precision 1/2
    assert scores["trajectory_match"].details["first_difference"].startswith("call 2: made")
    assert scores["tool_errors"].details["kinds"] == {"precondition": 1, "repeated": 1}
