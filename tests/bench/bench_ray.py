"""Runs on Ray against the plain runtime: throughput of 1 and 2 actors, the backend's
overhead, and the time to the first result.

Run: python tests/bench/bench_ray.py [--conversations N] [--latency S]

Ten-turn conversations with the scripted model answering after ``--latency`` seconds
(the runtime's own benchmark pack), so the figures show how the backend carries the
conversations rather than a model's speed: the plain runtime in this process, then
``run_on_ray`` with one actor and with two, on a local Ray instance (2 CPUs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_runtime import write_pack

import convsim
from convsim.distributed import run_on_ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.01)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    model_args = {"latency": str(args.latency)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "pack").mkdir()
        pack = write_pack(folder / "pack", args.conversations)
        started = time.perf_counter()
        convsim.run_sync(
            str(pack), "scripted", out=folder / "plain.jsonl", model_args=model_args,
            concurrency=64, metrics=[],
        )  # fmt: skip
        plain = time.perf_counter() - started
        turns = 10 * args.conversations
        print(f"plain runtime: {turns / plain:,.0f} turns/s ({plain:.1f} s)")
        for actors in (1, 2):
            started = time.perf_counter()
            outcome = run_on_ray(
                str(pack), "scripted", out=folder / f"ray{actors}.jsonl", actors=actors,
                model_args=model_args, concurrency=64, metrics=[],
            )  # fmt: skip
            elapsed = time.perf_counter() - started
            print(
                f"ray, {actors} actor(s): {turns / elapsed:,.0f} turns/s ({elapsed:.1f} s, "
                f"{elapsed / plain:.2f}x the plain runtime's time), first result after "
                f"{outcome.first_result_s:.2f} s, {outcome.results} conversations"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
