"""Streamed tool calls joined into whole calls.

A streamed answer sends each tool call in pieces: OpenAI-compatible servers send its
id and name in the first ``delta.tool_calls`` entry and its arguments in later ones,
all with the call's ``index``; vLLM may send a whole call in one entry, and some
servers repeat the id in every entry; Anthropic opens a ``tool_use`` content block
(id, name) and streams its input as ``input_json_delta`` pieces under the block's
index. Whatever the server, a piece says which call it belongs to and what it adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from convsim._types import ToolCall

from ._text import repair_text

__all__ = ["ToolCallPiece", "ToolCallJoiner"]


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """What one streamed event adds to one tool call."""

    index: int | None
    """The call's place in the answer (OpenAI's ``index``, Anthropic's block index);
    None when the server sends none (the piece then belongs to the call its id names,
    or to the last call)."""
    id: str | None = None
    name: str | None = None
    arguments: str | None = None
    """The next piece of the arguments' JSON text (may be empty or None)."""


@dataclass(slots=True)
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallJoiner:
    """Joins :class:`ToolCallPiece` s into :class:`ToolCall` s, in the order the calls
    were opened.

    An id or a name is taken from the first piece that carries it (a repeated one is
    the same); arguments are the pieces' texts end to end, kept as sent even when they
    are not valid JSON (the runtime answers those with a tool error).
    """

    __slots__ = ("_calls", "_last")

    def __init__(self) -> None:
        self._calls: dict[int, _Call] = {}
        self._last: int | None = None

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, piece: ToolCallPiece) -> None:
        """Add one piece, checking its fields' types (a wrong one raises TypeError)."""
        for name, value in (("id", piece.id), ("name", piece.name), ("arguments", piece.arguments)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"a tool call's {name} is {type(value).__name__}, not a string")
        index = piece.index
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
            raise TypeError(f"a tool call's index is {type(index).__name__}, not an integer")
        if index is None:
            index = self._place_of(piece.id)
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Call()
        self._last = index
        if piece.id and not call.id:
            call.id = piece.id
        if piece.name and not call.name:
            call.name = piece.name
        if piece.arguments:
            call.arguments.append(piece.arguments)

    def _place_of(self, call_id: str | None) -> int:
        """Where a piece without an index goes: the call its id names, a new call for a
        new id, else the last call."""
        if call_id:
            for index, call in self._calls.items():
                if call.id == call_id:
                    return index
            return max(self._calls, default=-1) + 1
        return self._last if self._last is not None else 0

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls so far, by index; a call the server gave no id is ``call_<index>``.

        Raises:
            ValueError: a call has no name.
        """
        joined = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.name:
                raise ValueError(f"the streamed tool call at index {index} has no name")
            joined.append(
                ToolCall(
                    id=call.id or f"call_{index}",
                    name=repair_text(call.name).text,
                    arguments=repair_text("".join(call.arguments)).text,
                )
            )
        return tuple(joined)
