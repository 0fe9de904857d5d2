"""Runs on Ray against the plain runtime: throughput of 1 and 2 actors, the backend's
overhead, and the time to the first result.

Run: python tests/bench/bench_ray.py [--conversations N] [--latency S] [--repeat K]

Ten-turn conversations (the runtime's own benchmark pack), carried two ways:

- the scripted model answering after ``--latency`` seconds: the runtime alone, so the
  figures show how the backend carries conversations rather than a model's speed;
- ``convsim mock-server`` (a separate process, answering after ``--latency`` too) through
  the OpenAI-compatible adapter: real HTTP calls.

Each is run by the plain runtime in this process, then by ``run_on_ray`` with one actor
and with two, on a local Ray instance (2 CPUs), ``--repeat`` times; the median and the
range are printed. Ray's start-up is paid once, before the first timed run.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_runtime import write_pack

import convsim
from convsim.distributed import run_on_ray


@contextlib.contextmanager
def mock_server(latency_ms: float) -> Iterator[str]:
    """``convsim mock-server`` in its own process; its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "convsim", "mock-server", "--port", str(port),
         "--ttft-ms", str(latency_ms)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{base}/models", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def spread(values: list[float], fmt: str = ",.0f") -> str:
    return (
        f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"
        if len(values) > 1
        else f"{values[0]:{fmt}}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    turns = 10 * args.conversations
    with tempfile.TemporaryDirectory() as tmp, mock_server(args.latency * 1000) as base:
        folder = Path(tmp)
        (folder / "pack").mkdir()
        pack = str(write_pack(folder / "pack", args.conversations))
        models = {
            "scripted": ("scripted", {"latency": str(args.latency)}),
            "mock server (HTTP)": ("openai-compatible:mock-model", {"base_url": base}),
        }
        run_on_ray(pack, "scripted", out=folder / "warm.jsonl", actors=2, limit=4, metrics=[])
        print(
            f"{args.conversations} ten-turn conversations, model latency {args.latency} s, "
            f"concurrency 64, median (range) of {args.repeat}"
        )
        for m, (label, (spec, model_args)) in enumerate(models.items()):
            rates: dict[str, list[float]] = {"plain": [], "1 actor": [], "2 actors": []}
            firsts: dict[str, list[float]] = {"1 actor": [], "2 actors": []}
            ratio: dict[str, list[float]] = {"1 actor": [], "2 actors": []}
            for k in range(args.repeat):
                started = time.perf_counter()
                convsim.run_sync(
                    pack, spec, out=folder / f"plain{m}-{k}.jsonl", model_args=model_args,
                    concurrency=64, metrics=[],
                )  # fmt: skip
                plain = time.perf_counter() - started
                rates["plain"].append(turns / plain)
                for actors, name in ((1, "1 actor"), (2, "2 actors")):
                    started = time.perf_counter()
                    outcome = run_on_ray(
                        pack, spec, out=folder / f"ray{m}-{actors}-{k}.jsonl", actors=actors,
                        model_args=model_args, concurrency=64, metrics=[],
                    )  # fmt: skip
                    elapsed = time.perf_counter() - started
                    assert outcome.results == args.conversations
                    rates[name].append(turns / elapsed)
                    ratio[name].append(elapsed / plain)
                    firsts[name].append(outcome.first_result_s or float("nan"))
            print(f"\n{label}")
            print(f"  {'backend':<16} {'turns/s':>24} {'time vs plain':>20} {'first result s':>20}")
            print(f"  {'plain runtime':<16} {spread(rates['plain']):>24}")
            for name in ("1 actor", "2 actors"):
                print(
                    f"  {'ray, ' + name:<16} {spread(rates[name]):>24} "
                    f"{spread(ratio[name], '.2f'):>20} {spread(firsts[name], '.2f'):>20}"
                )
    ray.shutdown()


if __name__ == "__main__":
    main()
