"""The child side of the code sandbox: run an answer's code, then a task's test cases.

convsim never imports this module: :mod:`convsim.metrics._sandbox` hands its source to
``python -I -c`` in a fresh process whose working folder is a new temporary folder.
Standard library only, and nothing runs on import.

What it reads on stdin (JSON): ``blocks`` (the answer's code, in order), ``setup``,
``cases``, ``timeout_s``, ``memory_mb``, ``cpu_s``, ``output_bytes``. What it writes, one
JSON object per line, on the stdout it was started with: ``{"ready": ...}`` once the
limits hold, then one ``{"step": "block"|"setup"|"case", "index": i, "status": ...}`` per
step, then ``{"done": true}``. What the code prints goes to ``output.txt`` in the folder.

Before any of the answer's code runs it

- sets resource limits (address space, CPU seconds, file size, open files, processes,
  no core files), soft and hard, so the code cannot raise them again;
- installs an audit hook (PEP 578) that refuses, with PermissionError: opening a file
  outside the folder (reading Python's own installation excepted), changing a file
  outside it, sockets and name lookups, starting processes, signalling processes,
  loading native code through ctypes (importing it raises ImportError, as if it were
  not installed), and changing resource limits;
- gives each step ``timeout_s`` seconds (a timer signal).

An audit hook is not a security boundary: C code (an installed extension module) can
do what the hook does not see. It keeps honest mistakes and casual escapes of generated
code inside the folder; for code that may be hostile, run convsim in a container.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from typing import Any

WORK = "."
OUTPUT = "output.txt"

# events refused outright
_REFUSED = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "os.startfile",
        "pty.spawn",
        "socket.__new__",
        "socket.bind",
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
        "socket.sendto",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.addressof",
        "ctypes.cdata",
        "ctypes.call_function",
        "resource.setrlimit",
        "resource.prlimit",
        "webbrowser.open",
    }
)
# events whose first argument is a path that may only be changed inside the folder
_CHANGES = frozenset(
    {
        "os.chdir",
        "os.chflags",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.mkdir",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.symlink",
        "os.truncate",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "shutil.chown",
        "shutil.copyfile",
        "shutil.copytree",
        "shutil.make_archive",
        "shutil.move",
        "shutil.rmtree",
        "shutil.unpack_archive",
    }
)
# events whose first argument is a path that may be read inside the folder or Python
_READS = frozenset({"os.listdir", "os.scandir", "os.listxattr", "os.getxattr", "glob.glob"})
_NATIVE = frozenset({"ctypes", "_ctypes"})


def _within(path: Any, roots: tuple[str, ...]) -> bool:
    if isinstance(path, int):  # an open file descriptor: it was checked when opened
        return True
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _guard(work: str, python: tuple[str, ...]) -> None:
    """Install the audit hook that keeps the code's files inside ``work``."""
    writable = (work,)
    readable = (work, *python)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if path is None:
                return
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                (flags or 0) & write_flags
            )
            if not _within(path, writable if writes else readable):
                what = "writing" if writes else "reading"
                raise PermissionError(f"sandbox: {what} {path!r} is outside the answer's folder")
        elif event in _REFUSED:
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event in _CHANGES:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            if not all(_within(p, writable) for p in paths):
                raise PermissionError(f"sandbox: {event} outside the answer's folder")
        elif event in _READS:
            if args and args[0] is not None and not _within(args[0], readable):
                raise PermissionError(f"sandbox: {event} outside the answer's folder")
        elif event == "import" and args[0] in _NATIVE:
            # ImportError, as if it were not installed: libraries that can do without
            # it (numpy) still import
            raise ImportError(f"sandbox: importing {args[0]} is not allowed")

    sys.addaudithook(hook)


def _limit(spec: dict[str, Any]) -> dict[str, int]:
    """Set the process's resource limits (soft = hard); the limits set, by name."""
    import resource

    memory = int(spec["memory_mb"]) * 1024 * 1024
    wanted = {
        "RLIMIT_AS": memory,
        "RLIMIT_CPU": int(spec["cpu_s"]),
        "RLIMIT_FSIZE": int(spec["output_bytes"]),
        "RLIMIT_NOFILE": 64,
        "RLIMIT_NPROC": 0,
        "RLIMIT_CORE": 0,
    }
    done: dict[str, int] = {}
    for name, value in wanted.items():
        limit = getattr(resource, name, None)
        if limit is None:
            continue
        _, hard = resource.getrlimit(limit)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(limit, (value, value))
        done[name] = value
    return done


class StepTimeout(BaseException):
    """A step ran past its time (a BaseException: ``except Exception`` does not catch it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise StepTimeout


def _outcome(exc: BaseException) -> tuple[str, str]:
    message = f"{type(exc).__name__}: {exc}"[:500]
    if isinstance(exc, StepTimeout):
        return "timeout", "the step ran past its time limit"
    if isinstance(exc, MemoryError):
        return "memory", message
    if isinstance(exc, AssertionError):
        return "failed", message
    return "error", message


def main() -> None:
    import signal

    spec = json.loads(sys.stdin.read())
    report = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")

    def send(**fields: Any) -> None:
        report.write(json.dumps(fields) + "\n")

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)

    sys.dont_write_bytecode = True
    limits = _limit(spec)
    work = os.path.realpath(WORK)
    python = tuple(
        {
            os.path.realpath(p)
            for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
        }
        | {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
    )
    _guard(work, python)
    signal.signal(signal.SIGALRM, _on_alarm)
    send(ready=True, limits=limits)

    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    steps = [("block", i, code) for i, code in enumerate(spec["blocks"])]
    if spec.get("setup"):
        steps.append(("setup", 0, spec["setup"]))
    steps += [("case", i, code) for i, code in enumerate(spec["cases"])]
    timeout = float(spec["timeout_s"])
    for step, index, code in steps:
        status, message = "passed", ""
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                exec(compile(code, f"<{step} {index}>", "exec", dont_inherit=True), namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:  # the code may raise anything, SystemExit included
            status, message = _outcome(exc)
        send(step=step, index=index, status=status, message=message)
    send(done=True)


if __name__ == "__main__":
    main()
