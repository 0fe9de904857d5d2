"""The response cache: hits and misses, what a key covers, expiry on an injected clock,
corrupt rows and files, two processes writing at once, secrets kept out of the file,
and runs and judge scoring that make no model call the second time."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim import Simulator
from convsim._errors import ConfigError, ServerError
from convsim._types import CallTimings, Completion, GenerationParams, Message, Usage
from convsim.adapters import CachedAdapter, ModelPool, ResponseCache, default_cache_dir
from convsim.adapters import parse_duration as duration
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from tests.conftest import FakeAdapter, write_pack

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
HELLO = (Message(role="user", content="hello"),)
AT_TURN_0 = GenerationParams(
    seed=7, metadata={"conversation_id": "c1", "scenario_id": "c1", "turn_id": "t0"}
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def cached(tmp_path: Path, **kwargs: Any) -> tuple[CachedAdapter, FakeAdapter, ResponseCache]:
    inner = FakeAdapter()
    cache = ResponseCache(tmp_path / "cache", **kwargs)
    return CachedAdapter(inner, cache), inner, cache


# -- hits, misses and what a key covers ---------------------------------------------------


async def test_the_same_request_is_answered_from_the_cache(tmp_path: Path) -> None:
    adapter, inner, cache = cached(tmp_path)
    first = await adapter.generate(HELLO, AT_TURN_0)
    again = await adapter.generate(HELLO, AT_TURN_0)
    assert len(inner.calls) == 1
    assert not first.cached and again.cached
    assert again.text == first.text and again.usage == first.usage
    assert again.attempts == 0 and again.timings == CallTimings()  # nothing was measured
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.writes, stats.corrupt) == (1, 1, 1, 0)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"messages": (Message(role="user", content="hello!"),)}, id="messages"),
        pytest.param({"params": AT_TURN_0.model_copy(update={"seed": 8})}, id="seed"),
        pytest.param({"params": AT_TURN_0.merged({"temperature": 0.5})}, id="temperature"),
        pytest.param({"params": AT_TURN_0.merged({"max_tokens": 9})}, id="max_tokens"),
        pytest.param(
            {"params": AT_TURN_0.model_copy(update={"metadata": {"turn_id": "t1"}})},
            id="turn position",
        ),
    ],
)
async def test_a_request_that_differs_is_a_miss(tmp_path: Path, other: dict[str, Any]) -> None:
    adapter, inner, _ = cached(tmp_path)
    await adapter.generate(HELLO, AT_TURN_0)
    answer = await adapter.generate(other.get("messages", HELLO), other.get("params", AT_TURN_0))
    assert not answer.cached and len(inner.calls) == 2


async def test_another_model_or_base_url_is_a_miss(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    await CachedAdapter(FakeAdapter(name="a"), cache).generate(HELLO, AT_TURN_0)
    other = FakeAdapter(name="b")
    assert not (await CachedAdapter(other, cache).generate(HELLO, AT_TURN_0)).cached
    from convsim.adapters import create_adapter

    one, two = (
        create_adapter("openai-compatible:m", {"base_url": f"http://127.0.0.1:{port}/v1"})
        for port in (1, 2)
    )
    assert one.cache_identity() != two.cache_identity()
    # limits, timeouts and prices do not change an answer: the same key
    slower = create_adapter(
        "openai-compatible:m", {"base_url": "http://127.0.0.1:1/v1", "timeout": 5, "rpm": 60}
    )
    assert slower.cache_identity() == one.cache_identity()


async def test_a_failed_call_is_not_cached(tmp_path: Path) -> None:
    outcomes = iter([ServerError("boom", status_code=500), "fine"])
    inner = FakeAdapter(lambda messages, params: next(outcomes))
    adapter = CachedAdapter(inner, ResponseCache(tmp_path))
    with pytest.raises(ServerError):
        await adapter.generate(HELLO, AT_TURN_0)
    answer = await adapter.generate(HELLO, AT_TURN_0)
    assert answer.text == "fine" and not answer.cached and len(inner.calls) == 2


async def test_a_streamed_hit_hands_on_the_whole_answer(tmp_path: Path) -> None:
    class Streaming(FakeAdapter):
        supports_streaming = True

        async def stream(self, messages: Any, params: Any, on_text: Any) -> Completion:
            on_text("he")
            on_text("llo")
            return Completion(text="hello", timings=CallTimings(ttft_s=0.1, total_s=0.2))

    adapter = CachedAdapter(Streaming(), ResponseCache(tmp_path))
    assert adapter.supports_streaming
    pieces: list[str] = []
    first = await adapter.stream(HELLO, AT_TURN_0, pieces.append)
    again = await adapter.stream(HELLO, AT_TURN_0, pieces.append)
    assert pieces == ["he", "llo", "hello"]
    assert first.timings.ttft_s == 0.1 and again.cached and again.timings.ttft_s is None


# -- expiry ----------------------------------------------------------------------------------


async def test_an_answer_older_than_the_expiry_is_asked_again(tmp_path: Path) -> None:
    clock = Clock()
    adapter, inner, _ = cached(tmp_path, expiry=3600, clock=clock)
    await adapter.generate(HELLO, AT_TURN_0)
    clock.now += 3600
    assert (await adapter.generate(HELLO, AT_TURN_0)).cached  # at the limit: still fresh
    clock.now += 1
    assert not (await adapter.generate(HELLO, AT_TURN_0)).cached
    assert len(inner.calls) == 2
    clock.now += 10  # the answer asked again was kept afresh
    assert (await adapter.generate(HELLO, AT_TURN_0)).cached


def test_durations_and_the_default_folder(tmp_path: Path) -> None:
    assert duration("3600") == duration("3600s") == duration("60m") == duration("1h") == 3600
    assert duration("7d") == 7 * 86400 and duration("1w") == duration("7d")
    for bad in ("", "7x", "-1d", "0s", "d"):
        with pytest.raises(ConfigError):
            duration(bad)
    with pytest.raises(ConfigError, match="above 0"):
        ResponseCache(tmp_path, expiry=0)
    assert default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "convsim" / "responses"
    )
    if sys.platform.startswith("linux"):
        assert default_cache_dir({}) == Path.home() / ".cache" / "convsim" / "responses"
        # a relative XDG_CACHE_HOME is invalid (XDG base directory spec): ignored
        assert default_cache_dir({"XDG_CACHE_HOME": "rel"}) == default_cache_dir({})


# -- corruption --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param("{not json", id="bad JSON"),
        pytest.param('{"text": "cut sho', id="truncated"),
        pytest.param('{"no_text": 1}', id="not a completion"),
        pytest.param(None, id="wrong types"),
    ],
)
async def test_a_bad_row_is_a_miss_and_is_replaced(tmp_path: Path, stored: str | None) -> None:
    adapter, inner, cache = cached(tmp_path)
    await adapter.generate(HELLO, AT_TURN_0)
    cache.close()
    with sqlite3.connect(cache.path) as db:
        if stored is None:
            db.execute("UPDATE responses SET created = 'x', completion = x'00ff'")
        else:
            db.execute("UPDATE responses SET completion = ?", (stored,))
    assert not (await adapter.generate(HELLO, AT_TURN_0)).cached
    assert cache.statistics().corrupt == 1 and len(inner.calls) == 2
    assert (await adapter.generate(HELLO, AT_TURN_0)).cached  # replaced by the new answer


async def test_a_file_of_garbage_is_set_aside_and_started_afresh(tmp_path: Path) -> None:
    adapter, inner, cache = cached(tmp_path)
    cache.directory.mkdir(parents=True)
    cache.path.write_bytes(b"\x00garbage, not a database\xff" * 400)
    assert not (await adapter.generate(HELLO, AT_TURN_0)).cached
    assert (await adapter.generate(HELLO, AT_TURN_0)).cached
    assert len(inner.calls) == 1 and cache.statistics().corrupt == 1
    assert list(cache.directory.glob("*.corrupt-*"))  # kept for a look, out of the way


async def test_a_file_damaged_while_open_is_a_miss_not_a_crash(tmp_path: Path) -> None:
    adapter, _, cache = cached(tmp_path)
    await adapter.generate(HELLO, AT_TURN_0)
    cache.close()
    for extra in cache.directory.glob(f"{cache.path.name}-*"):
        extra.unlink()
    size = cache.path.stat().st_size
    cache.path.write_bytes(b"\xde\xad" * (size // 2))
    assert not (await adapter.generate(HELLO, AT_TURN_0)).cached
    assert (await adapter.generate(HELLO, AT_TURN_0)).cached


# -- several processes ---------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from convsim._types import Completion
    from convsim.adapters import ResponseCache

    folder, name = sys.argv[1], sys.argv[2]
    cache = ResponseCache(folder)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()  # both start writing together
    for i in range(200):
        cache.store(f"shared-{i}", Completion(text=f"{name} {i}"))
        cache.store(f"{name}-{i}", Completion(text=f"{name} {i}"))
        assert cache.lookup(f"{name}-{i}") is not None
    print(cache.statistics().writes)
    """
)


