"""``convsim serve`` in a subprocess on loopback, for the service's tests."""

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


class Server:
    """A service process; its stderr (the server's log) goes to ``log``."""

    def __init__(
        self,
        tmp: Path,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.db = tmp / "service.db"
        self.results = tmp / "results"
        self.log = tmp / "server.log"
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "convsim", "serve", "--port", str(self.port),
                 "--db", str(self.db), "--results-dir", str(self.results), *self.args],
                stdout=log, stderr=log, env=self.env,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {self.log.read_text()}")
            try:
                httpx.get(self.url + "/openapi.json", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the service did not start")

    def key(self, name: str, *limits: str) -> str:
        extra = [a for limit in limits for a in ("--limit", limit)]
        out = cli("serve", "keys", "create", "--db", str(self.db), "--name", name, *extra)
        return out.splitlines()[-1]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

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
