"""``convsim list`` and ``convsim validate``: the packs, before any model is called."""

from __future__ import annotations

import click
from rich.table import Table

from .._gc import tune_gc_for_throughput
from .._plural import counted
from ._console import (
    clear_errors,
)
from ._console import stdout as _stdout
from ._options import PackReading, pack_reading_options


@click.command("list")
@clear_errors
def list_command() -> None:
    """List the bundled scenario packs."""
    from ..scenarios import list_packs

    table = Table(title="bundled scenario packs")
    for column in ("name", "kind", "conversations", "description"):
        table.add_column(column, overflow="fold")
    for info in list_packs():
        table.add_row(info.name, info.kind, str(info.conversations), info.description)
    _stdout().print(table)


@click.command()
@click.argument("pack")
@pack_reading_options
@clear_errors
def validate(pack: str, reading: PackReading) -> None:
    """Validate PACK (a bundled pack's name or a folder) without running it."""
    tune_gc_for_throughput()  # a big pack is millions of objects that live on
    loaded = reading.load(pack)
    flows = sorted({c.flow.scenario_type for c in loaded.conversations})
    tools = next((c.tools for c in loaded.conversations if c.tools is not None), None)
    listed = f", tools: {', '.join(tools.names)}" if tools is not None else ""
    out = _stdout()
    out.print(
        f"ok: {loaded.name} ({loaded.kind}, {counted(len(loaded), 'conversation')}, "
        f"flows: {', '.join(flows)}{listed}) hash {loaded.pack_hash[:12]}",
        highlight=False,
    )
    for note in loaded.notes:
        out.print(f"note: {note}", highlight=False)
