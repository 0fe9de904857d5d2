"""lm-eval loglikelihood and loglikelihood_rolling through convsim adapters.

Everything runs against the mock model server on 127.0.0.1 (or ``httpx.MockTransport``):
its tokenizer and per-token logprobs are documented and deterministic, so every
expected number below is worked out here from that documentation, independently of the
server's code.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog.testing
from anyio.from_thread import BlockingPortal, start_blocking_portal

from convsim import AuthError, ConfigError, ConvsimError, ProtocolError
from convsim.adapters import PromptLogprobs, PromptScorer, ScriptedAdapter, can_score_prompts
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance

from convsim.lm_eval import (
    ConvsimLM,
    LogprobsUnsupported,
    UnscorableRequest,
    continuation_logprob,
    rolling_logprob,
)

SEED = 0

# -- the mock model, from its documentation -----------------------------------------

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


def tokens(text: str) -> list[str]:
    """The mock tokenizer: a word or one punctuation mark, with the whitespace before it."""
    return _TOKEN.findall(text)


def logprob(token: str, seed: int = SEED) -> float:
    """``-(1 + H % 800) / 100``, H the first 4 bytes of sha256(f"{seed}:{token}")."""
    digest = hashlib.sha256(f"{seed}:{token}".encode()).digest()
    return -(1 + int.from_bytes(digest[:4], "big") % 800) / 100


def greedy(token: str, seed: int = SEED) -> bool:
    """The mock model's top choice is the token itself where its logprob >= -2."""
    return logprob(token, seed) >= -2.0


def expected(continuation_tokens: Sequence[str], seed: int = SEED) -> tuple[float, bool]:
    return (
        sum(logprob(t, seed) for t in continuation_tokens),
        all(greedy(t, seed) for t in continuation_tokens),
    )


# -- fixtures -----------------------------------------------------------------------


@pytest.fixture()
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


def serve(portal: BlockingPortal, **config: Any) -> Any:
    return portal.wrap_async_context_manager(MockModelServer(MockServerConfig(**config)))


def scoring_lm(server: MockModelServer, **kwargs: Any) -> ConvsimLM:
    return ConvsimLM(
        model="openai-compatible:mock-model",
        base_url=server.base_url,
        endpoint="completions",
        **kwargs,
    )


def ll_requests(pairs: Sequence[tuple[str, str]]) -> list[Instance]:
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


