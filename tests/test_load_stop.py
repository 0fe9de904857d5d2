"""Stopping ``convsim load``: SIGINT and SIGTERM write what was measured, marked partial,
and exit 130; a second signal stops at once, also against a server that never answers;
no worker process outlives the command, not even a SIGKILLed one. And the parts below:
stop requests, their relay to workers, a stopped sweep."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from conftest import Convsim

from convsim import ConvsimError
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.load import LoadPlan, NothingMeasured, StopRequest, run_load
from convsim.load._plan import _measured
from convsim.load._stop import ThreadedStop
from convsim.load._workers import Ended, Job, collect, run_processes

psutil = pytest.importorskip("psutil")

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A mock model slow enough that requests are in flight when a signal comes."""
    config = MockServerConfig(ttft_ms=20, itl_ms=2)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as mock,
    ):
        yield mock


class StalledServer:
    """Lists its model, then takes every generation request and never answers it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(65536)
            if not chunk:
                conn.close()
                return
            head += chunk
        if head.startswith(b"GET /v1/models"):
            body = b'{"object": "list", "data": [{"id": "mock-model", "object": "model"}]}'
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            conn.close()
        else:
            self.held.append(conn)  # read, never answered

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def stalled() -> Iterator[StalledServer]:
    server = StalledServer()
    yield server
    server.close()


def load(base_url: str, out: Path, *args: str) -> Convsim:
    return Convsim(
        "load",
        "--model", "openai-compatible:mock-model",
        "--model-arg", f"base_url={base_url}",
        "--synthetic", "turns=3,input_tokens=16,output_tokens=8",
        "--no-calibrate",
        "--duration", "600",
        "--out", str(out),
        *args,
    )  # fmt: skip


def processes_under(pid: int) -> list[Any]:
    """The process ``pid`` started, and theirs."""
    return list(psutil.Process(pid).children(recursive=True))


def gone(processes: list[Any]) -> bool:
    """Every one has ended (a zombie has: it only waits to be reaped)."""
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Poll ``condition`` until it holds (a hang guard with a deadline, not a clock)."""
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"no {what} in {timeout} s"
        time.sleep(0.02)


@pytest.fixture
def leftovers() -> Iterator[list[Any]]:
    """Processes a failed test may leave behind: killed after it, so that none goes on
    sending to the next test's server."""
    processes: list[Any] = []
    yield processes
    for p in processes:
        if not gone([p]):
            p.kill()


def started_workers(run: Convsim, count: int, leftovers: list[Any]) -> list[Any]:
    """Every process under ``run`` once ``count`` workers are up (multiprocessing's
    resource tracker too)."""

    def workers() -> list[Any]:
        under = processes_under(run.proc.pid)
        return [p for p in under if "spawn_main" in " ".join(p.cmdline())]

    run.wait_for(lambda: len(workers()) >= count, f"{count} worker processes")
    leftovers.extend(processes_under(run.proc.pid))
    return processes_under(run.proc.pid)


def workers_in(processes: list[Any]) -> list[Any]:
    """The load's worker processes among ``processes`` (not multiprocessing's resource
    tracker)."""
    return [p for p in processes if "spawn_main" in " ".join(p.cmdline())]


