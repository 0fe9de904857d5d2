"""``convsim load --format vllm``: the result in ``vllm bench serve``'s keys and units,
as a dashboard built on vLLM's JSON reads them; only what was measured."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from anyio.from_thread import start_blocking_portal
from test_load_cli import invoke, serve_mock

from convsim.load import (
    LoadPlan,
    LoadResult,
    RequestRecord,
    Window,
    parse_goodput,
    point_result,
    sweep_result,
)
from convsim.load._vllm_format import vllm_result, write_vllm_result

DASHBOARD_KEYS = {
    # what a dashboard reading vllm bench serve's JSON looks up, and the unit it expects
    "duration": "s",
    "completed": "count",
    "failed": "count",
    "total_input_tokens": "tokens",
    "total_output_tokens": "tokens",
    "request_throughput": "1/s",
    "request_goodput": "1/s",
    "output_throughput": "tokens/s",
    "total_token_throughput": "tokens/s",
    **{
        f"{stat}_{metric}_ms": "ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p99")
    },
    "max_concurrency": "count",
    "request_rate": "1/s",
}


def record(
    session: str,
    sent: float,
    end: float,
    *,
    ttft: float | None = None,
    gaps: tuple[float, ...] = (),
    tokens: tuple[int | None, int | None] = (None, None),
    error: str | None = None,
    source: str | None = "server",
) -> RequestRecord:
    return RequestRecord(
        session_id=session,
        turn_index=0,
        history_messages=1,
        scheduled_s=sent,
        sent_s=sent,
        ttfb_s=ttft,
        ttft_s=ttft,
        ttfot_s=ttft,
        inter_token_gaps_s=gaps,
        end_s=end,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        error=error,
        token_source=None if error else source,  # type: ignore[arg-type]
    )


RECORDS = [
    record("a", 1.0, 2.0, ttft=0.25, gaps=(0.25, 0.5), tokens=(100, 3)),
    record("b", 2.0, 3.0, ttft=0.5, gaps=(0.25,), tokens=(200, 2)),
    record("c", 3.0, 5.0, ttft=1.0, gaps=(0.5,), tokens=(50, 2)),
    record("d", 3.5, 4.0, error="Timeout"),
]
WINDOW = Window(1.0, 5.0)
DATE = "20250102-030405"


def open_point(records: list[RequestRecord] = RECORDS, **kwargs: Any) -> Any:
    point = point_result(records, WINDOW, target_rate=1.0, **kwargs)
    return point.model_copy(update={"target_request_rate": 1.0})


def test_a_dashboard_finds_vllms_keys_in_its_units() -> None:
    point = open_point(slos=parse_goodput("ttft:600"))
    data = vllm_result(point, LoadPlan(model="openai-compatible:org/model", rate=1.0), date=DATE)
    assert DASHBOARD_KEYS.keys() <= data.keys()
    assert data["date"] == DATE and data["model_id"] == "org/model"
    assert data["request_rate"] == 1.0 and data["burstiness"] == 1.0
    assert data["max_concurrency"] is None
    assert data["duration"] == 4.0 and data["completed"] == 3 and data["failed"] == 1
    assert data["total_input_tokens"] == 350 and data["total_output_tokens"] == 7
    assert data["request_throughput"] == 3 / 4
    assert data["request_goodput"] == 2 / 4  # c's TTFT of 1000 ms misses 600 ms
    assert data["output_throughput"] == 7 / 4 and data["total_token_throughput"] == 357 / 4
    ttft_ms = [250.0, 500.0, 1000.0]
    assert data["mean_ttft_ms"] == pytest.approx(np.mean(ttft_ms))
    assert data["median_ttft_ms"] == 500.0
    assert data["std_ttft_ms"] == pytest.approx(np.std(ttft_ms))
    assert data["p99_ttft_ms"] == pytest.approx(np.percentile(ttft_ms, 99))
    assert data["p99.9_ttft_ms"] == pytest.approx(np.percentile(ttft_ms, 99.9))
    assert data["p90_ttft_ms"] == pytest.approx(np.percentile(ttft_ms, 90))
    assert data["mean_e2el_ms"] == pytest.approx(np.mean([1000.0, 1000.0, 2000.0]))
    assert data["median_itl_ms"] == 375.0  # gaps pooled: 250, 500, 250, 500
    # tpot: (e2e - ttft) / (output - 1) per request: 375, 500, 1000 ms
    assert data["mean_tpot_ms"] == pytest.approx(np.mean([375.0, 500.0, 1000.0]))
    for key, unit in DASHBOARD_KEYS.items():
        if key != "max_concurrency":  # null in open loop without a cap, as vLLM writes it
            assert isinstance(data[key], int | float), (key, unit)
    json.dumps(data)  # plain JSON


def test_only_what_was_measured_is_written() -> None:
    records = [
        # unstreamed, one token each: no TTFT, no gaps, no TPOT; counts estimated
        record("a", 1.0, 2.0, tokens=(10, 1), source="estimate"),
        record("b", 2.0, 3.0, tokens=(10, 1), source="server"),
    ]
    data = vllm_result(open_point(records), LoadPlan(rate=1.0), date=DATE)
    for metric in ("ttft", "tpot", "itl"):
        assert not [k for k in data if k.endswith(f"_{metric}_ms")], metric
    assert data["median_e2el_ms"] == 1000.0
    for key in ("total_input_tokens", "total_output_tokens", "output_throughput"):
        assert key not in data  # an estimated count is not vLLM's tokenizer count
    assert data["request_goodput"] is None  # no objectives: as vLLM writes it


def test_closed_loop_and_arrival_settings() -> None:
    closed = point_result(RECORDS, WINDOW).model_copy(update={"concurrency": 8})
    data = vllm_result(closed, LoadPlan(concurrency=8), date=DATE)
    assert data["request_rate"] == "inf" and data["max_concurrency"] == 8
    assert "burstiness" not in data
    gamma = LoadPlan(rate=1.0, arrival="gamma", burstiness=0.5, max_concurrency=16)
    data = vllm_result(open_point(), gamma, date=DATE)
    assert data["burstiness"] == 0.5 and data["max_concurrency"] == 16
    assert "burstiness" not in vllm_result(
        open_point(), LoadPlan(rate=1, arrival="constant"), date=DATE
    )
    tools = open_point().model_copy(update={"target_request_rate": None})
    assert "request_rate" not in vllm_result(tools, LoadPlan(rate=1.0), date=DATE)


def test_a_sweep_is_one_object_per_line(tmp_path: Path) -> None:
    sweep = sweep_result([open_point(), open_point()])
    path = tmp_path / "sweep.jsonl"
    write_vllm_result(path, sweep, LoadPlan(rate=1.0), now=datetime(2025, 1, 2, 3, 4, 5))
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["date"] == DATE for line in lines)
    single = tmp_path / "one.json"
    write_vllm_result(single, LoadResult.of(open_point()), LoadPlan(rate=1.0))
    assert json.loads(single.read_text())["completed"] == 3


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with start_blocking_portal() as portal, serve_mock(portal) as mock:
        yield mock


def test_format_vllm_from_the_command_line(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "vllm.json"
    code, stdout, stderr = invoke(
        "--model", "openai-compatible:mock-model", "--model-arg", f"base_url={server.base_url}",
        "--concurrency", "2", "--max-requests", "12", "--no-calibrate",
        "--synthetic", "input_tokens=8,output_tokens=4", "--goodput", "ttft:60000",
        "--format", "vllm", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    data = json.loads(out.read_text())
    assert DASHBOARD_KEYS.keys() <= data.keys()
    assert "latency_ms" not in data and "schema_version" not in data
    assert data["model_id"] == "mock-model" and data["max_concurrency"] == 2
    assert data["completed"] >= 12 and data["request_goodput"] == data["request_throughput"]
    assert data["total_output_tokens"] == 4 * data["completed"]
    assert 4.0 <= data["median_ttft_ms"] < data["median_e2el_ms"]  # ms: the mock waits 5 ms
    assert "vllm bench serve's keys" in stdout


def test_format_vllm_needs_out() -> None:
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--no-preflight", "--concurrency", "1",
        "--max-requests", "1", "--format", "vllm",
    )  # fmt: skip
    assert code == 2 and "--format vllm is the form of --out" in stderr
    assert "Traceback" not in stderr