def test_two_processes_write_one_cache_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    results = []
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        results = [writer.communicate(timeout=120) for writer in writers]
    finally:
        for writer in writers:  # pipes closed, processes gone, whatever happened
            if writer.poll() is None:
                writer.kill()
            writer.communicate()
    for writer, (out, err) in zip(writers, results, strict=True):
        assert writer.returncode == 0, err
        assert out.strip() == "400", err  # no write was dropped
    cache = ResponseCache(folder)
    for i in range(200):
        for key in (f"a-{i}", f"b-{i}"):
            assert cache.lookup(key) is not None
        shared = cache.lookup(f"shared-{i}")
        assert shared is not None and shared.text in (f"a {i}", f"b {i}")  # one whole answer
    assert cache.statistics().corrupt == 0


# -- runs, judges and secrets -----------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            MockModelServer(MockServerConfig(ttft_ms=1, itl_ms=0))
        ) as mock,
    ):
        yield mock


def chat_requests(mock: Any) -> int:
    return int(mock.statistics().by_endpoint.get(CHAT, 0))


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


SCORED = ("response_length", "context_retention", "goal_achievement")
"""Metrics of the run tests besides the pack's own (latency among them)."""


@pytest.mark.parametrize("stream", ["false", "true"])
def test_a_second_identical_run_calls_no_model(server: Any, tmp_path: Path, stream: str) -> None:
    cache = tmp_path / "cache"
    target = [
        "--model", "openai-compatible:mock-model",
        "--model-arg", f"base_url={server.base_url}",
        "--model-arg", f"stream={stream}",
        "--metrics", ",".join(SCORED),
        "--limit", "3",
        "--no-preflight",
    ]  # fmt: skip
    before = chat_requests(server)
    first = invoke("run", "customer_support", *target, "--out", str(tmp_path / "1.jsonl"),
                   f"--cache={cache}")  # fmt: skip
    assert first.exit_code == 0, first.stderr
    called = chat_requests(server) - before
    assert called > 0 and f"cache: 0 hits, {called} misses, {called} answers kept" in first.stdout
    second = invoke("run", "customer_support", *target, "--out", str(tmp_path / "2.jsonl"),
                    f"--cache={cache}", "--cache-expiry", "7d")  # fmt: skip
    assert second.exit_code == 0, second.stderr
    assert chat_requests(server) - before == called  # no call the second time
    assert f"cache: {called} hits, 0 misses" in second.stdout
    runs = [
        sorted(
            (json.loads(line) for line in (tmp_path / name).read_text().splitlines()),
            key=lambda result: str(result["conversation_id"]),
        )
        for name in ("1.jsonl", "2.jsonl")
    ]
    for one, two in zip(*runs, strict=True):
        timed = one["scores"].pop("latency"), two["scores"].pop("latency")
        assert timed[0]["value"] > 0 and timed[1]["status"] == "not_applicable"  # none timed
        assert {n: s["value"] for n, s in one["scores"].items()} == {
            n: s["value"] for n, s in two["scores"].items()
        }
        assert [t["response"] for t in one["turns"]] == [t["response"] for t in two["turns"]]
        assert all("cached" not in t for t in one["turns"])  # lines as before without hits
        completed = [t for t in two["turns"] if t["status"] == "completed"]
        assert completed and all(t["cached"] is True for t in completed)
        assert all(t["timings"]["latency_s"] is None for t in completed)
        assert all(t["timings"]["ttft_s"] is None for t in completed)
        assert two["usage"]["total_tokens"] == 0  # nothing spent
        assert [t["usage"] for t in one["turns"]] == [t["usage"] for t in two["turns"]]
    summary = json.loads((tmp_path / "2.summary.json").read_text())
    assert summary["cache"] == {"hits": called, "misses": 0}
    assert summary["latency_s"] == {}  # no figure from answers nobody timed
    assert "cache" not in json.loads((tmp_path / "1.summary.json").read_text())
    assert "answers from the cache" in (tmp_path / "2.summary.md").read_text()
    manifest = json.loads((tmp_path / "2.manifest.json").read_text())
    assert manifest["settings"]["cache"] == str(cache)
    assert manifest["settings"]["cache_expiry"] == 7 * 86400


