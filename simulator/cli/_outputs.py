"""What several commands write or check after the work: summaries, HTML, gates."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import click

from .._plural import counted
from ._console import (
    print_error,
)
from ._console import stdout as _stdout

if TYPE_CHECKING:
    from rich.console import Console

    from ..adapters import ResponseCache
    from ..results._report import RunReport


EXIT_GATE_FAILED = 1


def print_cache_line(cache: ResponseCache, console: Console) -> None:
    """What the response cache did for this command: hits, misses, answers kept."""
    stats = cache.statistics()
    corrupt = f", {stats.corrupt} unreadable (asked again)" if stats.corrupt else ""
    console.print(
        f"cache: {counted(stats.hits, 'hit')}, {counted(stats.misses, 'miss', 'misses')}, "
        f"{counted(stats.writes, 'answer')} kept"
        f"{corrupt} ({cache.directory})",
        highlight=False,
    )


def make_folder(path: Path) -> None:
    """Create the folder an output file goes in, as ``convsim run`` does for its results.

    Raises:
        ConfigError: the folder cannot be made (a file of that name, no permission).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from .._errors import ConfigError

        raise ConfigError(f"{path}: cannot create its folder: {exc.strerror}") from None


def write_report_html(results: Path, html_out: str) -> None:
    from ..results._html import write_html

    if html_out:
        make_folder(Path(html_out))
    written = write_html(results, html_out or None)
    size = written.stat().st_size
    _stdout().print(f"html: {written} ({size / 1e6:.2f} MB)", highlight=False)


class SummaryFiles(NamedTuple):
    """Where a run's summary was written."""

    json_path: Path
    markdown_path: Path


def write_summaries(report: RunReport, results: Path) -> SummaryFiles:
    stem = results.name.removesuffix(".jsonl")
    json_path = results.with_name(stem + ".summary.json")
    md_path = results.with_name(stem + ".summary.md")
    try:
        json_path.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
        md_path.write_text(report.to_markdown(), encoding="utf-8")
    except OSError as exc:
        from .._errors import ResultsError

        raise ResultsError(f"cannot write the summary beside {results}: {exc.strerror}") from None
    return SummaryFiles(json_path, md_path)


def lock_results(results: Path) -> None:
    """Refuse to read a results file (and write beside it) while a run writes it; the
    lock is held until the command ends."""
    from .._errors import ResultsError
    from ..results._sinks import ResultsLock

    if not results.is_file():
        raise ResultsError(f"{results}: no such results file")
    click.get_current_context().with_resource(ResultsLock(results, required=False))


def check_gates(report: RunReport, gates: dict[str, float]) -> None:
    """Exit 1 with one line per failed gate."""
    failed = []
    for metric, bound in gates.items():
        summary = report.metrics.get(metric) or report.turn_metrics.get(metric)
        mean = summary.mean if summary is not None else None
        if mean is None:
            failed.append(f"gate failed: {metric} has no value in this run (needs >= {bound:g})")
        elif mean < bound:
            failed.append(f"gate failed: {metric} mean {mean:.4g} < {bound:g}")
    for line in failed:
        print_error(line)
    if failed:
        sys.exit(EXIT_GATE_FAILED)