def sending(worker: Any, base_url: str) -> bool:
    """``worker`` has two requests open to the server at once (its two sessions): its
    run has begun, past the single request of its preflight."""
    port = urlsplit(base_url).port
    open_to_server = [
        c
        for c in worker.net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]
    return len(open_to_server) >= 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "signum"), [(2, signal.SIGTERM), (1, signal.SIGINT)], ids=["2-SIGTERM", "1-SIGINT"]
)
def test_a_signal_writes_what_was_measured_and_leaves_no_worker(
    server: Any, tmp_path: Path, workers: int, signum: int, leftovers: list[Any]
) -> None:
    out = tmp_path / "load.json"
    with load(server.base_url, out, "--concurrency", "4", "--workers", str(workers)) as run:
        children = started_workers(run, workers, leftovers) if workers > 1 else []
        # a worker still starting on a busy machine would be stopped before it measured
        run.wait_for(
            lambda: all(sending(p, server.base_url) for p in workers_in(children)), "sends"
        )
        sent = server.statistics().by_endpoint[CHAT]
        run.wait_for(lambda: server.statistics().by_endpoint[CHAT] >= sent + 40, "load sent")
        run.interrupt(signum)
        run.wait_for_line("stopping: no new requests")
        assert run.finish(timeout=20) == 130, run.stderr
    assert "the result holds what was measured" in run.stderr
    result = json.loads(out.read_text())
    assert result["partial"] is True and result["partial_reason"] == "interrupted"
    assert result["stopped_by"] == "interrupted"
    assert 0 < result["duration_s"] < 600
    assert result["requests"]["completed"] >= 20 and result["client"]["workers"] == workers
    wait_until(lambda: gone(children), "end of every worker process", timeout=10)


@pytest.mark.slow
def test_two_sigints_end_a_run_against_a_server_that_never_answers(
    stalled: StalledServer, tmp_path: Path, leftovers: list[Any]
) -> None:
    out = tmp_path / "stalled.json"
    with load(stalled.base_url, out, "--concurrency", "4", "--workers", "2") as run:
        children = started_workers(run, 2, leftovers)
        run.wait_for(lambda: len(stalled.held) >= 4, "requests held by the server")
        run.interrupt()
        run.wait_for_line("stopping: no new requests")
        run.interrupt()
        run.wait_for_line("stopping at once")
        assert run.finish(timeout=15) == 130, run.stderr
    result = json.loads(out.read_text())
    assert result["partial"] is True and result["requests"]["completed"] == 0
    assert not result["valid"] and "no request completed" in " ".join(result["invalid_reasons"])
    assert any("in flight, cancelled" in note for note in result["notes"])
    wait_until(lambda: gone(children), "end of every worker process", timeout=10)


