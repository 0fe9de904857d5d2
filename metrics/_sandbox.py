"""Running an answer's Python and a task's test cases in a subprocess with limits.

Each run is a new ``python -I`` process (isolated mode: no user site-packages, no
``PYTHON*`` variables, the working folder not on ``sys.path``) in a new temporary folder
that is deleted afterwards, with an environment of its own (no proxies, no keys: only
``PATH``, ``HOME`` and ``TMPDIR`` pointing at the folder, and a UTF-8 locale), in a
session of its own so that it can be killed whole. :mod:`._sandbox_child` sets its
limits and its audit hook before the answer's code runs; see there for what they refuse.

What this gives: a step that loops is stopped after its time; a memory bomb meets
``MemoryError`` at the address-space limit; a flood of output meets the file-size limit;
reading or writing files outside the folder (Python's own installation may be read),
sockets, name lookups, starting processes and ctypes are refused with PermissionError;
a process that outlives every step's time is killed. What it does not give: a network
or file-system namespace, a different user, or protection from native code (a C
extension already installed can do what the audit hook does not see), nor from an
answer written to fool its own tests (it runs in the same process as them). Resource
limits need POSIX; elsewhere nothing runs and the caller is told why.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from ._once import LoadedOnce

__all__ = [
    "SandboxLimits",
    "StepOutcome",
    "SandboxRun",
    "SandboxUnavailable",
    "run_python",
    "sandbox_unavailable",
]

StepKind = Literal["block", "setup", "case"]
"""A block of the answer's code, the task's setup, or one of its test cases."""
StepStatus = Literal["passed", "failed", "error", "timeout", "memory", "not_run"]
"""``failed``: an assertion failed; ``error``: another exception; ``timeout`` and
``memory``: a limit stopped it; ``not_run``: the process ended before it."""

_CHILD = Path(__file__).with_name("_sandbox_child.py")
STARTUP_S = 10.0
"""Seconds a process may take to start and set its limits, on top of its steps' time."""
OUTPUT_BYTES = 1 << 20
"""The most the code may print, in bytes (the file-size limit)."""
_KEPT_OUTPUT = 2000


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (no POSIX resource limits, no interpreter to start)."""


def sandbox_unavailable() -> str | None:
    """Why code cannot run in the sandbox on this machine, or None when it can."""
    if os.name != "posix":
        return "running code needs POSIX resource limits (Linux, macOS)"
    if not sys.executable:
        return "no Python interpreter to start (sys.executable is empty)"
    return None


@dataclass(frozen=True)
class SandboxLimits:
    """How long each step may run and how much memory the process may use."""

    timeout_s: float = 5.0
    """Seconds per step: each block of the answer's code, the setup, each case."""
    memory_mb: int = 512
    """The process's address space, in MiB."""

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s must be a positive number, not {self.timeout_s!r}")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb must be at least 64, not {self.memory_mb!r}")


@dataclass(frozen=True)
class StepOutcome:
    """What one step (a block of the answer, the setup, a test case) did."""

    step: StepKind
    index: int
    status: StepStatus
    message: str = ""


@dataclass(frozen=True)
class SandboxRun:
    """One run: every step's outcome, in order, and how the process ended."""

    steps: tuple[StepOutcome, ...]
    returncode: int | None
    """The process's exit status (negative: the signal that ended it)."""
    killed: bool
    """The process outlived the time of all its steps and was killed."""
    output: str
    """The start of what the code printed."""
    limits: dict[str, int]
    """The resource limits the process set, by name."""

    def cases(self) -> tuple[StepOutcome, ...]:
        return tuple(s for s in self.steps if s.step == "case")


@LoadedOnce
def _slots() -> threading.BoundedSemaphore:
    """One sandbox process per CPU at a time: more would only make each step's time
    limit measure the others' work."""
    return threading.BoundedSemaphore(max(1, os.cpu_count() or 1))


