"""``--fail-under VALUE``: a bare bound gates each primary metric of the pack (config.yml
``metrics.primary``) in its own direction, on as many conversations as were scored; a
pack without primary metrics refuses it with exit 2 before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from convsim.cli import main
from convsim.cli._console import EXIT_GATE_FAILED
from convsim.scenarios import BUNDLED_PACKS_DIR

BUNDLED = BUNDLED_PACKS_DIR / "single_turn_qa"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def gate_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: gate failed:")]


def pack_with(tmp_path: Path, primary: list[str], secondary: list[str]) -> Path:
    """The bundled single-turn pack with other metric tiers."""
    folder = tmp_path / "qa"
    shutil.copytree(BUNDLED, folder)
    config = (folder / "config.yml").read_text(encoding="utf-8")
    start, end = config.index("metrics:"), config.index("evaluation_config:")
    tiers = "metrics:\n"
    for tier, names in (("primary", primary), ("secondary", secondary)):
        tiers += f"  {tier}: [{', '.join(names)}]\n"
    (folder / "config.yml").write_text(config[:start] + tiers + "\n" + config[end:])
    return folder


def run(pack: str | Path, out: Path, *more: str) -> tuple[int, str, str]:
    return invoke("run", str(pack), "--model", "scripted", "--limit", "4", "--out", str(out), *more)


def test_a_bare_bound_passes_on_the_primary_metrics(tmp_path: Path) -> None:
    """The bundled pack's primary metrics (exact_match, custom_score) are 1 with the
    scripted model: a bare 0.9 passes, though its secondary response_length (1.25) and
    more are never gated by it."""
    code, _, err = run("single_turn_qa", tmp_path / "r.jsonl", "--fail-under", "0.9", "--junit",
                       str(tmp_path / "j.xml"))  # fmt: skip
    assert code == 0, err
    junit = (tmp_path / "j.xml").read_text(encoding="utf-8")
    assert 'name="fail-under exact_match&gt;=0.9"' in junit
    assert 'name="fail-under custom_score&gt;=0.9"' in junit
    assert "response_length" not in junit.split("<testsuite")[1].split("</testsuite>")[0]
    assert "exact_match (primary) mean 1 &gt;= 0.9 (4 of 4 conversations scored)" in junit


def test_a_bare_bound_fails_on_the_primary_metrics_only(tmp_path: Path) -> None:
    code, _, err = run("single_turn_qa", tmp_path / "r.jsonl", "--fail-under", "1.2")
    assert code == EXIT_GATE_FAILED == 100
    assert gate_lines(err) == [
        "error: gate failed: exact_match (primary) mean 1 < 1.2 (4 of 4 conversations scored)",
        "error: gate failed: custom_score (primary) mean 1 < 1.2 (4 of 4 conversations scored)",
    ]  # response_length (secondary, mean 1.25) is not gated


def test_a_named_bound_overrides_the_bare_one_for_its_metric(tmp_path: Path) -> None:
    code, _, err = run(
        "single_turn_qa", tmp_path / "r.jsonl", "--fail-under", "1.2",
        "--fail-under", "exact_match=0.5",
    )  # fmt: skip
    assert code == EXIT_GATE_FAILED
    assert gate_lines(err) == [
        "error: gate failed: custom_score (primary) mean 1 < 1.2 (4 of 4 conversations scored)"
    ]


def test_a_lower_is_better_primary_metric_is_gated_from_above(tmp_path: Path) -> None:
    pack = pack_with(tmp_path, ["latency"], ["exact_match"])
    code, _, err = run(pack, tmp_path / "a.jsonl", "--fail-under", "5")
    assert code == 0, err  # the scripted model answers in microseconds: <= 5 s
    code, _, err = run(pack, tmp_path / "b.jsonl", "--fail-under", "0")
    assert code == EXIT_GATE_FAILED
    [line] = gate_lines(err)
    assert line.startswith("error: gate failed: latency (primary, lower is better) mean ")
    assert line.endswith(" > 0 (4 of 4 conversations scored)")


def test_a_named_bound_on_a_lower_is_better_primary_metric_keeps_its_direction(
    tmp_path: Path,
) -> None:
    """``--fail-under 0 --fail-under latency=10`` replaces latency's bare bound by 10 s,
    still from above: not a demand that latency be at least 10 s."""
    pack = pack_with(tmp_path, ["exact_match", "latency"], [])
    out = tmp_path / "r.jsonl"
    code, _, err = run(pack, out, "--fail-under", "0", "--fail-under", "latency=10")
    assert code == 0, err
    code, _, err = invoke("report", str(out), "--fail-under", "0", "--fail-under", "latency=0")
    assert code == EXIT_GATE_FAILED, err
    (line,) = gate_lines(err)
    assert line.startswith("error: gate failed: latency (primary, lower is better) mean ")
    assert " > 0 (4 of 4 conversations scored)" in line


def test_a_primary_metric_not_applicable_is_not_a_pass(tmp_path: Path) -> None:
    """context_retention measures nothing in a single-turn pack: no value, a failed gate,
    whatever the bound."""
    pack = pack_with(tmp_path, ["context_retention"], [])
    code, _, err = run(pack, tmp_path / "r.jsonl", "--fail-under", "0", "--min-scored", "1")
    assert code == EXIT_GATE_FAILED
    assert gate_lines(err) == [
        "error: gate failed: context_retention (primary): only 0 of 4 conversations scored "
        "(needs at least 1)"
    ]


def test_a_pack_without_primary_metrics_refuses_a_bare_bound(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code, _, err = run("customer_support", out, "--fail-under", "0.7")
    assert code == 2
    assert (
        "a bare bound (0.7) gates the primary metrics, and pack 'customer_support' has none" in err
    )
    assert "--fail-under METRIC=VALUE" in err and "Traceback" not in err
    assert not out.exists()  # refused before the run
    code, _, err = run(pack_with(tmp_path, [], ["exact_match"]), out, "--fail-under", "0.7")
    assert code == 2 and "has none" in err


def test_metrics_that_leave_out_a_primary_metric_refuse_a_bare_bound(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code, _, err = run("single_turn_qa", out, "--metrics", "exact_match", "--fail-under", "0.7")
    assert code == 2
    assert "--metrics leaves out custom_score" in err and not out.exists()


def test_report_and_compare_gate_the_primary_metrics_of_the_results(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert run("single_turn_qa", out)[0] == 0
    assert invoke("report", str(out), "--fail-under", "0.9")[0] == 0
    code, _, err = invoke("report", str(out), "--fail-under", "1.5")
    assert code == EXIT_GATE_FAILED and len(gate_lines(err)) == 2
    assert invoke("compare", str(out), str(out), "--fail-under", "0.9")[0] == 0
    code, _, err = invoke("compare", str(out), str(out), "--metrics", "latency",
                          "--fail-under", "1.5")  # fmt: skip
    assert code == EXIT_GATE_FAILED
    assert gate_lines(err) == [
        "error: gate failed: exact_match (primary) candidate mean 1 < 1.5 "
        "(4 of 4 paired conversations scored)",
        "error: gate failed: custom_score (primary) candidate mean 1 < 1.5 "
        "(4 of 4 paired conversations scored)",
    ]


def test_report_and_compare_refuse_a_bare_bound_on_untiered_results(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert run("customer_support", out)[0] == 0
    for args in (["report", str(out)], ["compare", str(out), str(out)]):
        code, _, err = invoke(*args, "--fail-under", "0.7")
        assert code == 2, (args, err)
        assert "has none (config.yml metrics.primary)" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["0.5", "0.6"], "one bare bound only"),
        (["high"], "expected METRIC=VALUE, or a number for the primary metrics"),
        (["nan"], "the bound must be a finite number"),
        (["exact_match=inf"], "the bound must be a finite number"),
    ],
)
def test_bad_bounds_are_refused(tmp_path: Path, values: list[str], message: str) -> None:
    args = [a for v in values for a in ("--fail-under", v)]
    code, _, err = run("single_turn_qa", tmp_path / "r.jsonl", *args)
    assert code == 2 and message in err and "--fail-under" in err


def test_help_explains_the_bare_bound() -> None:
    for command in ("run", "report", "compare"):
        code, stdout, _ = invoke(command, "--help")
        assert code == 0
        flat = " ".join(stdout.split())
        assert "A bare VALUE gates each primary metric of the pack" in flat, command
