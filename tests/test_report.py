"""Summaries of results."""

from __future__ import annotations

import convsim
from convsim import summarize


def test_summary_counts_statuses_metrics_and_groups() -> None:
    results = convsim.run_sync(
        "single_turn_qa", "scripted", model_args={"fail_rate": 0.3}, limit=20
    )
    report = summarize(results)
    assert report.conversations == 20
    failed = sum(r.status is convsim.Status.FAILED for r in results)
    assert 0 < failed < 20
    assert report.statuses == {
        "DONE": 20 - failed,
        "FAILED": failed,
        "TIMED_OUT": 0,
        "CANCELLED": 0,
    }
    assert report.errors == {"ServerError": failed}
    em = report.metrics["exact_match"]
    assert em.n == 20 - failed and em.not_applicable == failed and em.mean == 1.0
    assert em.higher_is_better is True and report.metrics["latency"].higher_is_better is False
    assert report.by_scenario_type["single_turn"].conversations == 20
    assert report.turns["completed"] == 20 - failed and report.turns["failed"] == failed
    assert set(report.latency_s) == {"mean", "p50", "p95", "p99", "max"}
    md = report.to_markdown()
    assert f"| FAILED | {failed} |" in md and "| exact_match | 1 |" in md


def test_summary_of_nothing() -> None:
    report = summarize([])
    assert report.conversations == 0 and report.metrics == {} and report.duration_s is None
    assert "conversations: 0" in report.to_markdown()


def test_turn_metrics_are_summarised_over_the_turns_that_ask_for_them() -> None:
    results = convsim.run_sync("coding_help", "scripted")
    report = summarize(results)
    asked = [
        s["technical_accuracy"]
        for r in results
        for s in r.turn_scores.values()
        if "technical_accuracy" in s
    ]
    summary = report.turn_metrics["technical_accuracy"]
    assert summary.n + summary.not_applicable == len(asked) > 0
    assert summary.n == sum(s.value is not None for s in asked)
    assert "## Turn metrics" in report.to_markdown()
    assert "technical_accuracy" not in report.metrics  # a turn metric, not a conversation one
