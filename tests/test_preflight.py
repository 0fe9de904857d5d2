"""Before the first conversation each distinct endpoint is checked with one cheap call: a
server that is down, a refused key or a base_url without /v1 stops the run at once with
one line saying what to fix, instead of failing every conversation."""

from __future__ import annotations

import errno
import json
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from convsim import EndpointError, Simulator, SimulatorConfig
from convsim.adapters import GenerationParams, Message
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._custom_http import CustomHttpAdapter
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter
from convsim.adapters._scripted import ScriptedAdapter

pytestmark = pytest.mark.anyio

CHAT = {
    "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class Recorder:
    """An httpx.MockTransport that answers by (method, path) and records every request."""

    def __init__(self, answers: dict[tuple[str, str], Any]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def transport(self) -> HttpxTransport:
        def respond(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            answer = self.answers.get((request.method, request.url.path), 404)
            if isinstance(answer, BaseException):
                raise answer
            if isinstance(answer, int):
                body = {"error": {"message": f"status {answer}", "type": "x"}}
                return httpx.Response(answer, json=body)
            return httpx.Response(200, json=answer)

        return HttpxTransport(transport=httpx.MockTransport(respond))

    @property
    def seen(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


def openai(recorder: Recorder, **config: Any) -> OpenAICompatibleAdapter:
    return OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1", "max_retries": 3, **config},
        transport=recorder.transport(),
        env={},
    )


def refused() -> httpx.ConnectError:
    error = httpx.ConnectError("All connection attempts failed")
    error.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    return error


# -- the adapter hook ---------------------------------------------------------------


async def test_the_default_hook_does_nothing_and_scripted_needs_no_check() -> None:
    await ScriptedAdapter().preflight()  # no server, nothing to check


async def test_a_listing_that_answers_is_enough() -> None:
    recorder = Recorder({("GET", "/v1/models"): {"data": []}})
    adapter = openai(recorder)
    await adapter.preflight()
    assert recorder.seen == ["GET /v1/models"]  # one call, no generation
    await adapter.aclose()


async def test_a_missing_listing_alone_is_not_fatal_when_generation_works() -> None:
    recorder = Recorder({("POST", "/v1/chat/completions"): CHAT})
    adapter = openai(recorder)
    await adapter.preflight()
    assert recorder.seen == ["GET /v1/models", "POST /v1/chat/completions"]
    body = json.loads(recorder.requests[1].content)
    assert body["max_tokens"] == 1  # a tiny generation
    await adapter.aclose()


async def test_connection_refused_says_is_the_server_running() -> None:
    recorder = Recorder({("GET", "/v1/models"): refused()})
    adapter = openai(recorder)
    with pytest.raises(EndpointError) as caught:
        await adapter.preflight()
    message = str(caught.value)
    assert message == "http://llm.test/v1: connection refused — is the server running?"
    assert len(recorder.requests) == 1  # no retries: the answer is clear
    await adapter.aclose()


async def test_a_name_that_does_not_resolve_says_check_the_host() -> None:
    error = httpx.ConnectError("[Errno -2] Name or service not known")
    error.__cause__ = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    adapter = openai(Recorder({("GET", "/v1/models"): error}))
    with pytest.raises(EndpointError, match=r"cannot resolve host llm\.test — check base_url"):
        await adapter.preflight()
    await adapter.aclose()


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_names_where_the_key_comes_from(status: int) -> None:
    recorder = Recorder({("GET", "/v1/models"): status, ("POST", "/v1/chat/completions"): status})
    adapter = OpenAIAdapter(
        {"model": "m", "base_url": "http://llm.test/v1"},
        transport=recorder.transport(),
        env={"OPENAI_API_KEY": "sk-wrong-key"},
    )
    with pytest.raises(EndpointError) as caught:
        await adapter.preflight()
    message = str(caught.value)
    assert message.startswith(f"{status} from http://llm.test/v1/chat/completions:")
    assert "the API key was refused — check OPENAI_API_KEY / api_key_env" in message
    assert "sk-wrong-key" not in message
    await adapter.aclose()


async def test_a_listing_refused_but_generation_allowed_is_fine() -> None:
    """Some gateways forbid /models: the generation decides."""
    recorder = Recorder({("GET", "/v1/models"): 403, ("POST", "/v1/chat/completions"): CHAT})
    adapter = openai(recorder)
    await adapter.preflight()
    await adapter.aclose()


async def test_a_key_given_as_an_argument_is_named_as_such() -> None:
    recorder = Recorder({("POST", "/v1/chat/completions"): 401})
    adapter = openai(recorder, api_key="sk-x")
    with pytest.raises(EndpointError, match="the API key was refused — check api_key"):
        await adapter.preflight()
    await adapter.aclose()


async def test_a_server_that_wants_a_key_nobody_gave() -> None:
    recorder = Recorder({("POST", "/v1/chat/completions"): 401})
    adapter = openai(recorder)
    with pytest.raises(EndpointError, match="no API key was sent — set api_key_env=NAME"):
        await adapter.preflight()
    await adapter.aclose()


async def test_a_base_url_without_v1_gets_the_hint() -> None:
    recorder = Recorder({})  # every path 404
    adapter = openai(recorder, base_url="http://llm.test")
    with pytest.raises(EndpointError) as caught:
        await adapter.preflight()
    assert str(caught.value).startswith(
        "404 from http://llm.test/chat/completions — does base_url end in /v1"
    )
    await adapter.aclose()


@pytest.mark.parametrize("status", [400, 429, 500, 503])
async def test_other_answers_are_not_the_preflights_business(status: int) -> None:
    """A 429 or 5xx may pass; the run's retries and circuit breaker deal with them."""
    recorder = Recorder({("POST", "/v1/chat/completions"): status})
    adapter = openai(recorder)
    await adapter.preflight()
    assert len(recorder.requests) == 2  # no retries
    await adapter.aclose()


async def test_anthropic_checks_its_models_listing_with_its_headers() -> None:
    recorder = Recorder({("GET", "/v1/models"): {"data": []}})
    adapter = AnthropicAdapter(
        {"model": "claude"}, transport=recorder.transport(), env={"ANTHROPIC_API_KEY": "k"}
    )
    await adapter.preflight()
    assert recorder.seen == ["GET /v1/models"]
    assert recorder.requests[0].headers["x-api-key"] == "k"
    assert recorder.requests[0].url.host == "api.anthropic.com"
    await adapter.aclose()


async def test_anthropic_404_says_base_url_is_the_api_root() -> None:
    recorder = Recorder({})
    adapter = AnthropicAdapter(
        {"model": "claude", "base_url": "http://llm.test/v1"},
        transport=recorder.transport(),
        env={"ANTHROPIC_API_KEY": "k"},
    )
    with pytest.raises(EndpointError, match="without /v1"):
        await adapter.preflight()
    await adapter.aclose()


async def test_the_custom_backend_has_no_listing_and_sends_a_tiny_generation() -> None:
    answer = {"choices": [{"text": "ok"}]}
    recorder = Recorder({("POST", "/generate"): answer})
    adapter = CustomHttpAdapter(
        {"model": "m", "base_url": "http://llm.test"}, transport=recorder.transport(), env={}
    )
    await adapter.preflight()
    assert recorder.seen == ["POST /generate"]
    assert json.loads(recorder.requests[0].content)["max_tokens"] == 1
    await adapter.aclose()


# -- the simulator ------------------------------------------------------------------


def simulator(adapter: Any, **settings: Any) -> Simulator:
    return Simulator(SimulatorConfig(model=adapter, **settings))


async def test_the_simulator_checks_before_the_first_conversation(tmp_path: Path) -> None:
    recorder = Recorder({("GET", "/v1/models"): refused()})
    adapter = openai(recorder)
    with pytest.raises(EndpointError, match=r"^model under test: http://llm\.test/v1: connection"):
        async with simulator(adapter) as sim:
            sim.run("customer_support")
    assert recorder.seen == ["GET /v1/models"]  # no conversation was sent
    await adapter.aclose()


async def test_preflight_can_be_turned_off() -> None:
    recorder = Recorder({("GET", "/v1/models"): refused()})
    adapter = openai(recorder)
    async with simulator(adapter, preflight=False):
        pass
    assert recorder.requests == []
    await adapter.aclose()


async def test_each_distinct_endpoint_is_checked_once_and_named() -> None:
    model = Recorder({("GET", "/v1/models"): {"data": []}})
    user = Recorder({("GET", "/v1/models"): {"data": []}})
    judge = Recorder({("GET", "/v1/models"): refused()})
    config = SimulatorConfig(
        model=openai(model),
        user_model=openai(user, base_url="http://user.test/v1"),
        judge={"model": openai(judge, base_url="http://judge.test/v1")},
    )
    with pytest.raises(EndpointError, match=r"^judge: http://judge\.test/v1: connection refused"):
        async with Simulator(config):
            pass
    assert (len(model.requests), len(user.requests), len(judge.requests)) == (1, 1, 1)


async def test_the_same_adapter_in_two_roles_is_checked_once() -> None:
    recorder = Recorder({("GET", "/v1/models"): {"data": []}})
    adapter = openai(recorder)
    async with Simulator(SimulatorConfig(model=adapter, judge={"model": adapter})):
        pass
    assert len(recorder.requests) == 1
    await adapter.aclose()


async def test_owned_adapters_are_closed_when_the_check_fails(monkeypatch: Any) -> None:
    closed: list[bool] = []
    original = OpenAICompatibleAdapter.aclose

    async def aclose(self: Any) -> None:
        closed.append(True)
        await original(self)

    monkeypatch.setattr(OpenAICompatibleAdapter, "aclose", aclose)
    port = closed_port()
    sim = Simulator("openai-compatible:m", model_args={"base_url": f"http://127.0.0.1:{port}/v1"})
    with pytest.raises(EndpointError, match="connection refused"):
        async with sim:
            pass
    assert closed == [True]


async def test_a_real_closed_port_fails_fast_through_aiohttp() -> None:
    port = closed_port()
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 0}, env={}
    )
    with anyio.fail_after(5), pytest.raises(EndpointError) as caught:
        await adapter.preflight()
    assert str(caught.value) == (
        f"http://127.0.0.1:{port}/v1: connection refused — is the server running?"
    )
    # generation calls afterwards go on as usual (here: failing the same way)
    with pytest.raises(Exception, match="connection"):
        await adapter.generate([Message(role="user", content="hi")], GenerationParams(max_tokens=1))
    await adapter.aclose()


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
