"""convsim compare: paired differences with intervals, unpaired conversations, and gates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import convsim
from convsim.cli import main
from convsim.results._compare import compare_files


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("compare")
    out = {}
    for name, args, limit in (
        ("full", {}, None),
        ("forgetful", {"memory_turns": "1"}, None),
        ("fewer", {}, 5),
    ):
        path = folder / f"{name}.jsonl"
        convsim.run_sync("multi_session_memory", "scripted", out=path, model_args=args, limit=limit)
        out[name] = path
    return out


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_a_forgetful_model_is_significantly_worse_at_retention(runs: dict[str, Path]) -> None:
    result = compare_files(runs["full"], runs["forgetful"], metrics=["context_retention"])
    (retention,) = result.metrics
    assert result.paired == retention.pairs > 5
    assert retention.mean_difference is not None and retention.mean_difference < 0
    assert retention.ci95 is not None and retention.ci95[0] <= retention.mean_difference
    assert retention.ci95[1] < 0 and retention.significantly_worse
    assert retention.wins + retention.ties + retention.losses == retention.pairs
    assert retention.losses > 0 and retention.wins == 0
    assert retention.wilcoxon_p is not None and retention.wilcoxon_p < 0.05
    assert all(c.difference < 0 for c in retention.most_changed)


def test_the_gate_fails_with_one_line_and_the_json_is_written(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "cmp.json"
    code, output = invoke(
        "compare", str(runs["full"]), str(runs["forgetful"]),
        "--fail-if-worse", "context_retention", "--json", str(out),
    )  # fmt: skip
    assert code == 100
    failed = [line for line in output.splitlines() if "gate failed" in line]
    assert len(failed) == 1 and "context_retention" in failed[0]
    data = json.loads(out.read_text())
    assert {m["metric"] for m in data["metrics"]} >= {"context_retention"}
    assert data["paired"] > 0 and data["only_in_base"] == []


def test_a_run_against_itself_passes_every_gate(runs: dict[str, Path]) -> None:
    code, output = invoke(
        "compare", str(runs["full"]), str(runs["full"]),
        "--fail-if-worse", "context_retention,goal_achievement",
    )  # fmt: skip
    assert code == 0, output
    same = compare_files(runs["full"], runs["full"], metrics=["context_retention"]).metrics[0]
    assert same.ties == same.pairs and same.mean_difference == 0 and not same.significantly_worse


def test_unpaired_conversations_are_reported_not_dropped(runs: dict[str, Path]) -> None:
    result = compare_files(runs["full"], runs["fewer"])
    assert result.paired == 5
    assert len(result.only_in_base) > 0 and result.only_in_candidate == []
    code, output = invoke("compare", str(runs["full"]), str(runs["fewer"]))
    assert code == 0 and "only in base" in output


def test_fail_under_on_report_and_compare(runs: dict[str, Path]) -> None:
    code, output = invoke("report", str(runs["forgetful"]), "--fail-under", "context_retention=0.9")
    assert code == 100 and "gate failed: context_retention mean" in output
    code, _ = invoke("report", str(runs["full"]), "--fail-under", "context_retention=0.9")
    assert code == 0
    code, output = invoke(
        "compare", str(runs["full"]), str(runs["forgetful"]),
        "--fail-under", "context_retention=0.9",
    )  # fmt: skip
    assert code == 100 and "candidate mean" in output


@pytest.mark.parametrize("gate", ["context_retention", "=0.5", "context_retention=high"])
def test_a_malformed_gate_exits_2(runs: dict[str, Path], gate: str) -> None:
    code, output = invoke("report", str(runs["full"]), "--fail-under", gate)
    assert code == 2 and "METRIC=VALUE" in output


def test_fail_under_on_run_exits_100_after_writing_the_results(tmp_path: Path) -> None:
    out = tmp_path / "gated.jsonl"
    code, output = invoke(
        "run", "multi_session_memory", "--model", "scripted", "--model-arg", "memory_turns=1",
        "--limit", "4", "--out", str(out), "--fail-under", "context_retention=0.99",
    )  # fmt: skip
    assert code == 100 and "gate failed: context_retention" in output
    assert len(out.read_text().splitlines()) == 4  # the results are written before the exit


def test_the_json_goes_into_a_folder_made_for_it(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "new" / "cmp.json"
    code, output = invoke("compare", str(runs["full"]), str(runs["full"]), "--json", str(out))
    assert code == 0, output
    assert json.loads(out.read_text())["paired"] > 0
