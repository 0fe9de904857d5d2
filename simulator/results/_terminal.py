"""Run reports and comparisons as rich tables on a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
from rich.text import Text

from .._plural import counted
from ._fit import Cell, across_tables, fits, print_all, row_table

if TYPE_CHECKING:
    from convsim._records import Score

    from ._compare import Comparison
    from ._report import MetricSummary, RunReport

__all__ = ["mean_cell", "print_comparison", "print_report", "score_cell"]


def mean_cell(summary: MetricSummary | None) -> str:
    if summary is None:
        return ""
    return "n/a" if summary.mean is None else f"{summary.mean:.4g}"


def _metric_parts(
    console: Console,
    title: str,
    unit: str,
    summaries: dict[str, MetricSummary],
    *,
    legend: bool = True,
) -> list[RenderableType]:
    """A metric, its mean and 95% CI over the scored ``unit`` only, its scored, n/a
    and failed counts and direction a row; whole at any width (applicable is scored plus
    failed: said in the title with the ``legend``, a column is too wide)."""
    corpus = any(m.corpus is not None for m in summaries.values())
    judged = any(m.judge_samples is not None for m in summaries.values())
    heads = [
        "metric",
        "mean",
        "95% CI",
        *(["corpus"] if corpus else []),
        "scored",
        "n/a",
        "failed",
        *(["judge samples"] if judged else []),
        "",
    ]
    rows: list[list[str]] = []
    for name, m in summaries.items():
        better = {True: "\u2191", False: "\u2193", None: ""}[m.higher_is_better]
        ci = "" if m.ci_low is None else f"{m.ci_low:.3g}-{m.ci_high:.3g}"
        whole = ["" if m.corpus is None else f"{m.corpus:.4g}"] if corpus else []
        row = [mean_cell(m), ci, *whole, str(m.n), str(m.not_applicable), str(m.failed)]
        if judged:
            row.append(_judge_samples_cell(m.judge_samples))
        rows.append([name, *row, better])
    if legend:
        title += (
            f"; scored: {unit} with a value (applicable: scored + failed); \u2191 higher is better"
        )
    return row_table(console, title, heads, rows)


def _judge_samples_cell(counts: dict[str, int] | None) -> str:
    """A judge metric's samples: graded of asked, then the unparsable and failed ones."""
    if counts is None:
        return ""
    return (
        f"{counts['graded']}/{counts['asked']} graded, "
        f"{counts['unparsable']} unparsable, {counts['failed']} failed"
    )


def _group_tables(
    console: Console, title: str, key: str, groups: dict[str, Any], names: list[str]
) -> list[RenderableType]:
    """A breakdown that fits the console: groups as rows and metrics as columns when
    that fits; otherwise turned round (metrics as rows), the groups split across as
    many tables as it takes, so that no number is ever cut."""
    rows = {
        name: [
            str(g.conversations),
            str(g.statuses.get("DONE", 0)),
            str(g.statuses.get("FAILED", 0)),
            *[mean_cell(g.metrics.get(n)) for n in names],
        ]
        for name, g in groups.items()
    }
    heads = ["conversations", "DONE", "FAILED", *names]
    wide = [[name, *cells] for name, cells in rows.items()]
    if fits(console, [key, *heads], wide, console.width):
        return row_table(console, title, [key, *heads], wide)
    return across_tables(console, title, "", rows, heads)


def _tiers(report: RunReport) -> list[tuple[str, dict[str, MetricSummary]]]:
    """The metric tables of a report: one, or for a pack that declares tiers its
    primary metrics, its secondary ones and those in neither, each a table of its own
    (a tier column would not fit 80 columns)."""
    mean = "mean over scored conversations"
    if not report.metric_tiers:
        return [(f"metrics ({mean})", report.metrics)]
    parts: dict[str | None, dict[str, MetricSummary]] = {}
    for name, summary in report.metrics.items():
        parts.setdefault(report.tier_of(name), {})[name] = summary
    titles = {
        "primary": f"primary metrics ({mean}; the pack's metrics.primary)",
        "secondary": "secondary metrics (the pack's metrics.secondary)",
        None: "other metrics (in neither tier)",
    }
    return [(titles[tier], parts[tier]) for tier in titles if tier in parts]


def _prose(out: Console, line: str) -> None:
    """A line of figures, whole on one line (a terminal wraps it; a log keeps it)."""
    out.print(Text(line), highlight=False)


