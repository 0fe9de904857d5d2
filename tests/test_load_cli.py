"""``convsim load`` against the mock server: closed loop, open loop, a sweep with SLOs,
workloads from a pack and a ShareGPT file, calibrated input lengths, the JSON result
and the per-request files, and clean errors for bad input."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner

from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from convsim.load import LoadPlan, LoadResult, run_load

POINT_KEYS = {
    "valid",
    "invalid_reasons",
    "target_rate",
    "achieved_rate",
    "requests",
    "throughput",
    "latency_ms",
    "schedule_delay_ms",
    "goodput",
    "by_turn",
}
PERCENTILES = {"mean", "p50", "p90", "p95", "p99", "p999"}


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["load", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with start_blocking_portal() as portal, serve_mock(portal) as mock:
        yield mock


def serve_mock(portal: BlockingPortal, **config: Any) -> Any:
    """The mock server (5 ms to the first token, 1 ms between tokens, unless ``config``
    says otherwise), served through ``portal``."""
    return portal.wrap_async_context_manager(
        MockModelServer(MockServerConfig(**{"ttft_ms": 5, "itl_ms": 1, **config}))
    )


def target(mock: Any) -> list[str]:
    return ["--model", "openai-compatible:mock-model", "--model-arg", f"base_url={mock.base_url}"]


def test_closed_loop_writes_the_result_with_its_contract(server: Any, tmp_path: Path) -> None:
    out, reqs = tmp_path / "r.json", tmp_path / "r.csv"
    code, stdout, stderr = invoke(
        *target(server),
        "--concurrency", "4",
        "--max-requests", "40",
        "--synthetic", "turns=2,input_tokens=32,output_tokens=8",
        "--out", str(out),
        "--requests", str(reqs),
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result.keys() >= POINT_KEYS and result["schema_version"] == 1
    assert result["target_rate"] is None and result["concurrency"] == 4
    assert result["requests"]["completed"] >= 40 and result["requests"]["failed"] == 0
    assert result["throughput"]["requests_per_s"] > 0
    assert result["throughput"]["output_tokens_per_s"] > 0
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert result["latency_ms"][metric].keys() >= PERCENTILES
        assert result["latency_ms"][metric]["p50"] is not None
    # streamed: the first token, after the mock's 5 ms, and before the last of eight
    latency = result["latency_ms"]
    assert 4.0 <= latency["ttft"]["p50"] < latency["e2e"]["p50"]
    assert [t["turn_index"] for t in result["by_turn"]] == [0, 1]
    assert set(result["by_turn"][0]) >= {"turn_index", "count", "ttft_ms", "e2e_ms"}
    assert result["client"]["max_sessions"] <= 4
    # calibrated against the server's usage: the first turns hold the tokens asked
    assert result["input_tokens"]["method"] in ("usage", "tokenize")
    assert abs(result["input_tokens"]["error_pct_max"]) <= 5.0
    rows = list(csv.DictReader(reqs.read_text().splitlines()))
    assert len(rows) == result["requests"]["completed"]
    assert {"session_id", "turn_index", "ttft_ms", "e2e_ms", "schedule_delay_ms"} <= rows[0].keys()
    assert "Load test" in stdout and "TTFT p99" in stdout


@pytest.mark.slow
def test_open_loop_sweep_with_slos_reports_the_best_rate(server: Any, tmp_path: Path) -> None:
    """End to end, with room for a busy machine: the client's send delay and loop lag may
    reach a second before a point is invalid. What the sweep decides, at the thresholds
    that count, is checked on hand-built records in test_load_result.py."""
    out, reqs = tmp_path / "sweep.json", tmp_path / "sweep.jsonl"
    code, stdout, stderr = invoke(
        *target(server),
        "--rate", "20",
        "--sweep", "10,20,40",
        "--duration", "0.6",
        "--arrival", "constant",
        "--synthetic", "turns=1,input_tokens=16,output_tokens=4",
        "--slo", "ttft_p99<=2s,e2e_p99<=5s",
        "--max-schedule-delay-ms", "1000",
        "--max-loop-lag-ms", "1000",
        "--out", str(out),
        "--requests", str(reqs),
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert [p["target_rate"] for p in result["points"]] == [10, 20, 40]
    for point in result["points"]:
        assert point.keys() >= POINT_KEYS
        assert point["valid"], point["invalid_reasons"]
        assert point["goodput"]["requests_per_s"] > 0
        assert point["goodput"]["conversations_per_s"] > 0
    assert result["max_rate_meeting_slo"] == 40
    lines = [json.loads(line) for line in reqs.read_text().splitlines()]
    assert {line["point"] for line in lines} == {0, 1, 2}
    assert "highest rate meeting every SLO: 40" in stdout


@pytest.mark.slow
def test_a_sweep_writes_its_html_page(server: Any, tmp_path: Path) -> None:
    page = tmp_path / "sweep.html"
    code, _, stderr = invoke(
        *target(server), "--rate", "5", "--sweep", "5,10", "--duration", "3",
        "--synthetic", "turns=2,input_tokens=16,output_tokens=4",
        "--slo", "ttft_p99<=500ms", "--html", str(page), "--no-calibrate",
    )  # fmt: skip
    assert code == 0, stderr
    html = page.read_text()
    assert "default-src 'none'" in html and "<script" not in html
    for plot in ("plot-sweep", "plot-latency", "plot-timeline", "plot-by_turn", "plot-delay"):
        assert plot in html, plot
    assert "highest rate meeting every SLO" in html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html, re.I)


def test_a_pack_feeds_real_answers_back(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "pack.json"
    code, _, stderr = invoke(
        *target(server), "--pack", "customer_support", "--repeat", "1", "--concurrency", "8",
        "--out", str(out), "--no-calibrate",
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result["requests"]["failed"] == 0
    depths = [t["mean_history_messages"] for t in result["by_turn"]]
    assert depths == sorted(depths) and depths[-1] > depths[0]


def test_metrics_score_the_completed_conversations_after_the_run(
    server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "quality.json"
    code, stdout, stderr = invoke(
        *target(server), "--pack", "customer_support", "--repeat", "1", "--concurrency", "4",
        "--metrics", "context_retention,response_length", "--out", str(out),
        "--no-calibrate", "--loop", "asyncio",
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    quality = result["quality"]
    assert list(quality) == ["context_retention", "response_length"]
    completed = result["conversations"]["completed"]
    assert completed > 0
    for summary in quality.values():
        assert summary["scored"] + summary["not_applicable"] + summary["failed"] == completed
    length = quality["response_length"]
    assert length["scored"] == completed and length["p10"] <= length["p50"] <= length["p90"]
    assert "context_retention (mean)" in stdout
    assert result["client"]["event_loop"] == "asyncio"


def test_without_metrics_nothing_is_kept_or_scored(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "plain.json"
    code, _, stderr = invoke(
        *target(server), "--pack", "customer_support", "--repeat", "1", "--concurrency", "4",
        "--out", str(out), "--no-calibrate",
    )  # fmt: skip
    assert code == 0, stderr
    assert json.loads(out.read_text())["quality"] is None


def test_a_sharegpt_file_sends_every_user_turn(server: Any, tmp_path: Path) -> None:
    data = tmp_path / "sharegpt.json"
    data.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "human", "value": "Hello there, I need help."},
                        {"from": "gpt", "value": "Sure, what is it?"},
                        {"from": "human", "value": "My order is late."},
                        {"from": "gpt", "value": "Sorry to hear that, let me check."},
                        {"from": "human", "value": "Thanks."},
                    ],
                },
                {"id": "b", "conversations": [{"from": "human", "value": "One question."}]},
            ]
        )
    )
    out, reqs = tmp_path / "d.json", tmp_path / "d.jsonl"
    code, _, stderr = invoke(
        *target(server), "--dataset", str(data), "--repeat", "1", "--concurrency", "2",
        "--out", str(out), "--requests", str(reqs), "--no-calibrate",
    )  # fmt: skip
    assert code == 0, stderr
    lines = [json.loads(line) for line in reqs.read_text().splitlines()]
    turns = sorted((line["session_id"], line["turn_index"]) for line in lines)
    assert turns == [("a#0", 0), ("a#0", 1), ("a#0", 2), ("b#0", 0)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "2", "--rate", "3", "--max-requests", "1"], "one of --concurrency"),
        (["--max-requests", "1"], "--concurrency N (closed loop)"),
        (["--concurrency", "2", "--duration", "1", "--slo", "ttft<=1s"], "invalid --slo"),
        (["--concurrency", "2", "--duration", "1", "--think-time", "gauss:1"], "--think-time"),
        (["--concurrency", "2", "--duration", "1", "--synthetic", "turns=2"], "input_tokens"),
        (["--rate", "2", "--duration", "1", "--sweep", "1,x"], "invalid --sweep"),
        (["--concurrency", "2", "--duration", "1", "--pack", "no_such_pack"], "no_such_pack"),
        (["--concurrency", "2", "--duration", "1", "--metrics", "coherence"], "needs --pack"),
        (
            [
                *("--concurrency", "2", "--duration", "1", "--pack", "customer_support"),
                *("--metrics", "no_such_metric"),
            ],
            "unknown metric 'no_such_metric'",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    code, _, stderr = invoke("--model", "openai-compatible:m", "--no-preflight", *args)
    assert code == 2
    assert message in stderr
    assert "Traceback" not in stderr


def test_a_broken_dataset_line_is_named(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n{"conv\n')
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--dataset", str(data), "--concurrency", "1",
        "--max-requests", "1",
    )  # fmt: skip
    assert code == 2 and f"{data}:2" in stderr


def test_a_server_that_is_down_exits_4(tmp_path: Path) -> None:
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--model-arg", "base_url=http://127.0.0.1:9/v1",
        "--concurrency", "1", "--max-requests", "1",
    )  # fmt: skip
    assert code == 4 and "connection refused" in stderr


def test_a_used_up_quota_ends_the_run_and_marks_it_invalid() -> None:
    """A 429 asking for a day (a daily quota): the run stops at once and says why,
    instead of pausing the key for the day and reporting the few requests before it as
    a valid result."""
    with (
        start_blocking_portal() as portal,
        serve_mock(portal, fault_rate=0.05, faults={"429": 1.0}, retry_after_s=86400.0) as mock,
    ):
        plan = LoadPlan(
            model="openai-compatible:mock-model",
            model_args={"base_url": mock.base_url},
            concurrency=4,
            duration=30,
            synthetic="turns=2,input_tokens=16,output_tokens=4",
            calibrate=False,
            drain_timeout=1,
        )
        run = portal.call(run_load, plan)
    result = run.result
    assert isinstance(result, LoadResult)
    assert not result.valid and result.stopped_by == "quota_exhausted"
    assert result.duration_s < 30  # stopped on the refusal, not at the duration
    assert result.requests.errors_by_class.get("QuotaExhausted", 0) >= 1
    assert any(
        "asked to wait 86400 s (Retry-After), more than max_retry_after" in r
        for r in result.invalid_reasons
    )


def test_the_folders_of_the_outputs_are_made_as_run_makes_its_own(
    server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "x" / "y.json"
    reqs = tmp_path / "r" / "s" / "requests.csv"
    page = tmp_path / "h" / "load.html"
    code, stdout, stderr = invoke(
        *target(server), "--concurrency", "1", "--max-requests", "2", "--no-calibrate",
        "--synthetic", "turns=1,input_tokens=8,output_tokens=2",
        "--out", str(out), "--requests", str(reqs), "--html", str(page),
    )  # fmt: skip
    assert code == 0, stderr
    assert json.loads(out.read_text())["requests"]["completed"] >= 2
    assert reqs.exists() and page.exists() and f"result: {out}" in stdout


def test_an_output_whose_folder_cannot_be_made_stops_before_the_load(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "y.json"
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--model-arg", "base_url=http://127.0.0.1:9/v1",
        "--concurrency", "1", "--max-requests", "1", "--out", str(out),
    )  # fmt: skip
    assert code == 2 and f"{out}: cannot create its folder" in stderr  # not 4: no request
    assert "Traceback" not in stderr


def test_tool_turns_run_against_the_mock_server(server: Any, tmp_path: Path) -> None:
    """A recorded conversation with tools: the mock calls the tool the user names, the
    workload answers it with the recorded result, and both requests are measured."""
    lookup = {
        "type": "function",
        "function": {
            "name": "look_up_order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "pattern": "^A-\\d{4}$"}},
                "required": ["order_id"],
            },
        },
    }
    dataset = tmp_path / "tools.jsonl"
    conversation = {
        "tools": [lookup],
        "messages": [
            {"role": "user", "content": "Please look up order A-1001."},
            {"role": "tool", "name": "look_up_order", "content": '{"status": "shipped"}'},
            {"role": "assistant", "content": "It shipped."},
        ],
    }
    dataset.write_text(json.dumps(conversation) + "\n")
    out, reqs = tmp_path / "r.json", tmp_path / "r.jsonl"
    code, _, stderr = invoke(
        *target(server),
        "--dataset", str(dataset),
        "--concurrency", "2",
        "--max-requests", "8",
        "--out", str(out),
        "--requests", str(reqs),
    )  # fmt: skip
    assert code == 0, stderr
    tools = json.loads(out.read_text())["tools"]
    assert tools["replies_with_tool_calls"] >= 4 and tools["failed"] == 0
    rows = [json.loads(line) for line in reqs.read_text().splitlines()]
    # each session: the request answered with a call, then the one carrying its result
    assert {(r["tool_round"], r["tool_calls"]) for r in rows} == {(0, 1), (1, 0)}
