"""Run reports and comparisons as rich tables on a terminal."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from convsim._records import Score

    from ._compare import Comparison
    from ._report import MetricSummary, RunReport

__all__ = ["mean_cell", "print_comparison", "print_report", "score_cell"]


def mean_cell(summary: MetricSummary | None) -> str:
    if summary is None:
        return ""
    return "n/a" if summary.mean is None else f"{summary.mean:.4g}"


def _metric_table(title: str, unit: str, summaries: dict[str, MetricSummary]) -> Table:
    """Mean and CI over the scored ``unit`` only, beside the scored, n/a and failed
    counts (applicable is scored plus failed: said in the title, a column is too wide)."""
    table = Table(
        title=f"{title}; scored: {unit} with a value (applicable: scored + failed); "
        "\u2191 higher is better"
    )
    table.add_column("metric", no_wrap=True)
    corpus = any(m.corpus is not None for m in summaries.values())
    for col in ("mean", "95% CI", *(["corpus"] if corpus else []), "scored", "n/a", "failed"):
        table.add_column(col, justify="right", no_wrap=True)  # numbers are never cut
    table.add_column("", no_wrap=True)
    for name, m in summaries.items():
        better = {True: "\u2191", False: "\u2193", None: ""}[m.higher_is_better]
        ci = "" if m.ci_low is None else f"{m.ci_low:.3g}-{m.ci_high:.3g}"
        whole = ["" if m.corpus is None else f"{m.corpus:.4g}"] if corpus else []
        row = [mean_cell(m), ci, *whole, str(m.n), str(m.not_applicable), str(m.failed)]
        table.add_row(name, *row, better)
    return table


def _cell_width(texts: Iterable[str]) -> int:
    """Columns a cell of the widest text needs, with padding and a border."""
    return max((len(t) for t in texts), default=0) + 3


def _group_tables(
    title: str, key: str, groups: dict[str, Any], names: list[str], width: int
) -> list[Table]:
    """A breakdown that fits ``width`` columns: groups as rows and metrics as columns
    when that fits; otherwise turned round (metrics as rows), the groups split across as
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
    wide = _cell_width([key, *rows]) + sum(
        _cell_width([h, *(r[i] for r in rows.values())]) for i, h in enumerate(heads)
    )
    if wide <= width:
        table = Table(title=title)
        for col in (key, *heads):
            table.add_column(col, justify="left" if col == key else "right", no_wrap=True)
        for name, cells in rows.items():
            table.add_row(name, *cells)
        return [table]
    first = _cell_width(heads)
    chunks: list[list[str]] = [[]]
    used = first
    for name in rows:
        need = _cell_width([name, *rows[name]])
        if chunks[-1] and used + need > width:
            chunks.append([])
            used = first
        chunks[-1].append(name)
        used += need
    tables: list[Table] = []
    for chunk in chunks:
        part = "" if len(chunks) == 1 else f" ({len(tables) + 1}/{len(chunks)})"
        table = Table(title=title + part)
        table.add_column("", no_wrap=True)
        for name in chunk:
            table.add_column(name, justify="right", no_wrap=True)
        for i, head in enumerate(heads):
            table.add_row(head, *[rows[name][i] for name in chunk])
        tables.append(table)
    return tables


