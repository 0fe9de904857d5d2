"""Gates CI can read: a failed gate exits 100, a crash exits 70 with its traceback, and
neither is 1; a metric gate with too few scored conversations fails and says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from convsim.cli import main
from convsim.cli._console import EXIT_CRASHED, EXIT_GATE_FAILED
from convsim.cli._gates import compare_gates, fail_under_gates
from convsim.results._compare import compare_files
from convsim.results._report import summarize_file

DATA = Path(__file__).parent / "data"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """Ten conversations, three of them FAILED: latency scored on 8, context_retention
    and exact_match on 2 each (the others not applicable)."""
    copy = tmp_path / "results.jsonl"
    shutil.copy(DATA / "results_v1.jsonl", copy)
    return copy


def gate_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: gate failed:")]


# -- exit codes ---------------------------------------------------------------------------


def test_the_codes_are_their_own() -> None:
    assert (EXIT_GATE_FAILED, EXIT_CRASHED) == (100, 70)


def test_a_failed_gate_exits_100_not_1(results: Path) -> None:
    code, _, err = invoke(
        "report", str(results), "--fail-under", "response_length=100", "--min-scored", "1"
    )
    assert code == EXIT_GATE_FAILED == 100
    assert gate_lines(err) == [
        "error: gate failed: response_length mean 12.22 < 100 "
        "(8 of 10 conversations scored, 2 not applicable)"
    ]
    assert "Traceback" not in err


def test_a_passing_gate_exits_0(results: Path) -> None:
    code, _, err = invoke("report", str(results), "--fail-under", "latency=0", "--min-scored", "8")
    assert code == 0, err
    assert gate_lines(err) == []


def test_a_crash_exits_70_and_prints_its_traceback(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: object) -> None:
        raise RuntimeError("the summary broke")

    monkeypatch.setattr("convsim.results._report.summarize_file", broken)
    code, _, err = invoke("report", str(results), "--fail-under", "latency=0")
    assert code == EXIT_CRASHED == 70
    assert "Traceback (most recent call last)" in err
    assert "RuntimeError: the summary broke" in err
    assert "in broken" in err  # the frame where it happened
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("error: convsim crashed (RuntimeError, exit 70)")


def test_a_crash_inside_a_gate_is_a_crash_not_a_failed_gate(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("metrics")

    monkeypatch.setattr("convsim.cli._report.fail_under_gates", broken)
    code, _, err = invoke("report", str(results), "--fail-under", "latency=0")
    assert code == 70 and "KeyError: 'metrics'" in err and gate_lines(err) == []


def test_bad_input_still_exits_2_without_a_traceback(tmp_path: Path) -> None:
    code, _, err = invoke("report", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such results file" in err and "Traceback" not in err


def test_help_lists_the_codes() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    assert "70   convsim crashed" in out and "100  a quality gate failed" in out
    assert "99   a load test's gate failed" in out
    _, run_help, _ = invoke("run", "--help")
    assert "70   convsim crashed" in run_help and "100  a --fail-under gate failed" in run_help
    for command in ("report", "compare"):
        _, text, _ = invoke(command, "--help")
        assert "70 crashed; 100 a gate failed" in text, command
        assert "--min-scored" in text


# -- too few scored -----------------------------------------------------------------------


def test_too_few_scored_fails_instead_of_passing(results: Path) -> None:
    # context_retention is 1.0 on the two conversations it applied to: a mean that passes
    code, _, err = invoke(
        "report", str(results), "--fail-under", "context_retention=0.5",
        "--fail-under", "latency=0",
    )  # fmt: skip
    assert code == 100
    assert gate_lines(err) == [
        "error: gate failed: context_retention: only 2 of 10 conversations scored "
        "(needs at least 10)",
        "error: gate failed: latency: only 8 of 10 conversations scored (needs at least 10)",
    ]


@pytest.mark.parametrize(("min_scored", "code"), [("2", 0), ("3", 100)])
def test_min_scored_sets_the_bar(results: Path, min_scored: str, code: int) -> None:
    got, _, err = invoke(
        "report", str(results), "--fail-under", "context_retention=0.5",
        "--min-scored", min_scored,
    )  # fmt: skip
    assert got == code, err


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_a_bad_min_scored_exits_2(results: Path, value: str) -> None:
    code, _, err = invoke("report", str(results), "--min-scored", value)
    assert code == 2 and "--min-scored" in err


def test_a_run_smaller_than_the_minimum_needs_every_conversation(results: Path) -> None:
    report = summarize_file(results)
    small = report.model_copy(update={"conversations": 5})
    latency = small.metrics["latency"].model_copy(update={"n": 4})
    small.metrics["latency"] = latency
    [short] = fail_under_gates(small, {"latency": 0.0}, min_scored=10)
    assert not short.passed
    assert short.line == "latency: only 4 of 5 conversations scored (needs at least 5)"
    small.metrics["latency"] = latency.model_copy(update={"n": 5})
    [whole] = fail_under_gates(small, {"latency": 0.0}, min_scored=10)
    assert whole.passed and whole.line.endswith("(5 of 5 conversations scored, 2 not applicable)")


def test_a_metric_the_run_never_scored_has_no_value(results: Path) -> None:
    [gate] = fail_under_gates(summarize_file(results), {"no_such": 0.5}, min_scored=1)
    assert not gate.passed and gate.line == "no_such has no value in this run (needs >= 0.5)"
    assert gate.gate == "fail-under no_such>=0.5"


def test_compare_gates_need_enough_pairs(results: Path) -> None:
    comparison = compare_files(results, results)
    few = compare_gates(
        comparison, worse=["exact_match"], fail_under={"exact_match": 0.5}, min_scored=10
    )
    assert [g.passed for g in few] == [False, False]
    assert {g.line for g in few} == {
        "exact_match: only 2 of 10 paired conversations scored (needs at least 10)"
    }
    enough = compare_gates(
        comparison, worse=["exact_match"], fail_under={"exact_match": 0.5}, min_scored=2
    )
    assert [g.passed for g in enough] == [True, True]
    code, _, err = invoke(
        "compare", str(results), str(results), "--fail-if-worse", "exact_match",
    )  # fmt: skip
    assert code == 100 and "only 2 of 10 paired conversations" in err
