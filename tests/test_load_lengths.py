"""Exact output lengths and input lengths in the server's tokens: the mock server honours
min_tokens and ignore_eos and serves vLLM's /tokenize, the OpenAI-compatible adapter sends
the fields only when asked, and calibration sizes synthetic text within 5% also behind a
chat template that adds tokens per message."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from convsim._types import GenerationParams, Message
from convsim.adapters import Budgets, create_adapter
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.load import calibrate

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server() -> AsyncIterator[MockModelServer]:
    async with MockModelServer(MockServerConfig(message_overhead_tokens=4)) as mock:
        yield mock


def _adapter(server: MockModelServer, stream: bool = False) -> Any:
    adapter = create_adapter(
        "openai-compatible:mock-model",
        {"base_url": server.base_url, "stream": stream, "max_retries": 0},
    )
    adapter.size_pool(4)
    adapter.share_budgets(Budgets())
    return adapter


@pytest.mark.parametrize("stream", [False, True])
async def test_ignore_eos_and_min_tokens_give_the_length_asked(
    server: MockModelServer, stream: bool
) -> None:
    adapter = _adapter(server, stream)
    hello = [Message(role="user", content="Hi")]
    exact = await adapter.generate(
        hello, GenerationParams(max_tokens=40, min_tokens=40, ignore_eos=True)
    )
    assert exact.usage.completion_tokens == 40 == len(exact.text.split())
    assert exact.finish_reason == "length"
    least = await adapter.generate(hello, GenerationParams(max_tokens=50, min_tokens=30))
    assert least.usage.completion_tokens == 30
    plain = await adapter.generate(hello, GenerationParams(max_tokens=50))
    assert plain.usage.completion_tokens < 30  # the mock's own short answer
    await adapter.aclose()


async def test_bad_length_fields_get_400(server: MockModelServer) -> None:
    async with httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        messages = [{"role": "user", "content": "hi"}]
        for extra in ({"min_tokens": "3"}, {"ignore_eos": 1}, {"min_tokens": 9, "max_tokens": 4}):
            response = await client.post(
                url, json={"model": "mock-model", "messages": messages, **extra}
            )
            assert response.status_code == 400, extra


async def test_the_adapter_sends_the_fields_only_when_asked() -> None:
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tokenize"):  # counting the answer without usage
            return httpx.Response(404)
        bodies.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]},
        )

    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://127.0.0.1:1/v1", "max_retries": 0},
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
    )
    hello = [Message(role="user", content="Hi")]
    await adapter.generate(hello, GenerationParams(max_tokens=5))
    await adapter.generate(hello, GenerationParams(max_tokens=5, min_tokens=5, ignore_eos=True))
    assert "min_tokens" not in bodies[0] and "ignore_eos" not in bodies[0]
    assert (bodies[1]["min_tokens"], bodies[1]["ignore_eos"]) == (5, True)


async def test_tokenize_counts_what_usage_counts(server: MockModelServer) -> None:
    adapter = _adapter(server)
    messages = [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Three words here"),
    ]
    usage = (await adapter.generate(messages, GenerationParams(max_tokens=1))).usage
    root = server.base_url.removesuffix("/v1")
    async with httpx.AsyncClient() as client:
        chat = await client.post(
            root + "/tokenize",
            json={
                "model": "mock-model",
                "messages": [{"role": m.role, "content": m.content} for m in messages],
            },
        )
        prompt = await client.post(
            root + "/tokenize", json={"model": "mock-model", "prompt": "Three words here"}
        )
    assert chat.json()["count"] == usage.prompt_tokens == 3 + 3 + 2 * 4
    assert prompt.json()["count"] == 3
    await adapter.aclose()


async def test_calibration_lands_within_five_percent_behind_a_chat_template(
    server: MockModelServer,
) -> None:
    adapter = _adapter(server)
    calibration = await calibrate(adapter)
    assert calibration.method == "tokenize"
    assert calibration.exact_output
    assert calibration.user_base_tokens == pytest.approx(4)
    rng = np.random.default_rng(1)
    for asked in (32, 100, 256, 1000):
        text = calibration.text.text(asked, rng)
        usage = (
            await adapter.generate(
                [Message(role="user", content=text)], GenerationParams(max_tokens=1)
            )
        ).usage
        got = usage.prompt_tokens - calibration.first_turn_base(0)
        assert abs(got - asked) <= 0.05 * asked, (asked, got)
    await adapter.aclose()


class _TemplatedServer:
    """A model whose chat template adds a default system prompt of 30 tokens to a
    conversation without one, and 14 tokens around a system prompt that is given (as
    SmolLM2's and Qwen's templates do); one token per word."""

    async def generate(self, messages: list[Message], params: GenerationParams) -> Any:
        from convsim._types import Completion, Usage

        words = sum(len(m.content.split()) for m in messages)
        has_system = any(m.role == "system" for m in messages)
        prompt = words + (14 if has_system else 30)
        out = params.max_tokens or 1
        return Completion(
            text="x " * out,
            usage=Usage(prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out),
        )


async def test_calibration_accounts_for_a_default_system_prompt_that_gives_way() -> None:
    """The system overhead comes out negative, and first turns with a shared prefix are
    sized exactly (clipping it at 0 put them 16 tokens over)."""
    calibration = await calibrate(_TemplatedServer(), exact_output=False)  # type: ignore[arg-type]
    assert calibration.method == "usage"
    assert calibration.system_tokens == pytest.approx(-16)
    for prefix, user in ((0, 40), (64, 40), (64, 256), (200, 32)):
        system = [Message(role="system", content="w " * prefix)] if prefix else []
        messages = [*system, Message(role="user", content="w " * user)]
        completion = await _TemplatedServer().generate(messages, GenerationParams(max_tokens=1))
        expected = calibration.first_turn_base(prefix) + user
        assert completion.usage.prompt_tokens == pytest.approx(expected), (prefix, user)


async def test_a_stream_without_usage_counts_its_chunks() -> None:
    """A server whose stream carries no usage and that has no tokenize endpoint still
    gets output tokens and TPOT: its chunks are counted, and the records say so."""
    from convsim.load import LoadShape, SyntheticSessions, drive, parse_synthetic

    async with MockModelServer(MockServerConfig(tokenize=False)) as server:
        adapter = create_adapter(
            "openai-compatible:mock-model",
            {"base_url": server.base_url, "stream": True, "stream_usage": False, "max_retries": 0},
        )
        adapter.size_pool(2)
        adapter.share_budgets(Budgets())
        workload = SyntheticSessions(parse_synthetic("turns=2,input_tokens=8,output_tokens=12"))
        outcome = await drive(adapter, workload, LoadShape(concurrency=2, max_requests=6))
        await adapter.aclose()
    done = [r for r in outcome.records if r.ok]
    assert done and all(r.output_from_chunks for r in done)
    assert {r.token_source for r in done} == {"estimate"}
    assert {r.output_tokens for r in done} == {12}
    assert all(r.tpot_s is not None for r in done)
    from convsim.load._figures import merged_result

    point = merged_result([outcome])
    assert point.token_sources == {"estimate": len(done)}
    said = f"{len(done)} of {len(done)} answers came without usage and the server has no"
    assert any(said in n for n in point.notes), point.notes
