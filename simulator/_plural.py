"""Counts in words: "1 conversation", "2 conversations"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """``count`` and ``noun``, plural unless the count is one (``plural`` where adding
    "s" is wrong: ``counted(2, "match", "matches")``); ``grouped`` writes thousands
    with commas (``1,200 requests``)."""
    number = f"{count:,}" if grouped else str(count)
    return f"{number} {noun if count == 1 else plural or noun + 's'}"
