"""``convsim report`` and ``convsim compare``: summaries of results files."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .._plural import counted
from ..results._terminal import print_comparison, print_report
from ._console import clear_errors
from ._console import stdout as _stdout
from ._gates import (
    FailUnder,
    compare_gates,
    exit_on_failed_gates,
    fail_under_gates,
    gate_suite,
    require_primary,
)
from ._options import (
    OptionalValueCommand,
    check_html_extra,
    fail_under_option,
    html_option,
    junit_option,
    parse_metrics,
)
from ._outputs import (
    lock_results,
    make_folder,
    write_junit_report,
    write_report_html,
    write_results_junit,
    write_summaries,
)


@click.command(cls=OptionalValueCommand)
@click.argument("results", type=click.Path(path_type=Path))
@click.option(
    "--csv",
    "csv_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write one row per conversation (ids, status, usage, cost, timing, error, "
    "score.<metric> columns) to this CSV file.",
)
@html_option
@fail_under_option
@junit_option(
    "one test case per --fail-under gate and one per conversation (failed when it "
    "FAILED or TIMED_OUT, with its error)"
)
@clear_errors
def report(
    results: Path,
    csv_out: Path | None,
    html_out: str | None,
    fail_under: FailUnder,
    min_scored: int,
    junit_out: Path | None,
) -> None:
    """Summarise a results file; writes RESULTS.summary.json and .summary.md beside it.

    \b
    Exit codes: 0 no gate failed; 2 bad input; 70 crashed; 100 a gate failed (one line
    per gate).
    """
    from ..results._report import summarize_file

    check_html_extra(html_out)
    lock_results(results)
    summary = summarize_file(results)
    require_primary(fail_under, summary.metric_tiers, f"{results} (its pack)")
    print_report(summary, _stdout())
    written = write_summaries(summary, results)
    _stdout().print(f"summary: {written.json_path}, {written.markdown_path}", highlight=False)
    if csv_out is not None:
        count = _write_csv(results, csv_out)
        _stdout().print(f"csv: {csv_out} ({counted(count, 'conversation')})", highlight=False)
    if html_out is not None:
        write_report_html(results, html_out)
    gates = fail_under_gates(summary, fail_under, min_scored=min_scored)
    if junit_out is not None:
        write_results_junit(junit_out, results, gates)
    exit_on_failed_gates(gates)


def _write_csv(results: Path, out: Path) -> int:
    """One row per conversation of ``results``; how many were written."""
    import csv

    from ..results import conversation_columns, conversation_row
    from ..results._sinks import read_results

    make_folder(out)
    rows = [conversation_row(r, str(results)) for r in read_results(results)]
    with out.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, conversation_columns(rows))
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


@click.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option(
    "--metrics",
    callback=parse_metrics,
    default=None,
    help="Comma-separated metrics to compare (default: every metric both runs scored).",
)
@click.option(
    "--fail-if-worse",
    default=None,
    metavar="METRIC,...",
    help="Exit 100 when CANDIDATE is significantly worse than BASE on one of these metrics "
    "(the 95% interval of the paired difference lies wholly on the worse side).",
)
@fail_under_option
@junit_option("one test case per --fail-if-worse and --fail-under gate")
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the comparison as JSON.",
)
@clear_errors
def compare(
    base: Path,
    candidate: Path,
    metrics: list[str] | None,
    fail_if_worse: str | None,
    fail_under: FailUnder,
    min_scored: int,
    junit_out: Path | None,
    json_out: Path | None,
) -> None:
    """Compare CANDIDATE's results with BASE's, paired by conversation.

    \b
    Exit codes: 0 no gate failed; 2 bad input; 70 crashed; 100 a gate failed (one line
    per gate).
    """
    from ..results._compare import as_json, compare_files

    worse_gates = [m.strip() for m in (fail_if_worse or "").split(",") if m.strip()]
    wanted = None if metrics is None else list(dict.fromkeys([*metrics, *worse_gates]))
    if wanted is not None:
        wanted = list(dict.fromkeys([*wanted, *fail_under.named]))
    result = compare_files(
        base, candidate, metrics=wanted, with_primary=fail_under.primary is not None
    )
    require_primary(fail_under, result.metric_tiers, f"{candidate} (its pack)")
    print_comparison(result, _stdout())
    if json_out is not None:
        make_folder(json_out)
        json_out.write_text(json.dumps(as_json(result), indent=2) + "\n")
        _stdout().print(f"comparison: {json_out}", highlight=False)
    gates = compare_gates(result, worse=worse_gates, fail_under=fail_under, min_scored=min_scored)
    if junit_out is not None:
        write_junit_report(junit_out, [gate_suite(gates)])
    exit_on_failed_gates(gates)
