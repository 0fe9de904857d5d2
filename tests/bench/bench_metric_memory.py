"""Memory and start-up of metrics that load a model: ``coherence`` (WordLlama) at high
concurrency, a 10,000-conversation ``customer_support`` run, and an offline run's start.

Run: python tests/bench/bench_metric_memory.py [--conversations N] [--concurrency C]
     [--runs R] [--cli-conversations M] [--parts memory,cli,startup]

Every measurement runs in a fresh process and reports that process's own peak RSS
(``ru_maxrss``); this script does not import convsim, so its children do not start from
its RSS. Medians and ranges are over R runs (default 3): the machine is shared and noisy.

1. ``memory``: N customer_support conversations (default 1,000; the bundled scenarios
   cycled with new ids, the flows' own metrics removed) at concurrency C (default 256)
   with the scripted model (no latency), through ``convsim.Simulator``: scored by
   ``coherence`` alone, and by no metric at all (the baseline, run alternately with it).
   Prints each one's peak RSS and wall time, how many times the WordLlama model was
   loaded in the process, and the difference of the peaks (the goal: under 100 MB).
2. ``cli``: ``convsim run`` of customer_support's flows (their metrics: coherence,
   conversation_flow, latency, response_length) with M scenarios (default 10,000),
   ``--model scripted``: at the CLI's default concurrency with no latency, and with all
   M conversations at once and a scripted latency of 1 s per answer (the setting of
   README's figure for 10,000 concurrent conversations). Peak RSS and wall time.
3. ``startup``: ``convsim run multi_session_memory --model scripted`` (14 conversations,
   scored by the pack's coherence and conversation_flow), against the same pack with
   the flows' metrics removed: wall time, start-up included, and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

BUNDLED_PACKS_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "packs"
CONVSIM = str(Path(sys.executable).parent / "convsim")
FLOW_METRICS = re.compile(r"^\s*(?:evaluation_)?metrics:.*\n", re.M)

DRIVER = """
import json, resource, sys, threading, time
import anyio
import convsim
from convsim.metrics import _wordllama

loads = 0
lock = threading.Lock()
read_model = _wordllama._read_model

def counted():
    global loads
    with lock:
        loads += 1
    return read_model()

_wordllama._read_model = counted  # called once by each load of the model

async def main(folder, concurrency, metrics):
    pack = convsim.load_pack(folder)
    started = time.perf_counter()
    first = None
    scored = done = 0
    async with convsim.Simulator("scripted", concurrency=concurrency, metrics=metrics) as sim:
        async for result in sim.run(pack):
            if first is None:
                first = time.perf_counter() - started
            done += 1
            score = result.scores.get("coherence")
            scored += score is not None and score.value is not None
    return {"seconds": time.perf_counter() - started, "first": first, "done": done,
            "scored": scored}

