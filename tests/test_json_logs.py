"""With --log-format json every line on stderr is JSON: structlog's events and what
the command says there (progress, the run's summary line, warnings, errors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from convsim.cli import _run as run_command
from convsim.cli import main


def events(result: Result) -> list[dict[str, Any]]:
    """Every line of stderr, each parsed as JSON (a line that is not fails the test)."""
    lines = result.stderr.splitlines()
    assert lines, result.output
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not JSON on stderr: {line!r}")
    return parsed


def messages(result: Result, level: str | None = None) -> list[str]:
    return [
        e["message"]
        for e in events(result)
        if e.get("event") == "cli_message" and (level is None or e["level"] == level)
    ]


def test_a_run_says_everything_on_stderr_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_command, "PROGRESS_LINE_S", 0.05)
    out = tmp_path / "r.jsonl"
    done = CliRunner().invoke(
        main,
        ["--log-format", "json", "--log-level", "info", "run", "customer_support",
         "--model-arg", "latency=0.05", "--concurrency", "2", "--limit", "4",
         "--out", str(out), "--fail-under", "goal_achievement=2"],
    )  # fmt: skip
    assert done.exit_code != 0  # the gate failed
    found = events(done)
    assert any(e.get("event") == "run_started" for e in found)  # structlog's own
    said = messages(done)
    assert any(m.startswith("customer_support: 4 done, 0 failed") for m in said)  # the summary
    assert any("finished" in m and "conv/s" in m for m in said)  # progress lines
    (gate,) = messages(done, "error")
    assert gate.startswith("gate failed: goal_achievement mean")
    assert all({"timestamp", "level"} <= e.keys() for e in found)
    assert "customer_support" in done.stdout  # the tables stay on stdout, as text


def test_bad_input_and_usage_errors_are_json_too(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["--log-format", "json", "report", str(tmp_path / "no.jsonl")])
    assert missing.exit_code == 2
    assert messages(missing, "error") == [f"{tmp_path / 'no.jsonl'}: no such results file"]
    usage = runner.invoke(main, ["--log-format", "json", "run", "customer_support", "--nope"])
    assert usage.exit_code == 2
    (error,) = messages(usage, "error")
    assert "run: No such option '--nope'" in error


def test_a_crash_is_one_json_event_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the listing broke")

    monkeypatch.setattr("convsim.scenarios.list_packs", broken)
    crash = CliRunner().invoke(main, ["--log-format", "json", "list"])
    assert crash.exit_code == 70
    (error,) = messages(crash, "error")
    assert error.startswith("convsim crashed (RuntimeError, exit 70)")
    assert "Traceback (most recent call last)" in error and "the listing broke" in error


def test_console_logs_stay_text() -> None:
    done = CliRunner().invoke(main, ["run", "customer_support", "--nope"])
    assert done.exit_code == 2 and "No such option" in done.stderr
    assert not done.stderr.lstrip().startswith("{")
