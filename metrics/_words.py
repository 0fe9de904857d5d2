"""Text as values are compared in: lower-cased words, one space apart."""

from __future__ import annotations

import re

__all__ = ["normal_words"]

_WORD = re.compile(r"\w+")


def normal_words(text: str) -> str:
    """``text`` case-folded, its words (runs of letters, digits and ``_``) one space
    apart: "Order #A-1042!" reads "order a 1042"."""
    return " ".join(_WORD.findall(text.casefold()))
