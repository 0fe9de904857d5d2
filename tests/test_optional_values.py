"""Options whose value may be left out (``--html[=FILE]``, ``--cache[=DIR]``) take it
after ``=`` only: a bare one never swallows the command's argument."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import convsim
from convsim.cli import main
from convsim.cli._main import COMMANDS
from convsim.cli._options import OptionalValue, OptionalValueCommand


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("optional") / "a.jsonl"
    convsim.run_sync("customer_support", "scripted", out=path, limit=2)
    return path


def test_every_optional_value_is_read_after_equals_only() -> None:
    """Each command option that may go without its value is an OptionalValue of an
    OptionalValueCommand: none is left that takes the next word."""
    found = []
    for name in COMMANDS.names():
        command = COMMANDS.get(name)
        assert isinstance(command, click.Command)
        for param in command.params:
            if isinstance(param, click.Option) and param._flag_needs_value:
                assert isinstance(param, OptionalValue), f"{name} {param.opts}"
                assert isinstance(command, OptionalValueCommand), name
                found.append(f"{name} {param.opts[0]}")
    assert sorted(found) == [
        *("load --otel", "load --server-metrics", "report --html", "run --cache"),
        *("run --html", "run --otel"),
        "score --cache",
    ]


def test_report_html_before_the_results_file_keeps_it_as_the_argument(results: Path) -> None:
    page = results.with_suffix(".html")
    page.unlink(missing_ok=True)
    done = invoke("report", "--html", str(results))
    assert done.exit_code == 0, done.output
    assert page.exists() and f"html: {page}" in done.stdout


def test_report_html_after_the_results_file_and_with_a_value(results: Path, tmp_path: Path) -> None:
    beside = invoke("report", str(results), "--html")
    assert beside.exit_code == 0 and f"html: {results.with_suffix('.html')}" in beside.stdout
    named = tmp_path / "named.html"
    given = invoke("report", str(results), f"--html={named}")
    assert given.exit_code == 0 and named.exists() and f"html: {named}" in given.stdout


def test_a_value_after_a_space_is_an_argument_and_the_error_says_how(
    results: Path, tmp_path: Path
) -> None:
    named = tmp_path / "named.html"
    done = invoke("report", str(results), "--html", str(named))
    assert done.exit_code == 2 and not named.exists()
    assert "unexpected extra argument" in done.stderr
    assert f"join them with '=': --html={named}" in done.stderr


def test_run_html_and_cache_before_the_pack_keep_the_pack(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    done = invoke(
        "run", "--cache", "--html", "customer_support", "--limit", "1", "--out", str(out),
        "--no-progress", env={"XDG_CACHE_HOME": str(tmp_path / "xdg")},
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert convsim.read_results(out)[0].pack == "customer_support"
    assert out.with_suffix(".html").exists()
    assert f"({tmp_path / 'xdg' / 'convsim' / 'responses'})" in done.stdout  # the default cache


def test_run_cache_with_a_folder(tmp_path: Path) -> None:
    cache = tmp_path / "answers"
    args = ["run", "customer_support", "--limit", "1", "--no-progress", f"--cache={cache}"]
    first = invoke(*args, "--out", str(tmp_path / "1.jsonl"))
    second = invoke(*args, "--out", str(tmp_path / "2.jsonl"))
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    assert "cache: 0 hits" in first.stdout and " 0 misses" in second.stdout
    assert f"({cache})" in second.stdout


def test_score_cache_before_the_file_keeps_the_file(results: Path) -> None:
    done = invoke("score", "--cache", str(results), "--metrics", "response_length")
    assert done.exit_code == 2
    assert "--cache keeps judge answers: it needs --judge" in done.stderr  # FILE was read


def test_the_help_writes_the_equals_sign() -> None:
    for command, shown in (("run", "--html[=FILE]"), ("run", "--cache[=DIR]"),
                           ("report", "--html[=FILE]"), ("score", "--cache[=DIR]")):  # fmt: skip
        done = invoke(command, "--help")
        assert done.exit_code == 0 and shown in done.stdout, command
