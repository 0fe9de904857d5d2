"""Tracing through OpenTelemetry (the SDK's in-memory exporter and reader) and the request
ids recorded on every call: nesting, failures, retries, tools, cancellation, load runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from test_agent_turns import CANCEL, WAIT, ToolModel, actor, conversation
from test_http_adapters import Reply, Seam, api_error, chat_reply, sequence

from convsim import ConfigError, ConversationResult, OpenTelemetry, RequestIds, Simulator, Status
from convsim._records import TurnRecord, TurnStatus
from convsim.adapters import GenerationParams, Message
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer
from convsim.load import LoadShape, SyntheticSessions, drive, parse_synthetic
from convsim.load._requests_file import write_requests

pytestmark = pytest.mark.anyio


class Started(SpanProcessor):
    """Counts spans started and ended: every span started must end."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


class Traced:
    """An OpenTelemetry on in-memory providers, and what it recorded."""

    def __init__(self) -> None:
        self.spans_out = InMemorySpanExporter()
        self.counts = Started()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        provider.add_span_processor(self.counts)
        self.reader = InMemoryMetricReader()
        self.telemetry = OpenTelemetry(provider, MeterProvider(metric_readers=[self.reader]))

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.spans_out.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        assert parent.context is not None
        return [
            s
            for s in self.spans(name)
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        ]

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: list(metric.data.data_points)
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }


@pytest.fixture
def traced() -> Traced:
    return Traced()


@pytest.fixture
def seam_http() -> Iterator[Seam]:
    yield Seam("httpx")


async def run_all(sim: Simulator, pack: Any, **kwargs: Any) -> list[ConversationResult]:
    return [r async for r in sim.run(pack, **kwargs)]


# -- a run against the mock server ----------------------------------------------------


async def test_one_trace_per_conversation_with_turns_calls_and_request_ids(
    traced: Traced,
) -> None:
    async with (
        MockModelServer() as server,
        Simulator(
            "openai-compatible:mock-model",
            model_args={"base_url": server.base_url, "request_id_header": "x-request-id"},
            concurrency=2,
            tracing=traced.telemetry,
        ) as sim,
    ):
        results = await run_all(sim, "customer_support", limit=2)
    conversations = traced.spans("convsim.conversation")
    assert len(conversations) == 2
    assert len({c.context.trace_id for c in conversations if c.context}) == 2  # a trace each
    for result in results:
        (root,) = [
            c
            for c in conversations
            if c.attributes and c.attributes["convsim.conversation_id"] == result.conversation_id
        ]
        assert root.parent is None
        attributes = dict(root.attributes or {})
        assert attributes["convsim.run_id"] == result.run_id
        assert attributes["convsim.scenario_id"] == result.scenario_id
        assert attributes["convsim.status"] == "DONE"
        turns = traced.children(root, "convsim.turn")
        ran = [t for t in result.turns if t.status is TurnStatus.COMPLETED]
        assert len(turns) == len(ran) > 1
        for span, record in zip(
            sorted(turns, key=lambda s: (s.attributes or {})["convsim.turn_index"]),
            ran,
            strict=True,
        ):
            assert (span.attributes or {})["convsim.turn_id"] == record.turn_id
            (call,) = traced.children(span, "chat mock-model")
            (attempt,) = traced.children(call, "POST")
            (ids,) = record.request_ids
            # the id sent came back from the server (the mock echoes x-request-id)
            assert ids.sent is not None and ids.server == ids.sent
            assert ids.response is not None and ids.response.startswith("chatcmpl-")
            call_attributes = dict(call.attributes or {})
            assert call_attributes["gen_ai.request.model"] == "mock-model"
            assert call_attributes["gen_ai.response.id"] == ids.response
            assert call_attributes["convsim.request_id"] == ids.sent
            assert record.usage is not None
            assert call_attributes["gen_ai.usage.input_tokens"] == record.usage.prompt_tokens
            assert call_attributes["gen_ai.usage.output_tokens"] == record.usage.completion_tokens
            assert (attempt.attributes or {})["convsim.request_id.server"] == ids.sent
            assert (attempt.attributes or {})["http.response.status_code"] == 200
            assert f"sent:{ids.sent}" in (span.attributes or {})["convsim.request_ids"]
        (score,) = traced.children(root, "convsim.score")
        assert (score.attributes or {})["convsim.score.goal_achievement"] == (
            result.scores["goal_achievement"].value
        )
    assert traced.counts.started == traced.counts.ended
    metrics = traced.metrics()
    calls = sum(len(r.turns) for r in results)
    (requests,) = metrics["convsim.client.requests"]
    assert 0 < requests.value <= calls
    assert {p.attributes["gen_ai.token.type"] for p in metrics["convsim.client.tokens"]} == {
        "input",
        "output",
    }
    (duration,) = metrics["gen_ai.client.operation.duration"]
    assert duration.count == requests.value


