"""Where token counts come from: the server's usage (asked for in streams), its
tokenizer when it sends none, else an estimate; every figure says which, the summaries
count them, and ``convsim run`` and ``convsim load`` count the same way."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner
from conftest import DATA, write_pack
from pydantic import TypeAdapter, ValidationError

from convsim import ConversationResult
from convsim._types import GenerationParams, Message, Usage
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig, MockServerStatistics
from convsim.cli import main
from convsim.results._report import summarize

pytestmark = pytest.mark.anyio

CHAT = [
    Message(role="system", content="Answer briefly."),
    Message(role="user", content="My order 4521 arrived broken, what now?"),
]


# -- the figure and its source ---------------------------------------------------------


def test_source_and_estimated_flag_agree() -> None:
    assert Usage(estimated=True).source == "estimate"
    assert Usage(source="estimate").estimated is True
    assert Usage(source="tokenizer").estimated is False
    assert Usage(1, 2, 3).source == "server"
    with pytest.raises(ValidationError, match="contradicts"):
        Usage(estimated=True, source="server")
    server, counted, guessed = (
        Usage(source="server"),
        Usage(source="tokenizer"),
        Usage(source="estimate"),
    )
    assert (server + counted).source == "tokenizer"  # a sum is as exact as its least exact part
    assert (counted + guessed + server).source == "estimate"
    assert (server + server).source == "server"


def test_usage_written_before_sources_reads_from_its_flag() -> None:
    read = TypeAdapter(Usage).validate_json
    assert read('{"prompt_tokens": 3, "estimated": true}').source == "estimate"
    assert read('{"prompt_tokens": 3, "estimated": false}').source == "server"
    assert read('{"prompt_tokens": 3}').source == "server"
    back = read(TypeAdapter(Usage).dump_json(Usage(2, 1, 3, source="tokenizer")))
    assert back == Usage(2, 1, 3, source="tokenizer")


def test_an_old_results_file_with_estimated_turns_summarises_them() -> None:
    line = (DATA / "results_v1.jsonl").read_text(encoding="utf-8").splitlines()[0]
    data = json.loads(line)
    turns = [t for t in data["turns"] if t.get("usage")]
    assert turns and all("source" not in t["usage"] for t in turns)
    turns[0]["usage"]["estimated"] = True
    result = ConversationResult.model_validate_json(json.dumps(data))
    report = summarize([result])
    assert report.token_sources == {"server": len(turns) - 1, "tokenizer": 0, "estimate": 1}
    said = report.token_sources_line()
    assert said is not None and "1 estimated" in said
    assert f"- {said}" in report.to_markdown()


# -- the adapter: usage from the stream, the tokenizer, the estimate ----------------------


async def _answer(config: MockServerConfig, **args: Any) -> tuple[Usage, MockServerStatistics]:
    async with MockModelServer(config) as server:
        adapter = OpenAICompatibleAdapter(
            {"model": "mock-model", "base_url": server.base_url, "max_retries": 0, **args}
        )
        try:
            completion = await adapter.generate(CHAT, GenerationParams(seed=7))
            again = await adapter.generate(CHAT, GenerationParams(seed=7))
        finally:
            await adapter.aclose()
        assert again.usage == completion.usage
        return completion.usage, server.statistics()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_servers_tokenizer_counts_what_its_usage_would(stream: bool) -> None:
    reported, _ = await _answer(MockServerConfig(message_overhead_tokens=3), stream=stream)
    assert reported.source == "server"  # a stream asked for it with stream_options
    counted, calls = await _answer(
        MockServerConfig(message_overhead_tokens=3, usage=False), stream=stream
    )
    assert counted.source == "tokenizer" and not counted.estimated
    assert (counted.prompt_tokens, counted.completion_tokens, counted.total_tokens) == (
        reported.prompt_tokens,
        reported.completion_tokens,
        reported.total_tokens,
    )
    # the first answer finds the form (1), then each answer counts its prompt (chat
    # messages, template included) and its text: 1 + 2 + 2
    assert calls.by_endpoint["/tokenize"] == 5


async def test_without_usage_or_tokenizer_the_estimate_says_so_and_asks_once() -> None:
    config = MockServerConfig(usage=False, tokenize=False, output_tokens=9)
    usage, calls = await _answer(config, stream=True)
    assert usage.source == "estimate" and usage.estimated
    assert usage.completion_tokens == 9  # a stream's chunks: one word (token) each here
    # two answers and the three forms of tokenize, each refused once: not asked again
    assert calls.requests == 2 + 3


def _templated_prompt(messages: list[dict[str, str]]) -> int:
    """The prompt count of a server whose template adds 3 tokens a message, 2 for the
    answer's start, and a 10-token system prompt of its own when none is given."""
    words = sum(len(m["content"].split()) for m in messages)
    default_system = 0 if any(m["role"] == "system" for m in messages) else 10
    return words + 3 * len(messages) + 2 + default_system


