"""Prefix-cache hits: the cached prompt tokens servers report (None when they do not
say, never 0), the mock server's simulated prefix cache and its ``/metrics``, results
lines that stay as they were without the count, and hit rates by turn depth in load
results and run summaries, rising over a session."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim._records import ConversationResult
from convsim._types import GenerationParams, Message, Usage
from convsim.adapters._anthropic import _usage as anthropic_usage
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._openai import _usage as openai_usage
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.adapters.mock._prefix_cache import PrefixCache
from convsim.adapters.mock._wire import Turn
from convsim.cli import main
from convsim.load._scraper import parse_exposition
from convsim.results._prefix_cache import NOT_REPORTED, PrefixCacheFold
from convsim.results._report import summarize

# -- what servers report ----------------------------------------------------------


def test_openai_usage_says_none_when_the_server_did_not_say() -> None:
    plain = openai_usage({"prompt_tokens": 100, "completion_tokens": 5})
    assert plain is not None and plain.cached_tokens is None
    null = openai_usage(
        {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": None}
    )
    assert null is not None and null.cached_tokens is None  # vLLM without the option
    miss = openai_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
    )
    assert miss is not None and miss.cached_tokens == 0  # said, and nothing was cached
    hit = openai_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    )
    assert hit is not None and (hit.cached_tokens, hit.cached_prompt_tokens) == (64, 64)


def test_anthropic_usage_says_none_without_cache_reads() -> None:
    plain = anthropic_usage({"input_tokens": 10, "output_tokens": 5})
    assert plain is not None and plain.cached_tokens is None
    read = anthropic_usage({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 0})
    assert read is not None and read.cached_tokens == 0


def test_usage_sums_keep_unsaid_apart_from_zero() -> None:
    assert (Usage() + Usage()).cached_tokens is None
    assert (Usage(cached_tokens=3) + Usage()).cached_tokens == 3
    assert (Usage(cached_tokens=3) + Usage(cached_tokens=4)).cached_tokens == 7


def _result(usage: Usage) -> ConversationResult:
    return ConversationResult.model_validate(
        {
            "run_id": "r", "conversation_id": "c", "scenario_id": "s", "scenario_type": "t",
            "pack": "p", "pack_hash": "h", "model": "m", "seed": 0, "status": "DONE",
            "termination_reason": "completed", "transcript": [],
            "turns": [
                {
                    "conversation_id": "c", "turn_index": 0, "turn_id": "t0",
                    "role": "assistant", "status": "completed", "usage": usage,
                }
            ],
            "usage": usage,
            "timings": {"started_at": 0.0, "finished_at": 1.0, "duration_s": 1.0},
        }
    )  # fmt: skip


def test_a_results_line_without_cached_tokens_is_written_as_before() -> None:
    line = _result(Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12)).model_dump_json()
    assert "cached_tokens" not in line
    assert json.loads(line)["schema_version"] == 2
    assert json.loads(line)["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "estimated": False,
        "source": "server",
        "cached_prompt_tokens": 0,
    }


def test_a_results_line_with_cached_tokens_is_version_7_and_reads_back() -> None:
    usage = Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12, cached_tokens=8)
    result = _result(usage)
    line = result.model_dump_json()
    assert json.loads(line)["schema_version"] == 7
    assert json.loads(line)["turns"][0]["usage"]["cached_tokens"] == 8
    again = ConversationResult.model_validate_json(line)
    assert again.turns[0].usage == usage


# -- the mock server's prefix cache -------------------------------------------------


def _turns(*texts: str) -> tuple[Turn, ...]:
    roles = ("user", "assistant")
    return tuple(Turn(roles[i % 2], t) for i, t in enumerate(texts))


def test_a_prompt_that_extends_the_last_turn_hits_in_whole_blocks() -> None:
    cache = PrefixCache(100, block_tokens=16)
    first = cache.lookup(_turns("a"), [40])
    assert first.cached_tokens == 0
    cache.answered(first, "b", 10)
    second = cache.lookup(_turns("a", "b", "c"), [40, 10, 30])
    assert second.cached_tokens == 48  # 50 tokens held, in whole blocks of 16
    again = cache.lookup(_turns("a", "b", "c"), [40, 10, 30])
    assert again.cached_tokens == 64  # the whole prompt held: all but its last token, 79
    other = cache.lookup(_turns("z", "b", "c"), [40, 10, 30])
    assert other.cached_tokens == 0  # the same later messages after another start


def test_a_hit_is_a_run_from_the_start() -> None:
    cache = PrefixCache(100, block_tokens=1)
    cache.lookup(_turns("a", "b", "c"), [5, 5, 5])
    # a's 5 tokens and x's role marker (b's too); c, held after b, is not after x
    assert cache.lookup(_turns("a", "x", "c", "d"), [5, 5, 5, 5]).cached_tokens == 6


def test_the_cache_forgets_the_least_recently_used() -> None:
    cache = PrefixCache(20, block_tokens=1)  # room for two messages of 10 tokens
    cache.lookup(_turns("a"), [10])
    cache.lookup(_turns("b"), [10])
    cache.lookup(_turns("a"), [10])  # used again: "b" is now the oldest
    cache.lookup(_turns("c"), [10])
    assert len(cache) == 20
    assert cache.lookup(_turns("a", "x"), [10, 1]).cached_tokens == 10
    # of b, only the role marker every user message starts with is still held
    assert cache.lookup(_turns("b", "x"), [10, 1]).cached_tokens == 1
    off = PrefixCache(0)
    off.lookup(_turns("a"), [40])
    assert off.lookup(_turns("a", "b"), [40, 40]).cached_tokens == 0 and len(off) == 0


def test_prompts_that_share_a_leading_text_share_its_whole_blocks() -> None:
    """As a trace's requests that declare the same prefix blocks: one message each."""
    cache = PrefixCache(100, block_tokens=16)
    shared = " ".join(f"w{i}" for i in range(70))
    first = f"{shared} and then one thing"
    second = f"{shared} but another thing entirely"
    assert cache.lookup(_turns(first), [len(first.split()) + 1]).cached_tokens == 0
    hit = cache.lookup(_turns(second), [len(second.split()) + 1]).cached_tokens
    assert hit == 64  # the role marker and 70 shared words: 71 tokens, 4 whole blocks
    assert cache.lookup(_turns(f"x {shared}"), [72]).cached_tokens == 0  # not a prefix


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="one token count per message"):
        PrefixCache(1).lookup(_turns("a"), [1, 2])


