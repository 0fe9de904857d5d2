"""Conversational judge metrics: prompts, grading, counting what could not be graded."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FakeAdapter

from convsim.adapters import GenerationParams
from convsim.adapters._cache import cache_key
from convsim.metrics import METRICS, JudgeSettings
from convsim.metrics._dialogue_judges import DIALOGUE_JUDGES
from convsim.metrics._transcripts import build_transcript

pytestmark = pytest.mark.anyio

MESSAGES = [
    {"role": "system", "content": "You are Nora, the support agent of a shoe shop."},
    {"role": "user", "content": "Hi, I'm Maria, my order NW-1 is late."},
    {"role": "assistant", "content": "Sorry Maria, let me check order NW-1."},
    {"role": "user", "content": "I need size 39, please send a replacement."},
    {"role": "assistant", "content": "A replacement in size 39 is on its way."},
]


def judge_answering(*answers: Any) -> FakeAdapter:
    queue = list(answers)

    def behave(messages: Any, params: Any) -> Any:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return FakeAdapter(behave, name="judge-model")


def grade(score: int) -> str:
    return f'{{"score": {score}, "reason": "graded {score}"}}'


async def score_with(
    name: str, judge: FakeAdapter, messages: list[dict[str, str]] = MESSAGES, **settings: Any
) -> Any:
    transcript = build_transcript("c", messages)
    metric = METRICS.get(name)().with_judge(JudgeSettings(judge, **settings))
    scorer = metric.scorer(transcript.conversation)
    for turn in transcript.turns:
        await scorer.update(turn)
    return await scorer.result()


def test_the_four_are_registered_listed_and_need_a_judge() -> None:
    from convsim.metrics import registered_metrics

    listed = {info.name: info for info in registered_metrics()}
    for name in DIALOGUE_JUDGES:
        assert type(METRICS.get(name)()).__name__ == "DialogueJudgeMetric"
        assert listed[name].traits is not None and "judge" in listed[name].traits.needs
    # other text under the prefix is still a rubric
    assert type(METRICS.get("judge:is it kind?")()).__name__ == "RubricJudgeMetric"


@pytest.mark.parametrize(
    ("name", "units"),
    [
        ("judge:turn_relevancy", 2),  # both replies
        ("judge:knowledge_retention", 1),  # the reply after the second user message
        ("judge:role_adherence", 2),
        ("judge:conversation_completeness", 1),  # the whole conversation, once
    ],
)
async def test_each_parses_a_good_answer_and_records_its_prompt(name: str, units: int) -> None:
    judge = judge_answering(grade(4))
    score = await score_with(name, judge)
    assert score.value == 0.75
    details = score.details
    metric = METRICS.get(name)()
    assert details["prompt_version"] == metric.prompt.version and "/" in metric.prompt.version
    assert details["prompt_sha256"] == metric.prompt.sha256 and len(metric.prompt.sha256) == 64
    assert details["samples_asked"] == units == details["samples_graded"] == len(judge.calls)
    assert details["samples_unparsable"] == 0 and details["samples_failed"] == 0
    assert details["reasons"] == ["graded 4"] * min(units, 5)


async def test_each_counts_an_unparsable_answer_and_a_failed_call() -> None:
    for name in DIALOGUE_JUDGES:
        judge = judge_answering("I would say four", "still prose", RuntimeError("503"), grade(5))
        score = await score_with(name, judge, samples=2, max_reasks=1)
        details = score.details
        # first unit: sample 0 prose twice (unparsable), sample 1 fails; then 5s
        assert details["samples_unparsable"] == 1, name
        assert details["samples_failed"] == 1, name
        assert details["failures"][0]["error"] == "RuntimeError: 503", name
        if name == "judge:knowledge_retention" or name == "judge:conversation_completeness":
            # one unit only, and it had no grade: a failure to measure, with the counts
            assert score.status == "failed" and details["samples_graded"] == 0, name
        else:
            assert score.value == 1.0 and details["samples_graded"] == 2, name


async def test_a_judge_that_never_answers_json_fails_the_score_with_the_counts() -> None:
    score = await score_with("judge:turn_relevancy", judge_answering("prose"), max_reasks=0)
    assert score.status == "failed" and "could not be parsed" in (score.reason or "")
    assert score.details["samples_unparsable"] == 2 == score.details["samples_asked"]
    assert score.details["unparsable_turns"] == ["t1", "t2"]


async def test_samples_give_a_spread_and_an_interval() -> None:
    judge = judge_answering(grade(1), grade(5), grade(3))
    score = await score_with("judge:conversation_completeness", judge, samples=3)
    assert score.value == 0.5
    assert score.details["sample_spread"] > 0
    low, high = score.details["ci95"]
    assert 0.0 <= low < 0.5 < high <= 1.0


async def test_without_a_judge_or_without_input_they_are_not_applicable() -> None:
    transcript = build_transcript("c", MESSAGES)
    scorer = METRICS.get("judge:role_adherence")().scorer(transcript.conversation)
    assert "needs a judge" in (scorer.result().reason or "")
    no_role = [m for m in MESSAGES if m["role"] != "system"]
    judge = judge_answering(grade(5))
    score = await score_with("judge:role_adherence", judge, no_role)
    assert score.status == "not_applicable" and "no role" in (score.reason or "")
    assert judge.calls == []
    one_turn = MESSAGES[:3]
    score = await score_with("judge:knowledge_retention", judge, one_turn)
    assert score.status == "not_applicable" and judge.calls == []


async def test_role_comes_from_the_persona_when_there_is_no_system_prompt() -> None:
    transcript = build_transcript(
        "c", MESSAGES[1:], metadata={"persona": "your persona: I am a pirate."}
    )
    judge = judge_answering(grade(2))
    metric = METRICS.get("judge:role_adherence")().with_judge(JudgeSettings(judge))
    scorer = metric.scorer(transcript.conversation)
    for turn in transcript.turns:
        await scorer.update(turn)
    assert (await scorer.result()).value == 0.25
    assert "I am a pirate." in judge.calls[0][0][0].content


async def test_turn_relevancy_shows_a_sliding_window() -> None:
    long = [
        m
        for i in range(12)
        for m in (
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i}"},
        )
    ]
    judge = judge_answering(grade(5))
    await score_with("judge:turn_relevancy", judge, long)
    last = judge.calls[-1][0][0].content
    assert "question 11" in last and "answer 6" in last and "question 6" not in last


async def test_the_prompts_and_so_the_cache_keys_differ_per_metric() -> None:
    params = GenerationParams(max_tokens=200, temperature=0.0)
    keys = set()
    for name in DIALOGUE_JUDGES:
        judge = judge_answering(grade(5))
        await score_with(name, judge)
        messages, _ = judge.calls[-1]
        keys.add(cache_key({"model": "judge"}, list(messages), params))
    assert len(keys) == len(DIALOGUE_JUDGES)


def test_a_runs_summary_counts_the_judges_samples_and_prints_them() -> None:
    from pathlib import Path

    from rich.console import Console

    import convsim
    from convsim.results._report import MetricSummary, summarize
    from convsim.results._terminal import _metric_parts

    guide = Path(__file__).parent / "data" / "guide_example"
    judge = judge_answering("prose", "prose", grade(5))  # the first unparsable, re-asked
    results = convsim.run_sync(guide, "scripted", judge=judge, metrics=["judge:turn_relevancy"])
    report = summarize(results)
    summary = report.metrics["judge:turn_relevancy"]
    counts = summary.judge_samples
    assert counts is not None and counts["unparsable"] == 1 and counts["failed"] == 0
    assert counts["asked"] == counts["graded"] + 1 and counts["graded"] > 0
    plain = MetricSummary(mean=None, n=0, not_applicable=1)
    assert "judge_samples" not in plain.model_dump()  # a metric no judge graded
    console = Console(width=200, record=True)
    for part in _metric_parts(console, "metrics", "conversations", {"j": summary}):
        console.print(part)
    assert f"{counts['graded']}/{counts['asked']} graded, 1 unparsable, 0 failed" in (
        console.export_text()
    )
    row = f"| judge:turn_relevancy | {counts['asked']} | {counts['graded']} | 1 | 0 |"
    assert row in report.to_markdown()  # summary.md counts them too


def test_the_html_report_shows_the_judges_samples(tmp_path: Any) -> None:
    from pathlib import Path

    import convsim
    from convsim.results._html import write_html
    from convsim.results._report import summarize

    pytest.importorskip("jinja2")
    guide = Path(__file__).parent / "data" / "guide_example"
    judge = judge_answering("prose", "prose", grade(4))  # one unparsable sample
    out = tmp_path / "out.jsonl"
    results = convsim.run_sync(
        guide, "scripted", judge=judge, metrics=["judge:turn_relevancy"], out=out
    )
    page = write_html(out).read_text(encoding="utf-8")
    section = page[page.index('id="judge-samples"') :]
    counts = summarize(results).metrics["judge:turn_relevancy"].judge_samples
    assert counts is not None and counts["unparsable"] == 1
    row = (
        f'<tr><td>judge:turn_relevancy</td><td class="num">{counts["asked"]}</td>'
        f'<td class="num">{counts["graded"]}</td><td class="num">1</td><td class="num">0</td></tr>'
    )
    assert row in section
