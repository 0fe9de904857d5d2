"""lm-eval generate_until task against the mock server: lm-eval's own client vs convsim.

Run: python tests/bench/bench_lm_eval.py [--docs N] [--concurrency N] [--latency-ms MS]

One local generate_until task (json data files, ``until: ["\\n"]``, ``max_gen_toks: 32``,
exact_match; half the targets are what the mock server answers) with N documents, the mock
server in a separate process with a fixed time to first token, and each of these in its own
subprocess, all at the same concurrency:
(a) lm-eval's own ``local-chat-completions`` model, ``num_concurrent=N``,
    ``--apply_chat_template``;
(b) lm-eval with ``--model convsim`` (``model=openai-compatible:mock-model``,
    ``concurrency=N``), ``--apply_chat_template``;
(c) ``convsim run lm-eval:TASK --include-path DIR`` (as ``convsim.run_sync``).
Wall time is timed inside each subprocess, from just before the evaluation (task loading
included) to its end; imports are not included. exact_match should be equal in all three.

measured on this machine (python 3.11.7, convsim 0.1.0, lm-eval 0.4.13), defaults: 2,000
docs, concurrency 64, 50 ms mock latency (latency floor 1.56 s), two runs:
  (a) local-chat-completions   4.83 / 4.53 s   1.00x
  (b) lm-eval --model convsim  4.84 / 4.49 s   1.00x / 0.99x
  (c) convsim run lm-eval:TASK 2.59 / 2.19 s   0.54x / 0.48x
exact_match 0.5000 in all. (b) runs lm-eval's own request building and per-document
scoring, which cost as much as (a)'s; (c) works each target out once and sends requests
without a worker-thread hop each (before those two changes it was level with (a)).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

TASK = "bench_lm_eval_echo"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def mock_reply(question: str, max_words: int) -> str:
    """What the mock server answers to a one-message chat ``question`` (seed 0)."""
    from convsim.adapters import Message
    from convsim.adapters._recall import recall_reply

    words = recall_reply([Message(role="user", content=question)], memory_turns=None, seed=0)
    return " ".join(words.split()[:max_words])


OPENINGS = "Understood|Thanks for the details|Got it|Sure"


def write_task(folder: Path, docs: int) -> Path:
    """A generate_until task of ``docs`` documents; even ones expect the mock's answer.

    The mock's opening word depends on the request's seed (lm-eval sends 1234, convsim
    its own), so exact_match ignores it.
    """
    data = folder / f"{TASK}.jsonl"
    with open(data, "w", encoding="utf-8") as fh:
        for i in range(docs):
            question = f"Question number {i} is about item {i * 7 % 101}. Please answer it"
            answer = mock_reply(question, 32) if i % 2 == 0 else f"Sure. Something else {i}"
            fh.write(json.dumps({"question": question, "answer": answer}) + "\n")
    (folder / f"{TASK}.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: {TASK}
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {data}
            test_split: test
            output_type: generate_until
            doc_to_text: "{{{{question}}}}"
            doc_to_target: "{{{{answer}}}}"
            generation_kwargs:
              until: ["\\n"]
              max_gen_toks: 32
              do_sample: false
              temperature: 0.0
            metric_list:
              - metric: exact_match
                aggregation: mean
                higher_is_better: true
                regexes_to_ignore: ["^({OPENINGS})[.] "]
            """
        ),
        encoding="utf-8",
    )
    return folder


# --- the three contenders, each run in its own subprocess ------------------------------


def _quiet() -> None:
    import logging

    import structlog

    logging.basicConfig(level=logging.ERROR)
    for name in ("lm-eval", "lm_eval", "httpx", "datasets", "convsim"):
        logging.getLogger(name).setLevel(logging.ERROR)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def _simple_evaluate(model: str, model_args: dict[str, Any], include: str) -> tuple[float, float]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    t0 = time.perf_counter()
    results = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[TASK],
        task_manager=TaskManager(include_path=include, include_defaults=False),
        apply_chat_template=True,
        verbosity="ERROR",
    )
    wall = time.perf_counter() - t0
    assert results is not None
    return wall, float(results["results"][TASK]["exact_match,none"])