def print_report(report: RunReport, out: Console) -> None:
    """The summary of a run: counts, metric tables, groups and curves."""
    head = Table(title=f"{', '.join(report.packs) or 'no results'} · {', '.join(report.models)}")
    head.add_column("status")
    head.add_column("conversations", justify="right")
    for status, count in report.statuses.items():
        head.add_row(status, str(count))
    out.print(head)
    out.print(
        _metric_table("metrics (mean over scored conversations)", "conversations", report.metrics)
    )
    if report.turn_metrics:
        title = "turn metrics (mean over the scored turns that ask for them)"
        out.print(_metric_table(title, "turns", report.turn_metrics))
    figures = [f"{report.conversations} conversations"]
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
        figures.append(f"{report.clipped_turns} turns clipped to the max_tokens cap")
    out.print("; ".join(figures), highlight=False)
    said = report.token_sources_line()
    if said and report.token_sources.get("server", 0) < sum(report.token_sources.values()):
        out.print(said, highlight=False)  # said only when not all are the server's
    names = list(report.metrics)
    for key, groups in (
        ("scenario_type", report.by_scenario_type),
        ("difficulty", report.by_difficulty),
        ("model", report.by_model),
    ):
        if len(groups) > 1 or key == "scenario_type":
            for table in _group_tables(f"by {key}", key, groups, names, out.width):
                out.print(table)
    if report.retention_curve:
        curve = Table(title="context_retention by distance (turns between fact and probe)")
        for col in ("distance", "recalled", "95% CI", "checks"):
            curve.add_column(col, justify="right")
        for d, m in report.retention_curve.items():
            curve.add_row(str(d), mean_cell(m), f"{m.ci_low:.3g} - {m.ci_high:.3g}", str(m.n))
        out.print(curve)
    if report.latency_s:
        out.print(
            "latency (s): " + ", ".join(f"{k} {v:.4g}" for k, v in report.latency_s.items()),
            highlight=False,
        )
    if report.errors:
        out.print(
            "errors: " + ", ".join(f"{k} x{v}" for k, v in report.errors.items()), highlight=False
        )
    if report.trials is not None:
        line = f"trials: {report.trials} per scenario"
        if report.pass_hat_k:
            line += "; goal achieved: " + ", ".join(
                f"pass^{k} {v:.3f}" for k, v in report.pass_hat_k.items()
            )
            line += "; " + ", ".join(f"pass@{k} {v:.3f}" for k, v in report.pass_at_k.items())
        if report.trial_spread:
            line += "; spread across trials: " + ", ".join(
                f"{name} {v:.3g}" for name, v in report.trial_spread.items()
            )
        out.print(line, highlight=False)


def score_cell(score: Score) -> str:
    if score.value is not None:
        return f"{score.value:.4g}"
    return "failed" if score.status == "failed" else "n/a"


def print_comparison(result: Comparison, out: Console) -> None:
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"{result.candidate} vs {result.base} ({result.paired} paired)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
    )
    # numbers are never cut; the metric's name and the interval wrap when space is short
    table.add_column("metric", overflow="fold", ratio=2)
    for name in ("n", "base", "cand.", "diff."):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("95% CI", justify="right", overflow="fold", ratio=1)
    for name in ("W/T/L", "p"):
        table.add_column(name, justify="right", no_wrap=True)
    for m in result.metrics:
        if not m.pairs:
            table.add_row(m.metric, "0", "-", "-", "-", "-", "-", "-")
            continue
        ci = f"{m.ci95[0]:+.2g}..{m.ci95[1]:+.2g}" if m.ci95 else "-"
        diff = f"{m.mean_difference:+.3g}"
        table.add_row(
            m.metric,
            str(m.pairs),
            f"{m.base_mean:.3g}",
            f"{m.candidate_mean:.3g}",
            f"[red]{diff}[/]" if m.significantly_worse else diff,
            ci,
            f"{m.wins}/{m.ties}/{m.losses}",
            "-" if m.wilcoxon_p is None else f"{m.wilcoxon_p:.2g}",
        )
    out.print(table)
    for m in result.metrics:
        if m.most_changed:
            changes = ", ".join(
                f"{c.conversation_id} {c.difference:+.3g}" for c in m.most_changed[:3]
            )
            out.print(f"{m.metric}: most changed {changes}", highlight=False)
    if result.only_in_base or result.only_in_candidate:
        out.print(
            f"unpaired: {len(result.only_in_base)} only in base "
            f"({', '.join(result.only_in_base[:5])}), {len(result.only_in_candidate)} only in "
            f"candidate ({', '.join(result.only_in_candidate[:5])})",
            highlight=False,
        )