@pytest.mark.anyio
async def test_the_mock_reports_cached_tokens_streamed_and_not() -> None:
    """Through the OpenAI-compatible adapter: the second turn resends the first."""
    async with MockModelServer(MockServerConfig(output_tokens=20)) as server:
        for stream in ("false", "true"):
            adapter = OpenAICompatibleAdapter(
                {"model": "mock-model", "base_url": server.base_url, "stream": stream}
            )
            try:
                system = Message(role="system", content=f"{stream} " + "word " * 40)
                history = [system, Message(role="user", content="hello " * 10)]
                first = await adapter.generate(history, GenerationParams())
                history += [
                    Message(role="assistant", content=first.text),
                    Message(role="user", content="more " * 10),
                ]
                second = await adapter.generate(history, GenerationParams())
            finally:
                await adapter.aclose()
            assert first.usage.cached_tokens == 0, stream
            # system 41 + user 10 + answer 20 words held: 71 tokens, 64 in whole blocks
            assert second.usage.cached_tokens == 64, stream


@pytest.mark.anyio
async def test_without_the_cache_the_mock_says_nothing() -> None:
    config = MockServerConfig(prefix_cache=False)
    async with MockModelServer(config) as server, httpx.AsyncClient() as client:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        answer = (await client.post(server.base_url + "/chat/completions", json=body)).json()
    assert "prompt_tokens_details" not in answer["usage"]


