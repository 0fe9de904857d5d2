"""``convsim load`` gates: one definition of "meets the SLO" for the result, the table,
the sweep's line and the HTML page; ``--fail-on-slo`` and ``--fail-on-invalid`` exit 99
as k6 thresholds fail a test, apart from quality gates (100) and crashes (70)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner
from rich.console import Console

from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from convsim.cli._console import EXIT_THRESHOLD_FAILED
from convsim.cli._gates import load_checks
from convsim.cli._load import _points_tables, _print_result
from convsim.load import LoadResult, RequestRecord, Window, parse_slos, point_result, sweep_result

# three sessions in the window [1, 5): TTFT p99 990 ms, E2E p99 1980 ms
RECORDS = [
    RequestRecord(
        session_id=f"s{i}",
        turn_index=0,
        history_messages=1,
        scheduled_s=start,
        sent_s=start,
        ttfb_s=ttft / 2,
        ttft_s=ttft,
        inter_token_gaps_s=(),
        end_s=start + e2e,
        input_tokens=10,
        output_tokens=4,
    )
    for i, (start, ttft, e2e) in enumerate([(1.0, 0.25, 1.0), (2.0, 1.0, 2.0), (3.0, 0.5, 1.0)])
]
MET = "ttft_p99<=1s,e2e_p99<=2s"
BEHIND = "the client fell behind: 3 sessions started where 32 were scheduled"


def points(slos: str = MET) -> tuple[Any, Any]:
    """The same records twice: at 0.5/s (valid) and at 8/s (the client fell behind its
    schedule: invalid), both with figures within ``slos``."""
    judged = parse_slos(slos)
    window = Window(1.0, 5.0)
    valid = point_result(RECORDS, window, slos=judged, target_rate=0.5, min_rate_ratio=0)
    behind = point_result(
        RECORDS, window, slos=judged, target_rate=8.0, invalid_reasons=[BEHIND], min_rate_ratio=0
    )
    return valid, behind


def slo_row(table_text: str) -> list[str]:
    [row] = [line for line in table_text.splitlines() if "meets SLO" in line]
    return [cell.strip() for cell in row.strip("│┃ ").split("│")[1:]]


WIDE = Console(width=200, force_terminal=False)


def render(renderables: list[Any]) -> str:
    with WIDE.capture() as capture:
        for renderable in renderables:
            WIDE.print(renderable)
    return capture.get()


def test_an_invalid_point_is_not_judged() -> None:
    valid, behind = points()
    assert valid.valid and valid.meets_slo is True
    assert not behind.valid
    assert behind.latency_ms.ttft.p99 is not None and behind.latency_ms.ttft.p99 <= 1000
    assert behind.meets_slo is None  # figures within the SLO, set by a client behind
    missed = point_result(RECORDS, Window(1.0, 5.0), slos=parse_slos("ttft_p99<=500ms"))
    assert missed.valid and missed.meets_slo is False
    assert point_result(RECORDS, Window(1.0, 5.0)).meets_slo is None  # no SLO


def test_the_table_and_the_sweep_line_say_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    valid, behind = points()
    for sweep, best in (
        (sweep_result([valid, behind]), "0.5 sessions/s (1 invalid, not judged)"),
        (sweep_result([behind]), "none of the points (1 invalid, not judged)"),
    ):
        cells = slo_row(render(_points_tables(list(sweep.points), slo=True, console=WIDE)))
        meeting = [p for p, cell in zip(sweep.points, cells, strict=True) if cell == "yes"]
        assert [p.target_rate for p in meeting] == (
            [] if sweep.max_rate_meeting_slo is None else [sweep.max_rate_meeting_slo]
        )
        assert cells[-1] == "invalid"  # the 8/s point: never "yes" beside "none of them"
        with WIDE.capture() as capture:
            _print_result(sweep, slo=True, out=WIDE)
        out = capture.get()
        assert f"highest rate meeting every SLO: {best}" in out


def test_the_html_page_has_the_same_row() -> None:
    pytest.importorskip("matplotlib")
    from convsim.results._load_html import render_load_html

    valid, behind = points()
    page = render_load_html(sweep_result([valid, behind]), [], title="t")
    row = re.search(r"<tr><td>meets SLO</td>(.*?)</tr>", page)
    assert row is not None
    assert re.findall(r"<td[^>]*>(\w+)</td>", row.group(1)) == ["yes", "invalid"]
    assert "meets SLO" not in render_load_html(point_result(RECORDS, Window(1, 5)), [], title="t")


def test_load_checks_say_what_they_found() -> None:
    valid, behind = points()
    ok = load_checks(LoadResult.of(valid), parse_slos(MET))
    assert ok.valid.passed and ok.slo is not None and ok.slo.passed
    assert ok.slo.gate == "meets SLO ttft_p99<=1000ms,e2e_p99<=2000ms"
    assert ok.valid.gate == "valid"
    strict = parse_slos("ttft_p99<=500ms,e2e_p99<=2s")
    missed = load_checks(
        LoadResult.of(point_result(RECORDS, Window(1.0, 5.0), slos=strict)), strict
    )
    assert missed.slo is not None and not missed.slo.passed
    assert missed.slo.line == "the run misses the SLO: ttft_p99 990 ms > 500 ms"
    invalid = load_checks(LoadResult.of(behind), parse_slos(MET))
    assert not invalid.valid.passed and invalid.valid.line.startswith(
        "the run is invalid: the client fell behind"
    )
    assert invalid.slo is not None and not invalid.slo.passed
    assert "not judged: the run is invalid" in invalid.slo.line
    assert load_checks(LoadResult.of(valid), None).slo is None
    sweep = load_checks(sweep_result([behind]), parse_slos(MET))
    assert sweep.slo is not None and not sweep.slo.passed
    assert sweep.slo.line.endswith("; 1 invalid, not judged")
    best = load_checks(sweep_result([valid, behind]), parse_slos(MET))
    assert best.slo is not None and best.slo.passed and not best.valid.passed
    asked = best.gates(fail_on_invalid=False, fail_on_slo=True)
    assert asked == [best.slo]
    assert best.gates(fail_on_invalid=False, fail_on_slo=False) == []


# -- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    config = MockServerConfig(ttft_ms=5, itl_ms=1)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as mock,
    ):
        yield mock


def load(server: Any, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        main,
        [
            "load", "--model", "openai-compatible:mock-model",
            "--model-arg", f"base_url={server.base_url}",
            "--synthetic", "turns=1,input_tokens=16,output_tokens=4", "--no-calibrate",
            *args,
        ],
    )  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


# a busy machine lags: room enough that the client never sets the pace here
STEADY = ("--concurrency", "2", "--max-requests", "10")
LENIENT = ("--max-schedule-delay-ms", "1000", "--max-loop-lag-ms", "1000")


def test_a_missed_slo_exits_99(server: Any) -> None:
    code, _, err = load(server, *STEADY, *LENIENT, "--slo", "ttft_p99<=0.001ms", "--fail-on-slo")
    assert code == EXIT_THRESHOLD_FAILED == 99, err
    assert re.search(r"error: gate failed: the run misses the SLO: ttft_p99 [\d.]+ ms > ", err)
    code, _, _ = load(server, *STEADY, *LENIENT, "--slo", "ttft_p99<=0.001ms")
    assert code == 0  # measured and reported, not a gate


def test_a_met_slo_exits_0(server: Any) -> None:
    code, out, err = load(server, *STEADY, *LENIENT, "--slo", "e2e_p99<=60s", "--fail-on-slo")
    assert code == 0, err
    assert "gate failed" not in err and "meets SLO" in out


def test_an_invalid_run_exits_99_with_fail_on_invalid(server: Any) -> None:
    # a send delay above -1 ms: every open-loop run is invalid
    invalid = ("--rate", "20", "--duration", "0.3", "--max-schedule-delay-ms", "-1")
    code, _, err = load(server, *invalid, "--fail-on-invalid")
    assert code == 99
    assert "error: gate failed: the run is invalid: " in err and "send delay p99" in err
    code, _, _ = load(server, *invalid)
    assert code == 0
    code, _, err = load(server, *invalid, "--slo", "e2e_p99<=60s", "--fail-on-slo")
    assert code == 99 and "is not judged: the run is invalid" in err


def test_fail_on_slo_needs_slo(server: Any) -> None:
    code, _, err = load(server, *STEADY, "--fail-on-slo")
    assert code == 2 and "--fail-on-slo needs --slo" in err and "Traceback" not in err


def test_help_lists_the_gates_and_codes() -> None:
    result = CliRunner().invoke(main, ["load", "--help"])
    assert "--fail-on-slo" in result.stdout and "--fail-on-invalid" in result.stdout
    assert "99   a load gate failed" in result.stdout and "70   convsim crashed" in result.stdout


def test_load_takes_runs_short_options_and_base_url(server: Any, tmp_path: Path) -> None:
    """-m, -c, -o and --base-url mean on `load` what they mean on `run`."""
    out = tmp_path / "new" / "x.json"
    result = CliRunner().invoke(
        main,
        [
            "load", "-m", "openai-compatible:mock-model", "--base-url", server.base_url,
            "-c", "2", "--max-requests", "4", "-o", str(out), *LENIENT,
            "--synthetic", "turns=1,input_tokens=16,output_tokens=4", "--no-calibrate",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(out.read_text())["requests"]["completed"] >= 4
    both = CliRunner().invoke(
        main,
        ["load", "-m", "openai-compatible:mock-model", "--base-url", server.base_url,
         "--model-arg", f"base_url={server.base_url}"],
    )  # fmt: skip
    assert both.exit_code == 2 and "both give the base URL" in both.stderr
