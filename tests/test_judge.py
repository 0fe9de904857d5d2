"""LLM-as-judge: strict parsing, re-asking, sampling, usage, budgets, configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FakeAdapter

import convsim
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.metrics import METRICS
from convsim.metrics._judge import parse_grade

GUIDE = Path(__file__).parent / "data" / "guide_example"
RUBRIC = "judge:Is the reply polite?"


@pytest.mark.parametrize(
    ("text", "grade"),
    [
        ('{"score": 4, "reason": "clear"}', (4, "clear")),
        ('Here you go: {"score": 5.0}', (5, "")),
        ('```json\n{"score": 1, "reason": "rude"}\n```', (1, "rude")),
    ],
)
def test_parse_grade_accepts_strict_json(text: str, grade: tuple[int, str]) -> None:
    assert parse_grade(text) == grade


@pytest.mark.parametrize(
    "text",
    [
        "I'd say 4.",
        '{"score": 6}',
        '{"score": "4"}',
        '{"score": true}',
        '{"score": 3.5}',
        '{"grade": 4}',
        "} before {",
        "{" * 200_000,  # an answer of braces: refused in linear time, not quadratic
    ],
)
def test_parse_grade_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):
        parse_grade(text)


def judge_answering(*answers: str) -> FakeAdapter:
    queue = list(answers)

    def behave(messages: Any, params: Any) -> str:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return FakeAdapter(behave, name="judge-model")


def judged_run(judge: Any, metrics: list[str], **kw: Any) -> convsim.ConversationResult:
    results = convsim.run_sync(GUIDE, "scripted", judge=judge, metrics=metrics, **kw)
    return next(r for r in results if r.conversation_id == "budget-planning")


def test_unparsable_answers_are_re_asked_with_the_bad_answer_shown() -> None:
    judge = judge_answering("four out of five", '{"score": 5, "reason": "kind"}')
    score = judged_run(judge, [RUBRIC]).scores[RUBRIC]
    assert score.value == 1.0  # every turn graded 5 -> (5 - 1) / 4
    reask = judge.calls[1][0]
    assert [m.role for m in reask] == ["user", "assistant", "user"]
    assert reask[1].content == "four out of five" and "JSON" in reask[2].content


def test_a_judge_that_never_answers_properly_scores_nothing() -> None:
    score = judged_run(judge_answering("no idea"), [RUBRIC]).scores[RUBRIC]
    assert score.status == "failed" and "could not be parsed" in (score.reason or "")
    assert score.details["unparsable_turns"] == ["introduction", "analysis", "refinement"]
    assert score.details["judge_calls"] == 6  # one re-ask per turn, then it gives up


def test_samples_are_averaged() -> None:
    judge = judge_answering('{"score": 1}', '{"score": 5}', '{"score": 5}')
    score = judged_run(judge, [RUBRIC], judge_samples=3).scores[RUBRIC]
    assert score.details["judge_calls"] == 9
    first_turn = ((1 + 5 + 5) / 3 - 1) / 4  # the three samples are averaged, then mapped
    assert score.value == pytest.approx((first_turn + 1.0 + 1.0) / 3)


def test_guide_rubrics_are_graded_per_turn_with_a_judge_and_not_applicable_without() -> None:
    result = judged_run(judge_answering('{"score": 3, "reason": "ok"}'), ["latency"])
    assert result.turn_scores["introduction"]["engagement_quality"].value == 0.5
    without = judged_run(None, ["latency"])
    assert "needs a judge" in (without.turn_scores["introduction"]["clarity_score"].reason or "")


def test_judge_calls_share_the_simulators_budgets_and_record_usage() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert "Rubric: " in json.loads(request.content)["messages"][0]["content"]
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": '{"score": 4}'}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
            },
        )

    judge = OpenAICompatibleAdapter(
        {
            "model": "grader",
            "base_url": "http://judge.test/v1",
            "input_price": 1.0,
            "output_price": 2.0,
        },
        transport=HttpxTransport(transport=httpx.MockTransport(handler)),
    )
    sim = convsim.Simulator("scripted", judge=judge, metrics=[RUBRIC])

    async def main() -> list[convsim.ConversationResult]:
        async with sim:
            return [r async for r in sim.run(GUIDE)]

    import anyio

    results = anyio.run(main)
    stats = {s.key: s for s in sim.budgets.statistics()}
    judged_scores = [
        *(r.scores[RUBRIC] for r in results),
        *(s for r in results for turn in r.turn_scores.values() for s in turn.values()),
    ]
    calls = sum(s.details.get("judge_calls", 0) for s in judged_scores)
    assert calls > 0 and stats[judge.connection_key()].requests == calls  # all budgeted
    score = next(r for r in results if r.conversation_id == "budget-planning").scores[RUBRIC]
    assert score.details["judge_usage"] == {"prompt_tokens": 300, "completion_tokens": 21}
    assert score.details["judge_cost_usd"] == pytest.approx((300 * 1.0 + 21 * 2.0) / 1e6)
    assert all(s.value == 0.75 for s in judged_scores if s.reason is None)


def test_judge_names_in_packs_and_the_registry() -> None:
    assert RUBRIC in METRICS and "judge:" not in METRICS
    assert METRICS.get("judge:accuracy")().rubric.startswith("Is every factual statement")
    with pytest.raises(convsim.ConfigError, match="judge_samples"):
        convsim.Simulator("scripted", judge="scripted", judge_samples=0)


def test_majority_of_samples() -> None:
    judge = judge_answering('{"score": 1}', '{"score": 5}', '{"score": 5}')
    score = judged_run(judge, [RUBRIC], judge_samples=3, judge_combine="majority").scores[RUBRIC]
    assert score.value == 1.0  # 5 wins the first turn's vote; later turns all say 5
    with pytest.raises(convsim.ConfigError, match="judge_combine"):
        convsim.Simulator("scripted", judge="scripted", judge_combine="median")
