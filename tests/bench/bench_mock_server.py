"""Mock server benchmark: requests/s it sustains, and its time to first token under load.

Run: python tests/bench/bench_mock_server.py [--seconds S] [--concurrency N]

Each part starts ``python -m convsim mock-server`` in its own process, so the server and
the client do not share a core or an event loop, then drives it from one bare aiohttp
``ClientSession`` (``TCPConnector(limit=N)``) with N workers sending requests back to
back for S seconds:

1. non-streaming chat completions, no delays: prints requests/s;
2. streaming chat completions with ``--ttft-ms 50``: prints requests/s and the median
   time to the first content chunk, next to the configured 50 ms;
3. the same at a low concurrency (``--calm-concurrency``, default 1), where the client
   is not busy, so the measured time to first token shows the server's own accuracy.

Each part also prints the CPU time both processes used while measuring (Linux, from
``/proc``): when the client is near 1.00 core and the server well below, the client is
the bottleneck and the figures are a lower bound of what the server can do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import aiohttp

MESSAGES = [
    {"role": "system", "content": "You are a helpful support agent."},
    {"role": "user", "content": "Hi, I'm Dana and my order A-1042 for 59 dollars is late."},
    {"role": "assistant", "content": "Sorry to hear that. Let me check order A-1042."},
    {"role": "user", "content": "Which order number and amount are we talking about?"},
]


class Server(NamedTuple):
    url: str
    pid: int


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def mock_server(*args: str) -> Iterator[Server]:
    """Run ``convsim mock-server ARGS`` in a subprocess; yield it; SIGINT it after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "convsim", "mock-server", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError(f"mock server exited with {proc.wait()}")
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        if url is None:
            raise RuntimeError("mock server did not print its address")
        # Keep reading its stderr so that a chatty server never blocks on a full pipe.
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield Server(url, proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if code != 0:
            raise RuntimeError(f"mock server exited with {code}")


async def drive(
    server: Server, *, seconds: float, concurrency: int, stream: bool
) -> dict[str, float]:
    """``concurrency`` workers send chat completions back to back for ``seconds``."""
    body = json.dumps({"model": "mock-model", "messages": MESSAGES, "stream": stream}).encode()
    headers = {"Content-Type": "application/json"}
    endpoint = server.url + "/v1/chat/completions"
    ttfts: list[float] = []
    done = errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal done, errors
            started = time.perf_counter()
            async with session.post(endpoint, data=body, headers=headers) as resp:
                if resp.status != 200:
                    errors += 1
                    await resp.read()
                    return
                if not stream:
                    json.loads(await resp.read())
                    done += 1
                    return
                first = None
                finished = False
                async for line in resp.content:
                    if first is None and line.startswith(b"data: ") and b'"content"' in line:
                        first = time.perf_counter() - started
                    if line.startswith(b"data: [DONE]"):
                        finished = True
                if first is not None and finished:
                    ttfts.append(first)
                    done += 1
                else:
                    errors += 1

        async def worker(stop_at: float) -> None:
            while time.perf_counter() < stop_at:
                await one()

        # Warm up the connections and caches, then measure.
        await asyncio.gather(*(one() for _ in range(concurrency)))
        done = errors = 0
        ttfts.clear()
        server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker(started + seconds) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        server_after, client_after = cpu_seconds(server.pid), time.process_time()
    result = {"requests": done, "errors": errors, "elapsed_s": elapsed, "rps": done / elapsed}
    result["client_cores"] = (client_after - client_cpu) / elapsed
    if server_cpu is not None and server_after is not None:
        result["server_cores"] = (server_after - server_cpu) / elapsed
        result["server_us_per_request"] = (server_after - server_cpu) / max(done, 1) * 1e6
    if ttfts:
        result["ttft_median_ms"] = statistics.median(ttfts) * 1000
        result["ttft_p99_ms"] = statistics.quantiles(ttfts, n=100)[98] * 1000
    return result


def cpu_line(r: dict[str, float]) -> str:
    line = f"client CPU {r['client_cores']:.2f} cores"
    if "server_cores" in r:
        line += (
            f", server CPU {r['server_cores']:.2f} cores "
            f"({r['server_us_per_request']:.0f} us per request)"
        )
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--calm-concurrency", type=int, default=1)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}")
    run = {"seconds": args.seconds, "concurrency": args.concurrency}

    with mock_server() as server:
        r = asyncio.run(drive(server, stream=False, **run))
    print(
        f"non-streaming chat, concurrency {args.concurrency}: {r['rps']:,.0f} req/s "
        f"({r['requests']:,} in {r['elapsed_s']:.1f} s, {r['errors']} errors); {cpu_line(r)}"
    )

    for concurrency in (args.concurrency, args.calm_concurrency):
        with mock_server("--ttft-ms", "50") as server:
            r = asyncio.run(
                drive(server, stream=True, seconds=args.seconds, concurrency=concurrency)
            )
        print(
            f"streaming chat (--ttft-ms 50), concurrency {concurrency}: {r['rps']:,.0f} req/s "
            f"({r['requests']:,} in {r['elapsed_s']:.1f} s, {r['errors']} errors), "
            f"TTFT median {r.get('ttft_median_ms', float('nan')):.1f} ms "
            f"(p99 {r.get('ttft_p99_ms', float('nan')):.1f} ms) vs 50 ms configured; "
            f"{cpu_line(r)}"
        )


if __name__ == "__main__":
    main()