@pytest.mark.anyio
async def test_the_mock_metrics_count_what_it_served() -> None:
    """While an answer waits for its first token it runs and holds KV cache; after it,
    the counters moved by its tokens."""
    waiting = anyio.Event()
    release = anyio.Event()

    async def sleep(_seconds: float) -> None:
        waiting.set()
        await release.wait()

    config = MockServerConfig(ttft_ms=50, output_tokens=6, kv_cache_tokens=100)
    async with (
        MockModelServer(config, sleep=sleep) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):

        def read(text: str) -> dict[str, float]:
            return {s.name: s.value for s in parse_exposition(text)}

        body = {"messages": [{"role": "user", "content": "one two three four"}]}
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(client.post, "/v1/chat/completions", json=body))
            await waiting.wait()
            during = read((await client.get("/metrics")).text)
            release.set()
        after = read((await client.get("/metrics")).text)
    assert during["vllm:num_requests_running"] == 1
    assert during["vllm:kv_cache_usage_perc"] == pytest.approx(0.10)  # 4 + 6 of 100 tokens
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:num_requests_waiting"] == 0 and after["vllm:num_preemptions_total"] == 0
    assert after["vllm:prompt_tokens_total"] == 4 and after["vllm:generation_tokens_total"] == 6
    assert after["vllm:prefix_cache_queries_total"] == 4
    assert after["vllm:prefix_cache_hits_total"] == 0
    assert after["vllm:time_to_first_token_seconds_count"] == 1
    assert after["vllm:time_to_first_token_seconds_sum"] == pytest.approx(0.05)


@pytest.mark.anyio
async def test_over_max_running_requests_wait_and_the_metrics_say_so() -> None:
    """A server's batch limit: the second request waits for the first's place, and its
    time to first token includes the wait."""
    answering = anyio.Event()
    release = anyio.Event()

    async def sleep(_seconds: float) -> None:
        answering.set()
        await release.wait()

    config = MockServerConfig(ttft_ms=50, output_tokens=2, max_running=1)
    body = {"messages": [{"role": "user", "content": "one two"}]}
    async with (
        MockModelServer(config, sleep=sleep) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):

        async def read() -> dict[str, float]:
            return {s.name: s.value for s in parse_exposition((await client.get("/metrics")).text)}

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(client.post, "/v1/chat/completions", json=body))
            await answering.wait()
            tg.start_soon(partial(client.post, "/v1/chat/completions", json=body))
            with anyio.fail_after(10):
                during = await read()
                while during["vllm:num_requests_waiting"] < 1:
                    await anyio.sleep(0.01)
                    during = await read()
            release.set()
        after = await read()
    assert during["vllm:num_requests_running"] == 1
    assert during["vllm:num_requests_waiting"] == 1
    assert after["vllm:num_requests_waiting"] == 0 and after["vllm:num_requests_running"] == 0
    assert after["vllm:time_to_first_token_seconds_count"] == 2
    assert after["vllm:time_to_first_token_seconds_sum"] > 0.1  # two draws of 50 ms + the wait


def test_the_cli_takes_the_cache_and_batch_options() -> None:
    from click.testing import CliRunner

    from convsim.cli import main

    served: list[MockServerConfig] = []

    async def capture(config: MockServerConfig) -> None:
        served.append(config)

    import convsim.cli._mock_server as cli_mock

    original = cli_mock._serve_mock
    cli_mock._serve_mock = capture  # type: ignore[assignment]
    try:
        result = CliRunner().invoke(
            main, ["mock-server", "--no-prefix-cache", "--max-running", "4"]
        )
    finally:
        cli_mock._serve_mock = original  # type: ignore[assignment]
    assert result.exit_code == 0, result.output
    assert served[0].prefix_cache is False and served[0].max_running == 4


# -- hit rates ------------------------------------------------------------------------


def test_no_report_means_no_hit_rate_and_a_reason() -> None:
    fold = PrefixCacheFold()
    fold.add(0, 100, None)
    figures = fold.figures()
    assert figures.hit_rate is None and figures.reason == NOT_REPORTED
    assert (figures.requests, figures.unreported, figures.hit_rate_by_turn) == (0, 1, [])


