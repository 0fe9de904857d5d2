"""Results files as flat rows: one per conversation, per turn and per score.

Plain dictionaries of plain values, so they serve a CSV file as well as a DataFrame
(pandas is needed only for :func:`convsim.results.load`). Columns are stable and flat:
nested values are spelled out (``prompt_tokens``, ``error_type``), and each conversation
metric gets a column ``score.<metric>`` in the conversation rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from convsim._records import ConversationResult, TurnRecord, TurnStatus

__all__ = [
    "CONVERSATION_COLUMNS",
    "conversation_columns",
    "conversation_row",
    "turn_rows",
    "score_rows",
]

CONVERSATION_COLUMNS = (
    "file",
    "run_id",
    "conversation_id",
    "scenario_id",
    "trial",
    "scenario_type",
    "difficulty",
    "pack",
    "model",
    "seed",
    "status",
    "termination_reason",
    "turns",
    "turns_completed",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost_usd",
    "started_at",
    "duration_s",
    "error_type",
    "error_message",
    "tool_calls",
    "tool_errors",
    "tool_rounds",
    "reasoning_turns",
    "reasoning_tokens",
)
"""Before the ``score.<metric>`` columns."""


def conversation_columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The columns of conversation rows: the fixed ones, then each ``score.<metric>``
    any row has, sorted."""
    metrics = {k for row in rows for k in row} - set(CONVERSATION_COLUMNS)
    return [*CONVERSATION_COLUMNS, *sorted(metrics)]


def conversation_row(result: ConversationResult, file: str) -> dict[str, Any]:
    error = result.error
    row: dict[str, Any] = {
        "file": file,
        "run_id": result.run_id,
        "conversation_id": result.conversation_id,
        "scenario_id": result.scenario_id,
        "trial": result.trial,
        "scenario_type": result.scenario_type,
        "difficulty": result.difficulty,
        "pack": result.pack,
        "model": result.model,
        "seed": result.seed,
        "status": result.status.value,
        "termination_reason": result.termination_reason.value,
        "turns": len(result.turns),
        "turns_completed": sum(1 for t in result.turns if t.status is TurnStatus.COMPLETED),
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "total_tokens": result.usage.total_tokens,
        "cost_usd": result.cost_usd,
        "started_at": result.timings.started_at,
        "duration_s": result.timings.duration_s,
        "error_type": error.type if error else None,
        "error_message": error.message if error else None,
        **_tool_cells(result.turns),
        **_reasoning_cells(result.turns),
    }
    for name, score in result.scores.items():
        row[f"score.{name}"] = score.value
    return row


def _turn_row(result: ConversationResult, turn: TurnRecord, file: str) -> dict[str, Any]:
    timings, usage, error = turn.timings, turn.usage, turn.error
    return {
        "file": file,
        "run_id": result.run_id,
        "conversation_id": result.conversation_id,
        "model": result.model,
        "turn_index": turn.turn_index,
        "turn_id": turn.turn_id,
        "role": turn.role,
        "status": turn.status.value,
        "skip_reason": turn.skip_reason,
        "user_message": turn.user_message,
        "response": turn.response,
        "finish_reason": turn.finish_reason,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
        "latency_s": timings.latency_s if timings else None,
        "ttft_s": timings.ttft_s if timings else None,
        "ttfot_s": timings.ttfot_s if timings else None,
        "queue_wait_s": timings.queue_wait_s if timings else None,
        "duration_s": timings.duration_s if timings else None,
        "attempts": turn.attempts,
        "error_type": error.type if error else None,
        "error_message": error.message if error else None,
        **_extra_call_cells(turn),
        **_tool_cells((turn,)),
        "tool_round_limit": turn.tool_round_limit,
        "has_reasoning": bool(turn.reasoning),
        "reasoning_tokens": turn.reasoning_tokens,
    }


def _tool_cells(turns: Iterable[TurnRecord]) -> dict[str, Any]:
    """Tool calls made (and those whose result was an error) and the model calls that
    asked for tools, over ``turns``."""
    calls = [c for t in turns for c in t.tool_calls]
    return {
        "tool_calls": len(calls),
        "tool_errors": sum(1 for c in calls if c.error is not None),
        "tool_rounds": sum(t.tool_rounds for t in turns),
    }


def _reasoning_cells(turns: Sequence[TurnRecord]) -> dict[str, Any]:
    """Turns that recorded reasoning, and the reasoning tokens the server reported
    (None when it reported none for any turn: nothing measured is not zero)."""
    reported = [t.reasoning_tokens for t in turns if t.reasoning_tokens is not None]
    return {
        "reasoning_turns": sum(1 for t in turns if t.reasoning),
        "reasoning_tokens": sum(reported) if reported else None,
    }


def _extra_call_cells(turn: TurnRecord) -> dict[str, Any]:
    """A turn's extra calls (a task's own questions to the model, counted in the
    conversation's usage): how many, and their tokens (None where none reported usage),
    so that a conversation's turn rows add up to its usage."""
    used = [c.usage for c in turn.extra_calls if c.usage is not None]
    return {
        "extra_calls": len(turn.extra_calls),
        "extra_prompt_tokens": sum(u.prompt_tokens for u in used) if used else None,
        "extra_completion_tokens": sum(u.completion_tokens for u in used) if used else None,
    }


def turn_rows(result: ConversationResult, file: str) -> Iterator[dict[str, Any]]:
    for turn in result.turns:
        yield _turn_row(result, turn, file)


def score_rows(result: ConversationResult, file: str) -> Iterator[dict[str, Any]]:
    """Conversation scores (``turn_id`` None), then each turn's own metrics."""
    scored: Iterable[tuple[str | None, dict[str, Any]]] = [
        (None, dict(result.scores)),
        *((turn_id, dict(scores)) for turn_id, scores in result.turn_scores.items()),
    ]
    for turn_id, scores in scored:
        for metric, score in scores.items():
            yield {
                "file": file,
                "run_id": result.run_id,
                "conversation_id": result.conversation_id,
                "model": result.model,
                "turn_id": turn_id,
                "metric": metric,
                "value": score.value,
                "status": score.status,
                "reason": score.reason,
            }
