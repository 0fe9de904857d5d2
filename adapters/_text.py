"""Answer text as valid Unicode: surrogate halves joined where they pair, replaced where not.

JSON escapes text as UTF-16 (``"\\ud83d\\ude00"`` is one emoji). A server that cuts an
emoji in half sends a lone ``"\\ud83d"``; a JavaScript gateway that splits a stream
between the two halves sends ``"\\ud83d"`` in one event and ``"\\ude00"`` in the next.
Python reads each as a lone surrogate, a character no UTF-8 file, terminal or JSON
encoder will take. Answers are text, so adapters hand back only valid Unicode: halves
that pair (also across stream events) are joined into their character, the others are
replaced with U+FFFD, and the number replaced is kept (``Completion.replaced_chars``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["RepairedText", "StreamedText", "repair_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR_OR_LONE = re.compile("([\ud800-\udbff][\udc00-\udfff])|[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


class RepairedText(NamedTuple):
    """Text made valid Unicode, and how many characters had to be replaced."""

    text: str
    replaced: int


def _has_surrogates(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def repair_text(text: str) -> RepairedText:
    """``text`` with surrogate pairs joined and lone surrogates replaced by U+FFFD."""
    if not _has_surrogates(text):
        return RepairedText(text, 0)
    replaced = 0

    def fix(match: re.Match[str]) -> str:
        nonlocal replaced
        pair = match.group(1)
        if pair is not None:
            return pair.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        replaced += 1
        return _REPLACEMENT

    return RepairedText(_PAIR_OR_LONE.sub(fix, text), replaced)


class StreamedText:
    """Repairs a streamed answer piece by piece: a high surrogate that ends a piece is
    held back until the next piece says whether its other half follows."""

    def __init__(self) -> None:
        self._pending = ""
        self.replaced = 0
        """Characters replaced with U+FFFD so far."""

    def feed(self, piece: str) -> str:
        """What of ``piece`` can be handed on now (possibly empty)."""
        if self._pending:
            piece, self._pending = self._pending + piece, ""
        if not _has_surrogates(piece):
            return piece
        if "\ud800" <= piece[-1] <= "\udbff":
            piece, self._pending = piece[:-1], piece[-1]
        repaired = repair_text(piece)
        self.replaced += repaired.replaced
        return repaired.text

    def flush(self) -> str:
        """At the end of the stream: a half still held back is replaced."""
        if not self._pending:
            return ""
        self._pending = ""
        self.replaced += 1
        return _REPLACEMENT
