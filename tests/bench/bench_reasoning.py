"""Reasoning benchmark: convsim's TTFT and TTFOT against a bare client's, same run.

Run: python tests/bench/bench_reasoning.py [--requests N] [--reasoning-tokens R]

Starts ``python -m convsim mock-server --reasoning-tokens R --ttft-ms 20 --itl-ms 1`` in
its own process (R words of ``reasoning_content``, one event each, before the answer),
then sends N streamed chat completions one at a time, alternating a bare aiohttp client
(times to the first ``data:`` event carrying reasoning, and carrying content) and
convsim's ``openai-compatible`` adapter (``timings.ttft_s`` and ``timings.ttfot_s``).
Prints the median of each and the differences, which the issue wants within 2 ms; a
server that ignored the reasoning would show TTFT near TTFOT (R ms apart here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from typing import NamedTuple

import aiohttp

from convsim.adapters import GenerationParams, Message
from convsim.adapters._openai import OpenAICompatibleAdapter

MESSAGES = [{"role": "user", "content": "Is 91 prime?"}]


class Reading(NamedTuple):
    ttft_s: float
    ttfot_s: float


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _ready(session: aiohttp.ClientSession, url: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            async with session.get(f"{url}/v1/models") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the mock server did not start")


async def _bare(session: aiohttp.ClientSession, url: str) -> Reading:
    body = {"model": "mock-model", "messages": MESSAGES, "stream": True}
    first = first_output = None
    t0 = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            delta = delta[0]["delta"] if delta else {}
            now = time.perf_counter()
            if first is None and (delta.get("reasoning_content") or delta.get("content")):
                first = now
            if first_output is None and delta.get("content"):
                first_output = now
    assert first is not None and first_output is not None
    return Reading(first - t0, first_output - t0)


async def _convsim(adapter: OpenAICompatibleAdapter) -> Reading:
    completion = await adapter.generate(
        [Message(role="user", content="Is 91 prime?")], GenerationParams()
    )
    timings = completion.timings
    assert timings.ttft_s is not None and timings.ttfot_s is not None
    return Reading(timings.ttft_s, timings.ttfot_s)


async def main(requests: int, reasoning_tokens: int) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "convsim", "mock-server", "--port", str(port)),
        *("--reasoning-tokens", str(reasoning_tokens), "--ttft-ms", "20", "--itl-ms", "1"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    adapter = OpenAICompatibleAdapter(
        {"model": "mock-model", "base_url": f"{url}/v1", "stream": True}, env={}
    )
    bare: list[Reading] = []
    ours: list[Reading] = []
    try:
        async with aiohttp.ClientSession() as session:
            await _ready(session, url)
            await _bare(session, url)  # warm both connections up
            await _convsim(adapter)
            for _ in range(requests):
                bare.append(await _bare(session, url))
                ours.append(await _convsim(adapter))
    finally:
        await adapter.aclose()
        server.terminate()
        await server.wait()

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1000

    rows = [
        ("TTFT", ms([r.ttft_s for r in bare]), ms([r.ttft_s for r in ours])),
        ("TTFOT", ms([r.ttfot_s for r in bare]), ms([r.ttfot_s for r in ours])),
    ]
    print(f"{requests} streamed requests each, {reasoning_tokens} reasoning tokens, medians:")
    print(f"{'':6} {'bare ms':>9} {'convsim ms':>11} {'diff ms':>8}")
    for name, b, c in rows:
        print(f"{name:6} {b:9.2f} {c:11.2f} {c - b:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--reasoning-tokens", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.reasoning_tokens))
