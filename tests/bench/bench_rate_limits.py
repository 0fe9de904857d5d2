"""Rate-limit benchmark: a run's throughput with random 429s against the same run without.

Run: python tests/bench/bench_rate_limits.py [--conversations N] [--repeats R] [--rpm N]

Starts ``python -m convsim mock-server`` in its own process twice: once fault-free, once
answering a fraction of generation requests (``--rate``, default 3.7%) with
``429 Retry-After: 0``. Each repeat runs the same pack (N five-turn conversations,
``openai-compatible`` over HTTP, default retries) through a :class:`convsim.Simulator`
against both servers, alternating which goes first, and prints turns/s of each and
their ratio; then the median and range of the ratios. A run with 429s should keep at
least 70% of the fault-free throughput. The machine's noise shows in the range: read
the median. ``--rpm`` and ``--tpm`` give the key a budget (set high, it never binds
but every call still passes through its buckets: their cost on the hot path).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import anyio
import structlog

import convsim

TURNS = 5


class Measured(NamedTuple):
    turns_per_s: float
    done: int
    failed: int
    rejected: int
    """429s the client received."""


@contextmanager
def mock_server(*args: str) -> Iterator[str]:
    """Run ``convsim mock-server ARGS`` in a subprocess; yield its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "convsim", "mock-server", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError(f"mock server exited with {proc.wait()}")
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        if url is None:
            raise RuntimeError("mock server did not print its address")
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield url + "/v1"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def write_pack(folder: Path, conversations: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    turns = [
        {"turn_id": f"t{i}", "prompt_template": f"Question {i} about order {{order}}."}
        for i in range(TURNS)
    ]
    flows = {"default": {"conversation_timeout": 600, "turns": turns}}
    (folder / "turn_configs.yml").write_text(json.dumps(flows))  # JSON is valid YAML
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(conversations):
            scenario = {
                "scenario_id": f"s{i:05d}",
                "scenario_description": "rate limits",
                "variables": {"order": f"A-{1000 + i}"},
            }
            fh.write(json.dumps(scenario) + "\n")
    return folder


async def measure(
    pack: Path, base_url: str, concurrency: int, budget: dict[str, float]
) -> Measured:
    args = {"base_url": base_url, **budget}
    started = time.perf_counter()
    turns = done = failed = 0
    async with convsim.Simulator(
        "openai-compatible:mock-model",
        model_args=args,
        concurrency=concurrency,
        metrics=["latency"],
    ) as sim:
        async for result in sim.run(str(pack)):
            turns += sum(1 for t in result.turns if t.status is convsim.TurnStatus.COMPLETED)
            done += result.status is convsim.Status.DONE
            failed += result.status is not convsim.Status.DONE
        rejected = sum(b.rate_limited for b in sim.budgets.statistics())
    return Measured(turns / (time.perf_counter() - started), done, failed, rejected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", type=float, default=0.037, help="fraction of 429s")
    parser.add_argument("--ttft-ms", default="5", help="the mock server's time to first token")
    parser.add_argument("--rpm", type=float, default=None, help="the key's requests/minute")
    parser.add_argument("--tpm", type=float, default=None, help="the key's tokens/minute")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(f"cpus: {os.cpu_count()}, python {sys.version.split()[0]}")
    common = ["--ttft-ms", args.ttft_ms, "--seed", "1"]
    faulty = [*common, "--fault-rate", str(args.rate), "--faults", "429", "--retry-after", "0"]
    budget = {k: v for k, v in (("rpm", args.rpm), ("tpm", args.tpm)) if v is not None}
    ratios: list[float] = []
    rates: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        pack = write_pack(Path(tmp) / "pack", args.conversations)
        with mock_server(*common) as clean_url, mock_server(*faulty) as faulty_url:
            for url in (clean_url, faulty_url):  # warm up both (the servers cache answers)
                anyio.run(measure, pack, url, args.concurrency, budget)
            for repeat in range(args.repeats):
                order = [clean_url, faulty_url] if repeat % 2 == 0 else [faulty_url, clean_url]
                runs = {
                    url: anyio.run(measure, pack, url, args.concurrency, budget) for url in order
                }
                clean, faults = runs[clean_url], runs[faulty_url]
                ratio = faults.turns_per_s / clean.turns_per_s
                ratios.append(ratio)
                rates.append(clean.turns_per_s)
                print(
                    f"repeat {repeat + 1}: fault-free {clean.turns_per_s:,.0f} turns/s "
                    f"({clean.done} done), {args.rate:.1%} 429s {faults.turns_per_s:,.0f} "
                    f"turns/s ({faults.done} done, {faults.failed} failed, "
                    f"{faults.rejected} 429s received): "
                    f"ratio {ratio:.2f}"
                )
    median = statistics.median(ratios)
    print(
        f"fault-free throughput{' with ' + str(budget) if budget else ''}: median "
        f"{statistics.median(rates):,.0f} turns/s (range {min(rates):,.0f}-{max(rates):,.0f})"
    )
    print(
        f"throughput with {args.rate:.1%} 429s / fault-free: median {median:.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} repeats; "
        "the target is at least 0.70)"
    )


if __name__ == "__main__":
    main()
