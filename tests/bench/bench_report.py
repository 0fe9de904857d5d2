"""The report at size: the summary of 5,000 conversations, and the HTML report of 2,000
in a real browser.

Run: python tests/bench/bench_report.py [--summary-conversations N] [--conversations N]
     [--summary-only] [--repeats R]

Part 1 runs N (5,000) ten-turn conversations with the scripted model (the runtime
benchmark's pack) and times the summary ``convsim report`` prints of that results file
(``summarize_file``), in CPU seconds of this process (``time.process_time``), R (5)
times: median and range. It prints the whole summary (read the file, fold the results,
the figures) and the figures alone (``Summarizer.report()``, where the bootstraps run),
each beside the same with the earlier pure-Python bootstrap, kept here for this
comparison only and measured in the same run, and whether the two give the same
intervals to three decimals. Target: the summary under 3 s of CPU.

Part 2 runs M (2,000) conversations, writes ``convsim report --html``, and prints the
file's size and the time to write it. Where headless Chromium is installed (Debian's
``chromium``), it also loads the page with a deep link to one conversation and prints
whether that transcript is in the rendered page, and takes a screenshot (``--shot FILE``)
whose pixel range shows it is not blank. The page's Content-Security-Policy forbids any
request, so nothing leaves the file.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from statistics import NormalDist
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).parent))
from bench_runtime import write_pack

import convsim
import convsim.metrics._aggregate as aggregate_module
from convsim.metrics._aggregate import BOOTSTRAP_MAX_N, BOOTSTRAP_RESAMPLES, Interval
from convsim.results._report import RunReport, Summarizer, summarize_file
from convsim.results._sinks import iter_results

SUMMARY_TARGET_S = 3.0


def earlier_bootstrap_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Interval:
    """The summary's bootstrap before it was vectorised (one ``choices`` per resample)."""
    n = len(values)
    if n == 0:
        raise ValueError("a confidence interval of no values")
    if n == 1:
        return Interval(float(values[0]), float(values[0]))
    alpha = (1 - confidence) / 2
    if n > BOOTSTRAP_MAX_N:
        mean = math.fsum(values) / n
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
        half = NormalDist().inv_cdf(1 - alpha) * std / math.sqrt(n)
        return Interval(mean - half, mean + half)
    rng = random.Random(seed)
    data = list(values)
    means = sorted(math.fsum(rng.choices(data, k=n)) / n for _ in range(resamples))
    low = means[max(0, math.floor(alpha * resamples))]
    high = means[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)]
    return Interval(low, high)


@contextmanager
def earlier_bootstrap() -> Iterator[None]:
    """The summary with the earlier bootstrap in place of the one it uses now."""
    current = aggregate_module.bootstrap_ci
    aggregate_module.bootstrap_ci = earlier_bootstrap_ci
    try:
        yield
    finally:
        aggregate_module.bootstrap_ci = current


class Timing(NamedTuple):
    """CPU seconds of repeated runs of one piece of work, and what the last one gave."""

    seconds: list[float]
    report: RunReport

    def line(self) -> str:
        low, high = min(self.seconds), max(self.seconds)
        return f"median {statistics.median(self.seconds):6.2f} s (range {low:.2f}-{high:.2f})"


def cpu_time(work: Callable[[], RunReport], repeats: int) -> Timing:
    seconds, report = [], None
    for _ in range(repeats):
        started = time.process_time()
        report = work()
        seconds.append(time.process_time() - started)
    assert report is not None
    return Timing(seconds, report)


def intervals(report: RunReport) -> dict[str, tuple[float | None, float | None]]:
    """Every interval of a summary, by where it is printed."""
    found = {}
    groups = {"": report.metrics, "turn ": report.turn_metrics}
    for kind, by_name in (
        ("type", report.by_scenario_type),
        ("difficulty", report.by_difficulty),
        ("model", report.by_model),
    ):
        for name, group in by_name.items():
            groups[f"{kind} {name} "] = group.metrics
    groups["retention distance "] = {str(d): s for d, s in report.retention_curve.items()}
    for where, summaries in groups.items():
        for name, s in summaries.items():
            found[where + name] = (s.ci_low, s.ci_high)
    return found


