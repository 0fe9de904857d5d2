"""At 80 columns, off a terminal (COLUMNS=80, output captured as when piped), no table
the CLI prints cuts a number or a metric name: run, report, compare, score, load, list,
the plugin metric table, trials and the cache line. And trials print pass@k and pass^k
for k = 1, 2, 4, ... and K, the JSON keeping every k."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner
from rich.console import Console

import convsim
from convsim import Score
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import _load as load_command
from convsim.cli import main
from convsim.load import LoadResult
from convsim.load._result import sweep_result
from convsim.results._fit import row_table
from convsim.results._report import shown_ks

WIDTH = 80
CUT = "\u2026"  # rich's ellipsis: a cell that did not fit


def invoke(*args: str, width: int = WIDTH) -> str:
    """What the command printed on stdout (its tables; progress goes to stderr)."""
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


TABLE = re.compile(r"^[ \u2500-\u257f]|[\u2500-\u257f]$")
"""A line of a table: it starts with a border or an indent (the figures under a name),
or ends with a border. The lines of prose around the tables stay whole on one line, as
a log keeps them (a terminal wraps them, cutting nothing)."""


def assert_fits(output: str, whole: Iterable[str], *, width: int = WIDTH) -> None:
    """Every line of a table within ``width``, nothing cut, and each of ``whole`` on
    one line, unbroken."""
    lines = output.splitlines()
    long = [line for line in lines if len(line) > width and TABLE.search(line)]
    assert not long, "\n".join(long)
    assert CUT not in output
    for text in whole:
        assert any(re.search(rf"(?<![\w:]){re.escape(text)}(?![\w:])", ln) for ln in lines), text


@pytest.fixture(scope="module")
def coding_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """coding_help with the code_analysis plugin, run at 80 columns: its turn metric
    table has names 36 characters long (the plugin metric table)."""
    out = tmp_path_factory.mktemp("narrow") / "coding.jsonl"
    output = invoke(
        "run", "coding_help", "--plugin", "code_analysis", "--out", str(out), "--no-progress"
    )
    failed = {
        (r.conversation_id, name): score.reason
        for r in convsim.read_results(out)
        for name, score in r.scores.items()
        if score.status == "failed"
    }
    assert not failed, failed  # a hook that failed says why, rather than a name gone missing
    return out, output


def _metric_names(results: Path) -> set[str]:
    names: set[str] = set()
    for r in convsim.read_results(results):
        names.update(r.scores)
        for scores in r.turn_scores.values():
            names.update(scores)
    return names


def _figures(results: Path) -> list[str]:
    """Every mean the summary of ``results`` prints, as printed."""
    summary = json.loads(results.with_name(results.stem + ".summary.json").read_text())
    means = [m["mean"] for part in ("metrics", "turn_metrics") for m in summary[part].values()]
    return [f"{m:.4g}" for m in means if m is not None]


def test_the_plugin_metric_table_of_a_run_is_whole_at_80_columns(
    coding_run: tuple[Path, str],
) -> None:
    out, output = coding_run
    names = _metric_names(out)
    assert "code_analysis:high_severity_findings" in names  # the longest, 36 characters
    assert_fits(output, [*names, *_figures(out)])


def test_report_is_whole_at_80_columns(coding_run: tuple[Path, str]) -> None:
    out, _ = coding_run
    output = invoke("report", str(out))
    assert_fits(output, [*_metric_names(out), *_figures(out)])


def test_report_is_whole_at_60_columns_too(coding_run: tuple[Path, str]) -> None:
    out, _ = coding_run
    output = invoke("report", str(out), width=60)
    assert_fits(output, _metric_names(out), width=60)


def test_compare_does_not_wrap_a_metric_name_at_80_columns(
    coding_run: tuple[Path, str], tmp_path: Path
) -> None:
    base = tmp_path / "base.jsonl"
    base.write_bytes(coding_run[0].read_bytes())
    slower = tmp_path / "slower.jsonl"
    invoke("run", "coding_help", "--plugin", "code_analysis", "--model-arg", "latency=0.001",
           "--out", str(slower), "--no-progress")  # fmt: skip
    output = invoke("compare", str(base), str(slower))
    summary = json.loads(coding_run[0].with_name("coding.summary.json").read_text())
    assert_fits(output, summary["metrics"])


def test_score_splits_its_metric_columns_at_80_columns(tmp_path: Path) -> None:
    results = tmp_path / "qa.jsonl"
    convsim.run_sync("customer_support", "scripted", out=results, limit=3)
    metrics = [
        "latency", "response_length", "context_retention", "goal_achievement", "coherence",
        "conversation_flow", "lexical_coherence", "custom_score", "consistency",
    ]  # fmt: skip
    output = invoke("score", str(results), "--metrics", ",".join(metrics))
    assert_fits(output, metrics)
    assert "(2/" in output  # the per-conversation table went on in a second part


def test_list_is_whole_at_80_columns() -> None:
    output = invoke("list")
    assert_fits(output, [p.name for p in convsim.list_packs()])


@pytest.fixture(scope="module")
def load_point(tmp_path_factory: pytest.TempPathFactory) -> LoadResult:
    """One measured point of ``convsim load`` against the mock server."""
    out = tmp_path_factory.mktemp("load") / "point.json"
    config = MockServerConfig(ttft_ms=2, itl_ms=1)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as mock,
    ):
        invoke("load", "--model", "openai-compatible:mock-model",
               "--model-arg", f"base_url={mock.base_url}", "--concurrency", "2",
               "--max-requests", "6", "--synthetic", "turns=2,input_tokens=16,output_tokens=4",
               "--slo", "ttft_p99<=500ms", "--no-calibrate", "--out", str(out))  # fmt: skip
    return LoadResult.model_validate_json(out.read_text())


def test_load_prints_whole_at_80_columns_and_splits_a_sweep_of_twelve_points(
    load_point: LoadResult,
) -> None:
    update = [
        {"target_rate": 2.0 * (i + 1), "target_request_rate": 4.0 * (i + 1), "concurrency": None}
        for i in range(12)
    ]
    points = [load_point.model_copy(update=u) for u in update]
    console = Console(width=WIDTH, record=True, soft_wrap=True)
    load_command._print_result(sweep_result(points), True, console)
    text = console.export_text()
    labels = [f"{2.0 * (i + 1):.3g} sessions/s" for i in range(12)]
    assert_fits(text, [*labels, "send delay p99", "goodput req/s", "meets SLO"])
    assert "Load test (latencies in ms) (2/" in text  # the points went on in a second table
    e2e = f"{load_point.latency_ms.e2e.p99:,.1f}"
    assert len(re.findall(rf"(?<![\d.]){re.escape(e2e)}(?![\d])", text)) >= 12


def test_a_name_longer_than_the_width_is_still_printed_whole() -> None:
    console = Console(width=30, record=True, soft_wrap=True)
    name = "plugin:a_metric_name_of_forty_characters"
    for part in row_table(console, "t", ["metric", "mean"], [[name, "0.5"], ["[b]x[/b]", "1"]]):
        console.print(part)
    text = console.export_text()
    assert name in text.splitlines() and CUT not in text
    assert "[b]x[/b]" in text  # a name is text, never markup


@pytest.mark.parametrize(("most", "ks"), [
    (1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]),
    (300, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]),
])  # fmt: skip
def test_shown_ks_are_the_powers_of_two_and_k_itself(most: int, ks: list[int]) -> None:
    assert shown_ks(most) == ks


def _trials(path: Path, trials: int) -> None:
    """A results file of two scenarios, ``trials`` trials each: one reaches its goal in
    every other trial, the other in every trial."""
    (base,) = convsim.run_sync("customer_support", "scripted", limit=1)
    lines = []
    for scenario, reached in (("a", lambda k: k % 2 == 0), ("b", lambda k: True)):
        for k in range(1, trials + 1):
            result = base.model_copy(
                update={
                    "conversation_id": f"{scenario}#{k}",
                    "scenario_id": scenario,
                    "trial": k,
                    "scores": {"goal_achievement": Score(value=1.0 if reached(k) else 0.0)},
                }
            )
            lines.append(result.model_dump_json())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_300_trials_print_ten_ks_and_the_json_keeps_all(tmp_path: Path) -> None:
    results = tmp_path / "trials.jsonl"
    _trials(results, 300)
    output = invoke("report", str(results))
    assert_fits(output, ["pass@k", "pass^k"])
    table = re.findall(r"^\S\s*(\d+)\s+\S\s+([01]\.\d{3})\s+\S\s+([01]\.\d{3})\s+\S$", output, re.M)
    assert [int(k) for k, _, _ in table] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert table[0][1:] == ("0.750", "0.750")  # (0.5 + 1) / 2 for k = 1
    assert table[-1][1:] == ("1.000", "0.500")  # at least one of 300; all 300: b only
    summary = json.loads(results.with_name("trials.summary.json").read_text())
    assert len(summary["pass_at_k"]) == len(summary["pass_hat_k"]) == 300
    markdown = results.with_name("trials.summary.md").read_text()
    rows = re.findall(r"^\| (\d+) \| [01]\.\d{3} \| [01]\.\d{3} \|$", markdown, re.M)
    assert [int(k) for k in rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]


def test_the_cache_line_is_whole_and_counts_in_words(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    args = ["run", "customer_support", "--limit", "1", "--no-progress", f"--cache={cache}"]
    first = invoke(*args, "--out", str(tmp_path / "a.jsonl"))
    line = next(ln for ln in first.splitlines() if ln.startswith("cache:"))
    assert re.match(r"cache: 0 hits, \d+ misses, \d+ answers kept \(", line)
    assert str(cache) in line  # the folder, whole
    assert_fits(first, [])
