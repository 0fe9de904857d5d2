"""Runs on Ray (a local instance): sharding, results streamed into one file, the same
conversations as in one process, and an actor killed mid-run with nothing lost or twice."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import convsim
from convsim.distributed import run_on_ray, shard_of

pytestmark = pytest.mark.slow  # a local Ray starts for the module

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

    from convsim.cli import _run as run_command
    from convsim.cli import main

    monkeypatch.setattr(run_command, "PROGRESS_LINE_S", 0.0)  # a line at every poll
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
    from convsim.distributed._ray import _actor_settings, _shard_settings

    args = {"rpm": "100", "tpm": "90000", "base_url": "x"}
    settings = _shard_settings("openai-compatible:m", 3, args, None, 0, 32)
    shares = [_actor_settings(settings, 3, k)["model_args"] for k in range(3)]
    assert shares == [
        {"rpm": 34, "tpm": 30000, "base_url": "x"},
        {"rpm": 33, "tpm": 30000, "base_url": "x"},
        {"rpm": 33, "tpm": 30000, "base_url": "x"},
    ]
    assert settings["model_args"] == args  # the run's own settings keep the totals
    with pytest.raises(convsim.ConfigError, match="rpm='fast' is not a number"):
        _shard_settings("openai-compatible:m", 3, {"rpm": "fast"}, None, 0, 32)


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


@pytest.mark.timeout(150)
def test_a_killed_driver_leaves_no_process_of_the_ray_it_started() -> None:
    """SIGKILL the driver alone: the local Ray it started goes too, its agents included
    (Ray kills what the driver started; the raylet's agents linger a minute without help)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    psutil = pytest.importorskip("psutil")
    script = (
        "import sys\n"
        "from convsim.distributed._ray import ensure_ray\n"
        "ensure_ray(None)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )

    def running(processes: list[Any]) -> list[str]:
        left = []
        for p in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(p.cmdline())[:60])
        return left

    session: list[Any] = []
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert _line(proc, timeout=90).strip() == "ready"
            session = psutil.Process(proc.pid).children(recursive=True)  # this Ray's alone
            names = " ".join(" ".join(p.cmdline()) for p in session)
            assert "ray::DashboardAgent" in names and "ray::RuntimeEnvAgent" in names
            os.kill(proc.pid, signal.SIGKILL)  # the driver alone, not its process group
            proc.wait(timeout=30)
            give_up = time.monotonic() + 20  # a hang guard: the agents alone take 60 s
            while running(session):
                assert time.monotonic() < give_up, f"still running: {running(session)}"
                time.sleep(0.1)
        finally:
            proc.kill()
            for p in session:  # left by a failure: this Ray's own processes, by pid
                with contextlib.suppress(psutil.Error):
                    p.kill()


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


@pytest.mark.anyio
async def test_a_stopped_load_test_on_ray_keeps_what_its_actors_measured() -> None:
    import time

    from convsim.adapters.mock import MockModelServer, MockServerConfig
    from convsim.load import LoadPlan, StopRequest, run_load

    stop = StopRequest()
    async with MockModelServer(MockServerConfig(ttft_ms=5)) as mock:
        plan = LoadPlan(
            model_args={"base_url": mock.base_url},
            synthetic="turns=1,input_tokens=8,output_tokens=4",
            rate=20,
            arrival="constant",
            duration=600,
            calibrate=False,
            backend="ray",
            workers=2,
        )

        def measuring() -> None:
            """Until the actors have sent 20 requests (a hang guard, not a clock)."""
            give_up = time.monotonic() + 60
            while mock.statistics().by_endpoint["/v1/chat/completions"] < 20:
                assert time.monotonic() < give_up, "the actors sent no load"
                time.sleep(0.02)

        async def stop_once_measuring() -> None:
            await anyio.to_thread.run_sync(measuring)
            stop.ask()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_once_measuring)
                run = await run_load(plan, stop=stop)
    assert run.result is not None and run.result.partial
    assert run.result.stopped_by == "interrupted"  # type: ignore[union-attr]
    assert run.result.client is not None and run.result.client.workers == 2  # type: ignore[union-attr]
    assert 0 < run.result.duration_s < 60  # type: ignore[union-attr]


