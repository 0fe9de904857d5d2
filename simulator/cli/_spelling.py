"""Distributions on the command line in the old spelling: read, and told about on stderr."""

from __future__ import annotations

from rich.markup import escape

from .._distribution_text import read_distribution
from ._console import stderr

__all__ = ["respell_distribution", "respell_synthetic"]


def respell_distribution(value: str, option: str) -> str:
    """``value`` in today's spelling (``uniform:20,80``), with a warning on stderr when
    it was written in the deprecated one (``uniform:20:80``). A value that is no
    distribution at all comes back as it is, for the option's parser to refuse."""
    try:
        read = read_distribution(value)
    except ValueError:
        return value
    if read.respelled is None:
        return value
    stderr().print(
        f"[yellow]warning:[/] {escape(option)} {escape(repr(value.strip()))}: numbers apart "
        f"with ':' are deprecated; write {escape(repr(read.respelled))}",
        highlight=False,
    )
    return read.respelled


def respell_synthetic(value: str, option: str) -> str:
    """``KEY=VALUE,...`` with each distribution in today's spelling (see
    :func:`respell_distribution`)."""
    pieces = []
    for piece in value.split(","):
        key, sep, given = piece.partition("=")
        if sep and given.count(":") > 1:
            piece = f"{key}={respell_distribution(given, f'{option} {key.strip()}')}"
        pieces.append(piece)
    return ",".join(pieces)
