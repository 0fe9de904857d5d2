"""Adapter rules: pricing names, settings checked before a run, wire-format details."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from conftest import write_pack

import convsim
from convsim import ConfigError, ProtocolError, RateLimited
from convsim.adapters import GenerationParams, Message, Usage
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._budget import Budgets
from convsim.adapters._custom_http import CustomHttpAdapter
from convsim.adapters._http import HttpxTransport, SSEDecoder
from convsim.adapters._http_adapter import HttpModelAdapter, ParsedAnswer
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter, OpenAIWireAdapter
from convsim.adapters._pricing import Price, price_of
from convsim.adapters._protocol import LogprobsUnsupported

ENV = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "ak-test"}


@pytest.mark.parametrize(
    ("provider", "model", "expected"),
    [
        ("openai", "gpt-4o-mini", Price(0.15, 0.6, 0.075)),
        (
            "openai",
            "gpt-4o-2024-08-06",
            Price(2.5, 10.0, 1.25),
        ),  # a dated snapshot of a listed model
        ("openai", "gpt-4o-mini-2024-07-18", Price(0.15, 0.6, 0.075)),
        ("anthropic", "claude-3-5-haiku-20241022", Price(0.8, 4.0, 0.08)),
        ("anthropic", "claude-3-5-haiku-latest", Price(0.8, 4.0, 0.08)),
        ("openai", "o1-pro", None),  # an unlisted variant is not priced as its family
        ("anthropic", "claude-opus-4-5", None),
        ("openai", "no-such-model", None),
    ],
)
def test_prices_only_for_listed_models_and_their_snapshots(
    provider: str, model: str, expected: Price | None
) -> None:
    assert price_of(provider, model) == expected


def test_a_price_names_its_input_and_output_rates() -> None:
    price = price_of("anthropic", "claude-3-5-haiku-latest")
    assert price is not None
    assert (price.input_per_mtok, price.output_per_mtok) == (0.8, 4.0)


def recorder(reply: dict) -> tuple[list[dict], HttpxTransport]:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=reply)

    return seen, HttpxTransport(transport=httpx.MockTransport(handler))


CHAT = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}


@pytest.mark.anyio
async def test_openai_sends_max_completion_tokens_and_no_sampling_to_reasoning_models() -> None:
    seen, transport = recorder(CHAT)
    params = GenerationParams(max_tokens=50, temperature=0.2, top_p=0.9, seed=3)
    for model in ("gpt-4o-mini", "o3-mini"):
        adapter = OpenAIAdapter({"model": model}, transport=transport, env=ENV)
        await adapter.generate([Message(role="user", content="hi")], params)
    regular, reasoning = seen
    assert regular["max_completion_tokens"] == 50 and "max_tokens" not in regular
    assert regular["temperature"] == 0.2 and regular["top_p"] == 0.9
    assert reasoning["max_completion_tokens"] == 50
    assert "temperature" not in reasoning and "top_p" not in reasoning and reasoning["seed"] == 3


@pytest.mark.anyio
async def test_compatible_servers_get_max_tokens_and_can_skip_stream_options() -> None:
    _, transport = recorder(CHAT)
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://x/v1", "stream_usage": False}, transport=transport
    )
    call = adapter.request(
        [Message(role="user", content="hi")], GenerationParams(max_tokens=5), stream=True
    )
    assert call.path == "/chat/completions"
    assert call.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": True,
    }


def test_openai_and_compatible_are_siblings_over_one_wire_format() -> None:
    assert issubclass(OpenAIAdapter, OpenAIWireAdapter)
    assert issubclass(OpenAICompatibleAdapter, OpenAIWireAdapter)
    assert not issubclass(OpenAIAdapter, OpenAICompatibleAdapter)
    assert not issubclass(OpenAICompatibleAdapter, OpenAIAdapter)


CONVERSATION = [Message(role="system", content="Be brief."), Message(role="user", content="hi")]
ALL_SET = GenerationParams(temperature=0.2, top_p=0.9, seed=3, max_tokens=50, stop=("END",))


@pytest.mark.parametrize(
    ("adapter", "path", "expected"),
    [
        (
            OpenAIAdapter({"model": "gpt-4o-mini"}, env=ENV),
            "/chat/completions",
            {"temperature": 0.2, "top_p": 0.9, "seed": 3, "max_completion_tokens": 50},
        ),
        (
            OpenAIAdapter({"model": "o4-mini"}, env=ENV),
            "/chat/completions",
            {"seed": 3, "max_completion_tokens": 50},
        ),
        (
            OpenAIAdapter({"model": "gpt-3.5-turbo-instruct", "endpoint": "completions"}, env=ENV),
            "/completions",  # the legacy endpoint never took max_completion_tokens
            {"temperature": 0.2, "top_p": 0.9, "seed": 3, "max_tokens": 50},
        ),
        (
            OpenAICompatibleAdapter({"model": "o4-mini", "base_url": "http://x/v1"}),
            "/chat/completions",  # a local model named like a reasoning model takes it all
            {"temperature": 0.2, "top_p": 0.9, "seed": 3, "max_tokens": 50},
        ),
        (
            OpenAICompatibleAdapter(
                {"model": "m", "base_url": "http://x/v1", "endpoint": "completions"}
            ),
            "/completions",
            {"temperature": 0.2, "top_p": 0.9, "seed": 3, "max_tokens": 50},
        ),
    ],
    ids=[
        "openai",
        "openai-reasoning",
        "openai-completions",
        "compatible-chat",
        "compatible-completions",
    ],
)
def test_each_sibling_builds_its_own_request_body(
    adapter: OpenAIWireAdapter, path: str, expected: dict
) -> None:
    call = adapter.request(CONVERSATION, ALL_SET, stream=False)
    assert call.path == path
    text = (
        {"prompt": "System: Be brief.\n\nUser: hi\n\nAssistant:"}
        if path == "/completions"
        else {"messages": [{"role": m.role, "content": m.content} for m in CONVERSATION]}
    )
    assert call.body == {"model": adapter.config.model, **text, **expected, "stop": ["END"]}


def test_openai_always_needs_a_key_and_a_compatible_server_takes_one_when_set() -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIAdapter({"model": "gpt-4o-mini", "base_url": "http://proxy/v1"}, env={})
    official = OpenAIAdapter({"model": "gpt-4o-mini"}, env=ENV)
    assert official.auth_headers() == {"Authorization": "Bearer sk-test"}
    assert official.base_url == "https://api.openai.com/v1"

    keyless = OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1"}, env={})
    assert keyless.auth_headers() == {}  # a local server usually wants none
    assert keyless.connection_key().endswith("|-")
    # OPENAI_API_KEY, when set, is sent, as the OpenAI SDK and vLLM's tools send it
    compatible = OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1"}, env=ENV)
    assert compatible.auth_headers() == {"Authorization": "Bearer sk-test"}
    named = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://x/v1", "api_key_env": "OPENAI_API_KEY"}, env=ENV
    )
    assert named.auth_headers() == {"Authorization": "Bearer sk-test"}
    with pytest.raises(ConfigError, match="base_url"):
        OpenAICompatibleAdapter({"model": "m"}, env=ENV)


@pytest.mark.anyio
async def test_only_a_compatible_completions_server_scores_prompts() -> None:
    official = OpenAIAdapter({"model": "gpt-4o-mini", "endpoint": "completions"}, env=ENV)
    chat = OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1"})
    completions = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://x/v1", "endpoint": "completions"}
    )
    assert not official.supports_prompt_logprobs and not chat.supports_prompt_logprobs
    assert completions.supports_prompt_logprobs
    with pytest.raises(LogprobsUnsupported, match=r"api\.openai\.com returns no logprobs"):
        await official.prompt_logprobs("Answer: yes")
    with pytest.raises(LogprobsUnsupported, match="endpoint=chat"):
        await chat.prompt_logprobs("Answer: yes")


@pytest.mark.anyio
async def test_anthropic_marks_empty_replies_so_the_api_accepts_the_history() -> None:
    adapter = AnthropicAdapter({"model": "claude-3-5-haiku-latest"}, env=ENV)
    call = adapter.request(
        [
            Message(role="user", content="hi"),
            Message(role="assistant", content="  "),
            Message(role="user", content="again"),
        ],
        GenerationParams(),
        stream=False,
    )
    assert call.path == "/v1/messages"
    assert [m["content"] for m in call.body["messages"]] == ["hi", "(no reply)", "again"]


def test_settings_a_model_cannot_take_fail_before_the_run(tmp_path: Path) -> None:
    pack = write_pack(
        tmp_path / "p",
        {
            "default": {
                "turns": [
                    {"turn_id": "hot", "prompt_template": "hi", "config": {"temperature": 1.5}}
                ]
            }
        },
        [{"scenario_id": "s", "scenario_description": "x"}],
    )
    anthropic = AnthropicAdapter({"model": "claude-3-5-haiku-latest"}, env=ENV)
    with pytest.raises(ConfigError, match=r"turn 'hot'.*temperature 1.5 is out of the API's range"):
        convsim.Simulator(anthropic).check(pack)
    openai_like = OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1"})
    assert len(convsim.Simulator(openai_like).check(pack)) == 1  # 0-2 is fine there


def test_adapters_sharing_a_key_settle_their_limits_when_bound() -> None:
    budgets = Budgets()
    loose = OpenAICompatibleAdapter({"model": "a", "base_url": "http://x/v1", "rpm": 600})
    strict = OpenAICompatibleAdapter({"model": "b", "base_url": "http://x/v1", "rpm": 60})
    loose.share_budgets(budgets)
    before = loose.budget()
    strict.share_budgets(budgets)
    assert loose.budget() is strict.budget() is before
    assert before.limits.rpm == 60  # tightened at binding, before any call


def test_sse_decoder_drops_an_unfinished_event_and_a_byte_order_mark() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b'\xef\xbb\xbfdata: one\n\ndata: {"cut')
    assert [e.data for e in events] == ["one"]
    assert decoder.flush() == []  # the unfinished event is not handed on half-read
    split = SSEDecoder()
    pieces = [b"da", b"ta: a", b"b\r", b"\n", b"data: c\n", b"\n"]
    got = [e.data for chunk in pieces for e in split.feed(chunk)]
    assert got == ["ab\nc"]  # one event: two data lines, split anywhere, CRLF or LF
    assert SSEDecoder().feed(b"data: x\r\n\r\n")[0].data == "x"


def test_usage_cost_uses_snapshot_prices() -> None:
    adapter = OpenAIAdapter({"model": "gpt-4o-mini-2024-07-18"}, env=ENV)
    cost = adapter.estimate_cost(Usage(prompt_tokens=1_000_000, completion_tokens=1_000_000))
    assert cost is not None and cost.total_cost == pytest.approx(0.75)


def test_each_backend_reads_an_answer_into_named_parts() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chat = OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1"})
    completions = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://x/v1", "endpoint": "completions"}
    )
    anthropic = AnthropicAdapter({"model": "claude-3-5-haiku-latest"}, env=ENV)
    custom = CustomHttpAdapter({"model": "m", "base_url": "http://x"}, env={})
    answers = [
        chat.parse_response(
            {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": usage}
        ),
        completions.parse_response(
            {"choices": [{"text": "hi", "finish_reason": "length"}], "usage": usage}
        ),
        anthropic.parse_response(
            {
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 2},
            }
        ),
        custom.parse_response({"choices": [{"text": "hi"}], "usage": usage}),
    ]
    assert all(isinstance(a, ParsedAnswer) and a.text == "hi" for a in answers)
    assert [a.finish_reason for a in answers] == ["stop", "length", "end_turn", "stop"]
    metered = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    assert all(a.usage == metered for a in answers)
    unmetered = chat.parse_response({"choices": [{"message": {"content": "hi"}}]})
    assert unmetered == ParsedAnswer("hi", None, None)  # usage is estimated by the caller


def test_a_key_in_an_errors_message_or_snippet_is_blanked_out() -> None:
    adapter = OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1", "api_key": "sk-z"})
    protocol = ProtocolError("bad answer for sk-z", snippet='{"key": "sk-z"}')
    rate_limited = RateLimited("sk-z is over quota", retry_after=1.0)
    for error in (protocol, rate_limited):
        adapter._scrub_error(error)
        assert "sk-z" not in str(error)
    assert protocol.snippet == '{"key": "***"}'


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("adapter", "streams"),
    [
        (OpenAIAdapter({"model": "gpt-4o-mini"}, env=ENV), True),
        (OpenAICompatibleAdapter({"model": "m", "base_url": "http://x/v1"}), True),
        (AnthropicAdapter({"model": "claude-3-5-haiku-latest"}, env=ENV), True),
        (CustomHttpAdapter({"model": "m", "base_url": "http://x"}, env={}), False),
    ],
    ids=["openai", "openai-compatible", "anthropic", "http"],
)
async def test_model_info_says_whether_stream_works(
    adapter: HttpModelAdapter, streams: bool
) -> None:
    assert adapter.supports_streaming is streams
    assert adapter.model_info().supports_streaming is streams
    if not streams:  # the base's refusal, before any request
        with pytest.raises(ConfigError, match=r"^http models do not stream$"):
            await adapter.stream([Message(role="user", content="hi")], GenerationParams(), print)