class _Recorder:
    """A chat-completions server that answers after ``delay`` seconds, records when each
    request arrived, and answers one request (the ``refuse_at``-th) with a 429."""

    def __init__(self, delay: float, refuse_at: int, retry_after: float) -> None:
        self.delay, self.refuse_at, self.retry_after = delay, refuse_at, retry_after
        self.arrivals: list[float] = []
        self.refused_at: float | None = None

    async def handle(self, request: Any) -> Any:
        import time

        import anyio
        from aiohttp import web

        body = await request.json()
        self.arrivals.append(time.monotonic())
        if len(self.arrivals) == self.refuse_at:
            self.refused_at = self.arrivals[-1]
            return web.json_response(
                {"error": {"message": "slow down", "type": "requests"}},
                status=429,
                headers={"Retry-After": str(self.retry_after)},
            )
        await anyio.sleep(self.delay)
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if body.get("stream"):
            chunk = {"choices": [{"index": 0, "delta": {"content": "fine thanks"}}]}
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
            text = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(end)}\n\ndata: [DONE]\n\n"
            return web.Response(text=text, content_type="text/event-stream")
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "fine thanks"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )


def _serving(recorder: _Recorder) -> Any:
    import contextlib

    from aiohttp import web

    @contextlib.asynccontextmanager
    async def serve() -> Any:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", recorder.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            await runner.cleanup()

    return serve()


def test_a_429_on_one_actor_pauses_every_actor_using_the_key(tmp_path: Path) -> None:
    from anyio.from_thread import start_blocking_portal

    recorder = _Recorder(delay=0.1, refuse_at=6, retry_after=3.0)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_serving(recorder)) as base_url,
    ):
        outcome = run_on_ray(
            "customer_support",
            "openai-compatible:m",
            out=tmp_path / "paused.jsonl",
            actors=2,
            model_args={"base_url": base_url},
            concurrency=2,  # one call at a time per actor
        )
    assert outcome.results == 14 and outcome.pauses_relayed >= 1
    assert recorder.refused_at is not None
    # the actor that got the 429 waits 3 s; the other one hears of it within a few polls
    # (slower when other tests share the cores: once over 2 s, so one call of its own may
    # still come late), and the server then sees nothing from either until the pause is
    # over: an actor that never heard would send a call every 0.1 s, a dozen in the window
    quiet = [t - recorder.refused_at for t in recorder.arrivals if t > recorder.refused_at]
    assert len([t for t in quiet if 1.5 < t < 2.8]) <= 1, quiet
    assert any(t >= 2.8 for t in quiet)  # and the run went on after it


def one_turn_pack(tmp_path: Path, n: int) -> Path:
    pack = tmp_path / "pack"
    pack.mkdir()
    flow = {"max_turns": 1, "turns": [{"turn_id": "t0", "prompt_template": "Hello {n}"}]}
    (pack / "turn_configs.yml").write_text(json.dumps({"default": flow}))
    lines = [
        json.dumps(
            {"scenario_id": f"s{i:03d}", "scenario_description": "hi", "variables": {"n": i}}
        )
        for i in range(n)
    ]
    (pack / "scenarios.jsonl").write_text("\n".join(lines) + "\n")
    return pack