def _environment(folder: str) -> dict[str, str]:
    return {
        "PATH": os.defpath,
        "HOME": folder,
        "TMPDIR": folder,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def run_python(
    blocks: Sequence[str],
    cases: Sequence[str],
    *,
    setup: str = "",
    limits: SandboxLimits = SandboxLimits(),  # frozen, so shared safely
) -> SandboxRun:
    """Run ``blocks`` (the answer's code) in order in one namespace, then ``setup``, then
    each of ``cases``, in a new sandboxed process; blocks here, off the event loop.

    Raises:
        SandboxUnavailable: code cannot run here, or the process could not start or
            never set its limits (nothing of the answer's code ran then).
    """
    why = sandbox_unavailable()
    if why is not None:
        raise SandboxUnavailable(why)
    steps = len(blocks) + (1 if setup else 0) + len(cases)
    budget = limits.timeout_s * steps
    spec = {
        "blocks": list(blocks),
        "setup": setup,
        "cases": list(cases),
        "timeout_s": limits.timeout_s,
        "memory_mb": limits.memory_mb,
        "cpu_s": math.ceil(budget) + 1,
        "output_bytes": OUTPUT_BYTES,
    }
    with _slots(), tempfile.TemporaryDirectory(prefix="convsim-code-") as folder:
        ended = _run(folder, json.dumps(spec), STARTUP_S + budget)
        output = _read_output(Path(folder) / "output.txt")
    lines = _lines(ended.report)
    if not lines or not lines[0].get("ready"):
        detail = ended.errors.strip().splitlines()[-1:] or [f"exit status {ended.returncode}"]
        raise SandboxUnavailable(f"the sandbox process did not start: {detail[0][:300]}")
    outcomes = _outcomes(lines[1:], blocks, setup, cases)
    limits_set = dict(lines[0].get("limits", {}))
    return SandboxRun(outcomes, ended.returncode, ended.killed, output, limits_set)


class _Ended(NamedTuple):
    """How the process ended and what it wrote on its two pipes."""

    report: str
    returncode: int | None
    killed: bool
    errors: str


def _run(folder: str, spec: str, budget: float) -> _Ended:
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _CHILD.read_text(encoding="utf-8")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=folder,
            env=_environment(folder),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise SandboxUnavailable(f"cannot start {sys.executable}: {exc}") from exc
    killed = False
    try:
        stdout, stderr = process.communicate(spec.encode(), timeout=budget)
    except subprocess.TimeoutExpired:
        killed = True
        _kill(process)
        stdout, stderr = process.communicate()
    except BaseException:  # cancelled or interrupted: leave no process behind
        _kill(process)
        process.communicate()
        raise
    return _Ended(
        stdout.decode("utf-8", "replace"),
        process.returncode,
        killed,
        stderr.decode("utf-8", "replace"),
    )


def _kill(process: subprocess.Popen[bytes]) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
        os.killpg(process.pid, signal.SIGKILL)


def _read_output(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(_KEPT_OUTPUT).decode("utf-8", "replace")
    except OSError:
        return ""


def _lines(report: str) -> list[dict[str, Any]]:
    """The report's JSON objects, up to the first line that is not one."""
    lines: list[dict[str, Any]] = []
    for line in report.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            break
        if not isinstance(item, dict):
            break
        lines.append(item)
    return lines


def _outcomes(
    lines: list[dict[str, Any]], blocks: Sequence[str], setup: str, cases: Sequence[str]
) -> tuple[StepOutcome, ...]:
    """Every step, in order: as reported, else not run (the process ended first)."""
    planned: list[tuple[StepKind, int]] = [("block", i) for i in range(len(blocks))]
    if setup:
        planned.append(("setup", 0))
    planned.extend(("case", i) for i in range(len(cases)))
    reported = {(line.get("step"), line.get("index")): line for line in lines if "step" in line}
    outcomes = []
    for step, index in planned:
        line = reported.get((step, index), {})
        status = line.get("status")
        if status in _REPORTED:
            outcomes.append(StepOutcome(step, index, status, str(line.get("message", ""))))
        else:
            outcomes.append(StepOutcome(step, index, "not_run"))
    return tuple(outcomes)


_REPORTED = ("passed", "failed", "error", "timeout", "memory")
