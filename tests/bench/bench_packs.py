"""Pack loading benchmark: a pack of 100,000 scenarios, and a 50 MB line refused.

Run: python tests/bench/bench_packs.py [--scenarios N] [--runs R] [--line-mb M]

Every pack is generated in a temporary folder; every measurement runs in a fresh
process, so each peak RSS (``ru_maxrss``) is that load's alone. (A child's ru_maxrss
starts from its parent's RSS at the fork, so this script keeps its own small: it
writes the packs a line at a time and does not import convsim.)

1. A multi-turn pack of N scenarios (default 100,000; about 250 MB): the bundled
   customer_support scenarios, each line given a new id, and that pack's flows.
   ``convsim.load_pack`` (metric names checked, as ``convsim validate`` does) loads it
   R times (default 3); prints the load's wall time and the process's peak RSS, median
   and range, beside the RSS after imports. Then ``convsim validate`` R times: wall
   time (start-up included) and peak RSS. The library leaves the garbage collector as
   it is; the command line tunes it (convsim._gc) before it loads a pack.
2. The same for a single-turn pack of N problems (single_turn_qa's problems, each with
   a 2 kB context and a new id).
3. Multi-turn packs whose scenarios.jsonl is one line of M MB (default 50): a JSON
   array (of numbers), and a JSON object (of a million keys and more). For each,
   prints the time ``load_pack`` takes to refuse it and the peak RSS, then the same
   for ``convsim validate`` (wall time including start-up, exit code, the lines it
   prints and the first problem).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

BUNDLED_PACKS_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "packs"

DRIVER = """
import json, resource, sys, time
import convsim
from convsim import PackError
after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    pack = convsim.load_pack(sys.argv[1])
    outcome = f"{len(pack)} conversations"
except PackError as exc:
    total = len(exc.problems) + getattr(exc, "more", 0)
    outcome = f"refused, {total:,} problem(s), the first: {exc.problems[0]}"
elapsed = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "peak_kb": peak, "imports_kb": after_imports,
                  "outcome": outcome}))
"""


class Load(NamedTuple):
    """One load in a fresh process: its wall time, the process's peak RSS, the RSS
    after imports (both MB) and what came of it."""

    seconds: float
    peak_mb: float
    imports_mb: float
    outcome: str


class Command(NamedTuple):
    """One command in a fresh process: wall time, peak RSS (MB), exit code, output."""

    seconds: float
    peak_mb: float
    returncode: int
    output: str


def write_multi_turn(folder: Path, scenarios: int) -> Path:
    """customer_support's flows and ``scenarios`` of its scenarios with new ids."""
    source = BUNDLED_PACKS_DIR / "customer_support"
    folder.mkdir(parents=True)
    shutil.copy(source / "turn_configs.yml", folder / "turn_configs.yml")
    lines = (source / "scenarios.jsonl").read_text().splitlines()
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(scenarios):
            scenario = json.loads(lines[i % len(lines)])
            scenario["scenario_id"] = f"{scenario['scenario_id']}_{i:06d}"
            fh.write(json.dumps(scenario) + "\n")
    return folder


def write_single_turn(folder: Path, problems: int) -> Path:
    """single_turn_qa's config and ``problems`` of its problems, each with new id and a
    2 kB context."""
    source = BUNDLED_PACKS_DIR / "single_turn_qa"
    folder.mkdir(parents=True)
    shutil.copy(source / "config.yml", folder / "config.yml")
    lines = (source / "problems.jsonl").read_text().splitlines()
    passage = "The committee met again to review the figures of the previous quarter. " * 28
    with open(folder / "problems.jsonl", "w") as fh:
        for i in range(problems):
            problem = json.loads(lines[i % len(lines)])
            problem["id"] = f"{problem['id']}_{i:06d}"
            problem["context"] = f"Passage {i}. {passage}"
            fh.write(json.dumps(problem) + "\n")
    return folder