def test_n_actors_together_stay_within_the_servers_rpm(tmp_path: Path) -> None:
    """A mock server that refuses over R requests in any window, and a budget of R split
    between two actors: no 429, with the pace close to R (so a budget that was not split,
    twice R, would be refused). The mock's clock runs 10x, so its minute is 6 s."""
    import time

    from anyio.from_thread import start_blocking_portal

    from convsim.adapters.mock import MockModelServer, MockServerConfig

    pack = one_turn_pack(tmp_path, 360)
    admitted: list[float] = []

    def fast_clock() -> float:
        now = time.monotonic() * 10.0
        admitted.append(now)
        return now

    server = MockModelServer(MockServerConfig(rpm=300), clock=fast_clock)
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(server) as mock:
        outcome = run_on_ray(
            pack,
            "openai-compatible:mock-model",
            out=tmp_path / "rpm.jsonl",
            actors=2,
            # 300 per 6 s is 3,000 per minute of real time: 1,500 for each actor
            model_args={"base_url": mock.base_url, "rpm": "3000"},
            metrics=["latency"],
            concurrency=16,
        )
        stats = server.statistics()
    assert outcome.results == 360
    assert stats.rate_limited == 0
    busiest = max(sum(1 for u in admitted if t - 60.0 < u <= t) for t in admitted)
    assert 270 <= busiest <= 300  # near the limit, never over it