def test_unreported_calls_are_left_out_of_the_rate() -> None:
    fold = PrefixCacheFold()
    fold.add(0, 100, 0)
    fold.add(1, 200, 150)
    fold.add(1, 1000, None)
    figures = fold.figures()
    assert figures.hit_rate == pytest.approx(150 / 300)
    assert [t.hit_rate for t in figures.hit_rate_by_turn] == [0.0, 0.75]
    assert figures.unreported == 1 and figures.reason is None


@pytest.fixture(scope="module")
def mock() -> Iterator[Any]:
    with start_blocking_portal() as portal:
        server = MockModelServer(MockServerConfig(ttft_ms=1))
        with portal.wrap_async_context_manager(server) as running:
            yield running


def test_a_multi_turn_load_shows_the_hit_rate_rising_with_turn_depth(
    mock: Any, tmp_path: Path
) -> None:
    out, requests = tmp_path / "r.json", tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "load", "--model", "openai-compatible:mock-model", "--base-url", mock.base_url,
            "--synthetic", "turns=5,input_tokens=64,output_tokens=32", "--seed", "7",
            "-c", "2", "--max-requests", "50", "--no-calibrate",
            "--out", str(out), "--requests", str(requests),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    cache = json.loads(out.read_text())["prefix_cache"]
    rates = [t["hit_rate"] for t in cache["hit_rate_by_turn"]]
    assert [t["turn_index"] for t in cache["hit_rate_by_turn"]] == [0, 1, 2, 3, 4]
    assert rates[0] < 0.2  # a session's first prompt: nothing of it was seen
    assert all(a < b for a, b in itertools.pairwise(rates))  # rising
    assert rates[-1] > 0.7
    assert cache["unreported"] == 0 and cache["reason"] is None
    assert 0 < cache["hit_rate"] < 1
    assert "prefix cache:" in result.stdout
    rows = [json.loads(line) for line in requests.read_text().splitlines()]
    assert all(isinstance(r["cached_tokens"], int) for r in rows)


def test_a_server_that_does_not_say_gives_a_reason(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with start_blocking_portal() as portal:
        server = MockModelServer(MockServerConfig(prefix_cache=False))
        with portal.wrap_async_context_manager(server) as running:
            result = CliRunner().invoke(
                main,
                [
                    "load", "--model", "openai-compatible:mock-model",
                    "--base-url", running.base_url,
                    "--synthetic", "turns=2,input_tokens=16,output_tokens=4",
                    "-c", "1", "--max-requests", "4", "--no-calibrate", "--out", str(out),
                ],
                catch_exceptions=False,
            )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    cache = json.loads(out.read_text())["prefix_cache"]
    assert cache["hit_rate"] is None and cache["reason"] == NOT_REPORTED
    assert cache["requests"] == 0 and cache["unreported"] >= 4


def test_a_run_summary_has_hit_rates_by_turn_only_when_reported() -> None:
    def turned(cached: list[int | None]) -> ConversationResult:
        result = _result(Usage())
        turns = [
            result.turns[0].__class__(
                conversation_id="c",
                turn_index=i,
                turn_id=f"t{i}",
                role="assistant",
                status="completed",  # type: ignore[arg-type]
                usage=Usage(prompt_tokens=100, cached_tokens=c),
            )
            for i, c in enumerate(cached)
        ]
        return result.model_copy(update={"turns": tuple(turns)})

    report = summarize([turned([0, 60]), turned([10, 80])])
    assert report.prefix_cache is not None
    assert report.prefix_cache.hit_rate == pytest.approx(150 / 400)
    assert [t.hit_rate for t in report.prefix_cache.hit_rate_by_turn] == [0.05, 0.7]
    assert "prefix cache: 37.5% of prompt tokens cached" in report.to_markdown()
    silent = summarize([turned([None, None])])
    assert silent.prefix_cache is None
    assert "prefix_cache" not in silent.model_dump(mode="json")
