"""vLLM's ``--goodput ttft:500 tpot:50`` beside ``--slo``: parsed, merged, counted as
vLLM counts it, and read from the command line in vLLM's several-words form."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from test_load_cli import invoke, serve_mock

from convsim import ConfigError
from convsim.cli._load import _goodput_words
from convsim.load import (
    SLO,
    LoadPlan,
    RequestRecord,
    goodput,
    merge_objectives,
    parse_goodput,
)


def record(session: str, ttft: float, end: float, output_tokens: int) -> RequestRecord:
    return RequestRecord(
        session_id=session,
        turn_index=0,
        history_messages=1,
        scheduled_s=None,
        sent_s=0.0,
        ttfb_s=ttft,
        ttft_s=ttft,
        ttfot_s=ttft,
        inter_token_gaps_s=(),
        end_s=end,
        input_tokens=1,
        output_tokens=output_tokens,
        error=None,
    )


def test_parse_goodput_reads_vllms_keys_in_ms() -> None:
    slos = parse_goodput("ttft:500 tpot:50,e2el:2000.5")
    assert slos.items == (
        SLO(metric="ttft", statistic="p99", threshold_ms=500.0),
        SLO(metric="tpot", statistic="p99", threshold_ms=50.0),
        SLO(metric="e2e", statistic="p99", threshold_ms=2000.5),
    )


def test_goodput_counts_requests_as_vllm_does() -> None:
    """vLLM: a request is good when each of its values is at most the threshold."""
    slos = parse_goodput("ttft:500 tpot:125")
    records = [
        record("a", 0.5, 0.875, 4),  # ttft 500 <= 500, tpot (875-500)/3 = 125 <= 125: good
        record("b", 0.501, 0.6, 2),  # ttft too slow
        record("c", 0.125, 1.0, 4),  # tpot 291.7 ms: too slow
        record("d", 0.2, 0.2, 1),  # one token: no tpot to break
    ]
    assert [slos.met_by(r) for r in records] == [True, False, False, True]
    assert goodput(records, slos, duration_s=2.0).requests_per_s == 1.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ttft=500", "invalid --goodput 'ttft=500'"),
        ("ttft:500 tpot", "invalid --goodput 'tpot'"),
        ("itl:5", "unknown key 'itl'"),
        ("ttft:-1", "invalid --goodput 'ttft:-1'"),
        ("ttft:5ms", "invalid --goodput 'ttft:5ms'"),
        ("ttft:500 ttft:400", "ttft given twice"),
        ("  ", "expected KEY:VALUE"),
    ],
)
def test_goodput_errors_name_the_word(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(reason)):
        parse_goodput(text)


def test_slo_and_goodput_merge_unless_they_share_a_metric() -> None:
    assert merge_objectives("e2e_p50<=2s", "ttft:500") == "e2e_p50<=2000ms,ttft_p99<=500ms"
    assert merge_objectives(None, "e2el:10") == "e2e_p99<=10ms"
    assert merge_objectives("ttft_p99<=1s", None) == "ttft_p99<=1s"
    with pytest.raises(ConfigError, match="both set an objective on ttft"):
        merge_objectives("ttft_p50<=1s", "tpot:5 ttft:500")
    with pytest.raises(ConfigError, match="both set an objective on e2e"):
        LoadPlan(slo="e2e_p99<=1s", goodput="e2el:900").objectives  # noqa: B018


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--goodput", "ttft:500", "tpot:50", "-c", "2"],
         ["--goodput", "ttft:500", "--goodput", "tpot:50", "-c", "2"]),
        (["--goodput=ttft:500", "e2el:9"], ["--goodput=ttft:500", "--goodput", "e2el:9"]),
        (["-c", "2", "x", "--goodput"], ["-c", "2", "x", "--goodput"]),
        (["--goodput", "ttft:1", "--", "tpot:2"], ["--goodput", "ttft:1", "--", "tpot:2"]),
        (["--slo", "ttft_p99<=1s", "tpot:2"], ["--slo", "ttft_p99<=1s", "tpot:2"]),
    ],
)  # fmt: skip
def test_the_words_after_goodput_are_its_values(args: list[str], words: list[str]) -> None:
    assert _goodput_words(args) == words


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with start_blocking_portal() as portal, serve_mock(portal) as mock:
        yield mock


def test_goodput_as_vllm_writes_it_on_the_command_line(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, stdout, stderr = invoke(
        "--model", "openai-compatible:mock-model", "--model-arg", f"base_url={server.base_url}",
        "--concurrency", "2", "--max-requests", "10", "--no-calibrate",
        "--synthetic", "input_tokens=8,output_tokens=4",
        "--goodput", "ttft:60000", "e2el:60000", "--fail-on-slo", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result["goodput"]["requests_per_s"] == result["throughput"]["requests_per_s"]
    assert result["meets_slo"] is True
    assert "goodput req/s" in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--goodput", "ttft=500"], "invalid --goodput 'ttft=500'"),
        (["--goodput", "ttft:500", "oops"], "invalid --goodput 'oops'"),
        (["--goodput", "ttft:500", "--slo", "ttft_p99<=1s"], "both set an objective on ttft"),
    ],
)
def test_bad_goodput_exits_2_naming_the_word(args: list[str], message: str) -> None:
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--no-preflight", "--concurrency", "1",
        "--max-requests", "1", *args,
    )  # fmt: skip
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
