"""Summaries of results."""

from __future__ import annotations

import json

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
    assert f"| FAILED | {failed} |" in md and "| exact_match | primary | 1 |" in md


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


def test_every_summary_shows_applicable_scored_and_not_applicable() -> None:
    """Means and intervals are over the scored conversations only; every output counts
    the scored, not applicable and failed ones (applicable: scored plus failed)."""
    import re

    from rich.console import Console

    from convsim import Score
    from convsim.results._html import render_html
    from convsim.results._terminal import print_report

    results = convsim.run_sync("single_turn_qa", "scripted", limit=5, metrics=["latency"])
    scores = [
        Score(value=0.2),
        Score(value=0.4),
        Score.not_applicable("no evidence: nothing recalled or forgotten", checks=2),
        Score.not_applicable("no completed turns"),
        Score.failed("RuntimeError: kaput"),
    ]
    results = [
        r.model_copy(update={"scores": {**r.scores, "probe": s}})
        for r, s in zip(results, scores, strict=True)
    ]
    report = summarize(results)
    m = report.metrics["probe"]
    assert (m.n, m.not_applicable, m.failed, m.applicable) == (2, 2, 1, 3)
    assert m.mean is not None and abs(m.mean - 0.3) < 1e-12  # the scored two alone
    assert m.ci_low is not None and m.ci_high is not None
    assert 0.2 <= m.ci_low <= m.ci_high <= 0.4
    # JSON (also what the service's summary returns)
    data = json.loads(report.model_dump_json())
    assert data["metrics"]["probe"]["applicable"] == 3 and data["metrics"]["probe"]["n"] == 2
    # Markdown
    md = report.to_markdown()
    assert "| applicable | scored | not applicable | failed |" in md
    untiered = r"\| probe \|  \| 0\.3 \| [^|]+ \| [^|]+ \| 3 \| 2 \| 2 \| 1 \|"  # no tier
    assert re.search(untiered, md), md
    # the terminal, at 80 columns
    console = Console(width=80, record=True, force_terminal=False)
    print_report(report, console)
    text = console.export_text()
    assert "scored" in text and "applicable: scored + failed" in text
    row = next(line for line in text.splitlines() if "│ probe" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[0] == "probe" and cells[1] == "0.3" and cells[3:6] == ["2", "2", "1"]
    assert all(len(line) <= 80 for line in text.splitlines())
    # HTML
    page = render_html(results, title="t", report=report)
    assert '<th class="num">applicable</th><th class="num">scored</th>' in page
    cell = '<td class="num">{}</td>'
    assert "".join(cell.format(v) for v in (3, 2, 2, 1)) in page
