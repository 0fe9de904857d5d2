"""Answers that arrive broken: half an emoji, a 200 that is not the answer.

A lone UTF-16 surrogate (``"\\ud83d"`` escaped in JSON) or a pair split across two
stream events (as JavaScript gateways send them) is repaired or replaced, counted, and
the run goes on. A 200 with truncated or malformed JSON, the wrong shape, a proxy's HTML
page or an unparsable stream event is retried like a 5xx and, when retries run out,
booked as infrastructure.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner
from conftest import write_pack
from test_http_adapters import (
    HI,
    Reply,
    Seam,
    Seen,
    anthropic_stream,
    chat_chunk,
    chat_reply,
    chat_stream,
    data_lines,
    sequence,
)

import convsim
from convsim import MalformedResponse, ProtocolError, Status, TerminationReason
from convsim.adapters import GenerationParams
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._custom_http import CustomHttpAdapter
from convsim.adapters._http import HttpxTransport
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._text import StreamedText, repair_text
from convsim.cli import main

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http(anyio_backend: str) -> AsyncIterator[Seam]:
    """httpx.MockTransport: no sockets at all."""
    seam = Seam("httpx")
    yield seam
    await seam.aclose()


@pytest.fixture(params=["httpx", "aiohttp"])
async def seam(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[Seam]:
    """Both seams: MockTransport, and the default aiohttp client against a local server."""
    seam = Seam(request.param)
    yield seam
    await seam.aclose()


HIGH, LOW, GRIN = "\ud83d", "\ude00", "\U0001f600"
FFFD = "\ufffd"


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- the repair itself ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "repaired", "replaced"),
    [
        ("plain ascii", "plain ascii", 0),
        (f"ok {GRIN} é", f"ok {GRIN} é", 0),
        (f"half {HIGH} emoji", f"half {FFFD} emoji", 1),
        (f"{LOW} first", f"{FFFD} first", 1),
        (f"end {HIGH}", f"end {FFFD}", 1),
        (f"{HIGH}{LOW} joined", f"{GRIN} joined", 0),  # two halves as separate code points
        (f"{LOW}{HIGH}", FFFD * 2, 2),  # the wrong order pairs nothing
        (f"{HIGH}{HIGH}{LOW}", f"{FFFD}{GRIN}", 1),
    ],
)
def test_repair_text(text: str, repaired: str, replaced: int) -> None:
    assert repair_text(text) == (repaired, replaced)
    assert encodable(repair_text(text).text)


@pytest.mark.parametrize(
    ("pieces", "handed_on", "replaced"),
    [
        (["hi ", f"there {GRIN}"], ["hi ", f"there {GRIN}"], 0),
        ([f"hi {HIGH}", f"{LOW} there"], ["hi ", f"{GRIN} there"], 0),  # a split pair
        ([HIGH, LOW], ["", GRIN], 0),  # each half alone in its event
        ([f"hi {HIGH}", "there"], ["hi ", f"{FFFD}there"], 1),  # the other half never came
        ([f"a {LOW}", "b"], [f"a {FFFD}", "b"], 1),
        ([f"end {HIGH}"], ["end "], 1),  # the stream ends on a half: flush replaces it
    ],
)
def test_streamed_text_joins_halves_across_pieces(
    pieces: list[str], handed_on: list[str], replaced: int
) -> None:
    stream = StreamedText()
    assert [stream.feed(p) for p in pieces] == handed_on
    tail = stream.flush()
    assert tail == (FFFD if pieces[-1].endswith(HIGH) else "")
    assert stream.replaced == replaced
    assert stream.flush() == ""  # nothing twice


# -- every HTTP adapter hands back valid text ------------------------------------------


async def test_a_lone_surrogate_in_a_chat_answer_is_replaced(seam: Seam) -> None:
    adapter = await seam.adapter(OpenAICompatibleAdapter, sequence(chat_reply(f"half {HIGH}!")))
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == f"half {FFFD}!" and completion.replaced_chars == 1
    assert completion.attempts == 1


async def test_a_surrogate_encoded_as_raw_utf8_bytes_is_replaced(http: Seam) -> None:
    raw = b'{"choices": [{"message": {"content": "a\xed\xa0\xbd b"}}]}'  # UTF-8 of U+D83D
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(Reply(body=raw)))
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == f"a{FFFD} b" and completion.replaced_chars == 1


async def test_a_pair_split_across_chat_stream_events_is_joined(seam: Seam) -> None:
    adapter = await seam.adapter(
        OpenAICompatibleAdapter, sequence(chat_stream(f"hi {HIGH}", f"{LOW} there")), stream=True
    )
    pieces: list[str] = []
    completion = await adapter.stream(HI, GenerationParams(), pieces.append)
    assert completion.text == f"hi {GRIN} there" and completion.replaced_chars == 0
    assert "".join(pieces) == completion.text and all(encodable(p) for p in pieces)
    assert completion.timings.ttft_s is not None


async def test_a_stream_ending_on_half_an_emoji_replaces_it(http: Seam) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(chat_stream("bye ", HIGH)), stream=True
    )
    pieces: list[str] = []
    completion = await adapter.stream(HI, GenerationParams(), pieces.append)
    assert completion.text == f"bye {FFFD}" and completion.replaced_chars == 1
    assert pieces == ["bye ", FFFD]


async def test_legacy_completions_repair_too(http: Seam) -> None:
    answer = Reply(body={"choices": [{"text": f"x{HIGH}", "finish_reason": "stop"}]})
    split = Reply(
        chunks=data_lines(
            {"choices": [{"text": f"a{HIGH}"}]},
            {"choices": [{"text": f"{LOW}b", "finish_reason": "stop"}]},
        )
    )
    plain = await http.adapter(OpenAICompatibleAdapter, sequence(answer), endpoint="completions")
    streamed = await http.adapter(
        OpenAICompatibleAdapter, sequence(split), endpoint="completions", stream=True
    )
    assert (await plain.generate(HI, GenerationParams())).text == f"x{FFFD}"
    assert (await streamed.generate(HI, GenerationParams())).text == f"a{GRIN}b"


async def test_anthropic_answers_repair_too(http: Seam) -> None:
    answer = Reply(
        body={
            "type": "message",
            "content": [{"type": "text", "text": f"{HIGH} hi"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 2},
        }
    )
    plain = await http.adapter(AnthropicAdapter, sequence(answer), api_key="k")
    streamed = await http.adapter(
        AnthropicAdapter,
        sequence(anthropic_stream(f"a {HIGH}", f"{LOW} b")),
        api_key="k",
        stream=True,
    )
    completion = await plain.generate(HI, GenerationParams())
    assert completion.text == f"{FFFD} hi" and completion.replaced_chars == 1
    completion = await streamed.generate(HI, GenerationParams())
    assert completion.text == f"a {GRIN} b" and completion.replaced_chars == 0


async def test_the_custom_backend_repairs_too(http: Seam) -> None:
    answer = Reply(body={"choices": [{"text": f"{LOW}{HIGH}"}]})
    adapter = await http.adapter(CustomHttpAdapter, sequence(answer), base_url="http://c.test")
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == FFFD * 2 and completion.replaced_chars == 2


async def test_an_error_message_with_half_an_emoji_is_repaired(http: Seam) -> None:
    refusal = Reply(status=400, body={"error": {"message": f"bad {HIGH} input"}})
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(refusal))
    with pytest.raises(convsim.BadRequest) as info:
        await adapter.generate(HI, GenerationParams())
    assert f"bad {FFFD} input" in str(info.value) and encodable(str(info.value))


# -- a run through the CLI ---------------------------------------------------------------


async def half_emoji(request: web.Request) -> web.StreamResponse:
    """A chat answer with a lone surrogate, or (streaming) a pair split across events."""
    body = await request.json()
    if not body.get("stream"):
        return web.Response(
            body=b'{"choices":[{"message":{"content":"half \\ud83d emoji"},'
            b'"finish_reason":"stop"}]}',
            content_type="application/json",
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for content in (b"hi \\ud83d", b"\\ude00 there"):
        event = b'data: {"choices":[{"delta":{"content":"' + content + b'"}}]}\n\n'
        await response.write(event)
    await response.write(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


@asynccontextmanager
async def serving(handler: Any) -> AsyncIterator[str]:
    """``handler`` on 127.0.0.1 at /v1/chat/completions; yields the base URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


