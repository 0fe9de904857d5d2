"""Pack fuzzing, long run: mutated packs through ``convsim validate``, counted by outcome.

Run: python tests/bench/bench_pack_fuzz.py [--cases N] [--seed S] [--show K] [--run]

Each case is a valid pack of either format (the bundled customer_support and
single_turn_qa, trimmed) changed one way (see tests/_pack_fuzz.py). Prints how many
were accepted, refused with exit 2 and a located message, or anything else (a
traceback, another exit code, a message naming no file), the first K of the last kind,
the slowest case, and the peak RSS. With --run, each accepted pack is also run
(scripted model, 3 conversations) and counted as running or failing at run time.
tests/test_pack_fuzz.py runs a few hundred of the same cases in the suite.
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _pack_fuzz import Answer, Case, Outcome, RunOutcome, cases, run, validate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=5, help="'other' cases to print")
    parser.add_argument("--run", action="store_true", help="also run accepted packs")
    args = parser.parse_args()
    counts: collections.Counter[Outcome] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    others: list[tuple[Case, Answer]] = []
    runs: collections.Counter[RunOutcome] = collections.Counter()
    broke: list[tuple[Case, str]] = []
    slowest = (0.0, "")
    started = time.perf_counter()

    @settings(
        max_examples=args.cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases())
    def one(case: Case) -> None:
        nonlocal slowest
        t0 = time.perf_counter()
        answer = validate(case)
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, (elapsed, case.change))
        counts[answer.outcome] += 1
        kinds[f"{case.kind} {answer.outcome.name.lower()}"] += 1
        if answer.outcome is Outcome.OTHER:
            others.append((case, answer))
        if args.run and answer.outcome is Outcome.ACCEPTED:
            ran, output = run(case)
            runs[ran] += 1
            if ran is RunOutcome.BROKE:
                broke.append((case, output))

    import hypothesis

    hypothesis.seed(args.seed)(one)()
    total = sum(counts.values())
    print(f"{total} cases in {time.perf_counter() - started:.1f} s (seed {args.seed})")
    for outcome in Outcome:
        print(f"  {outcome.value:<60} {counts[outcome]:>6}")
    for kind, n in sorted(kinds.items()):
        print(f"    {kind:<58} {n:>6}")
    for ran in RunOutcome if args.run else ():
        print(f"  accepted, then {ran.value:<50} {runs[ran]:>6}")
    print(f"slowest case: {slowest[0]:.2f} s ({slowest[1]})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {peak:.0f} MB")
    for case, answer in others[: args.show]:
        print(
            f"\n--- {case.kind}: {case.change} (exit {answer.exit_code})\n{answer.output[-2000:]}"
        )
    for case, output in broke[: args.show]:
        print(f"\n--- run of {case.kind}: {case.change}\n{output[-2000:]}")
    sys.exit(1 if others or broke else 0)


if __name__ == "__main__":
    main()