def _llama_cpp_python(seen: list[str], usage: bool = True) -> httpx.MockTransport:
    """A server that streams no usage (but reports it when not streaming, if ``usage``)
    and tokenizes text at /extras/tokenize only."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        body = json.loads(request.content)
        if request.url.path == "/extras/tokenize":
            return httpx.Response(200, json={"tokens": list(range(len(body["input"].split())))})
        if request.url.path.endswith("/tokenize"):
            return httpx.Response(404, json={"detail": "Not Found"})
        if not body.get("stream"):
            prompt = _templated_prompt(body["messages"])
            counts = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
            return httpx.Response(
                200,
                json={
                    "choices": [{"message": {"content": "Hi"}, "finish_reason": "length"}],
                    "usage": counts if usage else None,
                },
            )
        events = [
            {"choices": [{"delta": {"content": "Send"}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": " a photo please"}, "finish_reason": "stop"}]},
        ]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(answer)


async def test_a_text_tokenizer_counts_the_messages_and_measures_the_template() -> None:
    seen: list[str] = []
    adapter = OpenAICompatibleAdapter(
        {"model": "smollm2", "base_url": "http://127.0.0.1:9/v1", "stream": True},
        transport=HttpxTransport(transport=_llama_cpp_python(seen)),
    )
    wire = [{"role": m.role, "content": m.content} for m in CHAT]
    first = await adapter.generate(CHAT, GenerationParams())
    prompt = _templated_prompt(wire)
    assert first.usage == Usage(prompt, 4, prompt + 4, source="tokenizer")
    assert seen.count("/tokenize") == 2  # vLLM's form, llama.cpp's form: both refused, once
    assert seen.count("/v1/chat/completions") == 1 + 3  # the answer, three template probes
    seen.clear()
    without_system = [Message(role="user", content="Where is my parcel 4521 now?")]
    again = await adapter.generate(without_system, GenerationParams())
    prompt = _templated_prompt([{"role": "user", "content": without_system[0].content}])
    assert again.usage == Usage(prompt, 4, prompt + 4, source="tokenizer")
    # measured once: now the answer and two counts (its prompt, its text)
    assert seen == ["/v1/chat/completions", "/extras/tokenize", "/extras/tokenize"]
    await adapter.aclose()


async def test_a_text_tokenizer_without_any_usage_leaves_an_estimate() -> None:
    seen: list[str] = []
    adapter = OpenAICompatibleAdapter(
        {"model": "smollm2", "base_url": "http://127.0.0.1:9/v1", "stream": True},
        transport=HttpxTransport(transport=_llama_cpp_python(seen, usage=False)),
    )
    completion = await adapter.generate(CHAT, GenerationParams())
    assert completion.usage.source == "estimate"  # the template's share cannot be measured
    await adapter.generate(CHAT, GenerationParams())
    assert seen.count("/v1/chat/completions") == 2 + 1  # two answers, one probe: not again
    await adapter.aclose()


async def test_a_server_refusing_stream_options_is_asked_again_without_them() -> None:
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tokenize"):
            return httpx.Response(404)
        body = json.loads(request.content)
        bodies.append(body)
        if "stream_options" in body:
            message = "Unrecognized request argument supplied: stream_options"
            return httpx.Response(400, json={"error": {"message": message}})
        event = {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}
        text = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "stream": True, "max_retries": 0},
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
    )
    first = await adapter.generate(CHAT, GenerationParams())
    assert first.text == "ok" and first.attempts == 1
    assert ["stream_options" in b for b in bodies] == [True, False]
    await adapter.generate(CHAT, GenerationParams())
    assert ["stream_options" in b for b in bodies] == [True, False, False]  # not asked again
    assert first.usage.source == "estimate"
    await adapter.aclose()


async def test_another_400_is_not_sent_again() -> None:
    calls = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(400, json={"error": {"message": "max_tokens is too large"}})

    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "stream": True},
        transport=HttpxTransport(transport=httpx.MockTransport(answer)),
    )
    from convsim import BadRequest

    with pytest.raises(BadRequest, match="max_tokens"):
        await adapter.generate(CHAT, GenerationParams())
    assert calls == 1
    await adapter.aclose()


def _no_usage(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200, json={"choices": [{"message": {"content": "one two three"}, "finish_reason": "stop"}]}
    )


class _Encoding:
    def encode(self, text: str, disallowed_special: Any = ()) -> list[int]:
        return [0] * len(text.split())


async def test_openai_models_are_counted_with_tiktoken_when_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = types.ModuleType("tiktoken")
    fake.encoding_for_model = lambda model: _Encoding()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    adapter = OpenAIAdapter(
        {"model": "gpt-4o-mini"},
        transport=HttpxTransport(transport=httpx.MockTransport(_no_usage)),
        env={"OPENAI_API_KEY": "sk-test"},
    )
    completion = await adapter.generate(CHAT, GenerationParams())
    words = sum(len(m.content.split()) for m in CHAT)
    prompt = words + (1 + 3) * len(CHAT) + 3  # role and framing a message, answer priming
    assert completion.usage == Usage(prompt, 3, prompt + 3, source="tokenizer")
    await adapter.aclose()


async def test_without_tiktoken_openai_models_are_estimated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken fails
    adapter = OpenAIAdapter(
        {"model": "gpt-4o-mini"},
        transport=HttpxTransport(transport=httpx.MockTransport(_no_usage)),
        env={"OPENAI_API_KEY": "sk-test"},
    )
    completion = await adapter.generate(CHAT, GenerationParams())
    assert completion.usage.source == "estimate"
    await adapter.aclose()


# -- run and load on the same server ------------------------------------------------------


@pytest.fixture
def no_usage_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    config = MockServerConfig(
        usage=False, output_tokens=6, message_overhead_tokens=3, **request.param
    )
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as mock,
    ):
        yield mock


def _pack(tmp_path: Path) -> Path:
    turns = [
        {"turn_id": f"t{i}", "prompt_template": text}
        for i, text in enumerate(
            ["Hello, my parcel is late.", "It was order 4521.", "Can you refund it?"]
        )
    ]
    scenario = {"scenario_id": "late", "scenario_description": "a late parcel"}
    return write_pack(tmp_path / "pack", {"default": {"turns": turns}}, [scenario])


@pytest.mark.parametrize(
    ("no_usage_server", "source"),
    [({}, "tokenizer"), ({"tokenize": False}, "estimate")],
    indirect=["no_usage_server"],
    ids=["tokenizer", "estimate"],
)
def test_run_and_load_count_the_same_tokens_from_the_same_source(
    no_usage_server: Any, source: str, tmp_path: Path
) -> None:
    pack = _pack(tmp_path)
    target = ["--model", "openai-compatible:mock-model"]
    target += ["--model-arg", f"base_url={no_usage_server.base_url}", "--model-arg", "stream=true"]
    out = tmp_path / "run.jsonl"
    ran = CliRunner().invoke(main, ["run", str(pack), *target, "--out", str(out), "--no-progress"])
    assert ran.exit_code == 0, ran.output
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    by_run = [
        (
            t["turn_index"],
            t["usage"]["prompt_tokens"],
            t["usage"]["completion_tokens"],
            t["usage"]["source"],
        )
        for t in row["turns"]
    ]
    summary = json.loads((tmp_path / "run.summary.json").read_text(encoding="utf-8"))
    assert summary["token_sources"][source] == 3 and sum(summary["token_sources"].values()) == 3
    if source == "estimate":
        assert "3 estimated" in ran.output
        assert "3 estimated" in (tmp_path / "run.summary.md").read_text(encoding="utf-8")

    requests, result = tmp_path / "load.jsonl", tmp_path / "load.json"
    loaded = CliRunner().invoke(
        main,
        [
            "load",
            *target,
            "--pack",
            str(pack),
            "--repeat",
            "1",
            "--concurrency",
            "1",
            "--no-calibrate",
            "--out",
            str(result),
            "--requests",
            str(requests),
        ],
    )
    assert loaded.exit_code == 0, loaded.output
    by_load = sorted(
        (r["turn_index"], r["input_tokens"], r["output_tokens"], r["token_source"])
        for r in map(json.loads, requests.read_text(encoding="utf-8").splitlines())
    )
    assert by_load == by_run
    assert json.loads(result.read_text(encoding="utf-8"))["token_sources"] == {source: 3}
    assert "3 of 3 answers came without usage" in loaded.output


async def test_a_cached_adapter_counts_with_its_models_tokenizer(tmp_path: Path) -> None:
    from convsim.adapters._cache import CachedAdapter, ResponseCache

    async with MockModelServer(MockServerConfig()) as server:
        inner = OpenAICompatibleAdapter({"model": "mock-model", "base_url": server.base_url})
        cached = CachedAdapter(inner, ResponseCache(tmp_path / "cache"))
        try:
            assert await cached.count_tokens("three words here") == 3  # what load calibrates by
        finally:
            await cached.aclose()
