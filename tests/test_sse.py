"""The one server-sent-events decoder, against the WHATWG specification's reading.

``by_the_spec`` is a plain transcription of "Interpreting an event stream" in the HTML
standard (section 9.2.6): decode the whole stream, split it into lines, process each
line's field. The decoder reads the same stream in pieces split at random points, and
must find the same events, the same last event ID and the same reconnection time.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
from _listeners import Listener
from hypothesis import given, settings
from hypothesis import strategies as st

from convsim import ResponseTooLarge
from convsim._sse import SSEDecoder, SSEEvent
from convsim.client import AsyncEvaluationClient, EvaluationClient

pytestmark = pytest.mark.anyio


class Reading(NamedTuple):
    events: list[SSEEvent]
    last_event_id: str
    retry: int | None


def by_the_spec(stream: bytes) -> Reading:
    """The events of a whole stream, step by step as the specification says."""
    text = stream.decode("utf-8", errors="replace")  # "UTF-8 decode": replacement on errors
    if text.startswith("\ufeff"):  # ... which drops one leading byte-order mark
        text = text[1:]
    # "end-of-line = ( cr lf / cr / lf )"; a last line with no end is never processed
    lines: list[str] = []
    current = ""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\r" or char == "\n":
            lines.append(current)
            current = ""
            if char == "\r" and text[i + 1 : i + 2] == "\n":
                i += 1
        else:
            current += char
        i += 1
    events: list[SSEEvent] = []
    data_buffer, type_buffer, id_buffer = "", "", ""
    last_event_id, retry = "", None
    for line in lines:
        if line == "":  # dispatch the event
            last_event_id = id_buffer
            if data_buffer == "":
                data_buffer, type_buffer = "", ""
                continue
            if data_buffer.endswith("\n"):
                data_buffer = data_buffer[:-1]
            events.append(SSEEvent(type_buffer or None, data_buffer, last_event_id))
            data_buffer, type_buffer = "", ""
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            field, value = line.split(":", 1)
            if value.startswith(" "):
                value = value[1:]
        else:
            field, value = line, ""
        if field == "event":
            type_buffer = value
        elif field == "data":
            data_buffer += value + "\n"
        elif field == "id":
            if "\0" not in value:
                id_buffer = value
        elif field == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)  # other values of retry are ignored
    return Reading(events, last_event_id, retry)


def read_in_pieces(stream: bytes, cuts: list[int], limit: int | None = None) -> Reading:
    decoder = SSEDecoder(max_event_bytes=limit)
    events: list[SSEEvent] = []
    position = 0
    for cut in sorted(cuts):
        events += decoder.feed(stream[position:cut])
        position = cut
    events += decoder.feed(stream[position:])
    events += decoder.flush()
    return Reading(events, decoder.last_event_id, decoder.retry)


_LINES = st.sampled_from(
    [
        b"data: x", b"data:y", b"data:  two spaces", b"data", b"data:", b'data: {"a": 1}',
        b"data: \xc3\xa9t\xc3\xa9", b"data: \xf0\x9f\x98\x80", b"data: \xff\xfe broken",
        b"data: \xf0\x9f", b"data : not data", b"DATA: not data", b"event: delta",
        b"event:done", b"event:", b"event", b": keep-alive", b":", b"id: 7", b"id:", b"id",
        b"id: a\x00b", b"retry: 10", b"retry:250", b"retry: 1x", b"retry:", b"retry: -1",
        b"retry: \xd9\xa3", b"other: field", b"", b"\xef\xbb\xbfdata: a mark inside",
    ]
)  # fmt: skip
_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """Lines of fields, comments and blanks with any line end; sometimes a byte-order
    mark first, sometimes a last line left open."""
    lines = draw(st.lists(st.tuples(_LINES, _ENDS), max_size=30))
    stream = b"".join(line + end for line, end in lines)
    if draw(st.booleans()):
        stream = b"\xef\xbb\xbf" + stream
    if draw(st.booleans()):
        stream += draw(_LINES)
    return stream


_BYTES = st.sampled_from(
    [b"d", b"a", b"t", b"data", b"id", b"event", b"retry", b":", b" ", b"\r", b"\n",
     b"\r\n", b"7", b"x", b"\x00", b"\xef\xbb\xbf", b"\xef", b"\xc3", b"\xff"]
)  # fmt: skip


@settings(deadline=None)  # a shared machine's pauses are not the decoder's
@given(stream=streams(), cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=40))
def test_any_split_of_a_stream_reads_as_the_specification_reads_it_whole(
    stream: bytes, cuts: list[int]
) -> None:
    cuts = [c for c in cuts if c <= len(stream)]
    assert read_in_pieces(stream, cuts) == by_the_spec(stream)
    assert read_in_pieces(stream, cuts, limit=1 << 20) == by_the_spec(stream)


@settings(deadline=None)
@given(
    pieces=st.lists(_BYTES, max_size=80),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=40),
)
def test_any_bytes_split_anywhere_read_as_the_specification_reads_them(
    pieces: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(pieces)
    cuts = [c for c in cuts if c <= len(stream)]
    assert read_in_pieces(stream, cuts) == by_the_spec(stream)


def test_a_bare_cr_ends_a_line() -> None:
    events = SSEDecoder().feed(b"data: a\r\rdata: b\r\r")
    assert [e.data for e in events] == ["a", "b"]


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"") == []  # an empty read changes nothing
    assert decoder.feed(b"\n") == []  # the LF of the CRLF: no blank line, no dispatch
    assert [e.data for e in decoder.feed(b"data: b\r")] == []
    assert [e.data for e in decoder.feed(b"\r")] == ["a\nb"]  # CR then CR: a blank line


def test_fields_as_the_specification_reads_them() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(
        b"id: 1\nevent: start\ndata\ndata:  x\n\n"  # 'data' alone: an empty value
        b"data: y\n\n"  # the id stays; the type does not
        b"id: bad\x00id\nretry: 1500\nretry: 2s\nevent:\ndata: z\n\n"
    )
    assert events == [
        SSEEvent("start", "\n x", "1"),
        SSEEvent(None, "y", "1"),
        SSEEvent(None, "z", "1"),  # an id with a NUL is ignored
    ]
    assert decoder.retry == 1500  # '2s' is not all digits: ignored
    assert decoder.last_event_id == "1"


def test_a_blank_line_without_data_dispatches_nothing_but_sets_the_last_id() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 9\nevent: ping\n\n") == []
    assert decoder.last_event_id == "9"
    assert decoder.feed(b"data: after\n\n") == [SSEEvent(None, "after", "9")]


def test_an_unfinished_event_is_discarded_at_the_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: complete\n\ndata: cut") == [SSEEvent(None, "complete")]
    assert decoder.feed(b" off\n") == []
    assert decoder.flush() == []


def test_a_line_or_an_event_past_the_limit_stops_reading() -> None:
    with pytest.raises(ResponseTooLarge, match="1024 bytes") as info:
        SSEDecoder(max_event_bytes=1024).feed(b"data: " + b"x" * 1100)
    assert info.value.setting == "max_event_bytes" and info.value.limit == 1024
    decoder = SSEDecoder(max_event_bytes=1024)
    decoder.feed(b"data: " + b"x" * 600 + b"\r")
    with pytest.raises(ResponseTooLarge):
        decoder.feed(b"data: " + b"x" * 600 + b"\r")


STREAM = (
    b"\xef\xbb\xbfdata: " + json.dumps({"conversation_id": "c1"}).encode() + b"\rid: 1\r\r"
    b"data: " + json.dumps({"conversation_id": "c2"}).encode() + b"\rid: 2\r\r"
    b"event: end\rdata: {}\r\r"
)


def _event_stream(request: bytes) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        f"Content-Length: {len(STREAM)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + STREAM


def test_the_client_reads_results_with_the_same_decoder() -> None:
    with Listener(_event_stream) as service, EvaluationClient(service.url, "key") as client:
        results = list(client.iter_results("ev1"))
    # a byte-order mark first, lines ended by CR: both results, then the end
    assert [r["conversation_id"] for r in results] == ["c1", "c2"]


async def test_the_async_client_reads_results_with_the_same_decoder() -> None:
    with Listener(_event_stream) as service:
        async with AsyncEvaluationClient(service.url, "key") as client:
            results = [r async for r in client.iter_results("ev1")]
    assert [r["conversation_id"] for r in results] == ["c1", "c2"]
