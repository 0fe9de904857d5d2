"""Metric tiers: config.yml's ``metrics.primary`` and ``metrics.secondary`` are recorded on
every result and shown as tiers, primary first, in the summary JSON, summary.md, the
terminal tables, the HTML report and ``convsim compare``; packs without tiers (multi-turn
flows, task classes) have none, and no label is invented for them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import convsim
from convsim import MetricTiers, PackError, load_pack, summarize
from convsim.cli import main
from convsim.results._compare import as_json, compare
from convsim.results._terminal import print_comparison, print_report
from convsim.scenarios import BUNDLED_PACKS_DIR

BUNDLED = BUNDLED_PACKS_DIR / "single_turn_qa"

#: the bundled pack's tiers turned round: the secondary metric made primary, and one of
#: the primary ones secondary; the order must follow the tiers, not the bundled order.
TURNED = """\
metrics:
  primary:
    - "response_length"
    - "custom_score"
  secondary:
    - "exact_match"
"""


def turned_pack(tmp_path: Path) -> Path:
    folder = tmp_path / "qa"
    shutil.copytree(BUNDLED, folder)
    config = (folder / "config.yml").read_text(encoding="utf-8")
    start = config.index("metrics:")
    end = config.index("evaluation_config:")
    (folder / "config.yml").write_text(
        config[:start] + TURNED + "\n" + config[end:], encoding="utf-8"
    )
    return folder


@pytest.fixture(scope="module")
def turned(tmp_path_factory: pytest.TempPathFactory) -> list[convsim.ConversationResult]:
    return convsim.run_sync(turned_pack(tmp_path_factory.mktemp("tiers")), "scripted", limit=6)


def test_a_single_turn_pack_has_its_config_tiers_and_a_multi_turn_pack_none(
    tmp_path: Path,
) -> None:
    tiers = load_pack(turned_pack(tmp_path)).metric_tiers
    assert tiers == MetricTiers(
        primary=("response_length", "custom_score"), secondary=("exact_match",)
    )
    assert load_pack("customer_support").metric_tiers is None


def test_every_result_carries_the_tiers(turned: list[convsim.ConversationResult]) -> None:
    assert {r.metric_tiers for r in turned} == {
        MetricTiers(primary=("response_length", "custom_score"), secondary=("exact_match",))
    }
    line = json.loads(turned[0].model_dump_json())
    assert line["metric_tiers"] == {
        "primary": ["response_length", "custom_score"],
        "secondary": ["exact_match"],
    }
    assert convsim.ConversationResult.model_validate(line).metric_tiers == turned[0].metric_tiers


def test_the_summary_json_names_the_tiers_and_lists_primary_first(
    turned: list[convsim.ConversationResult],
) -> None:
    data = json.loads(summarize(turned).model_dump_json())
    assert data["metric_tiers"] == {
        "primary": ["response_length", "custom_score"],
        "secondary": ["exact_match"],
    }
    assert list(data["metrics"])[:3] == ["response_length", "custom_score", "exact_match"]
    assert {"latency", "context_retention"} <= set(list(data["metrics"])[3:])


def test_summary_md_labels_each_metric_with_its_tier_primary_first(
    turned: list[convsim.ConversationResult],
) -> None:
    md = summarize(turned).to_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| ") and " | " in line]
    metric_rows = [
        r.split(" | ")[:2] for r in rows if r.split(" | ")[1] in {"primary", "secondary", ""}
    ]
    assert metric_rows[:3] == [
        ["| response_length", "primary"],
        ["| custom_score", "primary"],
        ["| exact_match", "secondary"],
    ]
    assert "| metric | tier | mean |" in md
    assert ["| latency", ""] in metric_rows  # untiered: no label invented


def test_the_terminal_shows_a_table_per_tier_in_order(
    turned: list[convsim.ConversationResult],
) -> None:
    console = Console(width=80, record=True, force_terminal=False)
    print_report(summarize(turned), console)
    text = console.export_text()
    primary = text.index("primary metrics")
    secondary = text.index("secondary metrics")
    other = text.index("other metrics (in neither tier)")
    assert primary < text.index("│ response_length") < text.index("│ custom_score") < secondary
    assert secondary < text.index("│ exact_match") < other < text.index("│ latency")
    assert all(len(line) <= 80 for line in text.splitlines())


def test_untiered_results_read_as_before() -> None:
    results = convsim.run_sync("customer_support", "scripted", limit=2)
    assert all(r.metric_tiers is None for r in results)
    report = summarize(results)
    assert "metric_tiers" not in json.loads(report.model_dump_json())
    md = report.to_markdown()
    assert "| metric | mean |" in md and "tier" not in md
    console = Console(width=100, record=True, force_terminal=False)
    print_report(report, console)
    text = console.export_text()
    assert "primary" not in text and "secondary" not in text and "metrics (mean" in text


def test_the_html_report_labels_the_tiers(turned: list[convsim.ConversationResult]) -> None:
    pytest.importorskip("jinja2")
    from convsim.results._html import render_html

    page = render_html(turned, title="t")
    assert "<th>tier</th>" in page
    first = page.index("<tr><td>response_length</td><td>primary</td>")
    assert first < page.index("<tr><td>custom_score</td><td>primary</td>")
    assert page.index("<tr><td>exact_match</td><td>secondary</td>") > first
    assert "<tr><td>latency</td><td></td>" in page


def test_compare_lists_tiers_primary_first(turned: list[convsim.ConversationResult]) -> None:
    result = compare(turned, turned)
    assert [(m.metric, m.tier) for m in result.metrics][:3] == [
        ("response_length", "primary"),
        ("custom_score", "primary"),
        ("exact_match", "secondary"),
    ]
    assert all(m.tier is None for m in result.metrics[3:])
    data = as_json(result)
    assert data["metric_tiers"]["primary"] == ["response_length", "custom_score"]
    console = Console(width=80, record=True, force_terminal=False)
    print_comparison(result, console)
    text = console.export_text()
    assert text.index("primary metrics") < text.index("secondary metrics")
    assert text.index("secondary metrics") < text.index("other metrics")


def test_compare_with_named_metrics_can_add_the_primary_ones(
    turned: list[convsim.ConversationResult],
) -> None:
    only = compare(turned, turned, metrics=["latency"])
    assert [m.metric for m in only.metrics] == ["latency"]
    more = compare(turned, turned, metrics=["latency"], with_primary=True)
    assert [m.metric for m in more.metrics] == ["response_length", "custom_score", "latency"]


def test_the_cli_summary_file_has_the_tiers(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main, ["run", str(turned_pack(tmp_path)), "--model", "scripted", "--limit", "3",
               "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(out.with_name("r.summary.json").read_text(encoding="utf-8"))
    assert summary["metric_tiers"]["secondary"] == ["exact_match"]
    assert "| response_length | primary |" in out.with_name("r.summary.md").read_text()


def test_a_metric_in_both_tiers_is_refused_with_its_line(tmp_path: Path) -> None:
    folder = turned_pack(tmp_path)
    config = (folder / "config.yml").read_text(encoding="utf-8")
    (folder / "config.yml").write_text(
        config.replace('    - "exact_match"\n', '    - "custom_score"\n'), encoding="utf-8"
    )
    with pytest.raises(PackError) as info:
        load_pack(folder)
    (problem,) = info.value.problems
    line = config.splitlines().index("  secondary:") + 1
    assert (problem.file, problem.line, problem.field) == ("config.yml", line, "metrics.secondary")
    assert "custom_score is also in metrics.primary" in problem.message


def test_tiers_order_and_merge() -> None:
    a = MetricTiers(primary=("x",), secondary=("y",))
    assert a.ordered(["z", "y", "x"]) == ["x", "y", "z"]
    assert a.tier_of("x") == "primary" and a.tier_of("z") is None
    merged = a.merged(MetricTiers(primary=("y",), secondary=("w",)))
    assert merged == MetricTiers(primary=("x", "y"), secondary=("w",))
