"""Open files: a run checks the descriptor limit against what its concurrency needs
before it starts (raising the soft limit where it may, otherwise saying what to do),
and a call that finds the process out of descriptors says so instead of blaming the
server."""

from __future__ import annotations

import errno
import resource
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from click.testing import CliRunner

from convsim import ConfigError, LocalResourceError, ServerError, Simulator, SimulatorConfig
from convsim._runtime import _descriptors as descriptors
from convsim.adapters import GenerationParams, Message
from convsim.adapters._http import AiohttpTransport, HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.cli import main

pytestmark = pytest.mark.anyio

HI = [Message(role="user", content="hi")]


class Limits:
    """getrlimit/setrlimit stand-ins: the limits a test sets, and what was asked."""

    def __init__(self, soft: int, hard: int, *, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse
        self.set_to: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        if self.refuse:
            raise ValueError("not allowed to raise the current limit")
        self.set_to.append(limits)
        self.soft = limits[0]


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(soft: int, hard: int, **kw: Any) -> Limits:
        fake = Limits(soft, hard, **kw)
        monkeypatch.setattr(descriptors.resource, "getrlimit", fake.getrlimit)
        monkeypatch.setattr(descriptors.resource, "setrlimit", fake.setrlimit)
        return fake

    return install


def http_model(concurrency: int = 1000) -> SimulatorConfig:
    return SimulatorConfig(
        model={"spec": "openai-compatible:m", "args": {"base_url": "http://llm.test/v1"}},
        concurrency=concurrency,
        preflight=False,
    )


async def test_the_soft_limit_is_raised_to_what_the_run_needs(limits: Any) -> None:
    fake = limits(256, 65536)
    async with Simulator(http_model(1000)):
        pass
    [(soft, hard)] = fake.set_to
    assert hard == 65536 and 1000 < soft <= 65536


async def test_enough_descriptors_change_nothing(limits: Any) -> None:
    fake = limits(65536, 65536)
    async with Simulator(http_model(1000)):
        pass
    assert fake.set_to == []


async def test_a_hard_limit_too_low_says_what_to_do(limits: Any) -> None:
    limits(256, 512)
    with pytest.raises(ConfigError) as caught:
        async with Simulator(http_model(1000)):
            pass
    message = str(caught.value)
    assert "--concurrency 1000 needs about" in message
    assert "the limit is 256 (hard limit 512)" in message
    assert "ulimit -n" in message and "lower --concurrency" in message


async def test_a_refused_raise_says_what_to_do(limits: Any) -> None:
    limits(256, resource.RLIM_INFINITY, refuse=True)
    with pytest.raises(ConfigError, match="ulimit -n"):
        async with Simulator(http_model(1000)):
            pass


async def test_every_networked_role_counts(limits: Any) -> None:
    fake = limits(100, 100_000)
    args = {"base_url": "http://llm.test/v1"}
    config = SimulatorConfig(
        model={"spec": "openai-compatible:m", "args": args},
        user_model={"spec": "openai-compatible:u", "args": args},
        judge={"model": {"spec": "openai-compatible:j", "args": args}, "samples": 3},
        concurrency=100,
        preflight=False,
    )
    async with Simulator(config):
        pass
    [(soft, _)] = fake.set_to
    assert soft >= 100 * 3  # a connection per conversation to each (samples go in turn)


async def test_an_offline_model_needs_no_descriptors(limits: Any) -> None:
    fake = limits(64, 64)
    async with Simulator("scripted", concurrency=100_000):
        pass
    assert fake.set_to == []


def test_the_cli_exits_2_before_creating_the_results_file(limits: Any, tmp_path: Path) -> None:
    limits(256, 512)
    out = tmp_path / "r.jsonl"
    args = "run customer_support --model openai-compatible:m --concurrency 1000"
    result = CliRunner().invoke(
        main,
        [*args.split(), "--model-arg", "base_url=http://llm.test/v1", "--out", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 2
    assert "ulimit -n" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


# -- out of descriptors during a run ------------------------------------------------


def emfile() -> OSError:
    return OSError(errno.EMFILE, "Too many open files")


async def test_emfile_through_httpx_is_a_local_error_not_a_server_error() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        error = httpx.ConnectError("[Errno 24] Too many open files")
        error.__cause__ = emfile()
        raise error

    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1", "max_retries": 0},
        transport=HttpxTransport(transport=httpx.MockTransport(respond)),
        env={},
    )
    with pytest.raises(LocalResourceError) as caught:
        await adapter.generate(HI, GenerationParams())
    assert not isinstance(caught.value, ServerError)
    message = str(caught.value)
    assert "too many open files" in message and "ulimit -n" in message
    assert caught.value.infrastructure and caught.value.retryable
    await adapter.aclose()


class _NoDescriptorsConnector(aiohttp.TCPConnector):
    """Fails every connection as aiohttp does when socket() gets EMFILE."""

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        raise aiohttp.ClientConnectorError(req.connection_key, emfile())


async def test_emfile_through_aiohttp_is_a_local_error() -> None:
    transport = AiohttpTransport()
    transport._session = aiohttp.ClientSession(connector=_NoDescriptorsConnector())
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "max_retries": 0},
        transport=transport,
        env={},
    )
    with pytest.raises(LocalResourceError, match="too many open files"):
        await adapter.generate(HI, GenerationParams())
    await adapter.aclose()


async def test_other_connection_failures_stay_server_errors() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        error = httpx.ConnectError("refused")
        error.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        raise error

    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1", "max_retries": 0},
        transport=HttpxTransport(transport=httpx.MockTransport(respond)),
        env={},
    )
    with pytest.raises(ServerError):
        await adapter.generate(HI, GenerationParams())
    await adapter.aclose()
