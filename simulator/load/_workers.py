"""A load run's workers outside this process: told to stop, killed if they do not, and
never left behind.

A worker process dies with the process that started it, however that one ends (SIGKILL
included): on Linux the kernel kills it (``PR_SET_PDEATHSIG``), and everywhere it exits
when its control pipe from the parent reaches its end. It ignores SIGINT and SIGTERM, so
a terminal's Ctrl-C (sent to the whole process group) or a service manager's SIGTERM
reaches the run through the parent alone, which asks its workers to stop over the pipe.

:func:`collect` runs such workers (processes, or Ray actors through the same
:class:`Worker` protocol) to their end, relaying a :class:`StopRequest`: a stop at once
gives them ``kill_after`` seconds to answer, then kills those that have not.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Protocol

import anyio

from ._stop import StopRequest, ThreadedStop

__all__ = ["Ended", "Job", "ProcessWorker", "Worker", "collect", "run_processes"]

_PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
_JOIN_S = 5.0
"""How long a worker that has answered gets to exit before it is killed."""


@dataclass(frozen=True)
class Job:
    """What a worker runs: ``target(*args, stop)``, ``stop`` a :class:`ThreadedStop`
    that hears the parent's stop requests."""

    target: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Ended:
    """How one worker ended: with a value, with the error it raised, or without an
    answer (it died, or was ``killed`` after a stop at once)."""

    value: Any = None
    error: BaseException | None = None
    answered: bool = True
    killed: bool = False
    exit_code: int | None = None


class Worker(Protocol):
    """A worker running elsewhere, as :func:`collect` drives it."""

    def tell(self, at_once: bool) -> None:
        """Ask the worker to stop (at once, or giving in-flight work its grace)."""

    def result(self) -> Ended:
        """Block until the worker answers or ends."""

    def kill(self) -> None:
        """End the worker now."""


async def collect(
    workers: Sequence[Worker], stop: StopRequest, *, kill_after: float
) -> list[Ended]:
    """Every worker's end, in order; ``stop``'s requests are relayed to them all, and
    ``kill_after`` seconds after a stop at once, those still running are killed."""
    killed: set[int] = set()
    ended: list[Ended] = [Ended(answered=False)] * len(workers)

    async def kill_late() -> None:
        await anyio.sleep(kill_after)
        for index, worker in enumerate(workers):
            killed.add(index)
            worker.kill()

    async def wait(index: int, worker: Worker) -> None:
        # abandoned when the caller gives up: the worker is then killed, its thread ends
        end = await anyio.to_thread.run_sync(worker.result, abandon_on_cancel=True)
        ended[index] = replace(end, killed=index in killed and not end.answered)

    async with anyio.create_task_group() as guard:

        def relay(at_once: bool) -> None:
            for worker in workers:
                worker.tell(at_once)
            if at_once:
                guard.start_soon(kill_late)

        with stop.listening(relay):
            async with anyio.create_task_group() as waiting:
                for index, worker in enumerate(workers):
                    waiting.start_soon(wait, index, worker)
        guard.cancel_scope.cancel()
    return ended


async def run_processes(
    jobs: Sequence[Job], stop: StopRequest, *, kill_after: float
) -> list[Ended]:
    """Run each job in a :class:`ProcessWorker` of its own, as :func:`collect` does;
    none outlives the call, however it ends (cancelled too)."""
    workers: list[ProcessWorker] = []

    async def send(worker: ProcessWorker, job: Job) -> None:
        await anyio.to_thread.run_sync(worker.send, job, abandon_on_cancel=True)

    try:
        for _ in jobs:
            workers.append(ProcessWorker())  # in this thread: see ProcessWorker
        async with anyio.create_task_group() as sending:
            for worker, job in zip(workers, jobs, strict=True):
                sending.start_soon(send, worker, job)
        return await collect(workers, stop, kill_after=kill_after)
    finally:
        for worker in workers:
            worker.close()


@dataclass(frozen=True)
class _Stop:
    """A stop request sent down a worker's control pipe."""

    at_once: bool


@dataclass(frozen=True)
class _Reply:
    """A worker's answer, up its result pipe."""

    value: Any = None
    error: BaseException | None = None


class ProcessWorker:
    """A worker process (spawned: a fresh interpreter) running one :class:`Job`.

    Start it from a thread that outlives it, such as the event loop's: on Linux, the
    kernel kills the worker when the thread that started it ends.
    """

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        reads, self._control = context.Pipe(duplex=False)
        self._results, writes = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_worker_process,
            args=(reads, writes, os.getpid()),
            name="convsim-load-worker",
        )
        self.process.start()
        # only the worker holds these ends now: its death reads as the end of our pipe
        reads.close()
        writes.close()

    def send(self, job: Job) -> None:
        """Hand the worker its job (blocking while a large one is written); before any
        :meth:`tell`."""
        with contextlib.suppress(OSError):  # a worker that died reads nothing
            self._control.send(job)

    def tell(self, at_once: bool) -> None:
        with contextlib.suppress(OSError):
            self._control.send(_Stop(at_once))

    def result(self) -> Ended:
        try:
            reply: _Reply = self._results.recv()
        except (EOFError, OSError):
            self.process.join(_JOIN_S)
            return Ended(answered=False, exit_code=self.process.exitcode)
        self.process.join(_JOIN_S)
        return Ended(reply.value, reply.error, exit_code=self.process.exitcode)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def close(self) -> None:
        """Kill the worker if it still runs, and free its pipes."""
        self.kill()
        self.process.join(_JOIN_S)
        self._control.close()
        self._results.close()


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent ends (Linux); elsewhere the
    control pipe's end does it (:func:`_listen`)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def _listen(control: Connection, stop: ThreadedStop) -> None:
    """Relay the parent's stop requests; exit at once when the parent is gone."""
    while True:
        try:
            message: _Stop = control.recv()
        except (EOFError, OSError):
            os._exit(1)  # no one is left to read this worker's figures
        stop.ask(message.at_once)


def _worker_process(control: Connection, results: Connection, parent: int) -> None:
    """A worker process's body: receive the job, run it, send back what it returned or
    raised."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        job: Job = control.recv()
    except (EOFError, OSError):
        os._exit(1)
    stop = ThreadedStop()
    threading.Thread(
        target=_listen, args=(control, stop), name="stop-listener", daemon=True
    ).start()
    try:
        reply = _Reply(value=job.target(*job.args, stop))
    except Exception as exc:
        reply = _Reply(error=exc)
    try:
        results.send(reply)
    except Exception as exc:  # what does not pickle is sent as text
        what = reply.error if reply.error is not None else exc
        results.send(_Reply(error=RuntimeError(f"{type(what).__name__}: {what}")))
