"""Fault benchmark: what a run against a faulty server finishes, fails, hangs, loses.

Run: python tests/bench/bench_faults.py [--conversations 500] [--fault-rate 0.2]

Starts the mock server injecting ``--fault-rate`` faults (by default an equal mix of
every kind it has: 429, 500, dropped connections, malformed 200 answers, HTML pages,
streams that break midway, half emoji),
runs ``convsim run`` on N ten-turn conversations against it as a user would (a separate
process, streaming), then ``convsim run --resume --retry-failed`` on the same file, and
prints for each pass: conversations DONE, FAILED by cause, hung (the process did not
finish in time), duplicated (a conversation with more than one line counted twice by a
reader) and missing (in the pack, in no line), plus the exit code and the server's fault
counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from anyio.from_thread import start_blocking_portal

sys.path.insert(0, str(Path(__file__).parent))
from bench_runtime import write_pack

from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.results._sinks import read_results

DEFAULT_FAULTS = (
    "429,500,drop,malformed,html,truncated_sse,stream_error,stream_drop,"
    "lone_surrogate,split_surrogate"
)


def _run(args: list[str], timeout: float) -> tuple[int | None, float, str]:
    started = time.perf_counter()
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return None, time.perf_counter() - started, str(exc.stderr or "")[-2000:]
    return done.returncode, time.perf_counter() - started, done.stderr[-2000:]


def _count(results: Path, expected: set[str]) -> dict[str, object]:
    lines = [json.loads(raw) for raw in results.read_text().splitlines() if raw.strip()]
    per_id = Counter(obj["conversation_id"] for obj in lines)
    latest = {r.conversation_id: r for r in read_results(results)}
    by_status = Counter(r.status.value for r in latest.values())
    causes = Counter(
        f"{r.termination_reason.value}:{r.error.type if r.error else '-'}"
        for r in latest.values()
        if r.status.value != "DONE"
    )
    return {
        "lines": len(lines),
        "read_back": len(read_results(results)),
        "done": by_status.get("DONE", 0),
        "failed_by_cause": dict(causes.most_common()),
        "statuses": dict(by_status),
        "duplicated_by_readers": len(read_results(results)) - len(latest),
        "ids_with_several_lines": sum(1 for n in per_id.values() if n > 1),
        "missing": len(expected - set(per_id)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--faults", default=DEFAULT_FAULTS)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before 'hung'")
    args = parser.parse_args()
    faults = {kind: 1.0 for kind in args.faults.split(",")}
    config = MockServerConfig(
        fault_rate=args.fault_rate, faults=faults, retry_after_s=0.0, ttft_ms=2, itl_ms=0.5
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as server,
    ):
        (Path(tmp) / "pack").mkdir()
        pack = write_pack(Path(tmp) / "pack", args.conversations)
        expected = {
            json.loads(line)["scenario_id"]
            for line in (pack / "scenarios.jsonl").read_text().splitlines()
        }
        out = Path(tmp) / "results.jsonl"
        command = [sys.executable, "-m", "convsim", "run", str(pack), "--out", str(out)]
        command += ["--model", "openai-compatible:mock-model"]
        command += ["--model-arg", f"base_url={server.base_url}", "--model-arg", "stream=true"]
        command += ["--concurrency", str(args.concurrency), "--no-progress"]
        print(f"{args.conversations} x 10 turns; faults {faults} at rate {args.fault_rate}")
        passes = [("run", []), ("resume --retry-failed", ["--resume", "--retry-failed"])]
        for label, extra in passes:
            code, seconds, stderr = _run(command + extra, args.timeout)
            counts = _count(out, expected)
            counts["hung"] = 0 if code is not None else "the process did not finish"
            print(f"\n{label}: exit {code} in {seconds:.1f} s")
            print(json.dumps(counts, indent=2))
            if code not in (0, None):
                print(stderr.strip().splitlines()[-1] if stderr.strip() else "")
        print("\nserver:", json.dumps(dataclasses.asdict(server.statistics()), indent=2))


if __name__ == "__main__":
    main()
