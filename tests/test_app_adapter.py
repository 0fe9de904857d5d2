"""Applications under test: ``--model python:module:function`` and ``convsim.app(fn)``
evaluated like a model (concurrency, deadlines, retries, usage, cancellation, resume)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from _rag_app import DOCUMENTS, answer, crowded
from click.testing import CliRunner
from conftest import clock, manual_clock, write_pack

import convsim
from convsim import (
    ConfigError,
    JsonlSink,
    ProtocolError,
    Simulator,
    Status,
    TerminationReason,
    TurnStatus,
    read_results,
)
from convsim.adapters import AppReply, GenerationParams, Message, create_adapter
from convsim.cli import main

QUESTIONS = {
    "france": "What is the capital of France?",
    "japan": "Which city is the capital of Japan?",
    "moon": "How far away is the moon?",
}


def qa_pack(folder: Path, questions: dict[str, str] = QUESTIONS, turns: int = 1) -> Path:
    """One conversation per question: the question, then ``turns - 1`` follow-ups."""
    asked = [{"turn_id": "ask", "prompt_template": "{question}"}]
    for n in range(1, turns):
        asked.append({"turn_id": f"more{n}", "prompt_template": f"Say more ({n})."})
    return write_pack(
        folder,
        {"default": {"turns": asked}},
        [
            {"scenario_id": key, "scenario_description": key, "variables": {"question": q}}
            for key, q in questions.items()
        ],
    )


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout + result.stderr


async def run_all(model: Any, pack: Path, **settings: Any) -> dict[str, convsim.ConversationResult]:
    async with Simulator(model, **settings) as sim:
        return {r.conversation_id: r async for r in sim.run(pack)}


class Sleeps:
    """A sleep that records instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await anyio.lowlevel.checkpoint()


# -- the command line ----------------------------------------------------------------


def test_a_rag_app_runs_through_convsim_run_64_at_once(tmp_path: Path) -> None:
    crowded.reset(64)
    out = tmp_path / "rag.jsonl"
    code, output = invoke(
        "run", "single_turn_qa", "--model", "python:_rag_app:crowded", "--trials", "3",
        "-c", "64", "--no-preflight", "-o", str(out),
    )  # fmt: skip
    assert code == 0, output
    results = read_results(out)
    assert len(results) == crowded.calls == 90
    assert crowded.peak == 64  # the run's concurrency, all of it, and never more
    assert {r.status for r in results} == {Status.DONE}
    france = next(r for r in results if r.conversation_id.startswith("geo_capital_france"))
    assert france.turns[-1].response == f'From "france": "{DOCUMENTS["france"]}"'
    assert france.model == "python:_rag_app:crowded"
    # the app counts no tokens: estimated, and the results say so
    assert all(r.usage is not None and r.usage.source == "estimate" for r in results)
    manifest = json.loads(out.with_name("rag.manifest.json").read_text())
    assert manifest["model"] == "python:_rag_app:crowded"
    assert "async def" not in out.with_name("rag.manifest.json").read_text()


def test_resume_asks_the_app_only_for_what_is_missing(tmp_path: Path) -> None:
    pack = str(qa_pack(tmp_path / "pack"))
    out = tmp_path / "r.jsonl"
    crowded.reset(1)
    assert invoke("run", pack, "--model", "python:_rag_app:crowded", "--limit", "1",
                  "-o", str(out))[0] == 0  # fmt: skip
    first = read_results(out)
    code, output = invoke(
        "run", pack, "--model", "python:_rag_app:crowded", "-o", str(out), "--resume"
    )
    assert code == 0, output
    assert crowded.calls == 3  # one, then the two missing
    results = read_results(out)
    assert sorted(r.conversation_id for r in results) == sorted(QUESTIONS)
    assert results[0] == first[0]


