"""Runs under trio: a pack over HTTP with a rate budget, through Simulator.

The mock server is aiohttp, which needs asyncio: it runs in a thread of its own with its
own asyncio loop, on 127.0.0.1, while the test's event loop is trio's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import write_pack

from convsim import ConfigError, Simulator, Status
from convsim.adapters import GenerationParams, Message
from convsim.adapters._http import HttpxTransport, default_http_library
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@contextmanager
def mock_server_in_a_thread(**config: Any) -> Iterator[MockModelServer]:
    """A mock server on 127.0.0.1 in a thread running an asyncio loop; stopped on exit."""
    ready = threading.Event()
    found: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        try:
            async with MockModelServer(MockServerConfig(**config)) as server:
                found.update(server=server, stop=stop, loop=asyncio.get_running_loop())
                ready.set()
                await stop.wait()
        finally:
            ready.set()  # also when it failed to start: the test then says so

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(30)
    if "server" not in found:
        raise RuntimeError("the mock server did not start")
    try:
        yield found["server"]
    finally:
        found["loop"].call_soon_threadsafe(found["stop"].set)
        thread.join(30)


def two_turn_pack(tmp_path: Path, conversations: int) -> Path:
    turns = [
        {"turn_id": "ask", "prompt_template": "Where is order {{order}}?"},
        {"turn_id": "thanks", "prompt_template": "Thanks."},
    ]
    scenarios = [
        {"scenario_id": f"s{i}", "scenario_description": "trio", "variables": {"order": f"A-{i}"}}
        for i in range(conversations)
    ]
    return write_pack(tmp_path / "pack", {"default": {"turns": turns}}, scenarios)


async def test_a_pack_runs_over_http_with_an_rpm_budget_under_trio(tmp_path: Path) -> None:
    rpm = 600  # one call every 60 / (0.99 x 600) s = 0.101 s
    pack = two_turn_pack(tmp_path, conversations=3)
    with mock_server_in_a_thread(rpm=rpm) as server:
        model = OpenAICompatibleAdapter({"model": "mock-model", "base_url": server.base_url,
                                         "rpm": rpm, "max_retries": 0}, env={})  # fmt: skip
        try:
            started = anyio.current_time()
            async with Simulator(model, concurrency=3, metrics=["response_length"]) as sim:
                results = [r async for r in sim.run(str(pack))]
            elapsed = anyio.current_time() - started
            assert isinstance(model._transport, HttpxTransport)  # aiohttp needs asyncio
        finally:
            await model.aclose()
        served = server.statistics()
    assert sorted(r.scenario_id for r in results) == ["s0", "s1", "s2"]
    assert [r.status for r in results] == [Status.DONE] * 3, [r.error for r in results]
    assert all(len(r.turns) == 2 and r.turns[-1].response for r in results)
    assert all("response_length" in r.scores for r in results)
    (budget,) = sim.budgets.statistics()
    assert (budget.requests, budget.rate_limited, budget.in_flight) == (6, 0, 0)
    assert served.by_endpoint["/v1/chat/completions"] == 6 and served.rate_limited == 0
    # six calls paced by the budget, the first at once: at least five spacings
    assert elapsed >= 5 * 60 / (0.99 * rpm)


async def test_a_token_budget_refunds_under_trio(tmp_path: Path) -> None:
    with mock_server_in_a_thread() as server:
        model = OpenAICompatibleAdapter({"model": "mock-model", "base_url": server.base_url,
                                         "tpm": 60_000, "max_tokens": 500}, env={})  # fmt: skip
        try:
            messages = [Message(role="user", content="Hello there")]
            for _ in range(3):  # each claims 500+, uses a few: the rest comes back
                completion = await model.generate(messages, GenerationParams(max_tokens=500))
                assert completion.text
        finally:
            await model.aclose()
    tokens = model.budget()._tokens
    assert tokens is not None and tokens.level < 100  # not 3 x 500 kept in the bucket


async def test_the_default_seam_follows_the_event_loop() -> None:
    assert default_http_library() == "httpx"
    assert await anyio.to_thread.run_sync(default_http_library) == "aiohttp"  # no loop there


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_under_asyncio_the_default_seam_is_aiohttp() -> None:
    assert default_http_library() == "aiohttp"


async def test_aiohttp_asked_for_under_trio_is_a_clear_error() -> None:
    model = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "http": "aiohttp", "max_retries": 0},
        env={},
    )
    with pytest.raises(ConfigError, match="asyncio only; under trio drop it"):
        await model.generate([Message(role="user", content="hi")], GenerationParams())
    await model.aclose()


async def test_run_sync_under_trio_is_refused_with_convsims_message(tmp_path: Path) -> None:
    """Under trio too, run_sync says to use the async API (not trio's own error)."""
    from convsim import run_sync

    pack = two_turn_pack(tmp_path, 1)
    with pytest.raises(ConfigError, match="async with Simulator"):
        run_sync(pack, "scripted", out=tmp_path / "never.jsonl")
    assert not (tmp_path / "never.jsonl").exists()
