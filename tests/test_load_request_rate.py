"""``--rate`` counts sessions per second and says what requests per second it offers;
``--request-rate`` counts requests, for single-turn workloads only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from test_load_cli import invoke, serve_mock, target

from convsim.load import ShareGPTSessions, SyntheticSessions, parse_synthetic, read_sharegpt
from convsim.load._offered import SessionRequests, session_requests


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with start_blocking_portal() as portal, serve_mock(portal, ttft_ms=1, itl_ms=0) as mock:
        yield mock


def test_requests_per_session_of_each_workload(tmp_path: Path) -> None:
    synthetic = SyntheticSessions(parse_synthetic("turns=3,input_tokens=4,output_tokens=2"))
    assert session_requests(synthetic) == SessionRequests(single=False, mean=3.0)
    one = SyntheticSessions(parse_synthetic("turns=1,input_tokens=4,output_tokens=2"))
    assert session_requests(one) == SessionRequests(single=True, mean=1.0)
    spread = session_requests(
        SyntheticSessions(parse_synthetic("turns=uniform:1,3,input_tokens=4,output_tokens=2"))
    )
    assert not spread.single and spread.mean is not None and 1.8 < spread.mean < 2.2
    data = tmp_path / "chats.jsonl"
    data.write_text(
        '{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},'
        ' {"from": "human", "value": "c"}]}\n'
        '{"conversations": [{"from": "human", "value": "d"}]}\n'
    )
    chats = tuple(read_sharegpt(data))
    assert session_requests(ShareGPTSessions(chats)) == SessionRequests(single=False, mean=1.5)
    tools = tmp_path / "tools.jsonl"
    tools.write_text('{"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "x"}]}\n')
    unknown = session_requests(ShareGPTSessions(tuple(read_sharegpt(tools))))
    assert unknown == SessionRequests(single=False, mean=None)


def test_rate_says_sessions_and_the_requests_they_offer(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, stdout, stderr = invoke(
        *target(server), "--rate", "4", "--duration", "0.5", "--arrival", "constant",
        "--synthetic", "turns=3,input_tokens=8,output_tokens=2", "--no-calibrate",
        "--max-schedule-delay-ms", "1000", "--max-loop-lag-ms", "1000", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result["target_rate"] == 4 and result["target_request_rate"] == 12
    assert "4 sessions/s: offered 4 sessions/s = 12 requests/s (3 per session)" in stdout


def test_request_rate_runs_single_turn_sessions(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, stdout, stderr = invoke(
        *target(server), "--request-rate", "20", "--duration", "0.5", "--arrival", "constant",
        "--synthetic", "turns=1,input_tokens=8,output_tokens=2", "--no-calibrate",
        "--max-schedule-delay-ms", "1000", "--max-loop-lag-ms", "1000", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result["target_rate"] == 20 and result["target_request_rate"] == 20
    assert "20 requests/s: offered 20 sessions/s = 20 requests/s (one request each)" in stdout


def test_closed_loop_offers_no_rate(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, stdout, stderr = invoke(
        *target(server), "--concurrency", "2", "--max-requests", "4", "--no-calibrate",
        "--synthetic", "turns=2,input_tokens=8,output_tokens=2", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    assert json.loads(out.read_text())["target_request_rate"] is None
    assert "offered" not in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--synthetic", "turns=3,input_tokens=8,output_tokens=2"],
            "sessions send more (3 requests per session on average)",
        ),
        (
            ["--synthetic", "turns=uniform:1,2,input_tokens=8,output_tokens=2"],
            "give --rate in sessions per second",
        ),
        (["--rate", "2"], "give one of --rate (sessions per second) and --request-rate"),
        (["--concurrency", "2"], "give one of --concurrency (closed loop) and --request-rate"),
    ],
)
def test_request_rate_refuses_what_it_cannot_count(args: list[str], message: str) -> None:
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--no-preflight", "--request-rate", "5",
        "--duration", "1", *args,
    )  # fmt: skip
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
