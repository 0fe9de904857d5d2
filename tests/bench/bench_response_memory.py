"""Peak memory of an adapter reading large answers at once, with and without the
``max_inflight_bytes`` budget.

Run: python tests/bench/bench_response_memory.py [--mib 64] [--calls 32] [--budgets 256,128]

A server in a separate process answers every call with a JSON body of ``--mib`` MiB,
sending each answer's first half at once and its second half only once every call has
had its first half (or after 10 s), so all calls are in the middle of their answers at
the same time. Each configuration runs in a fresh client process, which reports its
peak resident set size (``ru_maxrss``) and the peak of bytes the budget counted:

1. no budget to speak of (``max_inflight_bytes`` = calls x body, never reached): what
   the adapter did before the budget existed;
2. each budget of ``--budgets`` (MiB; 256 is the default).

The resident set is larger than the bytes counted: a call that has read its answer
joins the pieces into one body and parses it (the text is copied twice more), and the
allocator keeps freed memory for reuse.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import resource
import socket
import time
from typing import Any

MIB = 2**20


def _serve(port: int, mib: int, calls: int) -> None:
    import asyncio

    from aiohttp import web

    text = b"w" * (mib * MIB - 100)
    body = b'{"choices": [{"message": {"content": "' + text + b'"}, "finish_reason": "stop"}]}'

    async def main() -> None:
        all_in = asyncio.Event()
        arrived = 0

        async def respond(request: web.Request) -> web.StreamResponse:
            nonlocal arrived
            await request.read()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            half = len(body) // 2
            try:
                await response.write(body[:half])
            except ConnectionError:
                return response
            finally:
                arrived += 1
                if arrived % calls == 0:
                    all_in.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(all_in.wait(), 10)
            with contextlib.suppress(ConnectionError):
                await response.write(body[half:])
                await response.write_eof()
            if arrived % calls == 0:
                all_in.clear()
            return response

        app = web.Application()
        app.router.add_post("/v1/chat/completions", respond)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def _client(port: int, calls: int, inflight: int, out: Any) -> None:
    import anyio

    from convsim import ResponseTooLarge
    from convsim.adapters import GenerationParams, Message, create_adapter

    async def main() -> dict[str, Any]:
        adapter = create_adapter(
            "openai-compatible:m",
            {
                "base_url": f"http://127.0.0.1:{port}/v1",
                "concurrency": str(calls),
                "max_retries": "0",
                "max_inflight_bytes": str(inflight),
            },
        )
        answered = refused = 0

        async def call() -> None:
            nonlocal answered, refused
            try:
                await adapter.generate([Message(role="user", content="hi")], GenerationParams())
                answered += 1
            except ResponseTooLarge:
                refused += 1

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(calls):
                tg.start_soon(call)
        seconds = time.perf_counter() - started
        await adapter.aclose()
        held = adapter.bytes_in_flight()  # type: ignore[attr-defined]
        return {
            "max_inflight_bytes_mib": inflight / MIB,
            "answered": answered,
            "refused": refused,
            "budget_peak_mib": round(held.peak / MIB, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "seconds": round(seconds, 2),
        }

    out.put(anyio.run(main))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per answer")
    parser.add_argument("--calls", type=int, default=32, help="calls at once")
    parser.add_argument("--budgets", default="256,128", help="max_inflight_bytes, MiB")
    args = parser.parse_args()
    port = _free_port()
    context = multiprocessing.get_context("spawn")
    server = context.Process(target=_serve, args=(port, args.mib, args.calls), daemon=True)
    server.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    try:
        budgets = [int(b) * MIB for b in args.budgets.split(",") if b.strip()]
        for inflight in (args.calls * args.mib * MIB, *budgets):
            queue = context.Queue()
            client = context.Process(target=_client, args=(port, args.calls, inflight, queue))
            client.start()
            print(json.dumps(queue.get(timeout=300)))
            client.join()
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
