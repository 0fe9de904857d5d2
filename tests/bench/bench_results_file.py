"""Results-file benchmark: bytes per conversation by length, and peak memory of a run.

Run: python tests/bench/bench_results_file.py [--conversations N]

Part 1 runs one scripted conversation of 10 and of 200 turns and prints the size of its
results line (each message is stored once, so it grows with the length, not its square).

Part 2 runs ``convsim run`` on N ten-turn conversations (default 10,000) with the
scripted model in a child process, then ``convsim report`` on its file, and prints each
one's peak RSS (the summary is folded line by line: near the run's own peak).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_pack(folder: Path, conversations: int, turns: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    turn_list = [
        f"  - turn_id: t{k}\n"
        f"    prompt_template: 'Message {k} from {{name}}: tell me about item {k}.'\n"
        for k in range(turns)
    ]
    (folder / "turn_configs.yml").write_text(
        f"default:\n  max_turns: {turns}\n  turns:\n" + "".join(turn_list), encoding="utf-8"
    )
    (folder / "scenarios.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "scenario_id": f"c{i:05d}",
                    "scenario_description": "bench",
                    "variables": {"name": f"N{i}"},
                }
            )
            + "\n"
            for i in range(conversations)
        ),
        encoding="utf-8",
    )
    return folder


def convsim(*args: str) -> tuple[float, float]:
    """Run ``convsim ARGS`` in a child; (seconds, peak RSS in MB of that child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "convsim", *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:  # ru_maxrss is the largest child so far: run the biggest last
        print("  (peak RSS not above an earlier child's; order the runs by size)")
    return elapsed, peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("bytes per conversation:")
        for turns in (10, 200):
            pack = write_pack(root / f"p{turns}", 1, turns)
            out = root / f"r{turns}.jsonl"
            convsim("run", str(pack), "--out", str(out), "--no-progress")
            print(f"  {turns:4d} turns: {out.stat().st_size / 1024:8.1f} KB")
        pack = write_pack(root / "many", args.conversations, 10)
        out = root / "many.jsonl"
        seconds, peak = convsim("run", str(pack), "--out", str(out), "--no-progress")
        print(
            f"convsim run, {args.conversations} ten-turn conversations: {seconds:.1f} s, "
            f"peak RSS {peak:.0f} MB, file {out.stat().st_size / 2**20:.0f} MB"
        )
        seconds, peak = convsim("report", str(out))
        print(f"convsim report: {seconds:.1f} s (peak RSS: at most the run's, {peak:.0f} MB)")


if __name__ == "__main__":
    main()