def print_report(report: RunReport, out: Console) -> None:
    """The summary of a run: counts, metric tables, groups and curves."""
    title = f"{', '.join(report.packs) or 'no results'} · {', '.join(report.models)}"
    head = [[status, str(count)] for status, count in report.statuses.items()]
    print_all(out, row_table(out, title, ["status", "conversations"], head))
    for i, (title, summaries) in enumerate(_tiers(report)):
        print_all(out, _metric_parts(out, title, "conversations", summaries, legend=not i))
    if report.turn_metrics:
        title = "turn metrics (mean over the scored turns that ask for them)"
        print_all(out, _metric_parts(out, title, "turns", report.turn_metrics))
    figures = [counted(report.conversations, "conversation")]
    if report.duration_s is not None:
        figures.append(f"wall time {report.duration_s:.1f} s")
    usage = report.usage
    if usage.get("total_tokens"):
        figures.append(
            f"tokens {usage.get('total_tokens', 0):,} ({usage.get('prompt_tokens', 0):,} in, "
            f"{usage.get('completion_tokens', 0):,} out)"
        )
    figures.append("cost " + report.cost_text())
    if report.clipped_turns:
        figures.append(f"{counted(report.clipped_turns, 'turn')} clipped to the max_tokens cap")
    _prose(out, "; ".join(figures))
    said = report.token_sources_line()
    if said and report.token_sources.get("server", 0) < sum(report.token_sources.values()):
        _prose(out, said)  # said only when not all are the server's
    names = list(report.metrics)
    for key, groups in (
        ("scenario_type", report.by_scenario_type),
        ("difficulty", report.by_difficulty),
        ("model", report.by_model),
        ("language", report.by_language),
    ):
        if len(groups) > 1 or key == "scenario_type" or (key == "language" and groups):
            print_all(out, _group_tables(out, f"by {key}", key, groups, names))
    if report.retention_curve:
        curve = [
            [str(d), mean_cell(m), f"{m.ci_low:.3g} - {m.ci_high:.3g}", str(m.n)]
            for d, m in report.retention_curve.items()
        ]
        title = "context_retention by distance (turns between fact and probe)"
        print_all(out, row_table(out, title, ["distance", "recalled", "95% CI", "checks"], curve))
    for label, spread in (
        ("latency", report.latency_s),
        ("TTFT", report.ttft_s),
        ("TTFOT", report.ttfot_s),
    ):
        if spread:
            _prose(out, f"{label} (s): " + ", ".join(f"{k} {v:.4g}" for k, v in spread.items()))
    if report.errors:
        _prose(out, "errors: " + ", ".join(f"{k} x{v}" for k, v in report.errors.items()))
    if report.trials is not None:
        _print_trials(report, out)


def _print_trials(report: RunReport, out: Console) -> None:
    """pass@k and pass^k for k = 1, 2, 4, ... and the most trials (the JSON has every
    k), and each metric's spread across a scenario's trials."""
    from ._report import shown_ks

    title = f"trials: {report.trials} per scenario"
    if report.pass_hat_k:
        rows = [
            [str(k), f"{report.pass_at_k[k]:.3f}", f"{report.pass_hat_k[k]:.3f}"]
            for k in shown_ks(max(report.pass_hat_k))
        ]
        title += "; goal achieved in at least one (pass@k) and in all (pass^k) of k trials"
        print_all(out, row_table(out, title, ["k", "pass@k", "pass^k"], rows))
    else:
        _prose(out, title)
    if report.trial_spread:
        title = "spread across trials (a scenario's standard deviation, mean over scenarios)"
        spread = [[name, f"{v:.3g}"] for name, v in report.trial_spread.items()]
        print_all(out, row_table(out, title, ["metric", "spread"], spread))


def score_cell(score: Score) -> str:
    if score.value is not None:
        return f"{score.value:.4g}"
    return "failed" if score.status == "failed" else "n/a"


def print_comparison(result: Comparison, out: Console) -> None:
    """The paired comparison: a metric a row, whole at any width; for runs of a pack
    that declares tiers, the primary metrics, the secondary ones and the rest each a
    table of their own, in that order."""
    rows: dict[str | None, list[list[Cell]]] = {}
    for m in result.metrics:
        tier = m.tier if result.metric_tiers else None
        if not m.pairs:
            rows.setdefault(tier, []).append([m.metric, "0", "-", "-", "-", "-", "-", "-"])
            continue
        ci = f"{m.ci95[0]:+.2g}..{m.ci95[1]:+.2g}" if m.ci95 else "-"
        diff = f"{m.mean_difference:+.3g}"
        rows.setdefault(tier, []).append(
            [
                m.metric,
                str(m.pairs),
                f"{m.base_mean:.3g}",
                f"{m.candidate_mean:.3g}",
                Text(diff, style="red") if m.significantly_worse else diff,
                ci,
                f"{m.wins}/{m.ties}/{m.losses}",
                "-" if m.wilcoxon_p is None else f"{m.wilcoxon_p:.2g}",
            ]
        )
    # the files' paths, never broken across lines
    out.print(Text(f"{result.candidate} vs {result.base} ({result.paired} paired)", "table.title"))
    heads = ["metric", "n", "base", "cand.", "diff.", "95% CI", "W/T/L", "p"]
    titles = {"primary": "primary metrics", "secondary": "secondary metrics", None: ""}
    if result.metric_tiers:
        titles[None] = "other metrics (in neither tier)"
    for tier, title in titles.items():
        if tier in rows:
            print_all(out, row_table(out, title, heads, rows[tier]))
    for m in result.metrics:
        if m.most_changed:
            changes = ", ".join(
                f"{c.conversation_id} {c.difference:+.3g}" for c in m.most_changed[:3]
            )
            _prose(out, f"{m.metric}: most changed {changes}")
    if result.only_in_base or result.only_in_candidate:
        _prose(
            out,
            f"unpaired: {len(result.only_in_base)} only in base "
            f"({', '.join(result.only_in_base[:5])}), {len(result.only_in_candidate)} only in "
            f"candidate ({', '.join(result.only_in_candidate[:5])})",
        )