def rolling_requests(texts: Sequence[str]) -> list[Instance]:
    return [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# -- ConvsimLM against the mock server ------------------------------------------------


def test_loglikelihood_sums_the_continuation_tokens(portal: BlockingPortal) -> None:
    context = "Question: Which is it?\nAnswer:"
    # " four six" is greedy throughout; " four Paris" is not (" Paris" is not the top)
    continuations = [" four six", " four Paris", " yes", " London"]
    assert greedy(" four") and greedy(" six") and greedy(" yes")
    assert not greedy(" Paris") and not greedy(" London")
    with serve(portal) as server:
        lm = scoring_lm(server)
        results = lm.loglikelihood(ll_requests([(context, c) for c in continuations]))
        stats = server.statistics()
    assert results == [pytest.approx(expected(tokens(c))) for c in continuations]
    assert [r[1] for r in results] == [True, False, True, False]
    assert results[0][0] == pytest.approx(logprob(" four") + logprob(" six"))
    assert lm.failures == []
    assert stats.by_endpoint["/v1/completions"] == len(continuations)
    # one echo call each: the server's usage counted (prompt words + one generated token)
    words = len(context.split())
    assert lm.usage.prompt_tokens == sum(words + len(c.split()) for c in continuations)
    assert lm.usage.completion_tokens == len(continuations)


def test_boundary_between_context_and_continuation(portal: BlockingPortal) -> None:
    cases = [
        # (context, continuation, the continuation's tokens as scored)
        ("Answer:", " Paris", [" Paris"]),  # a clean boundary
        ("Answer: ", "Paris", [" Paris"]),  # " Paris" straddles; it alone holds "Paris"
        ("Answer: Par", "is", [" Paris"]),  # inside one token: that token
        ("Answer: Par", "is four", [" four"]),  # straddling token stays with the context
        ("Answer:", "", []),  # nothing to score: log 1 = 0
    ]
    with serve(portal) as server:
        lm = scoring_lm(server)
        results = lm.loglikelihood(ll_requests([(c, k) for c, k, _ in cases]))
    for (context, continuation, scored), result in zip(cases, results, strict=True):
        assert result == pytest.approx(expected(scored)), (context, continuation)
    assert results[-1] == (0.0, True)
    assert lm.failures == []


def test_loglikelihood_rolling_leaves_out_the_first_token(portal: BlockingPortal) -> None:
    texts = [
        "The cat sat on the mat.",
        "Answer: Paris",
        "one",  # a single token: nothing has a context
        "Trailing space ",
    ]
    with serve(portal) as server:
        lm = scoring_lm(server)
        results = lm.loglikelihood_rolling(rolling_requests(texts))
    assert results == [pytest.approx(sum(logprob(t) for t in tokens(text)[1:])) for text in texts]
    assert results[2] == 0.0
    assert len(tokens(texts[3])) == 3  # "Trailing", " space", " "
    assert all(r < 0 for r in results[:2])


def test_many_requests_run_concurrently_in_order(portal: BlockingPortal) -> None:
    in_flight = 0
    most = 0
    overlapped = anyio.Event()

    async def sleep(seconds: float) -> None:  # the server's time to first token
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        if in_flight == 2:
            overlapped.set()
        # The first request is held until a second one arrives: a client that sends one
        # request at a time never releases it (the global test timeout then fails the test).
        await overlapped.wait()
        in_flight -= 1

    words = ["four", "six", "Paris", "Rome", "dog", "cat", "sea", "sky"]
    pairs = [(f"Item {i}:", f" {words[i % 8]} {words[(i * 3) % 8]}") for i in range(120)]
    server_cm = portal.wrap_async_context_manager(
        MockModelServer(MockServerConfig(ttft_ms=5), sleep=sleep)
    )
    with server_cm as server:
        lm = scoring_lm(server, concurrency=12)
        results = lm.loglikelihood(ll_requests(pairs))
        stats = server.statistics()
    assert results == [pytest.approx(expected(tokens(k))) for _, k in pairs]
    assert stats.by_endpoint["/v1/completions"] == len(pairs)
    assert 1 < most <= 12  # concurrent, and never past the concurrency asked for


def test_a_failed_request_is_recorded_and_the_others_scored(portal: BlockingPortal) -> None:
    # without retries, each injected malformed answer fails its request
    pairs = [(f"Question {i}:", " four six") for i in range(30)]
    with (
        serve(portal, fault_rate=0.3, faults={"malformed": 1.0}, seed=3) as server,
        structlog.testing.capture_logs() as logs,
    ):
        lm = scoring_lm(server, concurrency=4, max_retries=0)
        results = lm.loglikelihood(ll_requests(pairs))
        texts = [f"Some text {i} here" for i in range(10)]
        rolling = lm.loglikelihood_rolling(rolling_requests(texts))
        stats = server.statistics()
    failed = {f.index for f in lm.failures if f.request_type == "loglikelihood"}
    failed_rolling = {f.index for f in lm.failures if f.request_type == "loglikelihood_rolling"}
    assert len(failed) + len(failed_rolling) == stats.faults_injected["malformed"]
    assert 0 < len(failed) < len(pairs)
    assert {f.error_type for f in lm.failures} == {"MalformedResponse"}
    for index, result in enumerate(results):
        if index in failed:
            assert result == (-math.inf, False)  # never the chosen answer
        else:
            assert result == pytest.approx(expected(tokens(" four six"), seed=3))
    for index, (text, value) in enumerate(zip(texts, rolling, strict=True)):
        if index in failed_rolling:
            assert value == -math.inf
        else:
            assert value == pytest.approx(sum(logprob(t, 3) for t in tokens(text)[1:]))
    (reported, _) = [e for e in logs if e["event"] == "lm_eval.requests_failed"]
    assert reported["request_type"] == "loglikelihood" and reported["log_level"] == "warning"
    assert reported["failed"] == len(failed) and reported["total"] == 30
    assert "-inf" in reported["scored_as"] and "MalformedResponse" in reported["first_error"]


def test_an_empty_context_fails_that_request_only(portal: BlockingPortal) -> None:
    with serve(portal) as server:
        lm = scoring_lm(server)
        results = lm.loglikelihood(ll_requests([("", "Paris"), ("Answer:", " yes")]))
    assert results[0] == (-math.inf, False)
    assert results[1] == pytest.approx(expected([" yes"]))
    [failure] = lm.failures
    assert failure.index == 0 and failure.error_type == "UnscorableRequest"
    assert "non-empty context" in failure.message


def test_failures_stay_out_of_the_cache(portal: BlockingPortal) -> None:
    cached: list[tuple[str, Any, Any]] = []

    class Hook:
        def add_partial(self, attr: str, req: Any, res: Any) -> None:
            cached.append((attr, req, res))

    with serve(portal) as server:
        lm = scoring_lm(server)
        lm.set_cache_hook(Hook())
        lm.loglikelihood(ll_requests([("", "x"), ("Answer:", " yes")]))
        lm.loglikelihood_rolling(rolling_requests(["Answer: yes"]))
    assert cached == [
        ("loglikelihood", ("Answer:", " yes"), pytest.approx(expected([" yes"]))),
        ("loglikelihood_rolling", ("Answer: yes",), pytest.approx(logprob(":") + logprob(" yes"))),
    ]


def test_chat_template_contexts_are_scored_as_rendered_text(portal: BlockingPortal) -> None:
    with serve(portal) as server:
        lm = scoring_lm(server)
        context = lm.apply_chat_template(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
        )
        [result] = lm.loglikelihood(ll_requests([(context, " yes")]))
    # rendered as the completions endpoint renders messages: "...\n\nAssistant:" + " yes"
    assert result == pytest.approx(expected([" yes"]))
    assert lm._prompt_text(context) == "System: Be brief.\n\nUser: Hi.\n\nAssistant:"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"model": "scripted"}, "the scripted adapter returns no prompt logprobs"),
        (
            {"model": "openai-compatible:m", "base_url": "http://127.0.0.1:9/v1"},
            "openai-compatible:m uses endpoint=chat",
        ),
        (
            {"model": "openai:gpt-4o-mini", "api_key": "sk-test", "endpoint": "completions"},
            "api.openai.com returns no logprobs",
        ),
    ],
)
def test_adapters_without_prompt_logprobs_refuse_at_once(
    kwargs: dict[str, str], named: str
) -> None:
    lm = ConvsimLM(**kwargs)
    for method, requests in [
        (lm.loglikelihood, ll_requests([("Answer:", " yes")])),
        (lm.loglikelihood_rolling, rolling_requests(["Answer: yes"])),
    ]:
        with pytest.raises(LogprobsUnsupported) as caught:
            method(requests)
        message = str(caught.value)
        assert named in message
        assert "endpoint=completions" in message and "echo with logprobs" in message
        assert method.__name__ in message
        assert isinstance(caught.value, ConvsimError)
        assert isinstance(caught.value, NotImplementedError)  # what lm-eval expects
    assert lm.failures == [] and lm.usage.total_tokens == 0


