"""The HTML report at size: 2,000 ten-turn conversations, and the page in a real browser.

Run: python tests/bench/bench_report.py [--conversations N]

Runs N ten-turn conversations with the scripted model (the runtime benchmark's pack),
writes ``convsim report --html``, and prints the file's size and the time to write it.
Where headless Chromium is installed (Debian's ``chromium``), it also loads the page
with a deep link to one conversation and prints whether that transcript is in the
rendered page, and takes a screenshot (``--shot FILE``) whose pixel range shows it is not
blank. The page's Content-Security-Policy forbids any request, so nothing leaves the file.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_runtime import write_pack

import convsim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--shot", type=Path, default=None)
    args = parser.parse_args()
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
