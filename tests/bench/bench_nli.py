"""Timing benchmark: 1,000 dialogues of 8 turns through consistency and nli_coherence with
the NLI backend.

Run: python tests/bench/bench_nli.py [--dialogues N] [--turns T] [--sized]

The model is the folder CONVSIM_NLI_MODEL names; without one, with ``--sized``, a random
model of DeBERTa-v3-xsmall's shape and int8 quantisation (tests/bench/_sized_nli_model.py,
built in about a minute: its times estimate a real model's, its answers mean nothing);
else the tiny random test model of tests/_nli_model.py (a few kilobytes: its times
measure convsim's own overhead and the pair count, not a real cross-encoder's speed).
The output says which was used. The
dialogues are synthetic: a user stating things about themself and an assistant
answering in two sentences, one of them sometimes negated. Prints the wall time, the
pairs scored and the time per dialogue and per pair.

This is a benchmark script, not a test: importing it does nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_TOPICS = "jazz tea hiking dogs cats chess cooking cycling poetry gardening".split()


def dialogue(seed: int, turns: int) -> list[dict[str, str]]:
    """A synthetic dialogue of ``turns`` exchanges."""
    messages = []
    for t in range(turns):
        topic = _TOPICS[(seed + t) % len(_TOPICS)]
        other = _TOPICS[(seed * 7 + t) % len(_TOPICS)]
        user = f"I really like {topic} and I do it every week. What about you?"
        negated = "do not" if (seed + t) % 5 == 0 else "do"
        answer = f"I {negated} enjoy {topic} a lot. My favourite is {other}, honestly."
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return messages


def tiny_model(folder: Path) -> Path:
    """The random test model of tests/_nli_model.py, written to ``folder``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import _nli_model

    return _nli_model.write_model(folder, _nli_model.random_model(0))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument(
        "--sized", action="store_true", help="a random model of DeBERTa-v3-xsmall's shape"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="convsim-nli-bench-") as tmp:
        given = os.environ.get("CONVSIM_NLI_MODEL", "")
        if given:
            which = f"model {given}"
        elif args.sized:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import _sized_nli_model

            texts = [m["content"] for i in range(200) for m in dialogue(i, args.turns)]
            os.environ["CONVSIM_NLI_MODEL"] = str(
                _sized_nli_model.write_sized_model(Path(tmp), texts)
            )
            which = (
                "a RANDOM MODEL OF DeBERTa-v3-xsmall's SHAPE (int8): the times estimate a "
                "real model's; its scores mean nothing"
            )
        else:
            os.environ["CONVSIM_NLI_MODEL"] = str(tiny_model(Path(tmp)))
            which = (
                "the TINY RANDOM TEST MODEL (no CONVSIM_NLI_MODEL given): the times are "
                "convsim's overhead and pair counts, not a real model's speed"
            )
        run(args.dialogues, args.turns, which)


def run(dialogues: int, turns: int, which: str) -> None:
    import anyio

    from convsim.metrics import score_transcripts
    from convsim.metrics._contextual import pair_classifier
    from convsim.metrics._transcripts import build_transcript

    started = time.perf_counter()
    classifier = pair_classifier()
    if classifier is None:
        raise SystemExit("no NLI classifier: install convsim[nli] and set CONVSIM_NLI_MODEL")
    loaded = time.perf_counter() - started
    transcripts = [build_transcript(str(i), dialogue(i, turns)) for i in range(dialogues)]
    started = time.perf_counter()
    results: Any = anyio.run(
        lambda: score_transcripts(transcripts, ["consistency", "nli_coherence"], concurrency=16)
    )
    elapsed = time.perf_counter() - started
    pairs = 0
    for r in results:
        for name in ("consistency", "nli_coherence"):
            score = r.scores[name]
            if score.details.get("backend") != "nli":
                raise SystemExit(f"{name} did not score with the NLI backend: {score}")
        pairs += r.scores["consistency"].details.get("pairs_scored", 0)
        pairs += r.scores["nli_coherence"].details.get("turns", 0)
    print(f"NLI timing bench on {which}")
    print(f"  cpus {os.cpu_count()}; model loaded in {loaded:.2f} s")
    print(
        f"  {dialogues} dialogues of {turns} turns through consistency + nli_coherence: "
        f"{elapsed:.1f} s wall, {elapsed / dialogues * 1000:.1f} ms a dialogue; "
        f"{pairs} pairs scored, {elapsed / max(1, pairs) * 1000:.2f} ms a pair"
    )


if __name__ == "__main__":
    main()