def test_simple_evaluate_multiple_choice_and_perplexity(
    tmp_path: Path, offline: None, portal: BlockingPortal
) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from convsim.lm_eval import register_lm_eval_model

    questions = ["Pick one", "Choose well", "Which fits", "Say it", "Go on", "Last one"]
    choices = [["four six", "Paris", "red sea"], ["Rome", "dog"], ["cat sky", "three"]] * 2
    docs = []
    predicted = []
    for i, (question, options) in enumerate(zip(questions, choices, strict=True)):
        # the task's continuation is " " + choice; the mock ignores the context
        scores = [expected(tokens(" " + option))[0] for option in options]
        best = max(range(len(options)), key=scores.__getitem__)
        predicted.append(best)
        label = best if i % 3 else (best + 1) % len(options)  # 4 of 6 right
        docs.append({"question": question, "choices": options, "label": label})
    accuracy = sum(d["label"] == p for d, p in zip(docs, predicted, strict=True)) / len(docs)
    assert accuracy == pytest.approx(4 / 6)
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "tiny_mc.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: tiny_mc
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {data}
            test_split: test
            output_type: multiple_choice
            doc_to_text: "{{{{question}}}}\\nAnswer:"
            doc_to_choice: "{{{{choices}}}}"
            doc_to_target: label
            metric_list:
              - metric: acc
                aggregation: mean
                higher_is_better: true
            """
        ),
        encoding="utf-8",
    )
    pages = ["The cat sat on the mat.", "Rome is far, Paris is near."]
    pages_file = tmp_path / "pages.jsonl"
    pages_file.write_text("".join(json.dumps({"page": p}) + "\n" for p in pages), "utf-8")
    (tmp_path / "tiny_ppl.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: tiny_ppl
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {pages_file}
            test_split: test
            output_type: loglikelihood_rolling
            doc_to_text: ""
            doc_to_target: "{{{{page}}}}"
            metric_list:
              - metric: word_perplexity
            """
        ),
        encoding="utf-8",
    )
    register_lm_eval_model()
    with serve(portal) as server:
        results = simple_evaluate(
            model="convsim",
            model_args=(
                f"model=openai-compatible:mock-model,base_url={server.base_url},"
                "endpoint=completions,concurrency=4"
            ),
            tasks=["tiny_mc", "tiny_ppl"],
            task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        )
    assert results is not None
    assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(accuracy)
    total = sum(sum(logprob(t) for t in tokens(p)[1:]) for p in pages)
    words = sum(len(re.split(r"\s+", p)) for p in pages)
    perplexity = results["results"]["tiny_ppl"]["word_perplexity,none"]
    assert perplexity == pytest.approx(math.exp(-total / words))


