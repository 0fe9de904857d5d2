"""Runtime benchmark: turns/s, per-turn overhead, and memory at 10,000 conversations.

Run: python tests/bench/bench_runtime.py [--conversations N] [--memory-conversations N]

Part 1 drives N ten-turn conversations through the runtime with the scripted adapter
(no latency) and, in the same process, calls the same adapter directly for the same
turns ("raw client"). It prints turns/s for both, their ratio, and the runtime's
overhead per turn in microseconds.

Part 2 holds M ten-turn conversations at once (concurrency M, scripted latency 1 s per
call) and prints peak RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import resource
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

import convsim
from convsim._gc import tune_gc_for_throughput
from convsim.adapters import GenerationParams, Message, ScriptedAdapter
from convsim.metrics import DEFAULT_METRICS

TURNS = 10
USER_LINES = [
    "Hi, I'm {name} and my order {order_id} for {amount} dollars still hasn't arrived.",
    "I ordered it on {date} and paid with my {card} card.",
    "The tracking page has not changed for five days. What can you see on your side?",
    "My shipping address is {street}, please double check it.",
    "Can you tell me which order number and amount we are talking about?",
    "If it is lost, I would prefer a refund over a replacement.",
    "How long does a refund usually take to reach my {card} card?",
    "Remind me, what date did I place the order?",
    "Is there anything else you need from me to open the claim?",
    "Thanks. Please summarise what we agreed, including my name and the order number.",
]


def write_pack(folder: Path, conversations: int) -> Path:
    """A ten-turn flow and ``conversations`` scenarios, without reference answers."""
    turns = []
    for i, line in enumerate(USER_LINES):
        turn = {"turn_id": f"t{i}", "prompt_template": line}
        if i:
            turn["depends_on"] = [f"t{i - 1}"]
        turns.append(turn)
    flows = {"default": {"max_turns": TURNS, "conversation_timeout": 600, "turns": turns}}
    (folder / "turn_configs.yml").write_text(json.dumps(flows))  # JSON is valid YAML
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(conversations):
            fh.write(
                json.dumps(
                    {
                        "scenario_id": f"s{i:06d}",
                        "scenario_description": "a delayed order",
                        "variables": {
                            "name": f"Customer {i}",
                            "order_id": f"A-{100000 + i}",
                            "amount": 20 + i % 300,
                            "date": f"2026-03-{1 + i % 28:02d}",
                            "card": ["visa", "mastercard", "amex"][i % 3],
                            "street": f"{i % 999} Elm Street",
                        },
                    }
                )
                + "\n"
            )
    return folder


async def runtime_throughput(
    pack: convsim.Pack, concurrency: int, metrics: list[str] | None = None
) -> tuple[float, int]:
    started = time.perf_counter()
    turns = 0
    async with convsim.Simulator("scripted", concurrency=concurrency, metrics=metrics) as sim:
        async for result in sim.run(pack):
            turns += sum(1 for t in result.turns if t.status is convsim.TurnStatus.COMPLETED)
    return time.perf_counter() - started, turns


async def raw_throughput(pack: convsim.Pack) -> tuple[float, int]:
    """The same adapter called directly, with the same conversations, no runtime."""
    adapter = ScriptedAdapter()
    params = GenerationParams(max_tokens=512)
    started = time.perf_counter()
    turns = 0
    for conv in pack.conversations:
        history: list[Message] = []
        for turn in conv.flow.turns:
            text = turn.template.render(conv.scenario.variables)
            history.append(Message(role="user", content=text))
            completion = await adapter.generate(history, params.model_copy(update={"seed": turns}))
            history.append(Message(role="assistant", content=completion.text))
            turns += 1
    return time.perf_counter() - started, turns


async def memory_hold(pack: convsim.Pack) -> tuple[float, int]:
    started = time.perf_counter()
    done = 0
    async with convsim.Simulator(
        "scripted",
        model_args={"latency": 1.0},
        concurrency=len(pack),
        metrics=["latency", "response_length"],
    ) as sim:
        async for result in sim.run(pack):
            done += result.status is convsim.Status.DONE
    return time.perf_counter() - started, done


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--memory-conversations", type=int, default=10_000)
    parser.add_argument(
        "--gc",
        choices=["tuned", "default"],
        default="tuned",
        help="memory part: the CLI's GC settings (tuned) or CPython's defaults",
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    with tempfile.TemporaryDirectory() as tmp:
        pack = convsim.load_pack(write_pack(Path(tmp), args.conversations))
        raw_s, raw_turns = anyio.run(raw_throughput, pack)
        run_s, run_turns = anyio.run(runtime_throughput, pack, args.concurrency, [])
        with_s, with_turns = anyio.run(runtime_throughput, pack, args.concurrency, None)
        gc.collect()
        thresholds = gc.get_threshold()
        tune_gc_for_throughput()
        tuned_s, tuned_turns = anyio.run(runtime_throughput, pack, args.concurrency, [])
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    raw_rate, run_rate, tuned_rate = raw_turns / raw_s, run_turns / run_s, tuned_turns / tuned_s
    with_rate = with_turns / with_s
    print(f"python {sys.version.split()[0]}, convsim {convsim.__version__}")
    print(
        f"[throughput] {args.conversations} conversations x {TURNS} turns, "
        f"concurrency {args.concurrency}, scripted adapter without latency"
    )
    print(f"  raw adapter loop          : {raw_rate:10,.0f} turns/s ({raw_turns} turns)")
    print(
        f"  convsim runtime, no metrics: {run_rate:10,.0f} turns/s ({run_rate / raw_rate:.2f}x raw)"
    )
    print(
        f"  ... with default metrics   : {with_rate:10,.0f} turns/s "
        f"({with_rate / run_rate:.2f}x no metrics; {', '.join(DEFAULT_METRICS)})"
    )
    print(
        f"  ... no metrics, CLI's GC   : {tuned_rate:10,.0f} turns/s "
        f"({tuned_rate / raw_rate:.2f}x raw)"
    )
    print(
        f"  runtime overhead           : {(run_s - raw_s) / run_turns * 1e6:.1f} us per turn "
        "(state machine, records, results, scheduling)"
    )

    base = rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        pack = convsim.load_pack(write_pack(Path(tmp), args.memory_conversations))
        after_load = rss_mb()
        if args.gc == "tuned":
            tune_gc_for_throughput()
        hold_s, done = anyio.run(memory_hold, pack)
    print(
        f"[memory] {args.memory_conversations} concurrent conversations x {TURNS} turns, "
        f"scripted latency 1 s, {args.gc} GC settings"
    )
    print(f"  finished DONE     : {done} in {hold_s:.1f} s (ideal {TURNS} s)")
    print(
        f"  peak RSS          : {rss_mb():.0f} MB (before: {base:.0f} MB, after loading the pack: "
        f"{after_load:.0f} MB)"
    )


if __name__ == "__main__":
    main()
