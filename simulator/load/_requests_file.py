"""Per-request output of a load run: JSON lines (every inter-token gap) or CSV (flat).

Columns: ``point`` (the sweep point, 0 without a sweep), ``session_id``, ``turn_index``,
``history_messages``, ``scheduled_s``, ``sent_s``, ``end_s`` (run clock, seconds),
``schedule_delay_ms``, ``ttft_ms`` (to the first token of any kind), ``ttfot_ms`` (to
the first answer token: the same for a model that does not reason aloud), ``tpot_ms``,
``e2e_ms``, ``input_tokens``, ``cached_tokens`` (of the input tokens, those the server
reported its prefix cache held; empty when it did not say),
``output_tokens``, ``output_from_chunks`` (true when the stream carried no usage and
its chunks were counted), ``token_source`` (``server``, ``tokenizer`` or ``estimate``),
``reasoning_tokens`` (of the output tokens, those the server reported spent reasoning;
empty when it reported none), ``tool_round`` (the model call of its turn: 0 the first,
n the one sent with the tool results of the n-th reply asking for tools), ``tool_calls``
(tool calls its reply asked for), ``error``, ``request_id`` (the answering attempt's id:
the one sent with ``--request-id-header``, else the server's ``x-request-id``) and
``response_id`` (the provider's id of the answer); JSON lines add ``itl_ms`` (the list of
gaps) and, for a retried request, ``request_ids`` (every attempt's), CSV ``itl_count`` and
``itl_mean_ms``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from convsim._errors import ConfigError

from ._records import RequestRecord

__all__ = ["write_requests", "REQUEST_COLUMNS"]

REQUEST_COLUMNS = (
    "point",
    "session_id",
    "turn_index",
    "history_messages",
    "scheduled_s",
    "sent_s",
    "end_s",
    "schedule_delay_ms",
    "ttft_ms",
    "ttfot_ms",
    "tpot_ms",
    "e2e_ms",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "output_from_chunks",
    "token_source",
    "reasoning_tokens",
    "tool_round",
    "tool_calls",
    "error",
    "request_id",
    "response_id",
)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 4)


def _row(point: int, r: RequestRecord) -> dict[str, Any]:
    return {
        "point": point,
        "session_id": r.session_id,
        "turn_index": r.turn_index,
        "history_messages": r.history_messages,
        "scheduled_s": None if r.scheduled_s is None else round(r.scheduled_s, 6),
        "sent_s": round(r.sent_s, 6),
        "end_s": round(r.end_s, 6),
        "schedule_delay_ms": _ms(r.schedule_delay_s),
        "ttft_ms": _ms(r.ttft_s),
        "ttfot_ms": _ms(r.ttfot_s),
        "tpot_ms": _ms(r.tpot_s),
        "e2e_ms": _ms(r.e2e_s),
        "input_tokens": r.input_tokens,
        "cached_tokens": r.cached_tokens,
        "output_tokens": r.output_tokens,
        "output_from_chunks": r.output_from_chunks,
        "token_source": r.token_source,
        "reasoning_tokens": r.reasoning_tokens,
        "tool_round": r.tool_round,
        "tool_calls": r.tool_calls,
        "error": r.error,
        "request_id": r.request_id,
        "response_id": r.response_id,
    }


def write_requests(path: Path, requests: Iterable[tuple[int, RequestRecord]]) -> int:
    """Write ``(point, record)`` pairs to ``path`` (``.csv`` or ``.jsonl``), sorted by
    send time within each point; return how many were written.

    Raises:
        ConfigError: another suffix, or a file that cannot be written.
    """
    ordered = sorted(requests, key=lambda pr: (pr[0], pr[1].sent_s))
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise ConfigError(f"{path}: --requests writes .jsonl or .csv, not {suffix or 'no suffix'}")
    try:
        with path.open("w", encoding="utf-8", newline="") as fh:
            if suffix == ".csv":
                writer = csv.DictWriter(fh, [*REQUEST_COLUMNS, "itl_count", "itl_mean_ms"])
                writer.writeheader()
                for point, r in ordered:
                    gaps = r.inter_token_gaps_s
                    row = _row(point, r)
                    row["itl_count"] = len(gaps)
                    row["itl_mean_ms"] = _ms(sum(gaps) / len(gaps)) if gaps else None
                    writer.writerow(row)
            else:
                for point, r in ordered:
                    row = _row(point, r)
                    row["itl_ms"] = [round(g * 1000.0, 4) for g in r.inter_token_gaps_s]
                    if len(r.request_ids) > 1:  # the retried attempts' ids too
                        row["request_ids"] = [i.as_dict() for i in r.request_ids]
                    fh.write(json.dumps(row, separators=(",", ":")) + "\n")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the requests file: {exc}") from exc
    return len(ordered)