# -- the adapter's prompt_logprobs ----------------------------------------------------


async def _recording_adapter(
    respond: Any, seen: list[Mapping[str, Any]], **config: Any
) -> OpenAICompatibleAdapter:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, **json.loads(request.content)})
        status, body = respond(json.loads(request.content))
        return httpx.Response(status, json=body)

    async def no_wait(seconds: float) -> None:
        return None

    return OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1", "endpoint": "completions", **config},
        transport=HttpxTransport(transport=httpx.MockTransport(handler)),
        env={},
        sleep=no_wait,
    )


def _echo_answer(prompt: str, logprobs: Any) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "text": prompt + " ok", "logprobs": logprobs}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


@pytest.mark.anyio
async def test_prompt_logprobs_wire_format_and_generated_token_dropped() -> None:
    seen: list[Mapping[str, Any]] = []
    prompt = "Answer: yes"
    logprobs = {
        "tokens": ["Answer", ":", " yes", " ok"],
        "token_logprobs": [None, -1.5, -0.25, -0.1],
        "top_logprobs": [None, {":": -1.5}, {" no": -0.2}, {" ok": -0.1}],
        "text_offset": [0, 6, 7, 11],
    }
    adapter = await _recording_adapter(
        lambda body: (200, _echo_answer(body["prompt"], logprobs)), seen, stream="true"
    )
    try:
        assert isinstance(adapter, PromptScorer) and can_score_prompts(adapter)
        scored = await adapter.prompt_logprobs(prompt)
    finally:
        await adapter.aclose()
    assert seen == [
        {
            "path": "/v1/completions",
            "model": "m",
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 1,
            "echo": True,
        }
    ]  # not streamed although the adapter streams its generations
    assert scored == PromptLogprobs(
        tokens=("Answer", ":", " yes"),
        token_logprobs=(None, -1.5, -0.25),
        text_offset=(0, 6, 7),
        top_logprobs=(None, {":": -1.5}, {" no": -0.2}),
        usage=scored.usage,
        attempts=1,
    )
    assert scored.usage.total_tokens == 4 and not scored.usage.estimated
    assert continuation_logprob(scored, "Answer:", " yes") == (-0.25, False)
    assert rolling_logprob(scored) == -1.75