imports_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
metrics = [m for m in sys.argv[3].split(",") if m]
outcome = anyio.run(main, sys.argv[1], int(sys.argv[2]), metrics)
outcome.update(loads=loads, imports_kb=imports_kb,
               peak_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print(json.dumps(outcome))
"""


class Command(NamedTuple):
    """One command in a fresh process: wall time, peak RSS (MB), exit code, output."""

    seconds: float
    peak_mb: float
    returncode: int
    output: str


class Scoring(NamedTuple):
    """One Simulator run in a fresh process."""

    seconds: float
    first_result: float
    peak_mb: float
    imports_mb: float
    conversations: int
    scored: int
    loads: int


def measured(argv: list[str]) -> Command:
    """Run ``argv`` in a fresh process; its wall time and its own peak RSS."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - started
    return Command(elapsed, usage.ru_maxrss / 1024, proc.returncode, output)


def spread(values: list[float], unit: str, digits: int) -> str:
    return (
        f"median {statistics.median(values):.{digits}f} {unit} "
        f"(range {min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def write_pack(folder: Path, source: str, scenarios: int, *, flow_metrics: bool) -> Path:
    """A bundled pack's flows and ``scenarios`` of its scenarios with new ids; without
    the flows' metrics (conversation and turn) unless ``flow_metrics``."""
    origin = BUNDLED_PACKS_DIR / source
    folder.mkdir(parents=True)
    flows = (origin / "turn_configs.yml").read_text()
    if not flow_metrics:
        flows = FLOW_METRICS.sub("", flows)
    (folder / "turn_configs.yml").write_text(flows)
    lines = (origin / "scenarios.jsonl").read_text().splitlines()
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(scenarios):
            scenario = json.loads(lines[i % len(lines)])
            scenario["scenario_id"] = f"{scenario['scenario_id']}_{i:06d}"
            fh.write(json.dumps(scenario) + "\n")
    return folder


def scoring(folder: Path, concurrency: int, metrics: str) -> Scoring:
    command = measured([sys.executable, "-c", DRIVER, str(folder), str(concurrency), metrics])
    if command.returncode:
        raise SystemExit(f"the run failed:\n{command.output}")
    data: dict[str, Any] = json.loads(command.output.splitlines()[-1])
    return Scoring(
        data["seconds"],
        data["first"],
        data["peak_kb"] / 1024,
        data["imports_kb"] / 1024,
        data["done"],
        data["scored"],
        data["loads"],
    )


def part_memory(base: Path, conversations: int, concurrency: int, runs: int) -> None:
    folder = write_pack(base / "memory", "customer_support", conversations, flow_metrics=False)
    print(
        f"1. {conversations:,} customer_support conversations, concurrency {concurrency}, "
        f"scripted model, {runs} runs"
    )
    plain: list[Scoring] = []
    coherent: list[Scoring] = []
    for _ in range(runs):  # alternately, so drift on the machine touches both
        plain.append(scoring(folder, concurrency, ""))
        coherent.append(scoring(folder, concurrency, "coherence"))
    for title, rows in (("no metrics", plain), ("coherence ", coherent)):
        print(
            f"  {title}: peak RSS {spread([r.peak_mb for r in rows], 'MB', 0)}; "
            f"wall {spread([r.seconds for r in rows], 's', 2)}"
        )
        print(
            f"    first result after {spread([r.first_result for r in rows], 's', 2)}; "
            f"RSS after imports {statistics.median(r.imports_mb for r in rows):.0f} MB; "
            f"conversations {rows[0].conversations:,}, coherence scored "
            f"{min(r.scored for r in rows):,}; model loads per run "
            f"{sorted({r.loads for r in rows})}"
        )
    extra = [c.peak_mb - p.peak_mb for p, c in zip(plain, coherent, strict=True)]
    over = statistics.median(r.peak_mb for r in coherent) - statistics.median(
        r.peak_mb for r in plain
    )
    print(
        f"  coherence over no metrics: {over:+.0f} MB between medians; pairwise "
        f"{spread(extra, 'MB', 0)} (goal: under 100 MB)"
    )
    ratio = statistics.median(r.seconds for r in coherent) / statistics.median(
        r.seconds for r in plain
    )
    print(f"  wall time with coherence: {ratio:.2f}x no metrics")
    shutil.rmtree(folder)


def part_cli(base: Path, conversations: int, runs: int) -> None:
    folder = write_pack(base / "cli", "customer_support", conversations, flow_metrics=True)
    print(
        f"2. convsim run: customer_support's flows, {conversations:,} scenarios, "
        f"--model scripted, {runs} runs"
    )
    settings = [
        ("default concurrency, no latency", []),
        (
            f"concurrency {conversations:,}, latency 1 s",
            ["--concurrency", str(conversations), "--model-arg", "latency=1"],
        ),
    ]
    for title, extra in settings:
        commands = []
        for i in range(runs):
            out = base / f"cli-{i}.jsonl"
            argv = [CONVSIM, "run", str(folder), "--model", "scripted", "--out", str(out)]
            command = measured([*argv, "--overwrite", *extra])
            if command.returncode:
                raise SystemExit(f"convsim run failed ({command.returncode}):\n{command.output}")
            commands.append(command)
            for written in base.glob(f"cli-{i}*"):
                written.unlink()
        print(f"  {title}:")
        print(f"    peak RSS  {spread([c.peak_mb for c in commands], 'MB', 0)}")
        print(f"    wall time {spread([c.seconds for c in commands], 's', 1)}")
    shutil.rmtree(folder)


def part_startup(base: Path, runs: int) -> None:
    pack = BUNDLED_PACKS_DIR / "multi_session_memory"
    folders = {
        "with the pack's metrics": pack,
        "flows' metrics removed": write_pack(base / "startup", pack.name, 14, flow_metrics=False),
    }
    print(f"3. convsim run multi_session_memory --model scripted (14 conversations), {runs} runs")
    rows: dict[str, list[Command]] = {title: [] for title in folders}
    for i in range(runs):
        for title, folder in folders.items():
            out = base / f"startup-{i}.jsonl"
            argv = [CONVSIM, "run", str(folder), "--model", "scripted", "--out", str(out)]
            command = measured([*argv, "--overwrite"])
            if command.returncode:
                raise SystemExit(f"convsim run failed ({command.returncode}):\n{command.output}")
            rows[title].append(command)
            for written in base.glob(f"startup-{i}*"):
                written.unlink()
    for title, commands in rows.items():
        print(
            f"  {title}: wall {spread([c.seconds for c in commands], 's', 2)}; "
            f"peak RSS {spread([c.peak_mb for c in commands], 'MB', 0)}"
        )
    with_metrics, without = (statistics.median(c.seconds for c in r) for r in rows.values())
    print(f"  with the pack's metrics: {with_metrics / without:.2f}x the wall time without")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cli-conversations", type=int, default=10_000)
    parser.add_argument("--parts", default="memory,cli,startup")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if "memory" in parts:
            part_memory(base, args.conversations, args.concurrency, args.runs)
        if "startup" in parts:
            part_startup(base, args.runs)
        if "cli" in parts:
            part_cli(base, args.cli_conversations, args.runs)


if __name__ == "__main__":
    main()
