"""Tables that fit the console's width: a number or a name is never cut.

rich cuts a cell with "…" when a table is wider than the console, and wraps a name
across lines when its column may wrap. The tables convsim prints are built here
instead, in the first layout that fits:

- named rows (a metric and its figures): one row a line, boxed; else the same without
  the box; else each name on a line of its own with its figures on the line below;
- items across (groups, load points): figures down, items across, split into as many
  tables as it takes;
- many columns (a conversation and a column per metric): the columns split across as
  many tables as it takes, the first repeated in each.

Titles are word-wrapped to the width (lines of prose around the tables stay whole, as a
log keeps them); cells are plain text, never markup (a metric named ``judge:[x]``
prints as it is named).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Cell", "across_tables", "column_tables", "fits", "print_all", "row_table", "wrapped"]

Cell = str | Text
"""A cell: plain text (never read as markup), or a styled Text."""

_GAP = 2
"""Spaces between the columns of a layout without a box."""
_INDENT = 2
"""How far the figures under a name stand in, in the stacked layout."""


def wrapped(console: Console, text: Cell, *, style: str = "") -> Text:
    """``text`` word-wrapped to the console's width (a soft-wrapping console prints it
    as it is: the line breaks are in it); a word longer than the width goes on over the
    next line. Lines that name files are printed as they are instead."""
    whole = Text(text, style=style) if isinstance(text, str) else text
    lines = whole.wrap(console, console.width, overflow="fold")
    return Text("\n").join(lines)


def print_all(console: Console, parts: Iterable[RenderableType]) -> None:
    """Print what a table function returned, part by part."""
    for part in parts:
        console.print(part)


def _text(cell: Cell) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)


_UNBOUNDED = 1_000_000
"""Where a table is measured: rich clamps a measurement to the width it is given."""


def _fits(console: Console, table: Table, width: int) -> bool:
    options = console.options.update_width(_UNBOUNDED)
    return Measurement.get(console, options, table).maximum <= width


def fits(
    console: Console, heads: Sequence[str], rows: Sequence[Sequence[Cell]], width: int
) -> bool:
    """Whether the boxed table of ``heads`` and ``rows`` (the first column a name, the
    others figures) is at most ``width`` columns wide."""
    return _fits(console, _filled(heads, rows, boxed=True), width)


def _filled(heads: Sequence[str], rows: Sequence[Sequence[Cell]], *, boxed: bool) -> Table:
    table = _table(heads, boxed=boxed)
    for row in rows:
        table.add_row(*(_text(c) for c in row))
    return table


def _table(heads: Sequence[str], *, boxed: bool) -> Table:
    """A table of ``heads``: the first column (names) on the left, the others (figures)
    on the right, none of them ever wrapped or cut."""
    table = (
        Table()
        if boxed
        else Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    )
    for i, head in enumerate(heads):
        table.add_column(Text(head), justify="left" if i == 0 else "right", no_wrap=True)
    return table


def row_table(
    console: Console,
    title: str,
    heads: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    width: int | None = None,
) -> list[RenderableType]:
    """What to print for rows of a name (the first column) and its figures: the title,
    wrapped, and the first layout that fits ``width`` (default: the console's).

    Every cell is printed whole: boxed, one row a line, when that fits; else without
    the box; else each name on a line of its own with its figures below it.
    """
    width = console.width if width is None else width
    parts: list[RenderableType] = [wrapped(console, title, style="table.title")] if title else []
    for boxed in (True, False):
        table = _filled(heads, rows, boxed=boxed)
        if _fits(console, table, width):
            return [*parts, table]
    return [*parts, *_stacked(heads, rows)]


def _stacked(heads: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[RenderableType]:
    """Each name on a line of its own, its figures on the next, in aligned columns."""
    widths = [
        max([len(head), *(_text(row[i]).cell_len for row in rows)]) for i, head in enumerate(heads)
    ]
    gap = Text(" " * _GAP)

    def line(cells: Sequence[Cell]) -> Text:
        aligned = []
        for cell, cell_width in zip(cells, widths[1:], strict=True):
            text = _text(cell).copy()
            text.align("right", cell_width)
            aligned.append(text)
        return Text(" " * _INDENT) + gap.join(aligned)

    head = line(heads[1:])
    head.stylize("bold")
    rule = Text("\u2500" * head.cell_len)
    out: list[RenderableType] = [Text(heads[0], style="bold"), head, rule]
    for row in rows:
        out.append(_text(row[0]).copy())
        out.append(line(row[1:]))
    return out


def across_tables(
    console: Console,
    title: str,
    corner: str,
    items: Mapping[str, Sequence[Cell]],
    row_heads: Sequence[str],
    *,
    width: int | None = None,
) -> list[RenderableType]:
    """Figures down (``row_heads``), items across (``items``: an item's name and its
    cells, one per row head), split into as many tables as it takes for each to fit
    ``width``: the title of each says which part it is when there are several."""
    width = console.width if width is None else width
    names = list(items)
    chunks: list[list[str]] = []
    for name in names:
        if chunks and _fits(console, _across(corner, chunks[-1] + [name], items, row_heads), width):
            chunks[-1].append(name)
        else:
            chunks.append([name])
    out: list[RenderableType] = []
    for i, chunk in enumerate(chunks):
        part = "" if len(chunks) == 1 else f" ({i + 1}/{len(chunks)})"
        if title:
            out.append(wrapped(console, title + part, style="table.title"))
        out.append(_across(corner, chunk, items, row_heads))
    return out


def _across(
    corner: str, names: Sequence[str], items: Mapping[str, Sequence[Cell]], heads: Sequence[str]
) -> Table:
    table = _table([corner, *names], boxed=True)
    for i, head in enumerate(heads):
        table.add_row(Text(head), *(_text(items[name][i]) for name in names))
    return table


def column_tables(
    console: Console,
    title: str,
    heads: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    width: int | None = None,
) -> list[RenderableType]:
    """Rows of a name (the first column) and many figures: the figure columns split
    across as many boxed tables as it takes for each to fit ``width``, the name column
    repeated in each."""
    width = console.width if width is None else width
    chunks: list[list[int]] = []
    for column in range(1, len(heads)):
        if chunks and fits(console, *_columns(heads, rows, [*chunks[-1], column]), width):
            chunks[-1].append(column)
        else:
            chunks.append([column])
    out: list[RenderableType] = []
    for i, chunk in enumerate(chunks or [[]]):
        part = "" if len(chunks) <= 1 else f" ({i + 1}/{len(chunks)})"
        if title:
            out.append(wrapped(console, title + part, style="table.title"))
        out.append(_filled(*_columns(heads, rows, chunk), boxed=True))
    return out


def _columns(
    heads: Sequence[str], rows: Sequence[Sequence[Cell]], keep: Sequence[int]
) -> tuple[list[str], list[list[Cell]]]:
    """The first column and the columns ``keep``, of ``heads`` and ``rows``."""
    return [heads[0], *(heads[i] for i in keep)], [[r[0], *(r[i] for i in keep)] for r in rows]