def test_ctrl_c_stops_every_actor_gracefully_and_a_resume_finishes(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "interrupted.jsonl"
    script = (
        "import json\n"
        "from convsim.distributed import run_on_ray\n"
        f"o = run_on_ray('customer_support', 'scripted', out={str(out)!r}, actors=2,\n"
        "               model_args={'latency': '0.3'}, concurrency=2)\n"
        "print(json.dumps({'interrupted': o.interrupted, 'results': o.results}))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)  # the driver alone (a terminal signals the whole group)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout
    outcome = json.loads(stdout.strip().splitlines()[-1])
    recorded = convsim.read_results(out)
    assert outcome["interrupted"] and 2 <= outcome["results"] < 14
    # in-flight conversations had the grace period to finish: none was cut short
    assert all(r.status is convsim.Status.DONE for r in recorded)
    assert len(recorded) == len({r.conversation_id for r in recorded}) == outcome["results"]
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["finished_at"] is not None  # the results file was closed properly
    rest = run_on_ray("customer_support", "scripted", out=out, actors=2, resume=True)
    assert rest.results == 14 - outcome["results"] and not rest.interrupted
    ids = [r.conversation_id for r in convsim.read_results(out)]
    assert len(ids) == len(set(ids)) == 14


@pytest.mark.anyio
async def test_a_ray_run_handle_can_be_stopped_and_waited_for(tmp_path: Path) -> None:
    from convsim.distributed import RaySimulator

    sink = convsim.JsonlSink(tmp_path / "handle.jsonl")
    async with RaySimulator("scripted", actors=2, concurrency=2,
                            model_args={"latency": "0.2"}) as sim:  # fmt: skip
        handle = sim.run("customer_support", sink=sink)
        first = await handle.__anext__()
        handle.stop()
        rest = [r async for r in handle]
        outcome = await handle.wait()
    got = [first, *rest]
    assert outcome.interrupted and len(got) == outcome.results < 14
    assert handle.statistics().finished == outcome.results and handle.statistics().total == 14
    assert len(convsim.read_results(tmp_path / "handle.jsonl")) == len(got)
    assert all(r.status is convsim.Status.DONE for r in got)


def test_a_failing_shard_is_a_config_error_not_an_exception_group(tmp_path: Path) -> None:
    from convsim import ConfigError

    with pytest.raises(ConfigError, match=r"shard \d failed: .*no-such-model"):
        run_on_ray("customer_support", "no-such-model", out=tmp_path / "bad.jsonl", actors=2)


def test_actors_whose_circuit_breaker_trips_are_reported(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pack = one_turn_pack(tmp_path, 120)
    outcome = run_on_ray(
        pack,
        "openai-compatible:m",
        out=tmp_path / "down.jsonl",
        actors=2,
        model_args={"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": "0"},
        metrics=["latency"],
        concurrency=4,
    )
    assert outcome.stopped_early is not None and "in a row" in outcome.stopped_early
    assert outcome.not_run > 0 and outcome.results + outcome.not_run == 120
    assert not outcome.interrupted
    assert len(convsim.read_results(tmp_path / "down.jsonl")) == outcome.results


def test_the_command_line_judges_a_ray_run_as_it_judges_one_process(tmp_path: Path) -> None:
    """Infrastructure failures above --max-failure-rate exit 3, and an endpoint that
    does not answer its check exits 4 before any actor starts or any file is made."""
    from anyio.from_thread import start_blocking_portal
    from click.testing import CliRunner

    from convsim.adapters.mock import MockModelServer, MockServerConfig
    from convsim.cli import main

    failing = MockServerConfig(fault_rate=1.0, faults={"500": 1.0})
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(failing)) as mock,
    ):
        result = CliRunner().invoke(
            main,
            ["run", "customer_support", "--model", "openai-compatible:mock-model",
             "--model-arg", f"base_url={mock.base_url}", "--model-arg", "max_retries=0",
             "--backend", "ray", "--actors", "2", "--out", str(tmp_path / "500.jsonl")],
        )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "14 of 14 conversations failed for infrastructure reasons" in result.output
    assert len(convsim.read_results(tmp_path / "500.jsonl")) == 14

    result = CliRunner().invoke(
        main,
        ["run", "customer_support", "--model", "openai-compatible:m", "--model-arg",
         f"base_url={mock.base_url}", "--backend", "ray", "--actors", "2",
         "--out", str(tmp_path / "gone.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 4, result.output
    assert not (tmp_path / "gone.jsonl").exists()


def _line(proc: Any, timeout: float = 60.0) -> str:
    """The process's next line of output, or a failure (not a hang) when none comes."""
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"no output within {timeout} s")
    return str(proc.stdout.readline())


def test_a_second_signal_cancels_in_flight_conversations_and_a_resume_reruns_them(
    tmp_path: Path,
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "at-once.jsonl"
    script = (
        "import json\n"
        "from convsim.distributed import run_on_ray\n"
        f"o = run_on_ray('customer_support', 'scripted', out={str(out)!r}, actors=2,\n"
        "               model_args={'latency': '1.0'}, concurrency=4,\n"
        "               on_interrupt=lambda at_once: print('heard', at_once, flush=True))\n"
        "print(json.dumps({'interrupted': o.interrupted, 'results': o.results}))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # a result recorded: the others are in flight
        if out.exists() and out.read_text().strip():
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    assert _line(proc).split() == ["heard", "False"]  # a graceful stop, asked
    os.kill(proc.pid, signal.SIGTERM)  # again: at once
    assert _line(proc).split() == ["heard", "True"]
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout
    outcome = json.loads(stdout.strip().splitlines()[-1])
    recorded = convsim.read_results(out)
    statuses = {r.status for r in recorded}
    assert outcome["interrupted"] and convsim.Status.CANCELLED in statuses
    rest = run_on_ray("customer_support", "scripted", out=out, actors=2, resume=True)
    final = convsim.read_results(out)
    assert rest.results >= sum(r.status is convsim.Status.CANCELLED for r in recorded)
    assert len(final) == len({r.conversation_id for r in final}) == 14
    assert all(r.status is convsim.Status.DONE for r in final)


@pytest.mark.anyio
async def test_an_actor_keeps_its_results_until_the_driver_acknowledges_them() -> None:
    """A poll the driver gave up waiting for (a timeout) must not lose what it carried:
    the actor drops results only once a later poll acknowledges them."""
    from convsim.distributed._ray import _Shard

    shard = _Shard()
    shard.buffer += ["a", "b", "c"]
    lost = await shard.take(0)  # the driver never saw this reply
    again = await shard.take(0)
    assert (lost.lines, again.lines, again.first) == (["a", "b", "c"], ["a", "b", "c"], 0)
    shard.buffer.append("d")
    later = await shard.take(2)  # the driver has a and b
    assert (later.lines, later.first) == (["c", "d"], 2)
    assert (await shard.take(4)).lines == [] and shard.base == 4