class Agreement(NamedTuple):
    """How far two summaries' intervals are apart."""

    largest_gap: float
    same_to_three_decimals: bool


def agreement(a: RunReport, b: RunReport) -> Agreement:
    ours, theirs = intervals(a), intervals(b)
    assert ours.keys() == theirs.keys()
    pairs = [
        (x, y)
        for key in ours
        for x, y in zip(ours[key], theirs[key], strict=True)
        if x is not None and y is not None
    ]
    return Agreement(
        max((abs(x - y) for x, y in pairs), default=0.0),
        all(f"{x:.3f}" == f"{y:.3f}" for x, y in pairs),
    )


def summary_part(folder: Path, conversations: int, repeats: int) -> None:
    (folder / "summary").mkdir()
    pack = write_pack(folder / "summary", conversations)
    results = folder / "summary.jsonl"
    convsim.run_sync(str(pack), "scripted", out=results, concurrency=256)
    summary = Summarizer()
    for result in iter_results(results):
        summary.add(result)
    scored = {name: m.n for name, m in summary.report().metrics.items() if m.n}
    print(
        f"summary of {conversations:,} ten-turn conversations "
        f"({results.stat().st_size / 1e6:.0f} MB; scored metrics: {scored}), "
        f"CPU seconds over {repeats} runs:"
    )
    whole = cpu_time(lambda: summarize_file(results), repeats)
    figures = cpu_time(summary.report, repeats)
    with earlier_bootstrap():
        whole_before = cpu_time(lambda: summarize_file(results), repeats)
        figures_before = cpu_time(summary.report, repeats)
    print(f"  whole summary (read, fold, figures): {whole.line()}")
    print(f"    with the earlier bootstrap       : {whole_before.line()}")
    print(f"  figures alone (Summarizer.report) : {figures.line()}")
    print(f"    with the earlier bootstrap       : {figures_before.line()}")
    median = statistics.median(whole.seconds)
    verdict = "met" if median < SUMMARY_TARGET_S else "MISSED"
    print(f"  target: the whole summary under {SUMMARY_TARGET_S:.0f} s of CPU: {verdict}")
    agreed = agreement(whole.report, whole_before.report)
    print(
        "  intervals equal to three decimals: "
        f"{'yes' if agreed.same_to_three_decimals else 'NO'} "
        f"(largest gap {agreed.largest_gap:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--summary-conversations", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--shot", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        summary_part(Path(tmp), args.summary_conversations, args.repeats)
    if args.summary_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "pack").mkdir()
        pack = write_pack(folder / "pack", args.conversations)
        results = folder / "run.jsonl"
        convsim.run_sync(str(pack), "scripted", out=results, concurrency=256)
        html = folder / "run.html"
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "convsim", "report", str(results), f"--html={html}"],
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.perf_counter() - started
        size = html.stat().st_size
        print(
            f"{args.conversations:,} ten-turn conversations: report with --html in "
            f"{elapsed:.1f} s, HTML {size / 1e6:.2f} MB (target <= 5 MB)"
        )
        if done.returncode != 0:
            print(done.stderr)
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser is None:
            print("headless Chromium not installed (apt-get install chromium): page not loaded")
            return
        chosen = convsim.read_results(results)[args.conversations // 2]
        answer = next(t.response for t in chosen.turns if t.response) or ""
        flags = [browser, "--headless", "--no-sandbox", "--disable-gpu"]
        url = f"{html.as_uri()}#c={chosen.conversation_id}"
        started = time.perf_counter()
        dom = subprocess.run(
            [*flags, "--virtual-time-budget=10000", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        loaded = time.perf_counter() - started
        detail = dom[dom.find('id="detail"') :]
        print(
            f"Chromium: page loaded and scripted in {loaded:.1f} s; deep link to "
            f"{chosen.conversation_id}: transcript shown {answer[:40] in detail}"
        )
        shot = args.shot or folder / "shot.png"
        subprocess.run(
            [*flags, "--window-size=1300,1400", f"--screenshot={shot}", html.as_uri()],
            capture_output=True,
            timeout=120,
        )
        from PIL import Image

        low, high = Image.open(shot).convert("L").getextrema()
        print(f"screenshot {shot}: pixel range {low}-{high} (blank would be one value)")


if __name__ == "__main__":
    main()