def test_judge_answers_are_reused_by_score(server: Any, tmp_path: Path) -> None:
    results = tmp_path / "run.jsonl"
    made = invoke("run", "customer_support", "--limit", "2", "--out", str(results))
    assert made.exit_code == 0, made.stderr
    judge = [
        "--metrics", "judge:Is the reply polite?",
        "--judge", "openai-compatible:mock-model",
        "--judge-arg", f"base_url={server.base_url}",
        f"--cache={tmp_path / 'cache'}",
    ]  # fmt: skip
    before = chat_requests(server)
    first = invoke("score", str(results), *judge, "--out", str(tmp_path / "s1.jsonl"))
    assert first.exit_code == 0, first.stderr
    asked = chat_requests(server) - before
    assert asked > 0
    second = invoke("score", str(results), *judge, "--out", str(tmp_path / "s2.jsonl"))
    assert second.exit_code == 0, second.stderr
    assert chat_requests(server) - before == asked  # every judge answer came from the cache
    assert f"cache: {asked} hits, 0 misses" in second.stdout
    one, two = (
        [json.loads(line)["scores"] for line in (tmp_path / f).read_text().splitlines()]
        for f in ("s1.jsonl", "s2.jsonl")
    )
    for a, b in zip(one, two, strict=True):
        (name,) = a
        assert (a[name]["value"], a[name]["status"]) == (b[name]["value"], b[name]["status"])
        assert b[name]["details"]["judge_cached"] == a[name]["details"]["judge_calls"]
        assert b[name]["details"]["judge_calls"] == 0


