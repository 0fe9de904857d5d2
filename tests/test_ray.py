"""Runs on Ray (a local instance): sharding, results streamed into one file, the same
conversations as in one process, and an actor killed mid-run with nothing lost or twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import convsim
from convsim.distributed import run_on_ray, shard_of

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_sharding_is_stable_and_spreads() -> None:
    ids = [f"s{i}" for i in range(200)]
    first = [shard_of(i, 3) for i in ids]
    assert first == [shard_of(i, 3) for i in ids]  # the same everywhere, every time
    assert {0, 1, 2} == set(first) and min(first.count(k) for k in range(3)) > 40


def test_a_run_on_two_actors_gives_what_one_process_gives(tmp_path: Path) -> None:
    out = tmp_path / "ray.jsonl"
    outcome = run_on_ray("customer_support", "scripted", out=out, actors=2)
    on_ray = {r.conversation_id: r for r in convsim.read_results(out)}
    here = {r.conversation_id: r for r in convsim.run_sync("customer_support", "scripted")}
    assert set(on_ray) == set(here) and outcome.results == len(here)
    for cid, result in here.items():
        assert on_ray[cid].seed == result.seed  # the same conversation wherever it ran
        assert on_ray[cid].transcript == result.transcript
    assert outcome.first_result_s is not None and outcome.first_result_s < outcome.elapsed_s
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["settings"]["backend"] == "ray" and manifest["settings"]["actors"] == 2


def test_a_killed_actor_loses_nothing_and_records_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "killed.jsonl"
    killed: list[int] = []

    def kill_once(count: int, actor: Any) -> None:
        if count == 3 and not killed:
            killed.append(count)
            ray.kill(actor)

    outcome = run_on_ray(
        "customer_support",
        "scripted",
        out=out,
        actors=2,
        model_args={"latency": "0.05"},
        concurrency=2,
        kill_after=kill_once,
    )
    ids = [r.conversation_id for r in convsim.read_results(out)]
    lines = out.read_text().splitlines()
    assert killed and outcome.restarted_actors >= 1
    assert len(ids) == len(set(ids)) == len(lines) == 14


def test_the_command_line_runs_on_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from convsim import cli
    from convsim.cli import main

    monkeypatch.setattr(cli, "PROGRESS_LINE_S", 0.0)  # a line at every poll
    out = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(
        main,
        ["run", "customer_support", "--model", "scripted", "--backend", "ray", "--actors", "2",
         "--limit", "6", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "on 2 actors" in result.output
    assert "ray: " in result.output and "/6 finished" in result.output  # the driver's progress
    assert len(convsim.read_results(out)) == 6
    assert out.with_suffix(".summary.json").exists()


def test_budgets_are_split_among_the_actors() -> None:
    from convsim.distributed._ray import _split_budgets

    assert _split_budgets({"rpm": "600", "tpm": "90000", "base_url": "x"}, 3) == {
        "rpm": "200.0",
        "tpm": "30000.0",
        "base_url": "x",
    }


def test_a_killed_driver_is_resumed_with_nothing_lost_or_twice(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "driver.jsonl"
    script = (
        "from convsim.distributed import run_on_ray\n"
        f"run_on_ray('customer_support', 'scripted', out={str(out)!r}, actors=2,\n"
        "           model_args={'latency': '0.15'}, concurrency=2)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
    proc.wait(timeout=30)
    before = len(out.read_text().splitlines())
    assert 3 <= before < 14
    outcome = run_on_ray("customer_support", "scripted", out=out, actors=2, resume=True)
    ids = [r.conversation_id for r in convsim.read_results(out)]
    assert outcome.results == 14 - before
    assert len(ids) == len(set(ids)) == 14


@pytest.mark.anyio
async def test_the_simulator_api_on_ray(tmp_path: Path) -> None:
    from convsim.distributed import RaySimulator

    sink = convsim.JsonlSink(tmp_path / "api.jsonl")
    async with RaySimulator("scripted", actors=2) as sim:
        results = [r async for r in sim.run("customer_support", sink=sink, limit=5)]
    assert len(results) == 5 == len({r.conversation_id for r in results})
    assert len(convsim.read_results(tmp_path / "api.jsonl")) == 5
    assert sim.last is not None and sim.last.results == 5


def test_a_load_test_runs_on_ray_workers_and_merges_their_measurements(tmp_path: Path) -> None:
    from anyio.from_thread import start_blocking_portal
    from click.testing import CliRunner

    from convsim.adapters.mock import MockModelServer, MockServerConfig
    from convsim.cli import main

    out = tmp_path / "load.json"
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(MockServerConfig(ttft_ms=5))) as mock,
    ):
        result = CliRunner().invoke(
            main,
            ["load", "--model", "openai-compatible:mock-model", "--model-arg",
             f"base_url={mock.base_url}", "--rate", "20", "--arrival", "constant",
             "--duration", "2", "--synthetic", "turns=1,input_tokens=8,output_tokens=4",
             "--backend", "ray", "--actors", "2", "--no-calibrate", "--out", str(out)],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["client"]["workers"] == 2
    per_worker = data["client"]["worker_schedule_delay_p99_ms"]
    assert len(per_worker) == 2 and all(d is not None and d >= 0 for d in per_worker)
    assert abs(data["achieved_rate"] - 20.0) < 1.0  # the two shares make the whole schedule
    assert data["requests"]["completed"] >= 35 and data["requests"]["failed"] == 0
