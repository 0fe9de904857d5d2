"""The judge under failure: adapter errors, cancellation, majority ties, ungraded goals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from conftest import FakeAdapter, write_pack

from convsim import AdapterError, TurnRecord, TurnStatus
from convsim.adapters import Cost
from convsim.metrics import METRICS, JudgeSettings
from convsim.metrics._judge import RubricJudgeMetric, ask_judge
from convsim.scenarios import load_pack

pytestmark = pytest.mark.anyio


def scripted(*answers: Any) -> FakeAdapter:
    """A judge giving ``answers`` in order (an exception is raised), then the last forever."""
    queue = list(answers)

    def behave(messages: Any, params: Any) -> Any:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return FakeAdapter(behave, name="judge-model")


def grade(score: int) -> str:
    return f'{{"score": {score}, "reason": "graded {score}"}}'


def record(turn_id: str, response: str) -> TurnRecord:
    return TurnRecord(
        conversation_id="c",
        turn_index=0,
        turn_id=turn_id,
        role="assistant",
        status=TurnStatus.COMPLETED,
        user_message="hello",
        response=response,
    )


async def rubric_score(judge: FakeAdapter, turns: int = 1, **settings: Any) -> Any:
    metric = RubricJudgeMetric("judge:polite?", "polite?", JudgeSettings(judge, **settings))
    scorer = metric.scorer(None)  # type: ignore[arg-type]
    for i in range(turns):
        await scorer.update(record(f"t{i}", "Certainly, happy to help."))
    return await scorer.result()


# --- B: adapter errors --------------------------------------------------------------


async def test_a_failed_sample_is_recorded_and_the_other_grades_kept() -> None:
    judge = scripted(grade(5), RuntimeError("503 after retries"), grade(5))
    score = await rubric_score(judge, samples=3)
    assert score.value == 1.0
    assert score.details["failures"] == [
        {"turn_id": "t0", "sample": 1, "error": "RuntimeError: 503 after retries"}
    ]
    assert score.details["judge_calls"] == 3
    # the two answered calls' usage survives the failed one
    assert score.details["judge_usage"] == {"prompt_tokens": 2, "completion_tokens": 2}


async def test_a_failed_turn_is_recorded_and_the_other_turns_kept() -> None:
    judge = scripted(grade(3), AdapterError("server down", model="judge-model"), grade(5))
    score = await rubric_score(judge, turns=3)
    assert score.value == pytest.approx((0.5 + 1.0) / 2)
    assert score.details["turns"] == 2
    assert score.details["failures"] == [
        {"turn_id": "t1", "sample": 0, "error": "AdapterError: server down"}
    ]


async def test_a_judge_that_always_fails_is_not_applicable_with_the_reason() -> None:
    score = await rubric_score(scripted(RuntimeError("503 after retries")), turns=2)
    assert score.value is None and score.status == "failed"
    assert "RuntimeError: 503 after retries" in (score.reason or "")
    assert [f["turn_id"] for f in score.details["failures"]] == ["t0", "t1"]


async def test_ask_judge_returns_the_usage_so_far_and_the_error() -> None:
    judge = scripted("not json", RuntimeError("boom"))
    answer = await ask_judge(JudgeSettings(judge, max_reasks=2), "grade this")
    assert answer.grade is None and answer.error == "RuntimeError: boom"
    assert answer.calls == 2 and answer.usage.prompt_tokens == 1


async def test_cancellation_is_never_swallowed() -> None:
    async def hang(messages: Any, params: Any) -> str:
        scope.cancel()  # the caller gives up while the judge is being asked
        await anyio.sleep_forever()
        return grade(5)  # never reached

    judge = FakeAdapter(hang, name="judge-model")
    metric = RubricJudgeMetric("judge:polite?", "polite?", JudgeSettings(judge))
    scorer = metric.scorer(None)  # type: ignore[arg-type]
    finished = False
    with anyio.CancelScope() as scope:
        await scorer.update(record("t0", "hi"))
        finished = True
    assert len(judge.calls) == 1  # cancelled inside the judge call, not before it
    assert scope.cancelled_caught and not finished
    assert scorer.failures == [] and scorer.errors == []


# --- C: majority ties ---------------------------------------------------------------


async def test_a_majority_tie_takes_the_lower_grade() -> None:
    score = await rubric_score(scripted(grade(1), grade(5)), samples=2, combine="majority")
    assert score.value == 0.0  # 1 and 5 tie: 1, not 3 (a grade nobody gave)
    three_way = await rubric_score(
        scripted(grade(2), grade(4), grade(5)), samples=3, combine="majority"
    )
    assert three_way.value == 0.25  # all tie at one vote: 2
    clear = await rubric_score(
        scripted(grade(4), grade(2), grade(4)), samples=3, combine="majority"
    )
    assert clear.value == 0.75


# --- A: ungraded judge criteria of a goal -------------------------------------------


def conversation(tmp_path: Path, goal: dict[str, Any]) -> Any:
    turns = [{"turn_id": "t0", "prompt_template": "t0"}]
    folder = write_pack(
        tmp_path / "p",
        {"default": {"turns": turns}},
        [{"scenario_id": "s", "scenario_description": "x", "goal": goal}],
    )
    return load_pack(folder).conversations[0]


async def goal_score(tmp_path: Path, goal: dict[str, Any], judge: FakeAdapter) -> Any:
    metric = METRICS.get("goal_achievement")().with_judge(JudgeSettings(judge))
    scorer = metric.scorer(conversation(tmp_path, goal))
    await scorer.update(record("t0", "Your table is booked for eight."))
    return await scorer.result()


POLITE = {"kind": "judge", "value": "The reply is polite."}
BOOKED = {"kind": "contains", "value": "booked"}
MISSING = {"kind": "contains", "value": "refund"}


@pytest.mark.parametrize(
    "judge",
    [lambda: scripted("no idea"), lambda: scripted(RuntimeError("503 after retries"))],
    ids=["unparsable", "adapter-error"],
)
async def test_an_ungraded_judge_criterion_makes_an_open_goal_not_applicable(
    tmp_path: Path, judge: Any
) -> None:
    score = await goal_score(tmp_path, {"description": "book", "all_of": [BOOKED, POLITE]}, judge())
    # not 1.0: the judge criterion was never graded
    assert score.value is None and score.status == "failed"
    assert "all_of[1]" in (score.reason or "")
    assert [(u["group"], u["index"]) for u in score.details["ungraded"]] == [("all_of", 1)]
    assert score.details["judge_calls"] >= 1


async def test_an_ungraded_criterion_that_cannot_change_the_score_is_ignored(
    tmp_path: Path,
) -> None:
    goal = {"description": "book", "any_of": [BOOKED, POLITE]}
    score = await goal_score(tmp_path, goal, scripted(RuntimeError("503 after retries")))
    assert score.value == 1.0  # any_of already met: whatever the judge said, 1.0
    assert score.details["ungraded"] == [
        {"group": "any_of", "index": 1, "error": "RuntimeError: 503 after retries"}
    ]


async def test_an_ungraded_criterion_next_to_a_failed_one_still_moves_partial_credit(
    tmp_path: Path,
) -> None:
    # all_of is partial credit: [0, ungraded] is 0 or 0.5 depending on the grade
    goal = {"description": "refund", "all_of": [MISSING, POLITE]}
    score = await goal_score(tmp_path, goal, scripted("no idea"))
    assert score.status == "failed" and "all_of[1]" in (score.reason or "")


class PricedJudge(FakeAdapter):
    def estimate_cost(self, usage: Any) -> Cost:
        return Cost(total_cost=usage.prompt_tokens * 0.5 + usage.completion_tokens)


async def test_goal_judge_usage_and_cost_are_recorded(tmp_path: Path) -> None:
    judge = PricedJudge(lambda messages, params: grade(4), name="judge-model")
    score = await goal_score(tmp_path, {"description": "book", "all_of": [BOOKED, POLITE]}, judge)
    assert score.value == pytest.approx((1.0 + 0.75) / 2)
    assert score.details["judge"] == "judge-model"
    assert score.details["judge_calls"] == 1
    assert score.details["judge_usage"] == {"prompt_tokens": 1, "completion_tokens": 1}
    assert score.details["judge_cost_usd"] == 1.5
    assert score.details["ungraded"] == []


# --- reliability accounting ---------------------------------------------------------


async def test_samples_are_asked_at_once() -> None:
    """Three samples of a turn are in flight together: a judge that answers only once
    all three have arrived would wait forever for samples asked one after another."""
    arrived = 0
    everyone = anyio.Event()

    async def behave(messages: Any, params: Any) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            everyone.set()
        await everyone.wait()
        return grade(4)

    judge = FakeAdapter(behave, name="judge-model")
    with anyio.fail_after(5):
        score = await rubric_score(judge, samples=3)
    assert score.value == 0.75 and score.details["samples_graded"] == 3


async def test_scores_carry_the_spread_an_interval_and_the_counts() -> None:
    judge = scripted(grade(1), grade(5), grade(5), grade(5), "no idea", "still no idea", grade(5))
    score = await rubric_score(judge, turns=2, samples=3, max_reasks=1)
    details = score.details
    # turn 1: 1, 5, 5; turn 2: 5, (unparsable after one re-ask), 5
    assert details["samples_asked"] == 6
    assert details["samples_graded"] == 5
    assert details["samples_unparsable"] == 1 and details["samples_failed"] == 0
    spread_first = float(np.std([0.0, 1.0, 1.0]))
    assert details["sample_spread"] == pytest.approx((spread_first + 0.0) / 2)
    low, high = details["ci95"]
    assert low < score.value < high and low >= 0.0 and high <= 1.0
    again = await rubric_score(
        scripted(grade(1), grade(5), grade(5), grade(5), "no idea", "still no idea", grade(5)),
        turns=2,
        samples=3,
        max_reasks=1,
    )
    assert again.details["ci95"] == details["ci95"]  # seeded: the same grades, the same interval


async def test_a_judge_that_always_agrees_has_no_spread_and_a_point_interval() -> None:
    score = await rubric_score(scripted(grade(4)), turns=3, samples=2)
    assert score.details["sample_spread"] == 0.0
    assert score.details["ci95"] == [0.75, 0.75]


async def test_one_grade_gives_no_interval() -> None:
    score = await rubric_score(scripted(grade(4)))
    assert score.details["ci95"] is None and score.details["sample_spread"] is None


async def test_a_judge_behind_http_that_answers_prose_is_counted_unparsable() -> None:
    """The mock server answers in prose, as a small real model often does: every sample
    is asked (over HTTP), none parses, and the score fails saying so with the counts."""
    from convsim.adapters import create_adapter
    from convsim.adapters.mock import MockModelServer, MockServerConfig

    async with MockModelServer(MockServerConfig()) as server:
        adapter = create_adapter(
            "openai-compatible:mock-model", {"base_url": server.base_url, "max_retries": 0}
        )
        metric = RubricJudgeMetric(
            "judge:polite?", "polite?", JudgeSettings(adapter, samples=3, max_reasks=0)
        )
        scorer = metric.scorer(None)  # type: ignore[arg-type]
        await scorer.update(record("t0", "Certainly, happy to help."))
        score = await scorer.result()
        served = server.statistics().by_endpoint.get("/v1/chat/completions")
        await adapter.aclose()
    assert score.status == "failed" and "could not be parsed" in (score.reason or "")
    assert score.details["samples_asked"] == 3 == score.details["samples_unparsable"]
    assert score.details["samples_graded"] == 0 and served == 3


def test_an_answer_nested_past_the_json_parser_is_unparsable_not_a_crash() -> None:
    from convsim.metrics._goal import _json_in
    from convsim.metrics._judge import parse_grade

    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_grade('{"score": ' + deep + "}")
    with pytest.raises(ValueError, match="no JSON"):
        _json_in("here: " + deep)