def test_cache_options_refuse_bad_input(tmp_path: Path) -> None:
    alone = invoke("run", "customer_support", "--cache-expiry", "7d", "--limit", "1")
    assert alone.exit_code == 2 and "--cache-expiry needs --cache" in alone.stderr
    bad = invoke("run", "customer_support", f"--cache={tmp_path}", "--cache-expiry", "soon")
    assert bad.exit_code == 2 and "not a duration" in bad.stderr
    no_judge = invoke("score", str(tmp_path / "x.jsonl"), "--metrics", "response_length",
                      f"--cache={tmp_path}")  # fmt: skip
    assert no_judge.exit_code == 2 and "needs --judge" in no_judge.stderr


async def test_no_secret_reaches_the_cache_file(server: Any, tmp_path: Path) -> None:
    secret = "sk-cache-test-0123456789abcdef"
    folder = tmp_path / "cache"
    async with Simulator(
        "openai-compatible:mock-model",
        model_args={"base_url": server.base_url, "api_key": secret},
        metrics=["response_length"],
        cache=folder,
        preflight=False,
    ) as sim:
        results = [r async for r in sim.run("customer_support", limit=2)]
    assert results and all(r.status.value == "DONE" for r in results)
    files = list(folder.iterdir())
    assert files
    for path in files:
        assert secret.encode() not in path.read_bytes(), path.name