def test_convsim_load_measures_an_app_answering_whole(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    app = ("--model", "python:_rag_app:answer", "--pack", "single_turn_qa", "--repeat", "1")
    code, output = invoke("load", *app, "-c", "8", "--model-arg", "stream=false", "-o", str(out))
    assert code == 0, output
    report = json.loads(out.read_text())
    assert report["requests"]["completed"] == 30 and report["requests"]["failed"] == 0
    assert report["latency_ms"]["e2e"]["count"] == 30
    assert report["latency_ms"]["ttft"]["count"] == 0  # answered whole: no first token seen
    code, output = invoke("load", *app, "-c", "8", "-o", str(tmp_path / "streamed.json"))
    assert code == 2 and "give stream=false" in output


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        ("python", [], "needs the application: --model python:package.module:function"),
        ("python:no_such_module:fn", [], "there is no module 'no_such_module'"),
        ("python:_rag_app:nothing", [], "_rag_app has no nothing"),
        ("python:_rag_app:DOCUMENTS", [], "not a dict"),
        ("python:_rag_app", [], "expected python:package.module:function"),
        ("python:_rag_app:answer", ["--model-arg", "colour=red"], "colour"),
        ("python:_rag_app:answer", ["--model-arg", "concurrency=0"], "concurrency"),
        ("python:operator:setitem", [], "cannot be called as (messages, tools) or (messages)"),
    ],
)
def test_a_bad_application_exits_2_saying_why(
    tmp_path: Path, model: str, args: list[str], message: str
) -> None:
    code, output = invoke(
        "run", str(qa_pack(tmp_path / "pack")), "--model", model, *args,
        "-o", str(tmp_path / "r.jsonl"),
    )  # fmt: skip
    assert code == 2, output
    assert message in output
    assert "Traceback" not in output


# -- the Python API ------------------------------------------------------------------


@pytest.mark.anyio
async def test_convsim_app_evaluates_a_function_with_the_conversation(tmp_path: Path) -> None:
    seen: list[list[dict[str, Any]]] = []

    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        seen.append(messages)
        assert tools == []
        return f"reply {len(messages)}"

    results = await run_all(convsim.app(chat), qa_pack(tmp_path, {"france": "Hi?"}, turns=2))
    result = results["france"]
    assert [t.response for t in result.turns] == ["reply 1", "reply 3"]
    assert seen[1] == [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "reply 1"},
        {"role": "user", "content": "Say more (1)."},
    ]
    assert result.model.endswith(
        ":test_convsim_app_evaluates_a_function_with_the_conversation.<locals>.chat"
    )


@pytest.mark.anyio
async def test_a_sync_app_runs_in_a_worker_thread(tmp_path: Path) -> None:
    threads: list[int] = []

    def chat(messages: list[dict[str, Any]]) -> str:  # no tools parameter: called without
        threads.append(threading.get_ident())
        return "from a thread"

    results = await run_all(convsim.app(chat, name="python:mine:chat"), qa_pack(tmp_path))
    assert {r.turns[0].response for r in results.values()} == {"from a thread"}
    assert threading.get_ident() not in threads
    assert {r.model for r in results.values()} == {"python:mine:chat"}


@dataclasses.dataclass
class Turn:
    """A reply of the application's own shape (DeepEval's Turn has these fields)."""

    role: str
    content: str
    retrieval_context: list[str]


