"""convsim load against a reasoning model: each request records its time to the first
output token apart from its first token, and its reasoning tokens; ``ttfot`` SLOs judge
the former."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim import ConfigError
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from convsim.load import RequestRecord
from convsim.load._result import LatencyMs
from convsim.load._slo import parse_slos


def _record(ttft_s: float, ttfot_s: float | None) -> RequestRecord:
    return RequestRecord(
        "a", 0, 1, None, 1.0, ttft_s, ttft_s, (), 2.0, 5, 9, ttfot_s=ttfot_s, reasoning_tokens=4
    )


def test_a_ttfot_slo_judges_the_first_answer_token_not_the_first_thought() -> None:
    (slo,) = parse_slos("ttfot_p99<=100ms").items
    assert slo.request_value_ms(_record(0.02, 0.5)) == pytest.approx(500.0)
    assert slo.request_value_ms(_record(0.02, None)) is None
    (first,) = parse_slos("ttft_p99<=100ms").items
    assert first.request_value_ms(_record(0.02, 0.5)) == pytest.approx(20.0)


def test_an_unknown_slo_metric_names_ttfot_among_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="ttfot"):
        parse_slos("ttfx_p99<=100ms")


@pytest.fixture(scope="module")
def thinker() -> Iterator[Any]:
    with start_blocking_portal() as portal:
        config = MockServerConfig(ttft_ms=1, itl_ms=1, reasoning_tokens=20)
        with portal.wrap_async_context_manager(MockModelServer(config)) as mock:
            yield mock


def _load(mock: Any, tmp_path: Path, *extra: str, reqs: str = "r.csv") -> tuple[str, Path]:
    result = CliRunner().invoke(
        main,
        [
            "load",
            "--model", "openai-compatible:mock-model",
            "--model-arg", f"base_url={mock.base_url}",
            "--concurrency", "2",
            "--max-requests", "6",
            "--synthetic", "turns=1,input_tokens=16,output_tokens=4",
            "--no-calibrate",
            "--out", str(tmp_path / "r.json"),
            "--requests", str(tmp_path / reqs),
            *extra,
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return result.stdout, tmp_path / "r.json"


def test_load_reports_ttfot_beside_ttft_and_the_reasoning_tokens(
    thinker: Any, tmp_path: Path
) -> None:
    page = tmp_path / "r.html"
    stdout, out = _load(thinker, tmp_path, "--slo", "ttfot_p99<=10s", "--html", str(page))
    result = json.loads(out.read_text())
    latency = result["latency_ms"]
    # twenty thoughts of 1 ms each come between the first token and the first answer token
    assert latency["ttfot"]["count"] == latency["ttft"]["count"] >= 6
    assert latency["ttfot"]["p50"] >= latency["ttft"]["p50"] + 10
    reasoning = result["reasoning_tokens"]
    assert reasoning["requests"] == result["requests"]["completed"]
    assert reasoning["total"] == 20 * reasoning["requests"]
    assert reasoning["per_request"]["mean"] == 20
    assert result["meets_slo"] is True  # judged on the summaries' ttfot (no KeyError)
    (turn,) = result["by_turn"]
    assert turn["ttfot_ms"]["p50"] > turn["ttft_ms"]["p50"]
    assert re.search(r"TTFOT p50\s*│", stdout) and "reasoning tokens" in stdout
    with (tmp_path / "r.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {row["reasoning_tokens"] for row in rows} == {"20"}
    assert all(float(row["ttfot_ms"]) > float(row["ttft_ms"]) for row in rows)
    html = page.read_text()
    assert "TTFOT p99" in html and "reasoning tokens (total / per request)" in html


def test_a_model_that_does_not_reason_shows_ttfot_equal_to_ttft_and_no_reasoning(
    tmp_path: Path,
) -> None:
    with start_blocking_portal() as portal:
        config = MockServerConfig(ttft_ms=1, itl_ms=1)
        with portal.wrap_async_context_manager(MockModelServer(config)) as mock:
            stdout, out = _load(mock, tmp_path, reqs="r.jsonl")
    result = json.loads(out.read_text())
    assert result["latency_ms"]["ttfot"] == result["latency_ms"]["ttft"]
    assert result["reasoning_tokens"] is None  # nothing reported, nothing invented
    assert "reasoning tokens" not in stdout
    for line in (tmp_path / "r.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["ttfot_ms"] == row["ttft_ms"] and row["reasoning_tokens"] is None


def test_a_result_written_before_ttfot_reads_back_with_no_samples() -> None:
    old = LatencyMs.model_validate({k: {} for k in ("ttft", "tpot", "itl", "e2e")})
    assert old.ttfot.count == 0 and old.ttfot.p99 is None
