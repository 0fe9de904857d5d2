"""The evaluation service under a tenant's memory attack: its peak RSS, and another
tenant's latency meanwhile.

Run: python tests/bench/bench_service.py [--repeat 3] [--jobs 4] [--concurrency 16]

Each repeat starts ``convsim serve`` with its default limits and an allowed loopback
host whose every answer is an endless body. The attacker first asks to raise its own
``max_body_bytes`` (the attack that took the service to 4.0 GB; now refused with 422),
then runs ``--jobs`` jobs at ``--concurrency`` each against the endless host: every call
reads up to the key's ``response_bytes`` and fails. Printed: the service's resident
memory before, its peak (VmHWM) during the attack, and another tenant's request latency
meanwhile; median and range over the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _listeners import Listener
from _service import Server


def _rss(server: Server, field: str) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def attack(jobs: int, concurrency: int) -> dict[str, float]:
    with Listener(endless=True) as endless, tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), ["--allow-base-url", endless.url])
        server.start()
        try:
            hog = {"Authorization": f"Bearer {server.key('hog')}"}
            other = {"Authorization": f"Bearer {server.key('other')}"}
            before = _rss(server, "VmRSS")
            url = server.url + "/v1/evaluations"
            job = {
                "pack": "customer_support",
                "model": "openai-compatible:m",
                "model_args": {"base_url": endless.url + "/v1", "max_retries": "0"},
                "concurrency": concurrency,
            }
            raised = {**job, "model_args": {**job["model_args"], "max_body_bytes": str(2**40)}}
            refused = httpx.post(url, json=raised, headers=hog).status_code
            ids = []
            for _ in range(jobs):
                answer = httpx.post(url, json=job, headers=hog, timeout=60)
                answer.raise_for_status()
                ids.append(answer.json()["id"])
            latencies: list[float] = []
            finished = threading.Event()

            def wait() -> None:
                while not finished.is_set():
                    states = [httpx.get(f"{url}/{i}", headers=hog).json()["status"] for i in ids]
                    if all(s in ("done", "failed", "cancelled") for s in states):
                        finished.set()
                    time.sleep(0.2)

            waiter = threading.Thread(target=wait)
            waiter.start()
            with httpx.Client(headers=other, timeout=60) as client:
                while not finished.is_set():
                    started = time.perf_counter()
                    client.get(url).raise_for_status()
                    latencies.append(time.perf_counter() - started)
            waiter.join()
            return {
                "refused": refused,
                "before_mb": before / 2**20,
                "peak_mb": _rss(server, "VmHWM") / 2**20,
                "other_p50_ms": statistics.median(latencies) * 1000,
                "other_max_ms": max(latencies) * 1000,
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    runs = [attack(args.jobs, args.concurrency) for _ in range(args.repeat)]
    print(f"{args.jobs} jobs x concurrency {args.concurrency} against endless answers, "
          f"{args.repeat} repeats (median, range)")  # fmt: skip
    print(f"  raising max_body_bytes: HTTP {sorted({int(r['refused']) for r in runs})}")
    for key, label in (
        ("before_mb", "service RSS before (MB)"),
        ("peak_mb", "service peak RSS during (MB)"),
        ("other_p50_ms", "another tenant's latency p50 (ms)"),
        ("other_max_ms", "another tenant's latency max (ms)"),
    ):
        values = [r[key] for r in runs]
        print(f"  {label}: {statistics.median(values):.0f} "
              f"({min(values):.0f}-{max(values):.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