@pytest.mark.slow
def test_a_killed_command_takes_its_workers_along(
    server: Any, tmp_path: Path, leftovers: list[Any]
) -> None:
    with load(server.base_url, tmp_path / "x.json", "--concurrency", "4", "--workers", "2") as run:
        children = started_workers(run, 2, leftovers)
        sent = server.statistics().by_endpoint[CHAT]
        run.wait_for(lambda: server.statistics().by_endpoint[CHAT] >= sent + 20, "load sent")
        run.interrupt(signal.SIGKILL)
        run.finish()
    wait_until(lambda: gone(children), "end of every worker process", timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_stop_before_the_window_writes_no_result(
    server: Any, tmp_path: Path, workers: int, leftovers: list[Any]
) -> None:
    out = tmp_path / "none.json"
    args = ("--concurrency", "2", "--warmup", "600", "--workers", str(workers))
    with load(server.base_url, out, *args) as run:
        children = started_workers(run, workers, leftovers) if workers > 1 else []
        if workers == 1:
            run.wait_for_line("warming up")
        run.interrupt()
        assert run.finish(timeout=20) == 130, run.stderr
    assert "before anything was measured" in run.stderr and not out.exists()
    assert "Traceback" not in run.stderr
    wait_until(lambda: gone(children), "end of every worker process", timeout=10)


# -- the parts -------------------------------------------------------------------------


def test_a_stop_request_is_graceful_first_then_at_once() -> None:
    stop = StopRequest()
    heard: list[bool] = []
    with stop.listening(heard.append):
        stop.ask()
        stop.ask()
        stop.ask()  # nothing is stronger than at once
    stop.ask()  # no longer listening
    assert heard == [False, True] and stop.asked and stop.at_once
    late: list[bool] = []
    with stop.listening(late.append):
        pass
    assert late == [True]  # a listener that comes late hears where things stand


@pytest.mark.anyio
async def test_a_threaded_stop_reaches_the_loop_also_when_asked_before_it_serves() -> None:
    early = ThreadedStop()
    early.ask(False)  # before the loop serves: kept
    async with early.serves() as request:
        assert request.asked and not request.at_once
        await anyio.to_thread.run_sync(early.ask, True)  # from another thread
        assert request.at_once
    early.ask(True)  # after: nothing to reach, and no error


@pytest.mark.anyio
async def test_an_error_while_a_threaded_stop_serves_comes_out_as_raised() -> None:
    with pytest.raises(NothingMeasured, match="before the start"):
        async with ThreadedStop().serves():
            raise NothingMeasured("before the start")


class SilentWorker:
    """A worker that answers only when killed (then without an answer)."""

    def __init__(self) -> None:
        self.told: list[bool] = []
        self.killed = threading.Event()

    def tell(self, at_once: bool) -> None:
        self.told.append(at_once)

    def result(self) -> Ended:
        self.killed.wait()
        return Ended(answered=False, exit_code=-9)

    def kill(self) -> None:
        self.killed.set()


class PoliteWorker(SilentWorker):
    """Answers as soon as it is told to stop."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = threading.Event()

    def tell(self, at_once: bool) -> None:
        super().tell(at_once)
        self.stopped.set()

    def result(self) -> Ended:
        self.stopped.wait()
        return Ended("measured")


@pytest.mark.anyio
async def test_workers_hear_each_stop_and_one_that_does_not_answer_is_killed() -> None:
    stop = StopRequest()
    silent, polite = SilentWorker(), PoliteWorker()

    async def stop_twice() -> None:
        stop.ask()
        stop.ask()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_twice)
            ends = await collect([silent, polite], stop, kill_after=0.0)
    assert silent.told == polite.told == [False, True]
    assert ends[0].killed and not ends[0].answered
    assert ends[1] == Ended("measured")
    measured = _measured(ends)
    assert measured.outcomes == ["measured"]
    assert "worker 0 did not answer" in measured.notes[0]


def _wait_for_ever(started: Path, stop: ThreadedStop) -> None:
    """A worker's job that says it started, then ends only when its process does."""
    started.touch()
    threading.Event().wait()


@pytest.mark.slow
@pytest.mark.anyio
async def test_cancelled_worker_processes_are_killed(tmp_path: Path, leftovers: list[Any]) -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    marks = [tmp_path / "0", tmp_path / "1"]

    def workers() -> list[Any]:
        """The worker processes started since (not multiprocessing's resource tracker,
        which serves this process for its life)."""
        found = []
        for p in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.pid not in before and "spawn_main" in " ".join(p.cmdline()):
                    found.append(p)
        return found

    def both_running() -> bool:
        return all(m.exists() for m in marks)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            jobs = [Job(_wait_for_ever, (mark,)) for mark in marks]
            tg.start_soon(partial(run_processes, jobs, StopRequest(), kill_after=60))
            await anyio.to_thread.run_sync(wait_until, both_running, "both jobs running")
            running = workers()
            leftovers.extend(running)
            tg.cancel_scope.cancel()  # while this process waits for their answers
    assert len(running) == 2 and gone(running)


def test_a_worker_that_dies_unasked_is_an_error() -> None:
    with pytest.raises(ConvsimError, match=r"worker 1 ended without a result \(exit code -9\)"):
        _measured([Ended("measured"), Ended(answered=False, exit_code=-9)])


@pytest.mark.anyio
async def test_a_stopped_sweep_keeps_the_points_it_measured() -> None:
    stop = StopRequest()

    def report(line: str) -> None:
        if line.startswith("sweep: rate 40"):
            stop.ask()  # as the third point is about to start

    async with MockModelServer(MockServerConfig(ttft_ms=1)) as mock:
        plan = LoadPlan(
            model_args={"base_url": mock.base_url},
            synthetic="turns=1,input_tokens=8,output_tokens=4",
            rate=10,
            sweep="10,20,40",
            duration=0.3,
            arrival="constant",
            calibrate=False,
        )
        run = await run_load(plan, report=report, stop=stop)
    assert run.result is not None and run.result.partial
    assert run.result.partial_reason == "interrupted"
    assert [p.target_rate for p in run.result.points] == [10, 20]  # type: ignore[union-attr]
    assert {point for point, _ in run.requests} == {0, 1}
