"""``convsim metrics``: every metric a run can score, what it scores and what it reads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .._plural import counted
from ._console import clear_errors
from ._console import stdout as _stdout

if TYPE_CHECKING:
    from ..metrics import MetricInfo

__all__ = ["metrics_command"]

LEGEND = (
    "kind: turn scores each answer on its own, conversation the conversation as a "
    "whole. needs: without it a metric is not applicable; [in brackets] what it reads "
    "when given. A prefix builds a metric for any name after it (judge:Is it polite?); "
    "a plugin's metrics are scored with --plugin NAME. \u2191 higher is better, "
    "\u2193 lower."
)
_MIN_DESCRIPTION = 30
"""The narrowest the description column may be before each metric takes two lines."""


def _group(info: MetricInfo) -> str:
    """The heading a metric is listed under: where it comes from."""
    if info.source == "built-in":
        return "built-in"
    if info.source == "entry point":
        return f"from {info.provider}"
    if info.source == "prefix":
        return "prefixes" if info.provider in (None, "convsim") else f"{info.provider} prefixes"
    return f"plugin {info.provider}"


def _needs(info: MetricInfo) -> str:
    if info.traits is None:
        return "not declared"
    needs = ", ".join(sorted(info.traits.needs)) or "-"
    uses = ", ".join(sorted(info.traits.uses))
    return f"{needs} [{uses}]" if uses else needs


def _needs_in_words(info: MetricInfo) -> str:
    if info.traits is None:
        return "needs not declared"
    needs = ", ".join(sorted(info.traits.needs)) or "nothing"
    uses = ", ".join(sorted(info.traits.uses))
    return f"needs {needs}" + (f"; reads {uses} when given" if uses else "")


def _name(info: MetricInfo) -> Text:
    arrow = {True: " \u2191", False: " \u2193", None: ""}[info.higher_is_better]
    return Text(info.name + arrow)


def _what(info: MetricInfo) -> Text:
    if info.unavailable is not None:
        return Text(f"cannot be built here: {info.unavailable}", style="red")
    return Text(info.summary)


def _kind(info: MetricInfo) -> str:
    return "?" if info.traits is None else info.traits.kind


def _table(metrics: Sequence[MetricInfo]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    for head in ("metric", "kind", "needs"):
        table.add_column(head, no_wrap=True)
    table.add_column("what it measures", min_width=_MIN_DESCRIPTION, ratio=1)
    group = None
    for info in metrics:
        if _group(info) != group:
            group = _group(info)
            table.add_row(Text(group, style="bold"), end_section=False)
        table.add_row(_name(info), Text(_kind(info)), Text(_needs(info)), _what(info))
    return table


def _records(console: Console, metrics: Sequence[MetricInfo]) -> list[RenderableType]:
    """Each metric on two lines and more: its name, then its kind and needs, then
    what it measures, word-wrapped; for a console too narrow for the table."""
    out: list[RenderableType] = []
    group = None
    for info in metrics:
        if _group(info) != group:
            group = _group(info)
            out.append(Text(f"\n{group}", style="bold"))
        out.append(_name(info))
        lines = Text(f"{_kind(info)}; {_needs_in_words(info)}\n") + _what(info)
        wrapped = lines.wrap(console, console.width - 4)
        out.append(Text("\n").join(Text("    ") + line for line in wrapped))
    return out


def print_metrics(console: Console, metrics: Sequence[MetricInfo]) -> None:
    """The metrics as a table when the console is wide enough, else as records."""
    console.print(Text(f"{counted(len(metrics), 'metric')}. {LEGEND}"), soft_wrap=False)
    table = _table(metrics)
    measured = Measurement.get(console, console.options.update_width(1_000_000), table)
    if measured.minimum <= console.width:
        console.print(table, soft_wrap=False)
        return
    for part in _records(console, metrics):
        console.print(part)


@click.command("metrics")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of every metric.")
@clear_errors
def metrics_command(as_json: bool) -> None:
    """List every metric: built-in, from entry points, built by a prefix (judge:,
    lm_eval:, ...) and scored by a plugin; with its kind (turn or conversation), what
    it needs (a judge, a reference, facts, ...) and what it measures."""
    from ..metrics import registered_metrics
    from ..plugins import plugin_metrics

    metrics = [*registered_metrics(), *plugin_metrics()]
    if as_json:
        click.echo(json.dumps([m.as_json() for m in metrics], indent=2))
        return
    print_metrics(_stdout(), metrics)
