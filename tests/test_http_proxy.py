"""The aiohttp seam takes its proxy from the environment, as httpx would, once per origin."""

from __future__ import annotations

import socket

import pytest

from convsim import ServerError
from convsim.adapters import GenerationParams, Message
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer

pytestmark = pytest.mark.anyio

HELLO = [Message(role="user", content="Hello there")]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def adapter(base_url: str) -> OpenAICompatibleAdapter:
    return OpenAICompatibleAdapter(
        {"model": "mock-model", "base_url": base_url, "max_retries": 0, "timeout": 5}
    )


async def test_requests_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with MockModelServer() as server:
        # the mock server answers absolute-form requests, so it can stand in for a proxy
        monkeypatch.setenv("HTTP_PROXY", server.base_url.removesuffix("/v1"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("http_proxy", raising=False)
        model = adapter(f"http://127.0.0.1:{closed_port()}/v1")
        try:
            completion = await model.generate(HELLO, GenerationParams())
        finally:
            await model.aclose()
    assert completion.text
    assert server.statistics().requests == 1


async def test_no_proxy_sends_the_request_straight_to_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with MockModelServer() as server:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
        monkeypatch.delenv("http_proxy", raising=False)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        model = adapter(server.base_url)
        try:
            completion = await model.generate(HELLO, GenerationParams())
        finally:
            await model.aclose()
    assert completion.text


async def test_a_dead_proxy_fails_the_call_as_a_connection_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with MockModelServer() as server:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
        monkeypatch.delenv("http_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        model = adapter(server.base_url)
        try:
            with pytest.raises(ServerError, match="connection to"):
                await model.generate(HELLO, GenerationParams())
        finally:
            await model.aclose()
    assert server.statistics().requests == 0
