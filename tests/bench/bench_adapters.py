"""HTTP adapter benchmarks against the mock server, each beside a bare aiohttp loop.

Run: python tests/bench/bench_adapters.py [--requests N] [--skip-rpm]

Every figure comes from one run on this machine, with the mock server in a separate
process:
1. zero latency, non-streaming, concurrency 256: requests/s of conversations through
   the runtime and the OpenAI-compatible adapter, against a bare aiohttp loop;
2. 100 ms server latency, concurrency 1,000: the same, plus event-loop lag p50/p99;
3. streaming, 20 chunks, 50 ms server TTFT, concurrency 64: median TTFT as the adapter
   measures it and as a bare aiohttp loop does;
4. an RPM budget of 600 against a server enforcing 600/min, for 60 s: rejected calls
   and the share of 600 achieved;
5. streaming, 200 chunks and no server latency, concurrency 64: requests/s of the
   adapter reading streams, against a bare aiohttp loop (what each chunk costs).

``--stream-only`` runs part 5 alone, ``--repeat N`` N times (median and range).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import anyio
import structlog

sys.path.insert(0, str(Path(__file__).parent))

from bench_runtime import write_pack

import convsim
from convsim._gc import tune_gc_for_throughput
from convsim.adapters import create_adapter

BODY = {
    "model": "mock-model",
    "messages": [{"role": "user", "content": "Hello there, how are you?"}],
    "max_tokens": 32,
}


def write_one_turn_pack(folder: Path, conversations: int) -> Path:
    """Conversations of one turn whose request is the bare loop's request."""
    message = BODY["messages"][0]["content"]  # type: ignore[index]
    flows = {
        "default": {
            "turns": [
                {
                    "turn_id": "ask",
                    "prompt_template": message,
                    "config": {"max_tokens": BODY["max_tokens"]},
                }
            ]
        }
    }
    (folder / "turn_configs.yml").write_text(json.dumps(flows))
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(conversations):
            fh.write(json.dumps({"scenario_id": f"q{i:06d}", "scenario_description": "x"}) + "\n")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mock_server(*args: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "convsim", "mock-server", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("the mock server did not start")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def bare_loop(
    base_url: str, requests: int, concurrency: int, stream: bool = False, max_tokens: int = 32
) -> tuple[float, list[float]]:
    """Wall time for ``requests`` chat completions; TTFTs when streaming."""
    body = dict(BODY, stream=True, max_tokens=max_tokens) if stream else BODY
    data = json.dumps(body).encode()
    ttfts: list[float] = []
    left = requests
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                async with session.post(
                    base_url + "/chat/completions",
                    data=data,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    if stream:
                        first = True
                        async for chunk in r.content.iter_any():
                            if first and b'"content"' in chunk:
                                ttfts.append(time.perf_counter() - t0)
                                first = False
                    else:
                        json.loads(await r.read())

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
    return time.perf_counter() - started, ttfts


async def through_convsim(
    pack: convsim.Pack,
    base_url: str,
    concurrency: int,
    *,
    stream: bool = False,
    measure_lag: bool = False,
    max_tokens: int = 32,
) -> tuple[float, int, list[float], list[float]]:
    """Wall time, model calls, adapter TTFTs, event-loop lags."""
    adapter = create_adapter(
        "openai-compatible:mock-model",
        {
            "base_url": base_url,
            "concurrency": concurrency,
            "stream": stream,
            "max_tokens": max_tokens,
        },
    )
    lags: list[float] = []
    ttfts: list[float] = []
    calls = 0

    async def lag_probe() -> None:
        while True:
            t0 = time.perf_counter()
            await anyio.sleep(0.01)
            lags.append(time.perf_counter() - t0 - 0.01)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        if measure_lag:
            tg.start_soon(lag_probe)
        async with convsim.Simulator(adapter, concurrency=concurrency, metrics=[]) as sim:
            async for result in sim.run(pack):
                for turn in result.turns:
                    if turn.status is convsim.TurnStatus.COMPLETED:
                        calls += 1
                        if turn.timings and turn.timings.ttft_s is not None:
                            ttfts.append(turn.timings.ttft_s)
        elapsed = time.perf_counter() - started
        tg.cancel_scope.cancel()
    await adapter.aclose()
    return elapsed, calls, ttfts, lags


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def rpm_run(base_url: str, seconds: float) -> tuple[int, int]:
    adapter = create_adapter(
        "openai-compatible:mock-model",
        {"base_url": base_url, "rpm": 600, "concurrency": 50, "max_tokens": 16, "max_retries": 0},
    )
    with tempfile.TemporaryDirectory() as tmp:
        # one call per conversation, so finished conversations count every call
        pack = convsim.load_pack(write_one_turn_pack(Path(tmp), 2000))
        done = 0
        async with convsim.Simulator(adapter, concurrency=50, metrics=[]) as sim:
            handle = sim.run(pack)
            with anyio.move_on_after(seconds):
                async for result in handle:
                    done += sum(t.status is convsim.TurnStatus.COMPLETED for t in result.turns)
            handle.stop(grace_period=0)
            budget_stats = adapter.budget().statistics()  # type: ignore[attr-defined]
    await adapter.aclose()
    return done, budget_stats.rate_limited


def stream_throughput(requests: int, repeat: int) -> None:
    """Part 5: the cost of reading a long stream, chunk by chunk, beside a bare loop."""
    chunks = 200
    ratios: list[float] = []
    rates: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock_server("--output-tokens", str(chunks)) as url,
    ):
        pack = convsim.load_pack(write_one_turn_pack(Path(tmp), requests))
        for _ in range(repeat):
            bare_s, _ = anyio.run(bare_loop, url, requests, 64, True, chunks)
            run_s, calls, _, _ = anyio.run(
                lambda: through_convsim(pack, url, 64, stream=True, max_tokens=chunks)
            )
            rates.append(calls / run_s)
            ratios.append((calls / run_s) / (requests / bare_s))
    print(f"[5] streaming, {chunks} chunks, no server latency, concurrency 64, {repeat} runs")
    print(
        f"  convsim adapter: median {statistics.median(rates):,.0f} requests/s "
        f"(range {min(rates):,.0f}-{max(rates):,.0f})"
    )
    print(
        f"  against the bare aiohttp loop: median {statistics.median(ratios):.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--skip-rpm", action="store_true", help="skip the 60 s RPM run")
    parser.add_argument("--stream-only", action="store_true", help="run part 5 alone")
    parser.add_argument("--repeat", type=int, default=1, help="runs of part 5")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tune_gc_for_throughput()
    if args.stream_only:
        stream_throughput(min(args.requests, 2_000), args.repeat)
        return
    turns = 10
    tmp = Path(tempfile.mkdtemp())
    (tmp / "one").mkdir()
    (tmp / "ten").mkdir()
    single = convsim.load_pack(write_one_turn_pack(tmp / "one", args.requests))
    multi = convsim.load_pack(write_pack(tmp / "ten", args.requests // turns))

    print(
        f"python {sys.version.split()[0]}, convsim {convsim.__version__}, "
        f"aiohttp {aiohttp.__version__}"
    )
    with mock_server() as url:
        bare_s, _ = anyio.run(bare_loop, url, args.requests, 256)
        run_s, calls, _, _ = anyio.run(through_convsim, single, url, 256)
        multi_s, multi_calls, _, _ = anyio.run(through_convsim, multi, url, 256)
    bare_rate, run_rate, multi_rate = args.requests / bare_s, calls / run_s, multi_calls / multi_s
    print("[1] zero latency, non-streaming, concurrency 256")
    print(f"  bare aiohttp loop              : {bare_rate:8,.0f} requests/s")
    print(
        f"  convsim, one-turn conversations: {run_rate:8,.0f} requests/s  "
        f"({run_rate / bare_rate:.2f}x; the same request as the bare loop)"
    )
    print(
        f"  convsim, ten-turn conversations: {multi_rate:8,.0f} requests/s  "
        f"({multi_rate / bare_rate:.2f}x; growing histories, more work per request)"
    )

    n = min(args.requests, 20_000)
    with tempfile.TemporaryDirectory() as tmp2, mock_server("--ttft-ms", "100") as url:
        pack2 = convsim.load_pack(write_one_turn_pack(Path(tmp2), n))
        bare_s, _ = anyio.run(bare_loop, url, n, 1000)
        run_s, calls, _, lags = anyio.run(
            lambda: through_convsim(pack2, url, 1000, measure_lag=True)
        )
    bare_rate, run_rate = n / bare_s, calls / run_s
    print("[2] 100 ms server latency, concurrency 1,000")
    print(f"  bare aiohttp loop      : {bare_rate:8,.0f} requests/s")
    print(f"  convsim + openai adapter: {run_rate:8,.0f} requests/s  ({run_rate / bare_rate:.2f}x)")
    print(
        f"  event-loop lag         : p50 {pct(lags, 50) * 1e3:.1f} ms, "
        f"p99 {pct(lags, 99) * 1e3:.1f} ms"
    )

    n = 2_000
    with (
        tempfile.TemporaryDirectory() as tmp3,
        mock_server("--ttft-ms", "50", "--itl-ms", "5", "--output-tokens", "20") as url,
    ):
        pack3 = convsim.load_pack(write_one_turn_pack(Path(tmp3), n))
        _, bare_ttfts = anyio.run(bare_loop, url, n, 64, True)
        _, calls, ttfts, _ = anyio.run(lambda: through_convsim(pack3, url, 64, stream=True))
    print("[3] streaming, 20 chunks, server TTFT 50 ms, concurrency 64")
    print(f"  bare aiohttp loop TTFT : median {statistics.median(bare_ttfts) * 1e3:.1f} ms")
    print(
        f"  convsim adapter TTFT   : median {statistics.median(ttfts) * 1e3:.1f} ms "
        f"({(statistics.median(ttfts) - 0.050) * 1e3:+.1f} ms vs the server's 50 ms)"
    )

    if not args.skip_rpm:
        with mock_server("--rpm", "600") as url:
            done, rejected = anyio.run(rpm_run, url, 60.0)
        print("[4] RPM budget 600 against a server enforcing 600/min, 60 s")
        print(f"  completed {done} calls ({done / 600:.1%} of 600), rejected (429) {rejected}")
    stream_throughput(min(args.requests, 2_000), args.repeat)


if __name__ == "__main__":
    main()
