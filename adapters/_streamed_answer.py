"""A streamed answer as it arrives: its text, repaired piece by piece, and its timing.

Both the HTTP adapters and the LiteLLM adapter read streams; they differ in how a piece
of text comes out of an event, not in what is done with it. Times are taken when a piece
is handed on, after repair, so a piece held back for its other surrogate half counts
when it can be shown.

A reasoning model streams its reasoning before its answer (``reasoning_content`` on
vLLM, SGLang, DeepSeek and llama.cpp; ``reasoning`` on newer vLLM; Anthropic's thinking
blocks). Both kinds are tokens: the time to the first token (TTFT) and the gaps count
either, while the time to the first output token (TTFOT) waits for the answer, as the
user does. Only the answer is handed to ``on_text``.

Tool calls stream as pieces of their name and arguments (:class:`ToolCallPiece`). They
are the model's output as much as text is: a piece counts as a token for the TTFT, the
TTFOT and the gaps, and the pieces are joined into calls (:class:`ToolCallJoiner`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from convsim._types import ToolCall

from ._text import StreamedText
from ._tool_stream import ToolCallJoiner, ToolCallPiece

__all__ = ["StreamedAnswer"]


class StreamedAnswer:
    """The text and timing of one streamed answer; ``t0`` is when the call was sent."""

    __slots__ = (
        "_first",
        "_first_output",
        "_last",
        "_on_text",
        "_pieces",
        "_reasoning",
        "_repair",
        "_repair_reasoning",
        "_t0",
        "_tools",
        "gaps",
    )

    def __init__(self, t0: float, on_text: Callable[[str], None] | None = None) -> None:
        self._t0 = t0
        self._on_text = on_text
        self._repair = StreamedText()
        self._repair_reasoning = StreamedText()
        self._pieces: list[str] = []
        self._reasoning: list[str] = []
        self._first: float | None = None
        self._first_output: float | None = None
        self._last = 0.0
        self._tools = ToolCallJoiner()
        self.gaps: list[float] = []
        """Seconds between consecutive pieces handed on, reasoning and answer alike."""

    def feed(self, piece: str) -> None:
        """Take one event's answer text (repaired; half a character may wait)."""
        text = self._repair.feed(piece)
        if text:
            self._hand_on(text)

    def feed_reasoning(self, piece: str) -> None:
        """Take one event's reasoning text (repaired as the answer is)."""
        text = self._repair_reasoning.feed(piece)
        if text:
            self._tick()
            self._reasoning.append(text)

    def feed_tool_call(self, piece: ToolCallPiece) -> None:
        """Take one event's piece of a tool call (a TypeError for a misshapen one)."""
        self._tools.feed(piece)
        if piece.name or piece.arguments or piece.id:
            now = self._tick()
            if self._first_output is None:
                self._first_output = now

    def close(self) -> None:
        """At the end of the stream: hand on what repair still held back."""
        thought = self._repair_reasoning.flush()
        if thought:
            self._tick()
            self._reasoning.append(thought)
        tail = self._repair.flush()
        if tail:
            self._hand_on(tail)

    def _tick(self) -> float:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        else:
            self.gaps.append(now - self._last)
        self._last = now
        return now

    def _hand_on(self, text: str) -> None:
        now = self._tick()
        if self._first_output is None:
            self._first_output = now
        self._pieces.append(text)
        if self._on_text is not None:
            self._on_text(text)

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def reasoning(self) -> str | None:
        """The reasoning streamed before (or beside) the answer; None when none came."""
        return "".join(self._reasoning) if self._reasoning else None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls streamed, joined (ValueError: a call came without a name)."""
        return self._tools.calls() if self._tools else ()

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first piece of any kind; None when none came."""
        return None if self._first is None else self._first - self._t0

    @property
    def ttfot_s(self) -> float | None:
        """Seconds from sending to the first piece of the answer (text or a tool call);
        None when neither came."""
        return None if self._first_output is None else self._first_output - self._t0

    @property
    def replaced_chars(self) -> int:
        return self._repair.replaced + self._repair_reasoning.replaced
