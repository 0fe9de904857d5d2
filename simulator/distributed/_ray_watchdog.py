"""A local Ray that ends with the driver that started it, however the driver ends.

Ray ties the processes a driver starts (GCS, raylet, dashboard, monitors) to it with the
kernel's parent-death signal, but the raylet's own children, ``ray::DashboardAgent``
and ``ray::RuntimeEnvAgent``, outlive a SIGKILLed driver: they notice the raylet's
death, then spend a minute trying to report it to a GCS that is gone.

:func:`guard_local_ray` starts a small watchdog process in a session of its own (a
terminal's Ctrl-C or a kill of the driver's process group does not reach it) holding
the read end of a pipe whose write end only the driver holds. When the driver ends, the
pipe does too; the watchdog then stops what is left of that Ray session: the processes
the driver's ``ray.init`` started (recorded with their start times, so a reused pid is
never taken for one of them) and any started later by the same raylet. Other Ray
sessions on the machine are not touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Collection, Iterator
from typing import Any

from convsim._log import get_logger

__all__ = ["guard_local_ray"]

log = get_logger("convsim.distributed")

_TERM_GRACE_S = 1.0
"""Seconds the processes left get after SIGTERM, before SIGKILL."""
_ARMED = b"armed\n"


def guard_local_ray(session_dir: str, started_before: Collection[int]) -> None:
    """Have the Ray session at ``session_dir``, just started by this process, stopped
    when this process ends. ``started_before``: pids of this process's descendants from
    before ``ray.init`` (not Ray's). Needs psutil and ``os.posix_spawn`` (not Windows,
    where Ray ties its processes to the driver itself)."""
    import psutil

    if not hasattr(os, "posix_spawn"):
        return
    watched = list(_session_processes(psutil.Process(), session_dir, set(started_before)))
    raylet = next((p for p in watched if p.name() == "raylet"), None)
    plan = {
        "processes": [[p.pid, p.create_time()] for p in watched],
        "raylet": None if raylet is None else [raylet.pid, raylet.create_time()],
    }
    reads, writes = os.pipe()
    answers, says = os.pipe()
    try:
        _spawn([sys.executable, "-m", __name__], stdin=reads, stdout=says)
    finally:
        os.close(reads)
        os.close(says)
    # ``writes`` stays open for the life of this process, on purpose: the kernel closes
    # it when the process ends, however it ends, and that end is the watchdog's signal
    with contextlib.suppress(BrokenPipeError):  # a watchdog that failed to start
        os.write(writes, json.dumps(plan).encode() + b"\n")
    with os.fdopen(answers, "rb") as reply:
        armed = reply.readline() == _ARMED
    if armed:
        log.debug("ray_watchdog_armed", session_dir=session_dir, processes=len(watched))
    else:
        log.warning("ray_watchdog_failed", session_dir=session_dir)


def _session_processes(driver: Any, session_dir: str, before: set[int]) -> Iterator[Any]:
    """The processes of the Ray session ``driver`` started: those naming the session's
    folder, and everything they started (the raylet's agents and workers)."""
    import psutil

    seen: set[int] = set()
    for p in driver.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid in before or session_dir not in " ".join(p.cmdline()):
                continue
            for q in [p, *p.children(recursive=True)]:
                if q.pid not in seen:
                    seen.add(q.pid)
                    yield q


def _spawn(argv: list[str], *, stdin: int, stdout: int) -> None:
    """Start ``argv`` in a new session with these standard input and output; no object
    is kept to reap it: it outlives this process."""
    actions = [(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, stdout, 1)]
    try:
        os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setsid=True)
    except NotImplementedError:  # no POSIX_SPAWN_SETSID: a process group of its own
        os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setpgroup=0)


# -- the watchdog process ---------------------------------------------------------------


def _main() -> None:
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    plan = json.loads(sys.stdin.buffer.readline())
    watched = [p for p in (_same(psutil, pid, at) for pid, at in plan["processes"]) if p]
    sys.stdout.buffer.write(_ARMED)
    sys.stdout.close()
    while sys.stdin.buffer.read(4096):  # until the driver ends
        pass
    ended_at = time.time()
    left = [p for p in watched if _running(psutil, p)]
    if plan["raylet"] is not None:
        raylet, created = plan["raylet"]
        left.extend(_started_later(psutil, raylet, created, ended_at, {p.pid for p in left}))
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=_TERM_GRACE_S)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


def _same(psutil: Any, pid: int, created: float) -> Any:
    """The process ``pid`` if it is still the one started at ``created``."""
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        if p.create_time() == created:
            return p
    return None


def _running(psutil: Any, p: Any) -> bool:
    with contextlib.suppress(psutil.Error):
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    return False


def _started_later(
    psutil: Any, raylet: int, raylet_created: float, ended_at: float, known: set[int]
) -> Iterator[Any]:
    """Processes the raylet started after the driver's ``ray.init`` (they carry its pid
    as RAY_RAYLET_PID), started before the driver ended and before any other process
    took the raylet's pid."""
    newer = _same(psutil, raylet, raylet_created) is None and psutil.pid_exists(raylet)
    until = ended_at
    if newer:
        with contextlib.suppress(psutil.Error):
            until = min(until, psutil.Process(raylet).create_time())
    for p in psutil.process_iter(["pid", "create_time"]):
        if p.pid in known or p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if not raylet_created <= p.info["create_time"] <= until:
                continue
            if p.environ().get("RAY_RAYLET_PID") == str(raylet):
                yield p


if __name__ == "__main__":
    _main()
