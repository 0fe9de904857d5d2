"""The runtime's concurrency is real: conversations alive at once, against the asked value.

Run: python tests/bench/bench_concurrency.py [--conversations N]

Drives ``convsim run``'s runtime (``Simulator``, no metrics) with the OpenAI-compatible
adapter against the mock server in its own process, and prints, from the run's own
statistics, the time-weighted mean and the peak of conversations in flight, the
conversations whose start waited for a late event loop (``admission_held``), and
requests/s:

1. zero-latency mock, concurrency 256, three-turn conversations;
2. 100 ms per answer, concurrency 1,000, three-turn conversations;
3. the same as 2 with admission by loop lag turned off (``max_loop_lag=None``), to show
   what it costs or saves.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).parent))
from bench_mock_server import mock_server

import convsim
from convsim._gc import tune_gc_for_throughput
from convsim.adapters import create_adapter


def write_pack(folder: Path, conversations: int) -> Path:
    (folder / "scenarios.jsonl").write_text(
        "\n".join(
            f'{{"scenario_id": "c{i}", "scenario_type": "default", '
            f'"scenario_description": "conversation {i}", "variables": {{"n": {i}}}}}'
            for i in range(conversations)
        )
        + "\n"
    )
    (folder / "turn_configs.yml").write_text(
        "default:\n  turns:\n"
        "    - {turn_id: a, prompt_template: 'Hello, I am number {n}.'}\n"
        "    - {turn_id: b, depends_on: [a], prompt_template: 'What number am I?'}\n"
        "    - {turn_id: c, depends_on: [b], prompt_template: 'Thanks, bye.'}\n"
    )
    return folder


async def run(
    url: str, pack: Path, concurrency: int, max_loop_lag: float | None
) -> convsim.RunStatistics:
    adapter = create_adapter(
        "openai-compatible:mock-model",
        {"base_url": url + "/v1", "concurrency": concurrency, "max_tokens": 16},
    )
    async with convsim.Simulator(
        adapter, concurrency=concurrency, metrics=[], max_loop_lag=max_loop_lag
    ) as sim:
        handle = sim.run(pack)
        async for _ in handle:
            pass
        stats = handle.statistics()
    await adapter.aclose()
    return stats


def show(label: str, stats: convsim.RunStatistics, concurrency: int) -> None:
    print(
        f"{label}: in flight mean {stats.mean_in_flight:,.0f} max {stats.max_in_flight:,} "
        f"of {concurrency:,} asked, admission held {stats.admission_held:,}, "
        f"{stats.turns / stats.elapsed_s:,.0f} requests/s, {stats.done:,} done, "
        f"{stats.failed:,} failed",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=4000)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tune_gc_for_throughput()
    with tempfile.TemporaryDirectory() as tmp:
        pack = write_pack(Path(tmp), args.conversations)
        with mock_server() as server:
            stats = anyio.run(run, server.url, pack, 256, 0.05)
            show("zero latency, concurrency 256", stats, 256)
        with mock_server("--ttft-ms", "100") as server:
            stats = anyio.run(run, server.url, pack, 1000, 0.05)
            show("100 ms answers, concurrency 1,000", stats, 1000)
            stats = anyio.run(run, server.url, pack, 1000, None)
            show("100 ms answers, concurrency 1,000, no admission by lag", stats, 1000)


if __name__ == "__main__":
    main()