async def test_the_trace_context_reaches_the_server(seam_http: Seam, traced: Traced) -> None:
    adapter = await seam_http.adapter(OpenAICompatibleAdapter, sequence(chat_reply("Hi.")))
    async with Simulator(adapter, tracing=traced.telemetry, preflight=False) as sim:
        await run_all(sim, "customer_support", limit=1)
    (attempt, *_) = traced.spans("POST")
    sent = seam_http.seen[0].headers["traceparent"]
    assert attempt.context is not None
    assert sent.split("-")[1:3] == [
        f"{attempt.context.trace_id:032x}",
        f"{attempt.context.span_id:016x}",
    ]


# -- failures and retries -----------------------------------------------------------


async def test_a_retried_call_shows_each_attempt_and_keeps_every_id(
    seam_http: Seam, traced: Traced
) -> None:
    failing = api_error(500, "try later", headers={"x-request-id": "r1"})
    answer = Reply(
        body={**chat_reply("Recovered.").body, "id": "chatcmpl-2"}, headers={"x-request-id": "r2"}
    )
    adapter = await seam_http.adapter(OpenAICompatibleAdapter, sequence(failing, answer))
    async with Simulator(adapter, tracing=traced.telemetry, preflight=False) as sim:
        (result,) = await run_all(sim, "customer_support", limit=1)
    first = result.turns[0]
    assert first.request_ids == (
        RequestIds(server="r1"),
        RequestIds(server="r2", response="chatcmpl-2"),
    )
    (call, *_) = sorted(traced.spans("chat m"), key=lambda s: s.start_time or 0)
    assert (call.attributes or {})["convsim.attempts"] == 2
    assert call.status.status_code is StatusCode.UNSET  # the call succeeded in the end
    attempts = sorted(traced.children(call, "POST"), key=lambda s: s.start_time or 0)
    assert [(a.attributes or {})["http.response.status_code"] for a in attempts] == [500, 200]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert "http.request.resend_count" not in (attempts[0].attributes or {})
    assert (attempts[1].attributes or {})["http.request.resend_count"] == 1


async def test_a_failing_call_marks_its_spans_with_the_cause(
    seam_http: Seam, traced: Traced
) -> None:
    refusal = api_error(400, "bad request body", headers={"x-request-id": "bad-1"})
    adapter = await seam_http.adapter(OpenAICompatibleAdapter, sequence(refusal))
    async with Simulator(adapter, tracing=traced.telemetry, preflight=False) as sim:
        (result,) = await run_all(sim, "customer_support", limit=1)
    assert result.status is Status.FAILED
    failed = result.turns[0]
    assert failed.status is TurnStatus.FAILED
    assert failed.request_ids == (RequestIds(server="bad-1"),)  # the failing call's id
    (call,) = traced.spans("chat m")
    assert call.status.status_code is StatusCode.ERROR
    assert "BadRequest" in (call.status.description or "")
    assert "bad request body" in (call.status.description or "")
    assert (call.attributes or {})["error.type"] == "BadRequest"
    assert (call.attributes or {})["convsim.request_ids"] == ("server:bad-1",)
    (turn,) = traced.spans("convsim.turn")
    assert turn.status.status_code is StatusCode.ERROR
    (root,) = traced.spans("convsim.conversation")
    assert root.status.status_code is StatusCode.ERROR
    assert "FAILED" in (root.status.description or "")
    (requests,) = traced.metrics()["convsim.client.requests"]
    assert requests.attributes["error.type"] == "BadRequest"