@pytest.mark.anyio
async def test_prompt_logprobs_retries_like_any_call() -> None:
    seen: list[Mapping[str, Any]] = []
    logprobs = {"tokens": ["a", " b"], "token_logprobs": [None, -1.0], "text_offset": [0, 1]}

    def respond(body: Mapping[str, Any]) -> tuple[int, Any]:
        if len(seen) < 3:
            return 503, {"error": {"message": "busy"}}
        return 200, _echo_answer(body["prompt"], logprobs)

    adapter = await _recording_adapter(respond, seen)
    try:
        scored = await adapter.prompt_logprobs("a b")
    finally:
        await adapter.aclose()
    assert scored.attempts == 3 and len(seen) == 3
    assert scored.top_logprobs is None  # none given: kept apart from an empty answer
    with pytest.raises(UnscorableRequest, match="no top logprobs"):
        continuation_logprob(scored, "a", " b")


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ({"text": "Answer: yes ok", "logprobs": None}, "without logprobs"),
        ({"text": " ok", "logprobs": {"tokens": [" ok"]}}, "did not echo the prompt"),
        (
            {
                "text": "Answer: yes ok",
                "logprobs": {"tokens": ["Answer"], "token_logprobs": [None], "text_offset": []},
            },
            "text_offset is not a list of 1",
        ),
    ],
)
@pytest.mark.anyio
async def test_a_server_without_echo_logprobs_is_a_clear_protocol_error(
    choice: dict[str, Any], message: str
) -> None:
    seen: list[Mapping[str, Any]] = []
    adapter = await _recording_adapter(
        lambda body: (200, {"choices": [{"index": 0, **choice}]}),
        seen,
        api_key="sk-never-shown",
    )
    try:
        with pytest.raises(ProtocolError, match=message) as caught:
            await adapter.prompt_logprobs("Answer: yes")
    finally:
        await adapter.aclose()
    assert len(seen) == 1  # a protocol error is not retried
    assert "sk-never-shown" not in str(caught.value)


@pytest.mark.anyio
async def test_prompt_logprobs_against_the_mock_server() -> None:
    async with MockModelServer(MockServerConfig(api_key="sk-mock-key")) as server:
        adapter = OpenAICompatibleAdapter(
            {
                "model": "mock-model",
                "base_url": server.base_url,
                "endpoint": "completions",
                "api_key": "sk-mock-key",
            }
        )
        wrong = OpenAICompatibleAdapter(
            {
                "model": "mock-model",
                "base_url": server.base_url,
                "endpoint": "completions",
                "api_key": "sk-wrong-key",
            }
        )
        try:
            scored = await adapter.prompt_logprobs("Question: Which? Answer: four")
            with pytest.raises(AuthError) as caught:
                await wrong.prompt_logprobs("Answer: four")
        finally:
            await adapter.aclose()
            await wrong.aclose()
    assert list(scored.tokens) == tokens("Question: Which? Answer: four")
    assert scored.token_logprobs == (None, *(logprob(t) for t in scored.tokens[1:]))
    assert "sk-wrong-key" not in str(caught.value)


@pytest.mark.anyio
async def test_adapters_that_cannot_score_say_so() -> None:
    chat = OpenAICompatibleAdapter({"model": "m", "base_url": "http://127.0.0.1:9/v1"})
    official = OpenAIAdapter(
        {"model": "gpt-4o-mini", "endpoint": "completions"}, env={"OPENAI_API_KEY": "k"}
    )
    try:
        assert not can_score_prompts(ScriptedAdapter())
        assert not can_score_prompts(chat) and not can_score_prompts(official)
        with pytest.raises(ConfigError, match=r"endpoint=chat.*endpoint=completions"):
            await chat.prompt_logprobs("Answer: yes")
        with pytest.raises(ConfigError, match=r"api\.openai\.com"):
            await official.prompt_logprobs("Answer: yes")
    finally:
        await chat.aclose()
        await official.aclose()