@pytest.mark.parametrize(
    ("reply", "text", "source"),
    [
        ("plain", "plain", "estimate"),
        (AppReply("typed", usage={"prompt_tokens": 7, "completion_tokens": 2}), "typed", "server"),
        ({"role": "assistant", "content": "openai shape"}, "openai shape", "estimate"),
        ({"text": "guide shape", "usage": {"total_tokens": 2}}, "guide shape", "server"),
        (Turn("assistant", "dataclass", ["doc"]), "dataclass", "estimate"),
    ],
)
@pytest.mark.anyio
async def test_a_reply_may_be_text_or_a_message_with_usage(
    reply: Any, text: str, source: str
) -> None:
    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return reply

    completion = await convsim.app(chat).generate(
        [Message(role="user", content="hello there")], GenerationParams()
    )
    assert completion.text == text
    assert completion.usage.source == source
    if isinstance(reply, AppReply):
        assert (completion.usage.prompt_tokens, completion.usage.total_tokens) == (7, 9)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (None, "it is a NoneType"),
        ({"answer": "x"}, "it has no content"),
        ({"content": 3}, "its content is int"),
        ({"content": "", "tool_calls": [{"name": "lookup"}]}, "this turn offers no tools"),
        ({"content": "x", "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens"),
    ],
)
@pytest.mark.anyio
async def test_an_unusable_reply_is_a_protocol_error_naming_the_app(
    reply: Any, message: str
) -> None:
    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return reply

    with pytest.raises(ProtocolError, match="unusable reply") as caught:
        await convsim.app(chat, name="python:m:chat").generate(
            [Message(role="user", content="q")], GenerationParams()
        )
    assert message in str(caught.value) and "python:m:chat" in str(caught.value)


