"""Results files as pandas DataFrames: what ``pandas.read_json(path, lines=True)`` gives
in nested form, flattened and joined across files."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convsim._extras import needs_extra
from convsim.results._sinks import read_results

from ._rows import conversation_columns, conversation_row, score_rows, turn_rows

__all__ = ["Results", "load"]


@dataclass(frozen=True)
class Results:
    """One or more results files as three flat tables; ``file`` says where a row came
    from."""

    conversations: Any
    """One row per conversation: ids, the trial (``--trials``; None without), model,
    status and termination reason, counts, usage, cost, timing, error, tool calls
    (``tool_calls``, ``tool_errors``, ``tool_rounds``), reasoning (``reasoning_turns``,
    ``reasoning_tokens``: None when the server reported none), and a ``score.<metric>``
    column per metric."""
    turns: Any
    """One row per turn: ids, role, status, the user message and the response, usage,
    latency, time to first token (``ttft_s``) and to the first output token
    (``ttfot_s``), attempts, error, tool calls (``tool_calls``, ``tool_errors``,
    ``tool_rounds``, ``tool_round_limit``) and reasoning (``has_reasoning``,
    ``reasoning_tokens``)."""
    scores: Any
    """One row per score: conversation scores (``turn_id`` empty) and each turn's own
    metrics, with value, status and reason."""


def _pandas() -> Any:
    with needs_extra("pandas", "convsim.results"):
        import pandas
    return pandas


def load(paths: str | Path | Iterable[str | Path]) -> Results:
    """Read results files (the conversations that count: a retried conversation by its
    last line) into :class:`Results`.

    Raises:
        MissingExtra: pandas is not installed (the ``pandas`` extra).
        ResultsError: a file is missing or holds a bad line (named with its line).
    """
    pd = _pandas()
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    conversations: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    scores: list[dict[str, Any]] = []
    for path in files:
        label = str(path)
        for result in read_results(path):
            conversations.append(conversation_row(result, label))
            turns.extend(turn_rows(result, label))
            scores.extend(score_rows(result, label))
    return Results(
        conversations=pd.DataFrame(conversations, columns=conversation_columns(conversations)),
        turns=pd.DataFrame(turns),
        scores=pd.DataFrame(scores),
    )
