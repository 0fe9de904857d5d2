"""``convsim serve`` (and other serving commands) in a subprocess on loopback, for the
service's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "convsim", *args], capture_output=True, text=True, check=True
    )
    return done.stdout


class LoopbackProcess:
    """A ``convsim`` command serving on a loopback port; its output goes to ``log``.
    :meth:`start` returns once ``ready_path`` answers."""

    what = "the process"
    ready_path = "/"

    def __init__(
        self, log: Path, *, env: Mapping[str, str] | None = None, port: int | None = None
    ) -> None:
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "convsim", *self.command()],
                stdout=log, stderr=log, env=self.env,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited: {self.log.read_text()}")
            try:
                httpx.get(self.url + self.ready_path, timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.what} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Server(LoopbackProcess):
    """A service process; its stderr (the server's log) goes to ``log``."""

    what = "the service"
    ready_path = "/openapi.json"

    def __init__(
        self,
        tmp: Path,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        super().__init__(tmp / "server.log", env=env, port=port)
        self.db = tmp / "service.db"
        self.results = tmp / "results"
        self.args = list(args)

    def command(self) -> list[str]:
        return ["serve", "--port", str(self.port), "--db", str(self.db),
                "--results-dir", str(self.results), *self.args]  # fmt: skip

    def key(self, name: str, *limits: str) -> str:
        extra = [a for limit in limits for a in ("--limit", limit)]
        out = cli("serve", "keys", "create", "--db", str(self.db), "--name", name, *extra)
        return out.splitlines()[-1]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def peak_rss_bytes(self) -> int:
        """The process's peak resident memory (VmHWM)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def everything_written(self) -> bytes:
        """Every byte the service wrote to disk: database, results, uploads, log."""
        found = b""
        for path in [self.log, *self.db.parent.glob(self.db.name + "*"), *self.results.rglob("*")]:
            if path.is_file():
                found += path.read_bytes()
        return found
