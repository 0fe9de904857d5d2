"""Terminal output that fits: breakdowns turned round or split rather than cut, and
progress lines when the output is not a terminal."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.console import Console

from convsim.cli import _run as run_command
from convsim.cli import main
from convsim.results import _terminal
from convsim.results._report import MetricSummary


def _groups(count: int, metrics: list[str]) -> dict[str, object]:
    return {
        f"group_number_{i}": SimpleNamespace(
            conversations=10 + i,
            statuses={"DONE": 9, "FAILED": 1},
            metrics={m: MetricSummary(mean=0.123456 + i, n=10, not_applicable=0) for m in metrics},
        )
        for i in range(count)
    }


def _console(width: int) -> Console:
    return Console(width=width, record=True, force_terminal=False, soft_wrap=True)


def _render(tables: list[object], console: Console) -> str:
    for table in tables:
        console.print(table)
    return console.export_text()


@pytest.mark.parametrize(("groups", "metrics"), [(2, 3), (3, 12), (12, 4)])
def test_breakdowns_fit_the_width_without_cutting_a_number(groups: int, metrics: int) -> None:
    names = [f"metric_name_{k}" for k in range(metrics)]
    console = _console(80)
    tables = _terminal._group_tables(
        console, "by scenario_type", "scenario_type", _groups(groups, names), names
    )
    text = _render(tables, console)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for i in range(groups):
        assert f"group_number_{i}" in text
        assert f"{0.123456 + i:.4g}" in text  # every mean, whole
    for name in names:
        assert name in text


def test_off_a_terminal_a_run_prints_progress_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_command, "PROGRESS_LINE_S", 0.05)
    result = CliRunner().invoke(
        main,
        ["run", "customer_support", "--model", "scripted", "--model-arg", "latency=0.05",
         "--concurrency", "2", "--limit", "4", "--out", str(tmp_path / "p.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = re.findall(r"customer_support: (\d+)/4 finished .* conv/s", result.output)
    assert len(lines) >= 2  # periodic, not only the last line
    assert [int(n) for n in lines] == sorted(int(n) for n in lines)
