"""``convsim load`` against a bare aiohttp loop on the same mock server, in the same run.

Run: python tests/bench/bench_load.py [--seconds S] [--repeats N]

Prints, each measured in this run (the mock server and ``convsim load`` in their own
processes, as users run them):

1. closed loop, zero-latency mock, concurrency 256, one worker: requests/s of
   ``convsim load`` over those of the bare loop (``bench_mock_server.drive``), non-streaming
   and streaming, median and range over the repeats, with the mean requests in flight;
2. open loop, constant arrivals at 200 and 500 sessions/s: achieved rate against the
   target, send-delay p99, and whether the run is valid;
3. streaming with the mock's TTFT at 50 ms: reported TTFT p50 at concurrency 256 and
   32, and whether each run is valid (a client that saturates is flagged invalid).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_mock_server import Server, drive, mock_server

SESSIONS = ["--synthetic", "turns=1,input_tokens=20,output_tokens=16", "--no-exact-output"]


def load(server: Server, *extra: str) -> dict[str, Any]:
    """One ``convsim load`` run against ``server``; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run(
            [
                sys.executable, "-m", "convsim", "load",
                "--model", "openai-compatible:mock-model",
                "--model-arg", f"base_url={server.url}/v1",
                "--no-calibrate", *SESSIONS, "--out", str(out), *extra,
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def closed_loop(seconds: float, repeats: int) -> None:
    for stream in (False, True):
        ratios: list[float] = []
        with mock_server() as server:
            for _ in range(repeats):
                bare = asyncio.run(drive(server, seconds=seconds, concurrency=256, stream=stream))
                result = load(
                    server, "--concurrency", "256", "--duration", str(seconds), "--warmup", "1",
                    "--model-arg", f"stream={str(stream).lower()}",
                )  # fmt: skip
                rps = result["throughput"]["requests_per_s"]
                ratios.append(rps / bare["rps"])
                print(
                    f"  closed loop c=256 stream={stream}: bare {bare['rps']:,.0f} req/s, "
                    f"convsim load {rps:,.0f} req/s, ratio {ratios[-1]:.2f}, "
                    f"in flight {result['client']['mean_in_flight']:.0f}",
                    flush=True,
                )
        print(
            f"closed loop c=256 stream={stream}: ratio median {statistics.median(ratios):.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}); target >= 0.8"
        )


def open_loop(seconds: float) -> None:
    with mock_server() as server:
        for rate in (200, 500):
            r = load(
                server, "--rate", str(rate), "--duration", str(seconds), "--warmup", "1",
                "--arrival", "constant",
            )  # fmt: skip
            print(
                f"open loop {rate}/s: achieved {r['achieved_rate']:.1f}/s "
                f"({(r['achieved_rate'] / rate - 1) * 100:+.2f}%), send delay p99 "
                f"{r['schedule_delay_ms']['p99']:.2f} ms, valid {r['valid']} {r['invalid_reasons']}"
            )


def ttft(seconds: float) -> None:
    with mock_server("--ttft-ms", "50") as server:
        for concurrency in (256, 32):
            r = load(
                server, "--concurrency", str(concurrency), "--duration", str(seconds),
                "--warmup", "1",
            )  # fmt: skip
            print(
                f"streaming, server TTFT 50 ms, c={concurrency}: reported TTFT p50 "
                f"{r['latency_ms']['ttft']['p50']:.1f} ms, "
                f"{r['throughput']['requests_per_s']:,.0f} req/s, "
                f"valid {r['valid']} {r['invalid_reasons']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    closed_loop(args.seconds, args.repeats)
    open_loop(args.seconds)
    ttft(args.seconds)


if __name__ == "__main__":
    main()
