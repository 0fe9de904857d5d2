"""A streamed answer as it arrives: its text, repaired piece by piece, and its timing.

Both the HTTP adapters and the LiteLLM adapter read streams; they differ in how a piece
of text comes out of an event, not in what is done with it. The time to the first piece
(TTFT) and the gaps between pieces are taken when a piece is handed on, after repair, so
a piece held back for its other surrogate half counts when it can be shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ._text import StreamedText

__all__ = ["StreamedAnswer"]


class StreamedAnswer:
    """The text and timing of one streamed answer; ``t0`` is when the call was sent."""

    __slots__ = ("_first", "_last", "_on_text", "_pieces", "_repair", "_t0", "gaps")

    def __init__(self, t0: float, on_text: Callable[[str], None] | None = None) -> None:
        self._t0 = t0
        self._on_text = on_text
        self._repair = StreamedText()
        self._pieces: list[str] = []
        self._first: float | None = None
        self._last = 0.0
        self.gaps: list[float] = []
        """Seconds between consecutive pieces handed on."""

    def feed(self, piece: str) -> None:
        """Take one event's text (repaired; half a character may wait for the next)."""
        text = self._repair.feed(piece)
        if text:
            self._hand_on(text)

    def close(self) -> None:
        """At the end of the stream: hand on what repair still held back."""
        tail = self._repair.flush()
        if tail:
            self._hand_on(tail)

    def _hand_on(self, text: str) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        else:
            self.gaps.append(now - self._last)
        self._last = now
        self._pieces.append(text)
        if self._on_text is not None:
            self._on_text(text)

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first piece; None when no text came."""
        return None if self._first is None else self._first - self._t0

    @property
    def replaced_chars(self) -> int:
        return self._repair.replaced