async def test_a_key_in_the_url_never_reaches_a_span(traced: Traced) -> None:
    """A transport's error names the URL before the adapter scrubs it: spans mask it."""
    import asyncio

    from convsim import ServerError
    from convsim._telemetry import using_telemetry

    secret = "sk-proj-SECRETSECRET1234567890abcd"

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": f"http://127.0.0.1:{port}/v1?key={secret}", "max_retries": 0}
    )
    try:
        with using_telemetry(traced.telemetry), pytest.raises(ServerError) as raised:
            await adapter.generate([Message(role="user", content="hi")], GenerationParams())
    finally:
        await adapter.aclose()
        server.close()
    assert secret not in str(raised.value)
    spans = traced.spans()
    assert {s.name for s in spans} >= {"POST"}
    for span in spans:
        shown = json.dumps(
            [dict(span.attributes or {}), span.status.description]
            + [dict(e.attributes or {}) for e in span.events],
            default=str,
        )
        assert secret not in shown, span.name
    (attempt,) = traced.spans("POST")
    assert "key=***" in (attempt.status.description or "")  # masked, not dropped


# -- tools and cancellation -----------------------------------------------------------


async def test_tool_calls_have_spans_of_their_own(tmp_path: Path, traced: Traced) -> None:
    model = ToolModel([[("cancel_order", {"order_id": "A-1"})], "Cancelled.", "Bye"])
    running = actor(conversation(tmp_path), model, telemetry=traced.telemetry)
    result = await running.run()
    assert result.status is Status.DONE
    (tool,) = traced.spans("execute_tool cancel_order")
    attributes = dict(tool.attributes or {})
    assert attributes["gen_ai.tool.call.id"] == result.turns[0].tool_calls[0].id
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    (turn, _second) = sorted(traced.spans("convsim.turn"), key=lambda s: s.start_time or 0)
    assert tool.parent is not None and turn.context is not None
    assert tool.parent.span_id == turn.context.span_id
    assert len(traced.children(turn, "chat tool-model")) == 2  # asked for the tool, answered


async def test_a_refused_tool_call_is_an_error_span(tmp_path: Path, traced: Traced) -> None:
    model = ToolModel([[("cancel_order", {"order_id": "A-2"})], "Could not.", "Bye"])
    await actor(conversation(tmp_path), model, telemetry=traced.telemetry).run()
    (tool,) = traced.spans("execute_tool cancel_order")
    assert tool.status.status_code is StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "precondition"


async def test_cancellation_ends_every_span(tmp_path: Path, traced: Traced) -> None:
    model = ToolModel([[("wait_forever", {})]])
    running = actor(conversation(tmp_path, CANCEL, WAIT), model, telemetry=traced.telemetry)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:

            async def cancel_once_blocked() -> None:
                while not model.calls:
                    await anyio.lowlevel.checkpoint()
                await anyio.wait_all_tasks_blocked()
                group.cancel_scope.cancel()

            group.start_soon(cancel_once_blocked)
            await running.run()
    assert running.result is not None and running.result.status is Status.CANCELLED
    assert traced.counts.started == traced.counts.ended > 0
    (tool,) = traced.spans("execute_tool wait_forever")
    assert (tool.attributes or {})["error.type"] == "cancelled"
    (root,) = traced.spans("convsim.conversation")
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["convsim.status"] == "CANCELLED"


# -- load runs ------------------------------------------------------------------------


async def test_a_load_run_traces_each_request_with_its_ids(tmp_path: Path, traced: Traced) -> None:
    async with MockModelServer() as server:
        adapter = OpenAICompatibleAdapter(
            {"model": "mock-model", "base_url": server.base_url, "request_id_header": "x-req"}
        )
        try:
            outcome = await drive(
                adapter,
                SyntheticSessions(parse_synthetic("turns=2,input_tokens=16,output_tokens=4")),
                LoadShape(concurrency=2, max_requests=6),
                telemetry=traced.telemetry,
            )
        finally:
            await adapter.aclose()
    records = outcome.records
    assert records and all(r.request_id is not None for r in records)
    assert all((r.response_id or "").startswith("chatcmpl-") for r in records)
    calls = traced.spans("chat mock-model")
    assert len(calls) == len(records)
    assert all(c.parent is None for c in calls)  # a trace per request
    sent = {(c.attributes or {})["convsim.request_id"] for c in calls}
    assert sent == {r.request_id for r in records}
    for call in calls:
        (attempt,) = traced.children(call, "POST")
        assert (attempt.attributes or {})["convsim.request_id.sent"] in sent
    path = tmp_path / "requests.jsonl"
    write_requests(path, [(0, r) for r in records])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {row["request_id"] for row in rows} == sent