def test_what_is_not_an_application_is_refused() -> None:
    with pytest.raises(ConfigError, match="not the class"):
        convsim.app(Turn)
    with pytest.raises(ConfigError, match="retry_on takes exception classes"):
        convsim.app(answer, retry_on=("TimeoutError",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="concurrency"):
        convsim.app(answer, concurrency=0)
    with pytest.raises(ConfigError, match="without python:"):
        create_adapter("python:convsim.adapters:ScriptedAdapter")


# -- errors, retries, deadlines, cancellation -------------------------------------------


class Busy(Exception):
    """The application's retryable error (its retriever is busy)."""


def flaky(failures: int, error: Callable[[], Exception]) -> Callable[..., Any]:
    """An app that raises ``error()`` on its first ``failures`` calls per question."""
    failed: dict[str, int] = {}

    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        question = messages[-1]["content"]
        if "France" in question and failed.get(question, 0) < failures:
            failed[question] = failed.get(question, 0) + 1
            raise error()
        return "answered"

    return chat


@pytest.mark.anyio
async def test_a_declared_retryable_error_is_retried(tmp_path: Path) -> None:
    sleeps = Sleeps()
    app = convsim.app(flaky(1, lambda: Busy("index busy")), retry_on=(Busy,), sleep=sleeps)
    results = await run_all(app, qa_pack(tmp_path))
    france = results["france"].turns[0]
    assert results["france"].status is Status.DONE and france.response == "answered"
    assert france.attempts == 2 and len(sleeps.waits) == 1
    assert {r.turns[0].attempts for k, r in results.items() if k != "france"} == {1}


@pytest.mark.anyio
async def test_retries_are_bounded_and_the_last_error_kept(tmp_path: Path) -> None:
    app = convsim.app(
        flaky(10, lambda: Busy("index busy")), retry_on=Busy, max_retries=2, sleep=Sleeps()
    )
    results = await run_all(app, qa_pack(tmp_path))
    error = results["france"].turns[0].error
    assert error is not None and error.attempts == 3
    assert error.type == "AdapterCodeError" and "Busy: index busy" in error.message


@pytest.mark.anyio
async def test_another_error_fails_the_turn_with_its_cause_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    sleeps = Sleeps()
    app = convsim.app(flaky(1, lambda: KeyError("embedding")), retry_on=(Busy,), sleep=sleeps)
    results = await run_all(app, qa_pack(tmp_path, turns=2))
    failed = results["france"]
    turn = failed.turns[0]
    assert turn.status is TurnStatus.FAILED and turn.error is not None
    assert turn.error.type == "AdapterCodeError" and turn.error.attempts == 1
    assert "raised KeyError: 'embedding'" in turn.error.message
    assert turn.error.side == "assistant" and not turn.error.infrastructure
    assert sleeps.waits == []
    assert results["japan"].status is Status.DONE and results["moon"].status is Status.DONE


@pytest.mark.anyio
async def test_a_convsim_error_from_the_app_counts_as_it_declares() -> None:
    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        raise convsim.RateLimited("the app's model said 429", retry_after=0)

    with pytest.raises(convsim.RateLimited) as caught:
        await convsim.app(chat, max_retries=1, sleep=Sleeps()).generate(
            [Message(role="user", content="q")], GenerationParams()
        )
    assert caught.value.attempts == 2


@manual_clock
@pytest.mark.anyio
async def test_a_slow_app_hits_the_conversation_timeout(tmp_path: Path) -> None:
    started, cancelled = anyio.Event(), anyio.Event()

    async def slow(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        if "France" not in messages[-1]["content"]:
            return "quick"
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    async with Simulator(convsim.app(slow), conversation_timeout=0.5) as sim:
        handle = sim.run(qa_pack(tmp_path))
        await started.wait()
        clock().advance(1)
        results = {r.conversation_id: r async for r in handle}
    assert cancelled.is_set()
    assert results["france"].status is Status.TIMED_OUT
    assert results["france"].termination_reason is TerminationReason.CONVERSATION_TIMEOUT
    assert results["japan"].status is Status.DONE


@pytest.mark.anyio
async def test_a_sync_app_past_its_timeout_is_abandoned() -> None:
    release, returned = threading.Event(), threading.Event()

    def stuck(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        release.wait(10)
        returned.set()
        return "too late"

    app = convsim.app(stuck, timeout=0.05, max_retries=0)
    try:
        with anyio.fail_after(5), pytest.raises(convsim.Timeout) as caught:
            await app.generate([Message(role="user", content="q")], GenerationParams())
        assert not returned.is_set()  # the call gave up on the thread, not the reverse
    finally:
        release.set()
    assert "timeout=0.05" in str(caught.value) and "its thread runs on" in str(caught.value)


@pytest.mark.anyio
async def test_cancelling_a_run_cancels_the_apps_calls(tmp_path: Path) -> None:
    entered: list[str] = []
    left: list[str] = []
    all_in = anyio.Event()

    async def waiting(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        entered.append(messages[-1]["content"])
        if len(entered) == len(QUESTIONS):
            all_in.set()
        try:
            await anyio.sleep_forever()
        finally:
            left.append(messages[-1]["content"])
        raise AssertionError("unreachable")

    out = tmp_path / "results.jsonl"
    tasks_before = asyncio.all_tasks()
    with anyio.fail_after(5):  # a hang guard
        with anyio.CancelScope() as caller:
            async with Simulator(convsim.app(waiting), grace_period=0) as sim:
                sim.run(qa_pack(tmp_path / "pack"), sink=JsonlSink(out))
                await all_in.wait()
                caller.cancel()
                await anyio.sleep_forever()
    assert caller.cancelled_caught
    assert asyncio.all_tasks() - tasks_before == set(), "tasks were left behind"
    assert sorted(left) == sorted(entered) == sorted(QUESTIONS.values())
    written = read_results(out)
    assert len(written) == 3 and {r.status for r in written} == {Status.CANCELLED}
    assert {r.turns[0].error.type for r in written if r.turns[0].error} == {"Cancelled"}


def test_an_app_in_the_current_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``convsim`` command's path starts at its own folder, not the current one."""
    (tmp_path / "my_cwd_app.py").write_text(
        "async def answer(messages, tools):\n    return 'from the current directory'\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_cwd_app", raising=False)
    adapter = create_adapter("python:my_cwd_app:answer")
    assert adapter.model_info().model_id == "python:my_cwd_app:answer"
    assert sys.path[-1] == str(tmp_path)  # after everything installed: it shadows nothing
    monkeypatch.delitem(sys.modules, "my_cwd_app")


def test_an_app_does_not_stream_and_says_how_to_load_test_it() -> None:
    with pytest.raises(ConfigError, match="give stream=false"):
        create_adapter("python:_rag_app:answer", {"stream": "true"})
    assert create_adapter("python:_rag_app:answer", {"stream": "false", "max_retries": "0"})
