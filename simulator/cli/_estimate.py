"""``convsim run --dry-run``: what a run would take, printed before anything is called."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from .._plural import counted

if TYPE_CHECKING:
    from .._runtime._estimate import RunEstimate

__all__ = ["print_estimate"]


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def _range(low: float | None, high: float | None) -> str:
    if low is None:
        return "unknown (no price)"
    if high is None:
        return f"{_usd(low)} - unbounded (no max_tokens cap)"
    return f"{_usd(low)} - {_usd(high)}"


def print_estimate(pack: str, estimate: RunEstimate, console: Console) -> None:
    """The estimate, a line per role, then the run's cost range and what it rests on."""
    console.print(
        f"dry run of {escape(pack)}: {counted(estimate.conversations, 'conversation')}, "
        f"{counted(estimate.turns, 'turn')}; no model was called",
        highlight=False,
    )
    for role, r in estimate.roles.items():
        if not r.calls:
            continue
        unbounded = r.completion_tokens_high is None
        prompts = f"{r.prompt_tokens_low:,} - " + (
            "no bound" if unbounded else f"{r.prompt_tokens_high:,}"
        )
        answers = "no cap" if unbounded else f"at most {r.completion_tokens_high:,}"
        console.print(
            f"  {role} ({escape(r.model or '')}): {counted(r.calls, 'call', grouped=True)}, "
            f"prompt tokens {prompts}, "
            f"answer tokens {answers}, cost {_range(r.cost_low, r.cost_high)}",
            highlight=False,
        )
    console.print(f"cost: {_range(estimate.cost_low, estimate.cost_high)}", highlight=False)
    for name in estimate.unpriced:
        console.print(
            f"no price for {escape(name)}: its cost is unknown (give input_price=... "
            "output_price=..., USD per million tokens, or a price file)",
            highlight=False,
        )
    console.print(
        "low: prompts with every answer empty; high: every answer at its max_tokens cap. "
        "Tokens estimated at about 4 characters a token; the judge's re-asks not counted.",
        highlight=False,
    )