async def test_the_simulator_takes_a_cache_object_and_the_pool_fronts_every_model(
    tmp_path: Path,
) -> None:
    cache = ResponseCache(tmp_path)
    inner = FakeAdapter()
    async with Simulator(inner, cache=cache, metrics=["response_length"]) as sim:
        assert isinstance(sim.model, CachedAdapter) and sim.model.inner is inner
        first = [r async for r in sim.run("customer_support", limit=1)]
        calls = len(inner.calls)
        second = [r async for r in sim.run("customer_support", limit=1)]
    assert calls and len(inner.calls) == calls
    assert all(t.cached for t in second[0].turns if t.status.value == "completed")
    assert first[0].usage.total_tokens > 0 and second[0].usage == Usage()
    assert sim.config.cache is cache
    async with ModelPool(cache=cache) as pool:
        adapter = pool.get(inner, role="judge")
        assert pool.get(inner) is adapter and adapter.inner is inner  # type: ignore[attr-defined]
        assert pool.get("scripted", role="model").inner is not None  # type: ignore[attr-defined]
    assert ModelPool().get(inner) is inner  # no cache: the adapter itself


async def test_simulated_user_answers_are_cached_and_cost_nothing(tmp_path: Path) -> None:
    path = write_pack(
        tmp_path / "pack",
        {
            "default": {
                "turns": [
                    {"turn_id": "open", "prompt_template": "My kettle arrived broken."},
                    {"turn_id": "ask", "role": "user", "prompt_template": "Ask for a refund."},
                ]
            }
        },
        [
            {
                "scenario_id": "s0",
                "scenario_description": "A refund.",
                "user": {"persona": "a nurse"},
            }
        ],
    )
    cache = ResponseCache(tmp_path / "cache")
    model, user = FakeAdapter(name="agent"), FakeAdapter(name="user-sim")
    results = []
    for _ in range(2):
        async with Simulator(model, user_model=user, metrics=[], cache=cache) as sim:
            results += [r async for r in sim.run(path)]
    assert len(user.calls) == 1 and len(model.calls) == 2  # nothing asked the second time
    first, second = (r.turns[1] for r in results)
    assert not first.user_cached and second.user_cached and second.cached
    assert second.user_message == first.user_message and second.user_usage == first.user_usage
    assert second.timings is not None and second.timings.user_latency_s is None
    assert results[0].user_usage is not None and results[0].user_usage.total_tokens == 2
    assert results[1].user_usage == Usage()  # the cached message cost nothing


def test_the_cache_can_come_from_the_environment_or_a_config_file(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    config = tmp_path / "run.yaml"
    config.write_text(f"cache: {folder}\ncache_expiry: 1d\n", encoding="utf-8")
    run = ["run", "customer_support", "--limit", "1"]
    first = invoke(*run, "--config", str(config), "--out", str(tmp_path / "1.jsonl"))
    assert first.exit_code == 0, first.stderr
    assert "cache: 0 hits" in first.stdout and str(folder) in first.stdout
    second = CliRunner(env={"CONVSIM_RUN_CACHE": str(folder)}).invoke(
        main, [*run, "--out", str(tmp_path / "2.jsonl")], catch_exceptions=False
    )
    assert second.exit_code == 0, second.stderr
    assert "0 misses" in second.stdout and "cache: 0 hits" not in second.stdout
