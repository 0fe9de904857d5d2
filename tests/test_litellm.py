"""``litellm:PROVIDER/MODEL`` works like every other adapter: convsim's retries, budgets,
usage sources, streaming timings and cost; LiteLLM's own retries off; the extra asked
for when missing; litellm imported only when such a model is built.

Offline: LiteLLM's OpenAI-compatible route is pointed at the mock server, and its
Anthropic route at a loopback server answering with a recorded Messages API body.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web
from conftest import write_pack

import convsim
from convsim import ConfigError, EndpointError, MissingExtra, Status
from convsim._errors import AuthError, RateLimited
from convsim._types import GenerationParams, Message, Usage
from convsim.adapters import create_adapter
from convsim.adapters._budget import Budgets
from convsim.adapters._egress import EgressPolicy
from convsim.adapters._litellm import LitellmAdapter
from convsim.adapters._pricing import price_of
from convsim.adapters.mock import MockModelServer, MockServerConfig

pytestmark = [
    pytest.mark.anyio,
    # LiteLLM's types and stream reader warn under recent pydantic (theirs to fix)
    pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
]

KEY = "sk-litellm-test-0123456789abcdef"
HI = [Message(role="user", content="Hello there, how are you?")]


async def no_wait(seconds: float) -> None:
    """Retry back-off and 429 pauses without real waiting."""
    await anyio.lowlevel.checkpoint()


def adapter(base_url: str, **args: Any) -> LitellmAdapter:
    built = LitellmAdapter(
        {"model": "openai/mock-model", "base_url": base_url, "api_key": KEY, **args},
        sleep=no_wait,
    )
    return built


def pack(tmp_path: Path, conversations: int, turns: int = 2) -> Path:
    flow = [
        {"turn_id": f"t{i}", "prompt_template": f"Message {i} about {{topic}}."}
        for i in range(turns)
    ]
    scenarios = [
        {
            "scenario_id": f"c{i:02d}",
            "scenario_description": "litellm",
            "variables": {"topic": f"order {i}"},
        }
        for i in range(conversations)
    ]
    return write_pack(tmp_path / "pack", {"default": {"turns": flow}}, scenarios)


# -- a run through LiteLLM against the mock server ----------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_run_end_to_end_records_server_usage_and_streamed_ttft(
    tmp_path: Path, stream: bool
) -> None:
    async with MockModelServer(MockServerConfig(itl_ms=1)) as server:
        model = create_adapter(
            "litellm:openai/mock-model",
            {"base_url": server.base_url, "api_key": KEY, "stream": str(stream).lower()},
        )
        with anyio.fail_after(60):
            async with convsim.Simulator(model, concurrency=4) as sim:
                results = [r async for r in sim.run(pack(tmp_path, 4))]
        served = server.statistics()

    assert [r.status for r in results] == [Status.DONE] * 4
    turns = [t for r in results for t in r.turns]
    # every turn one call, and one for the check before the run
    assert len(turns) == 8 == served.by_endpoint["/v1/chat/completions"] - 1
    for turn in turns:
        assert turn.usage is not None and turn.usage.completion_tokens > 0
        assert not turn.usage.estimated  # the mock's own counts, passed on by LiteLLM
        assert turn.usage.source == "server"
        assert turn.attempts == 1
        assert turn.usage.cached_tokens is not None  # the mock's prefix cache said 0
        timings = turn.timings
        assert timings is not None and timings.latency_s is not None
        if stream:
            assert timings.ttft_s is not None and 0 < timings.ttft_s <= timings.latency_s
        else:
            assert timings.ttft_s is None


def test_cache_reads_pass_through_and_unsaid_stays_none() -> None:
    from litellm.types.utils import PromptTokensDetailsWrapper
    from litellm.types.utils import Usage as LitellmUsage

    said = LitellmUsage(
        prompt_tokens=40,
        completion_tokens=5,
        prompt_tokens_details=PromptTokensDetailsWrapper(cached_tokens=32),
    )
    usage = LitellmAdapter._server_usage(said)
    assert usage is not None and usage.cached_tokens == 32 == usage.cached_prompt_tokens
    unsaid = LitellmAdapter._server_usage(LitellmUsage(prompt_tokens=40, completion_tokens=5))
    assert unsaid is not None and unsaid.cached_tokens is None


async def test_streaming_hands_on_each_piece_and_times_the_first() -> None:
    async with MockModelServer(MockServerConfig(ttft_ms=50, itl_ms=5)) as server:
        model = adapter(server.base_url)
        pieces: list[str] = []
        completion = await model.stream(HI, GenerationParams(max_tokens=6), pieces.append)

    assert len(pieces) > 1 and "".join(pieces) == completion.text
    assert completion.timings.ttft_s is not None and completion.timings.ttft_s >= 0.05
    assert len(completion.timings.inter_token_s) == len(pieces) - 1
    assert completion.usage.completion_tokens == len(pieces)
    assert not completion.usage.estimated


async def test_an_answer_without_usage_is_marked_estimated(monkeypatch: pytest.MonkeyPatch) -> None:
    async with MockModelServer(MockServerConfig()) as server:
        model = adapter(server.base_url)
        real = model._litellm.acompletion

        async def no_usage(**kwargs: Any) -> Any:
            response = await real(**kwargs)
            response.usage = None
            return response

        monkeypatch.setattr(model._litellm, "acompletion", no_usage)
        completion = await model.generate(HI, GenerationParams(max_tokens=4))

    assert completion.usage.estimated
    assert completion.usage.source == "estimate"


async def test_a_429_is_retried_by_convsim_not_by_litellm() -> None:
    config = MockServerConfig(fault_rate=1.0, faults={"429": 1.0}, retry_after_s=0.0)
    async with MockModelServer(config) as server:
        model = adapter(server.base_url, max_retries=2)
        with pytest.raises(RateLimited) as caught:
            await model.generate(HI, GenerationParams(max_tokens=4))
        served = server.statistics()

    # one request per convsim attempt: LiteLLM (and the OpenAI SDK under it) sent no more
    assert served.by_endpoint["/v1/chat/completions"] == 3
    assert served.faults_injected["429"] == 3
    assert caught.value.attempts == 3
    assert caught.value.retry_after == 0.0  # the server's Retry-After reached convsim
    assert KEY not in str(caught.value)


async def test_a_flaky_server_is_survived_through_retries(tmp_path: Path) -> None:
    config = MockServerConfig(fault_rate=0.4, faults={"429": 1.0, "500": 1.0}, seed=3)
    async with MockModelServer(config) as server:
        model = adapter(server.base_url, max_retries=8)
        with anyio.fail_after(60):
            async with convsim.Simulator(model, concurrency=4) as sim:
                results = [r async for r in sim.run(pack(tmp_path, 5))]
        served = server.statistics()

    assert [r.status for r in results] == [Status.DONE] * 5
    attempts = sum(t.attempts for r in results for t in r.turns)
    assert served.faults_injected["429"] + served.faults_injected["500"] > 0
    assert attempts > 10  # 10 turns, some retried
    assert attempts + 1 == served.by_endpoint["/v1/chat/completions"]  # + the check


async def test_a_refused_key_is_an_auth_error_with_the_key_blanked() -> None:
    async with MockModelServer(MockServerConfig(api_key="the-right-key")) as server:
        model = adapter(server.base_url, max_retries=3)
        with pytest.raises(AuthError) as caught:
            await model.generate(HI, GenerationParams(max_tokens=4))
        served = server.statistics()

    assert served.unauthorized == 1  # not retried
    assert caught.value.status_code == 401
    assert KEY not in str(caught.value)


async def test_an_unreachable_server_is_a_retryable_server_error() -> None:
    from convsim._errors import ServerError

    model = adapter("http://127.0.0.1:9", max_retries=1, timeout=5)
    with pytest.raises(ServerError) as caught:
        await model.generate(HI, GenerationParams(max_tokens=4))
    assert caught.value.retryable and caught.value.attempts == 2


async def test_the_check_before_a_run_tells_a_down_endpoint_apart() -> None:
    with pytest.raises(EndpointError, match="connection refused"):
        await adapter("http://127.0.0.1:9/v1").preflight()
    async with MockModelServer(MockServerConfig(api_key="the-right-key")) as server:
        with pytest.raises(EndpointError, match=r"^401 from litellm:openai/mock-model") as caught:
            await adapter(server.base_url).preflight()
        assert KEY not in str(caught.value)
        await adapter(server.base_url, api_key="the-right-key").preflight()  # passes
        served = server.statistics()
    assert served.by_endpoint["/v1/chat/completions"] == 2  # one call each, no retry


async def test_a_missing_key_is_not_retried_and_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with MockModelServer(MockServerConfig()) as server:
        keyless = LitellmAdapter(
            {"model": "openai/mock-model", "base_url": server.base_url, "max_retries": 3},
            sleep=no_wait,
        )
        with pytest.raises(AuthError, match="not sent") as caught:
            await keyless.generate(HI, GenerationParams(max_tokens=4))
        with pytest.raises(EndpointError, match="nothing was sent"):
            await keyless.preflight()
        served = server.statistics()
    assert caught.value.attempts == 1 and not caught.value.retryable
    assert served.requests == 0


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


async def test_a_stream_the_server_sent_no_usage_for_is_estimated() -> None:
    # a server that ignores stream_options: LiteLLM must not pass off a count as its own
    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk({"role": "assistant", "content": "Fine"}))
        await response.write(_chunk({"content": ", thanks."}))
        await response.write(_chunk({}, "stop"))
        await response.write(b"data: [DONE]\n\n")
        return response

    async with _loopback(answer) as base_url:
        model = adapter(f"{base_url}/v1", stream=True)
        completion = await model.generate(HI, GenerationParams(max_tokens=8))

    assert completion.text == "Fine, thanks."
    assert completion.usage.estimated
    assert completion.timings.ttft_s is not None


async def test_an_answer_the_server_sent_no_usage_for_is_estimated() -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Fine, thanks."},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    async with _loopback(answer) as base_url:
        completion = await adapter(f"{base_url}/v1").generate(HI, GenerationParams(max_tokens=8))

    assert completion.text == "Fine, thanks."
    assert completion.usage.estimated


# -- budgets, cost, configuration ----------------------------------------------------------


def test_adapters_of_one_endpoint_and_key_share_one_budget() -> None:
    budgets = Budgets()
    one, two = adapter("http://127.0.0.1:1/v1"), adapter("http://127.0.0.1:1/v1", rpm=10)
    other = adapter("http://127.0.0.1:2/v1")
    for each in (one, two, other):
        each.share_budgets(budgets)
    assert one.budget() is two.budget()
    assert one.budget().limits.rpm == 10  # the stricter limit of the two
    assert other.budget() is not one.budget()
    assert KEY not in one.connection_key()


def test_the_pool_size_follows_the_run_unless_set() -> None:
    free, fixed = adapter("http://127.0.0.1:1/v1"), adapter("http://127.0.0.1:1/v1", concurrency=3)
    free.size_pool(7)
    fixed.size_pool(7)
    assert (free.rate_limits().concurrency, fixed.rate_limits().concurrency) == (7, 3)


def test_cost_from_given_prices_then_litellm_table() -> None:
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=500_000, total_tokens=1_500_000)
    priced = adapter("http://127.0.0.1:1/v1", input_price=2, output_price=8)
    assert priced.estimate_cost(usage).total_cost == pytest.approx(2 + 4)
    assert adapter("http://127.0.0.1:1/v1").estimate_cost(usage) is None  # unknown model

    mistral = LitellmAdapter({"model": "mistral/mistral-small-latest"})
    prompt, completion = mistral._litellm.cost_per_token(
        model="mistral/mistral-small-latest", prompt_tokens=10**6, completion_tokens=5 * 10**5
    )
    cost = mistral.estimate_cost(usage)  # LiteLLM's own table
    assert cost is not None and prompt + completion > 0
    assert cost.total_cost == pytest.approx(prompt + completion)


@pytest.mark.parametrize("model", ["gpt-4o", "/gpt-4o", "openai/"])
def test_a_model_without_its_provider_is_refused(model: str) -> None:
    with pytest.raises(ConfigError, match="expected litellm:PROVIDER/MODEL"):
        create_adapter(f"litellm:{model}")


def test_litellm_is_asked_not_to_retry_nor_cache() -> None:
    kwargs = adapter("http://127.0.0.1:1/v1", api_version="2024-06-01").arguments(
        HI, GenerationParams(max_tokens=5, temperature=0.2, seed=1), stream=True
    )
    assert kwargs["num_retries"] == 0 and kwargs["max_retries"] == 0
    assert kwargs["caching"] is False
    assert kwargs["stream_options"] == {"include_usage": True}
    assert (kwargs["max_tokens"], kwargs["temperature"], kwargs["seed"]) == (5, 0.2, 1)
    assert kwargs["api_version"] == "2024-06-01"


def test_a_tenant_of_the_service_cannot_use_litellm() -> None:
    # LiteLLM makes its own connections and reads this process's credentials (AWS, Google
    # Cloud): an egress policy could not hold it, so a model under one is refused
    policy = EgressPolicy(["https://"])
    with pytest.raises(ConfigError, match="cannot be held to an egress policy"):
        LitellmAdapter({"model": "bedrock/anthropic.claude-3-haiku"}, env={}, egress=policy)


@asynccontextmanager
async def _loopback(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """A server on 127.0.0.1 answering every POST with ``handler``; yields its URL."""
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


# -- a recorded answer in another wire format: Anthropic's Messages API -------------------

RECORDED = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-3-haiku-20240307",
    "content": [{"type": "text", "text": "Hello! I'm doing well, thank you."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 14, "output_tokens": 11},
}


async def test_a_recorded_anthropic_answer_reads_through_litellm() -> None:
    seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, await request.json(), dict(request.headers)))
        return web.json_response(RECORDED)

    async with _loopback(answer) as base_url:
        model = create_adapter(
            "litellm:anthropic/claude-3-haiku-20240307", {"base_url": base_url, "api_key": KEY}
        )
        completion = await model.generate(
            [Message(role="system", content="Be brief."), *HI], GenerationParams(max_tokens=20)
        )

    assert completion.text == "Hello! I'm doing well, thank you."
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (14, 11)
    assert not completion.usage.estimated
    [(path, body, headers)] = seen
    assert path == "/v1/messages"
    assert body["system"] in ("Be brief.", [{"type": "text", "text": "Be brief."}])
    assert body["max_tokens"] == 20
    assert headers["x-api-key"] == KEY
    cost = model.estimate_cost(completion.usage)
    listed = price_of("anthropic", "claude-3-haiku-20240307")  # convsim's pricing file first
    assert cost is not None and listed is not None
    assert cost.total_cost == pytest.approx(
        (14 * listed.input_per_mtok + 11 * listed.output_per_mtok) / 1e6
    )


# -- the extra, and the import it costs ----------------------------------------------------


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def test_importing_convsim_does_not_import_litellm(tmp_path: Path) -> None:
    done = _python(
        "import sys\n"
        "import convsim, convsim.adapters, convsim.cli, convsim.adapters._litellm\n"
        "from convsim.adapters import ADAPTERS\n"
        "assert 'litellm' in ADAPTERS.names(), ADAPTERS.names()\n"
        "print('litellm' in sys.modules)\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_without_the_extra_a_litellm_model_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(MissingExtra, match=r"^litellm models needs the litellm extra"):
        create_adapter("litellm:openai/gpt-4o-mini")


def test_without_the_extra_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    done = _python(
        "import sys\n"
        "sys.modules['litellm'] = None\n"
        "sys.argv = ['convsim', 'run', 'single_turn_qa', '--model', 'litellm:openai/x',"
        " '--out', 'out.jsonl']\n"
        "from convsim.cli import main\n"
        "main()\n",
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: litellm models needs the litellm extra: pip install 'convsim[litellm]'"
    ], done.stderr


def test_secrets_stay_out_of_the_adapter_description() -> None:
    model = adapter("http://127.0.0.1:1/v1")
    assert KEY not in repr(model.config) and KEY not in json.dumps(model.model_info().model_dump())


def test_penalties_are_passed_to_litellm() -> None:
    both = GenerationParams(frequency_penalty=0.4, presence_penalty=-0.2)
    built = LitellmAdapter({"model": "openai/m"})
    arguments = built.arguments([Message(role="user", content="Hi")], both, False)
    assert (arguments["frequency_penalty"], arguments["presence_penalty"]) == (0.4, -0.2)
    assert "frequency_penalty" not in built.arguments([], GenerationParams(), False)