def contender(which: str, url: str, include: str, concurrency: int) -> dict[str, Any]:
    _quiet()
    if which == "a":
        wall, em = _simple_evaluate(
            "local-chat-completions",
            {
                "base_url": f"{url}/chat/completions",
                "model": "mock-model",
                "num_concurrent": concurrency,
                "tokenizer_backend": None,
                "max_retries": 3,
            },
            include,
        )
    elif which == "b":
        from convsim.lm_eval import register_lm_eval_model

        register_lm_eval_model()
        wall, em = _simple_evaluate(
            "convsim",
            {
                "model": "openai-compatible:mock-model",
                "base_url": url,
                "concurrency": concurrency,
            },
            include,
        )
    else:
        import lm_eval.tasks  # noqa: F401  imported before t0, as in (a) and (b)

        import convsim
        from convsim._gc import tune_gc_for_throughput

        tune_gc_for_throughput()
        t0 = time.perf_counter()
        pack = convsim.load_pack(f"lm-eval:{TASK}", include_path=include)
        results = convsim.run_sync(
            pack,
            "openai-compatible:mock-model",
            model_args={"base_url": url},
            concurrency=concurrency,
            metrics=[],
        )
        wall = time.perf_counter() - t0
        values = [r.scores["lm_eval_task:exact_match"].value for r in results]
        em = sum(values) / len(values)
    return {"wall": wall, "exact_match": em}


def run_contender(which: str, url: str, include: Path, concurrency: int) -> dict[str, Any]:
    env = {**os.environ, **OFFLINE}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--contender",
            which,
            "--url",
            url,
            "--include",
            str(include),
            "--concurrency",
            str(concurrency),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    process_wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-15:]}
    return {**json.loads(lines[-1][len("RESULT ") :]), "process": process_wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=50)
    parser.add_argument("--contender", choices=["a", "b", "c"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--include", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.contender:
        result = contender(args.contender, args.url, args.include, args.concurrency)
        print("RESULT " + json.dumps(result), flush=True)
        return

    os.environ.update(OFFLINE)
    import lm_eval
    from bench_adapters import mock_server

    import convsim

    print(
        f"python {sys.version.split()[0]}, convsim {convsim.__version__}, "
        f"lm-eval {getattr(lm_eval, '__version__', '?')}; {args.docs} docs, "
        f"concurrency {args.concurrency}, mock latency {args.latency_ms:g} ms"
    )
    floor = args.docs / args.concurrency * args.latency_ms / 1000
    names = {
        "a": "(a) lm-eval local-chat-completions",
        "b": "(b) lm-eval --model convsim",
        "c": "(c) convsim run lm-eval:TASK",
    }
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        include = write_task(Path(tmp), args.docs)
        with mock_server("--ttft-ms", f"{args.latency_ms:g}") as url:
            for which in "abc":
                results[which] = run_contender(which, url, include, args.concurrency)

    base = results["a"].get("wall")
    print(f"latency floor (docs / concurrency x latency): {floor:.2f} s")
    print(f"{'':38} {'wall s':>8} {'docs/s':>8} {'vs (a)':>7} {'process s':>9} {'exact_match':>11}")
    for which in "abc":
        r = results[which]
        if "error" in r:
            print(f"{names[which]:38} failed:")
            for line in r["error"]:
                print(f"    {line}")
            continue
        ratio = f"{r['wall'] / base:.2f}x" if base else "-"
        print(
            f"{names[which]:38} {r['wall']:8.2f} {args.docs / r['wall']:8.0f} {ratio:>7} "
            f"{r['process']:9.2f} {r['exact_match']:11.4f}"
        )
    print("vs (a): wall time over (a)'s; process s: the subprocess, imports included")


if __name__ == "__main__":
    main()