def write_one_line(folder: Path, megabytes: int, shape: str) -> Path:
    """customer_support's flows and a scenarios.jsonl of one line ``megabytes`` MB
    long: a JSON array of numbers (``shape`` "array") or an object of keys
    ("object")."""
    folder.mkdir(parents=True)
    shutil.copy(BUNDLED_PACKS_DIR / "customer_support" / "turn_configs.yml", folder)
    size = megabytes * 10**6
    with open(folder / "scenarios.jsonl", "w") as fh:
        if shape == "array":
            fh.write("[1")
            for _ in range(size // 2 // 100_000):
                fh.write(",1" * 100_000)
            fh.write("]\n")
        else:
            fh.write('{"k0":1')
            for i in range(1, size // 12):
                fh.write(f',"k{i}":1')
            fh.write("}\n")
    return folder


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


def load(folder: Path) -> Load:
    command = measured([sys.executable, "-c", DRIVER, str(folder)])
    if command.returncode:
        raise SystemExit(f"the load failed:\n{command.output}")
    data: dict[str, Any] = json.loads(command.output.splitlines()[-1])
    return Load(data["seconds"], data["peak_kb"] / 1024, data["imports_kb"] / 1024, data["outcome"])


def spread(values: list[float], unit: str, digits: int) -> str:
    return (
        f"median {statistics.median(values):.{digits}f} {unit} "
        f"(range {min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def report_loads(title: str, folder: Path, data_file: str, runs: int) -> None:
    size = (folder / data_file).stat().st_size
    print(f"{title}: {size / 10**6:.0f} MB {data_file}")
    loads = [load(folder) for _ in range(runs)]
    print(f"  outcome: {loads[0].outcome}")
    print(f"  load time: {spread([r.seconds for r in loads], 's', 2)} over {runs} runs")
    print(f"  peak RSS:  {spread([r.peak_mb for r in loads], 'MB', 0)}")
    imports = statistics.median(r.imports_mb for r in loads)
    print(f"  RSS after imports, before loading: {imports:.0f} MB")
    convsim = str(Path(sys.executable).parent / "convsim")
    commands = [measured([convsim, "validate", str(folder)]) for _ in range(runs)]
    print(f"  convsim validate: {commands[0].output.splitlines()[0][:60]}")
    print(f"    wall time {spread([c.seconds for c in commands], 's', 2)} (start-up included)")
    print(f"    peak RSS  {spread([c.peak_mb for c in commands], 'MB', 0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--line-mb", type=int, default=50)
    parser.add_argument("--skip-single-turn", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        multi = write_multi_turn(base / "multi", args.scenarios)
        report_loads(
            f"1. multi-turn pack, {args.scenarios:,} scenarios", multi, "scenarios.jsonl", args.runs
        )
        shutil.rmtree(multi)
        if not args.skip_single_turn:
            single = write_single_turn(base / "single", args.scenarios)
            report_loads(
                f"2. single-turn pack, {args.scenarios:,} problems",
                single,
                "problems.jsonl",
                args.runs,
            )
            shutil.rmtree(single)
        for shape in ("array", "object"):
            report_refusal(write_one_line(base / shape, args.line_mb, shape), shape)


def report_refusal(folder: Path, shape: str) -> None:
    size = (folder / "scenarios.jsonl").stat().st_size
    print(f"3. scenarios.jsonl of one {size / 10**6:.0f} MB line (a JSON {shape})")
    refused = load(folder)
    print(f"  load_pack: {refused.outcome[:150]}")
    print(f"    time to refusal {refused.seconds:.3f} s, peak RSS {refused.peak_mb:.0f} MB")
    cli = measured([str(Path(sys.executable).parent / "convsim"), "validate", str(folder)])
    lines = cli.output.strip().splitlines()
    print(f"  convsim validate: exit {cli.returncode}, {len(lines):,} line(s) printed")
    for line in lines[:2]:
        print(f"    {line[:150]}")
    print(f"    wall time {cli.seconds:.2f} s (start-up included), peak RSS {cli.peak_mb:.0f} MB")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
