"""Server-sent events, read as the WHATWG HTML specification reads an event stream.

One incremental decoder serves every reader of a stream: the model adapters (answers
streamed by a model server) and the service's client (results streamed by
``convsim serve``). Bytes go in as they arrive, split anywhere; events come out.

What the specification says, and this decoder does: the stream is UTF-8 (invalid bytes
become U+FFFD) with one optional byte-order mark first; a line ends at CRLF, LF or a lone
CR (a CRLF split between two chunks is still one line end); a line starting with a colon
is a comment; ``field: value`` loses one space after the colon, and a line without a
colon is a field with an empty value; ``data`` lines join with LF, ``event`` names the
event's type, ``id`` sets the last event ID (kept for later events; a value with a NUL
is ignored), ``retry`` sets the reconnection time when it is all ASCII digits; other
fields are ignored; a blank line dispatches the event, unless it has no data line; an
event the stream ends in the middle of is discarded.

With ``max_event_bytes``, a line or an event (its data lines together) longer than that
raises :class:`~convsim.ResponseTooLarge` instead of growing without end.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import ResponseTooLarge
from ._plural import counted

__all__ = ["SSEEvent", "SSEDecoder"]

_BOM = b"\xef\xbb\xbf"
_CR = 0x0D
_LF = 0x0A


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event."""

    event: str | None
    """Its type; None when the stream named none (a ``message``, the specification says)."""
    data: str
    id: str = ""
    """The last event ID when it was dispatched (set by this or an earlier event); what a
    reconnecting reader sends as ``Last-Event-ID``."""


class SSEDecoder:
    """Incremental server-sent-events decoder: :meth:`feed` bytes, get events."""

    __slots__ = (
        "_after_cr",
        "_buffer",
        "_data",
        "_data_bytes",
        "_event",
        "_id",
        "_started",
        "last_event_id",
        "max_event_bytes",
        "retry",
    )

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        self.last_event_id = ""
        """The ID of the last dispatched event (the specification's last event ID string)."""
        self.retry: int | None = None
        """The reconnection time the stream asked for, in milliseconds (None: it did not)."""
        self._buffer = bytearray()
        """An unfinished line (whole lines are taken at each feed)."""
        self._after_cr = False
        """The last line taken ended with a CR at the end of a chunk: an LF opening the
        next chunk belongs to that line end."""
        self._started = False
        self._event: str | None = None
        self._data: list[str] = []
        self._data_bytes = 0
        self._id = ""
        """The specification's last event ID buffer."""

    def _too_large(self) -> ResponseTooLarge:
        """The error for a line or an event past ``max_event_bytes``."""
        limit = self.max_event_bytes
        assert limit is not None  # only raised under a limit
        return ResponseTooLarge(
            f"a server-sent event went past {counted(limit, 'byte')}; reading stopped there",
            limit=limit,
            setting="max_event_bytes",
        )

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events that ``chunk`` completes (none while a line or event is open)."""
        if self._after_cr and chunk:
            self._after_cr = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
        buffer = self._buffer
        held = len(buffer)  # no line end in it: the last feed took every whole line
        buffer += chunk
        if not self._started:  # a byte-order mark may open the stream, in any pieces
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                return []
            self._started = True
            if buffer.startswith(_BOM):
                del buffer[: len(_BOM)]
                held = max(0, held - len(_BOM))
        last = max(buffer.rfind(b"\n", held), buffer.rfind(b"\r", held))
        limit = self.max_event_bytes
        if last < 0:
            if limit is not None and len(buffer) > limit:
                raise self._too_large()  # a line that never ends
            return []
        # whole lines only: line ends are ASCII, so no character is cut in two
        text = buffer[: last + 1].decode("utf-8", errors="replace")
        self._after_cr = buffer[last] == _CR and last == len(buffer) - 1
        del buffer[: last + 1]
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        lines.pop()  # what follows the last line end: nothing
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:  # dispatch
                self.last_event_id = self._id
                if data:
                    events.append(SSEEvent(self._event, "\n".join(data), self._id))
                    data = self._data = []
                self._event, self._data_bytes = None, 0
                continue
            if line.startswith("data:"):
                value = line[6:] if line.startswith("data: ") else line[5:]
            elif line[0] == ":":
                continue  # a comment (keep-alive)
            else:
                name, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if name == "event":
                    self._event = value or None
                    continue
                if name == "id":
                    if "\0" not in value:
                        self._id = value
                    continue
                if name == "retry":
                    if value.isascii() and value.isdigit():
                        self.retry = int(value)
                    continue
                if name != "data":
                    continue  # a field the specification ignores
            data.append(value)
            self._data_bytes += len(line)
            # characters undercount bytes by up to four times: count exactly only when
            # that could matter
            if limit is not None and self._data_bytes * 4 > limit:
                self._data_bytes = sum(len(v.encode()) + 6 for v in data)
                if self._data_bytes > limit:
                    raise self._too_large()
        if limit is not None and len(buffer) > limit:
            raise self._too_large()  # a line that never ends
        return events

    def flush(self) -> list[SSEEvent]:
        """At the end of the stream: an unfinished event is discarded, as the
        specification says (a stream cut mid-event then reads as incomplete)."""
        self._buffer = bytearray()
        self._after_cr = False
        self._event, self._data, self._data_bytes = None, [], 0
        return []