@pytest.fixture
def half_emoji_server() -> Iterator[str]:
    """The server runs in a thread of its own: the CLI wants the main thread."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serving(half_emoji)) as url,
    ):
        yield url


@pytest.mark.parametrize(
    ("stream", "answer"), [(False, f"half {FFFD} emoji"), (True, f"hi {GRIN} there")]
)
def test_convsim_run_records_every_conversation_despite_half_emoji(
    half_emoji_server: str, tmp_path: Path, stream: bool, answer: str
) -> None:
    turns = [{"turn_id": "t0", "prompt_template": "Hello {name}"}]
    scenarios = [
        {"scenario_id": f"s{i}", "scenario_description": "emoji", "variables": {"name": "A"}}
        for i in range(3)
    ]
    pack = write_pack(tmp_path / "pack", {"default": {"turns": turns}}, scenarios)
    out = tmp_path / "out.jsonl"
    args = ["run", str(pack), "--model", "openai-compatible:m", "--out", str(out)]
    args += ["--model-arg", f"base_url={half_emoji_server}", "--no-progress"]
    args += ["--model-arg", f"stream={str(stream).lower()}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3 and {r["status"] for r in rows} == {"DONE"}
    assert {r["transcript"][-1]["content"] for r in rows} == {answer}


# -- a 200 that is not the answer is an infrastructure fault, retried -----------------------

BROKEN_BODIES = {
    "truncated JSON": b'{"id": "x", "choices": [{"index": 0, "mess',
    "malformed JSON": b'{"choices": [}',
    "a proxy's HTML page": b"<html><body><h1>502 Bad Gateway</h1></body></html>",
    "an empty body": b"",
    "the wrong shape": b'{"object": "list", "data": []}',
    "text of the wrong type": b'{"choices": [{"message": {"content": 42}}]}',
    "a finish reason of the wrong type": (
        b'{"choices": [{"message": {"content": "hi"}, "finish_reason": 7}]}'
    ),
    "not UTF-8": b'{"choices": [{"message": {"content": "\xff\xfe"}}]}',
}


@pytest.mark.parametrize("body", BROKEN_BODIES.values(), ids=BROKEN_BODIES.keys())
async def test_a_broken_200_is_retried_and_then_answered(seam: Seam, body: bytes) -> None:
    adapter = await seam.adapter(
        OpenAICompatibleAdapter, sequence(Reply(body=body), chat_reply("fine"))
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "fine" and completion.attempts == 2 and len(seam.seen) == 2


@pytest.mark.parametrize("body", list(BROKEN_BODIES.values())[:4], ids=list(BROKEN_BODIES)[:4])
async def test_a_broken_200_every_time_is_an_infrastructure_failure(
    http: Seam, body: bytes
) -> None:
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(Reply(body=body)), max_retries=2)
    with pytest.raises(MalformedResponse) as info:
        await adapter.generate(HI, GenerationParams())
    error = info.value
    assert isinstance(error, ProtocolError) and error.infrastructure and error.retryable
    assert error.attempts == 3 and len(http.seen) == 3
    assert error.snippet == body.decode("utf-8", "replace")[:200]  # what came back, kept


async def test_an_unparsable_stream_event_is_retried(seam: Seam) -> None:
    broken = Reply(
        chunks=[b'data: {"choices": [{"delta": {"content": "oo\n\n', b"data: [DONE]\n\n"]
    )
    adapter = await seam.adapter(
        OpenAICompatibleAdapter, sequence(broken, chat_stream("fine")), stream=True
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "fine" and completion.attempts == 2


async def test_an_html_page_instead_of_a_stream_is_malformed_with_its_snippet(http: Seam) -> None:
    page = b"<html><body>Bad Gateway</body></html>\n"
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(Reply(chunks=[page])), stream=True, max_retries=1
    )
    with pytest.raises(MalformedResponse, match="no server-sent events") as info:
        await adapter.generate(HI, GenerationParams())
    assert info.value.snippet == page.decode() and info.value.attempts == 2


async def test_a_broken_event_after_delivered_text_is_final(http: Seam) -> None:
    broken = Reply(chunks=[*data_lines(chat_chunk("Hello"), done=False), b"data: {not json}\n\n"])
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(broken, chat_stream("never")), stream=True
    )
    pieces: list[str] = []
    with pytest.raises(MalformedResponse) as info:
        await adapter.stream(HI, GenerationParams(), pieces.append)
    assert pieces == ["Hello"]  # already with the caller: it cannot be taken back
    assert info.value.attempts == 1 and not info.value.retryable and len(http.seen) == 1
    assert info.value.snippet == "{not json}"


async def test_a_refused_request_is_still_not_retried(http: Seam) -> None:
    refusal = Reply(status=400, body={"error": {"message": "no"}})
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(refusal, chat_reply()))
    with pytest.raises(convsim.BadRequest):
        await adapter.generate(HI, GenerationParams())
    assert len(http.seen) == 1


async def run_pack(adapter: Any, tmp_path: Path, conversations: int = 6) -> list[Any]:
    turns = [{"turn_id": f"t{i}", "prompt_template": f"Turn {i} of {{name}}"} for i in range(2)]
    scenarios = [
        {"scenario_id": f"s{i}", "scenario_description": "faults", "variables": {"name": i}}
        for i in range(conversations)
    ]
    pack = write_pack(tmp_path / "pack", {"default": {"turns": turns}}, scenarios)
    async with convsim.Simulator(adapter, concurrency=3) as sim:
        return [r async for r in sim.run(str(pack))]


async def test_a_run_books_malformed_answers_as_infrastructure(http: Seam, tmp_path: Path) -> None:
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(Reply(body=b"<html>proxy</html>")), max_retries=1
    )
    results = await run_pack(adapter, tmp_path)
    assert {r.status for r in results} == {Status.FAILED}
    assert {r.termination_reason for r in results} == {TerminationReason.INFRASTRUCTURE_ERROR}
    error = results[0].error
    assert error is not None and error.type == "MalformedResponse"
    assert error.infrastructure and error.snippet == "<html>proxy</html>" and error.attempts == 2


async def test_a_run_retries_malformed_answers_to_success(http: Seam, tmp_path: Path) -> None:
    asked: set[str] = set()

    def broken_the_first_time(seen: Seen) -> Reply:
        request = json.dumps(seen.body["messages"])
        if request not in asked:
            asked.add(request)
            return Reply(body=b'{"choices": [{"mess')
        return chat_reply("fine")

    adapter = await http.adapter(OpenAICompatibleAdapter, broken_the_first_time)
    results = await run_pack(adapter, tmp_path)
    assert {r.status for r in results} == {Status.DONE}
    assert all(t.attempts == 2 for r in results for t in r.turns)


# -- JSON nested deeper than Python's parser goes, and counts that are not counts -------

DEEP = b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
"""An error body nested 100,000 deep: json.loads raises RecursionError on it."""


@pytest.mark.parametrize(
    ("status", "error", "retried"),
    [
        (500, convsim.ServerError, True),
        (429, convsim.RateLimited, True),
        (400, convsim.BadRequest, False),
        (401, convsim.AuthError, False),
    ],
)
async def test_a_deeply_nested_error_body_is_the_statuss_error(
    seam: Seam, status: int, error: type[Exception], retried: bool
) -> None:
    deep = Reply(status=status, body=DEEP, headers={"Retry-After": "0"})
    adapter = await seam.adapter(OpenAICompatibleAdapter, sequence(deep, chat_reply("fine")))
    if retried:
        completion = await adapter.generate(HI, GenerationParams())
        assert completion.text == "fine" and completion.attempts == 2
    else:
        with pytest.raises(error, match=f"{status} from "):
            await adapter.generate(HI, GenerationParams())
        assert len(seam.seen) == 1


async def test_a_deeply_nested_answer_or_event_is_malformed(http: Seam) -> None:
    adapter = await http.adapter(OpenAICompatibleAdapter, sequence(Reply(body=DEEP)), max_retries=0)
    with pytest.raises(MalformedResponse, match="unreadable response"):
        await adapter.generate(HI, GenerationParams())
    deep_event = Reply(chunks=[b"data: " + DEEP + b"\n\n", b"data: [DONE]\n\n"])
    streaming = await http.adapter(
        OpenAICompatibleAdapter, sequence(deep_event), stream=True, max_retries=0
    )
    with pytest.raises(MalformedResponse, match="unreadable stream event"):
        await streaming.generate(HI, GenerationParams())


async def test_a_deeply_nested_404_still_fails_the_check_before_a_run() -> None:
    def not_found(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, content=DEEP)

    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": "http://llm.test/v1"},
        transport=HttpxTransport(transport=httpx.MockTransport(not_found)),
        env={},
    )
    with pytest.raises(convsim.EndpointError, match=r"404 from http://llm\.test/v1/chat"):
        await adapter.preflight()
    await adapter.aclose()


BAD_COUNTS: dict[str, Any] = {
    "negative": {"prompt_tokens": -5, "completion_tokens": 3, "total_tokens": -2},
    "1e308": {"prompt_tokens": 1e308, "completion_tokens": 3, "total_tokens": 3},
    "above 10**9": {"prompt_tokens": 9, "completion_tokens": 10**12, "total_tokens": 9},
    "infinite": {"prompt_tokens": 9, "completion_tokens": "inf", "total_tokens": 9},
}


@pytest.mark.parametrize("usage", BAD_COUNTS.values(), ids=BAD_COUNTS.keys())
async def test_token_counts_that_are_not_counts_are_a_malformed_answer(
    http: Seam, usage: dict[str, Any]
) -> None:
    broken = chat_reply("counted")
    assert isinstance(broken.body, dict)
    broken = Reply(body={**broken.body, "usage": usage})
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(broken, chat_reply("fine")), max_retries=1
    )
    completion = await adapter.generate(HI, GenerationParams())
    assert completion.text == "fine" and completion.attempts == 2  # retried, like a 5xx
    assert 0 <= completion.usage.prompt_tokens < 100


@pytest.mark.parametrize("usage", BAD_COUNTS.values(), ids=BAD_COUNTS.keys())
async def test_streamed_token_counts_that_are_not_counts_are_malformed(
    http: Seam, usage: dict[str, Any]
) -> None:
    chunks = [
        chat_chunk("hi"),
        chat_chunk(finish="stop"),
        {**chat_chunk(), "choices": [], "usage": usage},
    ]
    adapter = await http.adapter(
        OpenAICompatibleAdapter, sequence(Reply(chunks=data_lines(*chunks))), stream=True,
        max_retries=0,
    )  # fmt: skip
    with pytest.raises(MalformedResponse, match="unreadable stream event"):
        await adapter.generate(HI, GenerationParams())


async def test_anthropic_token_counts_are_checked_too(http: Seam) -> None:
    answer = {
        "type": "message",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": -1, "output_tokens": 2},
    }
    adapter = await http.adapter(
        AnthropicAdapter, sequence(Reply(body=answer)), api_key="k", max_retries=0
    )
    with pytest.raises(MalformedResponse, match=r"usage\.prompt_tokens is -1, not a token count"):
        await adapter.generate(HI, GenerationParams())
