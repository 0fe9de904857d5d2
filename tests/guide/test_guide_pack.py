"""The guide's single-turn pack (its "Task Configuration" config.yml and "Create Dataset"
problems.jsonl, copied as they are into my_new_task/): its metric tiers are shown first
and labelled, a bare ``--fail-under`` gates its primary metrics, and its
``languages: ["en"]`` keeps its problems, which carry no language."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from convsim import MetricTiers, load_pack
from convsim.cli import main

PACK = Path(__file__).parent / "my_new_task"


def test_the_guides_pack_has_its_tiers_and_keeps_its_problems() -> None:
    pack = load_pack(PACK)
    assert pack.metric_tiers == MetricTiers(
        primary=("exact_match", "custom_score"), secondary=("semantic_similarity",)
    )
    assert len(pack) == 3 and not any("languages" in note for note in pack.notes)


def test_the_guides_pack_runs_with_its_primary_metrics_gated(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main, ["run", str(PACK), "--model", "scripted", "--out", str(out), "--fail-under", "0.5"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(out.with_name("r.summary.json").read_text(encoding="utf-8"))
    assert summary["metric_tiers"] == {
        "primary": ["exact_match", "custom_score"],
        "secondary": ["semantic_similarity"],
    }
    assert list(summary["metrics"])[:3] == ["exact_match", "custom_score", "semantic_similarity"]
    assert "by_language" not in summary  # its problems carry no language
    failed = CliRunner().invoke(main, ["report", str(out), "--fail-under", "1.5"])
    assert failed.exit_code == 100
    gated = [line for line in failed.stderr.splitlines() if "gate failed" in line]
    assert [line.split()[3] for line in gated] == ["exact_match", "custom_score"]
