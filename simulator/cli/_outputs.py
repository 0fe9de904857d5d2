"""What several commands write after the work: summaries, HTML, JUnit, the cache line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import click

from .._plural import counted
from ._console import stdout as _stdout

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from ..adapters import ResponseCache
    from ..results._junit import JUnitSuite
    from ..results._report import RunReport
    from ._gates import GateOutcome


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


def write_junit_report(path: Path, suites: Sequence[JUnitSuite]) -> None:
    """Write ``suites`` as a JUnit XML file and say so in one line."""
    from ..results._junit import write_junit

    written = write_junit(path, suites)
    cases = sum(len(s.cases) for s in suites)
    failed = sum(c.failure is not None for s in suites for c in s.cases)
    _stdout().print(f"junit: {written} ({cases} test cases, {failed} failed)", highlight=False)


def write_results_junit(path: Path, results: Path, gates: Sequence[GateOutcome]) -> None:
    """The JUnit report of a results file: its gates, then one test case per
    conversation."""
    from ..results._junit import conversation_suite
    from ..results._sinks import iter_results
    from ._gates import gate_suite

    suites = [gate_suite(gates)] if gates else []
    suites.append(conversation_suite(iter_results(results), properties={"results": str(results)}))
    write_junit_report(path, suites)