async def test_without_tracing_a_load_run_still_records_the_ids() -> None:
    async with MockModelServer() as server:
        adapter = OpenAICompatibleAdapter({"model": "mock-model", "base_url": server.base_url})
        try:
            outcome = await drive(
                adapter,
                SyntheticSessions(parse_synthetic("turns=1,input_tokens=16,output_tokens=4")),
                LoadShape(concurrency=1, max_requests=2),
            )
        finally:
            await adapter.aclose()
    # no id sent, none echoed: the answer's own id is still kept
    assert all(r.request_id is None for r in outcome.records)
    assert all((r.response_id or "").startswith("chatcmpl-") for r in outcome.records)


# -- records, options, off by default ---------------------------------------------------


def test_a_results_line_without_ids_is_written_as_before() -> None:
    record = TurnRecord("c", 0, "t", "assistant", TurnStatus.COMPLETED, response="hi")
    with_ids = TurnRecord(
        "c", 0, "t", "assistant", TurnStatus.COMPLETED, response="hi",
        request_ids=(RequestIds(sent="a", response="chatcmpl-1"),),
    )  # fmt: skip
    base: dict[str, Any] = {
        "run_id": "r", "conversation_id": "c", "scenario_id": "s", "scenario_type": "x",
        "pack": "p", "pack_hash": "h", "model": "m", "seed": 0, "status": "DONE",
        "termination_reason": "completed", "transcript": [],
        "timings": {"started_at": 0, "finished_at": 1, "duration_s": 1},
    }  # fmt: skip
    plain = ConversationResult(**base, turns=(record,)).model_dump_json()
    assert '"schema_version":2' in plain and "request_ids" not in plain
    line = ConversationResult(**base, turns=(with_ids,)).model_dump_json()
    assert '"schema_version":6' in line
    assert '"request_ids":[{"sent":"a","response":"chatcmpl-1"}]' in line
    again = ConversationResult.model_validate_json(line)
    assert again.turns[0].request_ids == with_ids.request_ids


@pytest.mark.parametrize(
    ("name", "says"),
    [("Authorization", "needs for itself"), ("x request", "not an HTTP header name")],
)
def test_a_request_id_header_that_cannot_be_used_is_refused(name: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        OpenAICompatibleAdapter({"model": "m", "base_url": "http://x", "request_id_header": name})


async def test_tracing_is_off_by_default() -> None:
    async with Simulator("scripted") as sim:
        (result,) = await run_all(sim, "customer_support", limit=1)
    assert sim.telemetry is None
    assert all(not t.request_ids for t in result.turns)  # no HTTP, no ids


def test_otel_is_not_imported_unless_asked_for() -> None:
    code = (
        "import sys, anyio, convsim\n"
        "async def main():\n"
        "    async with convsim.Simulator('scripted') as sim:\n"
        "        [r async for r in sim.run('customer_support', limit=1)]\n"
        "anyio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'convsim._otel'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_the_extra_tracing_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from convsim import Simulator\n"
        "try:\n"
        "    Simulator('scripted', tracing=True)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'convsim[otel]'" in out.stdout


async def test_a_request_that_never_started_leaves_no_open_span(
    seam_http: Seam, traced: Traced
) -> None:
    adapter = await seam_http.adapter(OpenAICompatibleAdapter, sequence(chat_reply("Hi.")))
    from convsim._telemetry import using_telemetry

    with using_telemetry(traced.telemetry):
        await adapter.generate([Message(role="user", content="Hi")], GenerationParams())
    (attempt,) = traced.spans("POST")
    assert attempt.parent is None  # no call span around it here: the attempt alone
    assert traced.counts.started == traced.counts.ended == 1


def test_an_answer_replayed_from_the_cache_carries_no_ids(tmp_path: Path) -> None:
    from convsim.adapters import Completion, ResponseCache

    cache = ResponseCache(tmp_path / "cache")
    try:
        answered = Completion(text="Hi.", request_ids=(RequestIds(server="old-run"),))
        cache.store("k", answered)
        replayed = cache.lookup("k")
    finally:
        cache.close()
    assert replayed is not None and replayed.text == "Hi." and replayed.request_ids == ()
