"""Tracing costs nothing when it is off: throughput of this tree against another (by
default ``main``, the code before tracing), with tracing off, and with it on for scale.

Run: python tests/bench/bench_tracing.py [--before REV] [--requests N] [--conversations N]

Two workloads, each in a fresh process per measurement, three measurements per tree,
interleaved (before, after, before, ...) so that drift on a shared machine hits both:

- ``load``: ``drive()`` of N single-turn requests, concurrency 64, against the mock
  server (its own process, zero latency): requests/s of the client;
- ``run``: the runtime, ``Simulator("scripted")`` over N five-turn conversations
  (default metrics off, no results file): conversations/s.

The other tree is a ``git worktree`` of REV, assembled into the ``convsim`` package with
.ci/checks.py's reading of pyproject and put first on PYTHONPATH. Printed: median and range of three
for each tree, the ratio after/before of the medians, and the same with tracing on (an
SDK TracerProvider with no exporter: spans are made and dropped).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci"))

from checks import read_layout  # noqa: E402

LOAD = """
import sys, time, anyio
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.load import LoadShape, SyntheticSessions, drive, parse_synthetic
url, n, traced = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "on"
async def main():
    telemetry = None
    if traced:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.metrics import MeterProvider
        from convsim import OpenTelemetry
        telemetry = OpenTelemetry(TracerProvider(), MeterProvider())
    adapter = OpenAICompatibleAdapter({"model": "mock-model", "base_url": url})
    workload = SyntheticSessions(parse_synthetic("turns=1,input_tokens=16,output_tokens=8"))
    shape = LoadShape(concurrency=64, max_requests=n)
    extra = {"telemetry": telemetry} if traced else {}
    t0 = time.perf_counter()
    outcome = await drive(adapter, workload, shape, **extra)
    elapsed = time.perf_counter() - t0
    await adapter.aclose()
    done = sum(r.ok for r in outcome.records)
    print(done / elapsed)
anyio.run(main)
"""

RUN = """
import sys, time, json, tempfile, pathlib, anyio
from convsim import Simulator
n, traced = int(sys.argv[1]), sys.argv[2] == "on"
folder = pathlib.Path(tempfile.mkdtemp())
turns = [{"turn_id": f"t{i}", "prompt_template": f"Line {i} of the talk."} for i in range(5)]
for i in range(1, 5):
    turns[i]["depends_on"] = [f"t{i - 1}"]
(folder / "turn_configs.yml").write_text(json.dumps({"default": {"turns": turns}}))
with open(folder / "scenarios.jsonl", "w") as fh:
    for i in range(n):
        fh.write(json.dumps({"scenario_id": f"s{i}", "scenario_description": "talk"}) + "\\n")
async def main():
    kwargs = {}
    if traced:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.metrics import MeterProvider
        from convsim import OpenTelemetry
        kwargs["tracing"] = OpenTelemetry(TracerProvider(), MeterProvider())
    async with Simulator("scripted", concurrency=256, metrics=[], **kwargs) as sim:
        t0 = time.perf_counter()
        done = 0
        async for _ in sim.run(str(folder)):
            done += 1
        print(done / (time.perf_counter() - t0))
anyio.run(main)
"""


def before_tree(rev: str, work: Path) -> Path:
    """``rev`` checked out and assembled as the ``convsim`` package; the folder to put on
    PYTHONPATH."""
    checkout = work / "checkout"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), rev],
        check=True,
        capture_output=True,
    )
    # the package as pyproject's package-dir lays it out, data files included: the
    # checkout is a scratch copy, so its folders are linked into one another
    layout = read_layout(checkout / "pyproject.toml")
    root = checkout / layout.package_dir["convsim"]
    for name, folder in layout.package_dir.items():
        if name.startswith("convsim."):
            (root / name.removeprefix("convsim.")).symlink_to(checkout / folder)
    tree = work / "tree"
    tree.mkdir()
    (tree / "convsim").symlink_to(root)
    return tree


def measure(code: str, args: list[str], pythonpath: Path | None) -> float:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"a measurement failed ({args}):\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def wait_for_port(port: int, deadline_s: float = 30.0) -> None:
    """Return once something listens on 127.0.0.1:``port``."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.1)


def line(name: str, values: list[float], unit: str) -> str:
    return (
        f"  {name:<22} median {statistics.median(values):>9,.0f} {unit}"
        f"  range {min(values):,.0f}-{max(values):,.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        before = before_tree(args.before, work)
        server = subprocess.Popen(
            [sys.executable, "-m", "convsim", "mock-server", "--port", "18977"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(18977)
            url = "http://127.0.0.1:18977/v1"
            results: dict[str, dict[str, list[float]]] = {
                "load": {"before": [], "after (off)": [], "after (on)": []},
                "run": {"before": [], "after (off)": [], "after (on)": []},
            }
            for _ in range(args.repeat):
                for kind, code, base in (
                    ("load", LOAD, [url, str(args.requests)]),
                    ("run", RUN, [str(args.conversations)]),
                ):
                    results[kind]["before"].append(measure(code, [*base, "off"], before))
                    results[kind]["after (off)"].append(measure(code, [*base, "off"], None))
                    results[kind]["after (on)"].append(measure(code, [*base, "on"], None))
        finally:
            server.terminate()
            server.wait()
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "checkout")],
                check=False,
                capture_output=True,
            )
    for kind, unit in (("load", "req/s"), ("run", "conv/s")):
        print(f"{kind}:")
        runs = results[kind]
        for name, values in runs.items():
            print(line(name, values, unit))
        base = statistics.median(runs["before"])
        print(f"  ratio off/before  {statistics.median(runs['after (off)']) / base:.3f}")
        print(f"  ratio on/before   {statistics.median(runs['after (on)']) / base:.3f}")
    print(json.dumps({k: {n: v for n, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
