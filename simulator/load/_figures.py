"""From what the workers measured to one point's figures, merged exactly.

Workers share one run clock (the schedule's zero), so their raw records and samples are
concatenated and summarised once: the percentiles are those of the pooled samples, not
an average of the workers' percentiles.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._plural import counted
from ._driver import DriveOutcome, Pause
from ._records import RequestRecord
from ._result import (
    ClientFigures,
    ConversationFigures,
    InputTokenAccuracy,
    PointResult,
    TimelineEntry,
    Window,
    point_result,
)
from ._slo import Goodput, SLOs
from ._stats import summarize

__all__ = ["Thresholds", "InputCheck", "merged_result"]


@dataclass(frozen=True)
class Thresholds:
    """When the load generator's own figures make a run invalid."""

    max_schedule_delay_ms: float = 10.0
    max_loop_lag_ms: float = 10.0
    max_worker_cpu: float = 0.95
    min_rate_ratio: float = 0.95
    max_paused_share: float = 0.5
    """The share of the window 429s may keep the key paused: past it, the run measured
    the provider's rate limit rather than the server."""


@dataclass(frozen=True)
class InputCheck:
    """What a first turn's prompt should count: ``base`` tokens (template, system
    prompt) plus the asked input, per session id."""

    method: str
    tokens_per_word: float
    base_tokens: dict[str, float]
    asked: dict[str, int]


def _window(outcomes: Sequence[DriveOutcome]) -> Window:
    return Window(min(o.window.start_s for o in outcomes), max(o.window.end_s for o in outcomes))


def _conversations(
    outcomes: Sequence[DriveOutcome],
    records: Sequence[RequestRecord],
    window: Window,
    slos: SLOs | None,
) -> tuple[ConversationFigures, float | None]:
    met: dict[str, bool] = defaultdict(lambda: True)
    if slos is not None:
        for r in records:
            met[r.session_id] = met[r.session_id] and slos.met_by(r)
    sessions = [s for o in outcomes for s in o.sessions]
    started = sum(1 for r in records if r.opens_session and r.sent_s in window)
    ended = [s for s in sessions if s.ended_s in window]
    completed = [s for s in ended if not s.failed and s.turns_done == s.turns_planned]
    failed = sum(1 for s in ended if s.failed)
    good = sum(1 for s in completed if met[s.session_id]) if slos is not None else None
    share = None if good is None or not completed else good / len(completed)
    figures = ConversationFigures(
        started=started,
        completed=len(completed),
        failed=failed,
        per_s=len(completed) / window.duration_s,
        meeting_slo_share=share,
    )
    return figures, None if good is None else good / window.duration_s


def _client(outcomes: Sequence[DriveOutcome], window: Window) -> ClientFigures:
    seconds = window.duration_s
    lags = np.concatenate([np.asarray(o.loop_lag_s, dtype=np.float64) for o in outcomes])
    return ClientFigures(
        workers=len(outcomes),
        cpu_cores=sum(o.cpu_s for o in outcomes) / seconds,
        max_worker_cpu=max(o.cpu_s / o.window.duration_s for o in outcomes),
        event_loop_lag_ms=summarize(lags, 1000.0),
        mean_in_flight=sum(o.mean_in_flight for o in outcomes),
        max_in_flight=sum(o.max_in_flight for o in outcomes),
        mean_sessions=sum(o.mean_sessions for o in outcomes),
        max_sessions=sum(o.max_sessions for o in outcomes),
        held_by_max_concurrency=sum(o.held_by_cap for o in outcomes),
        event_loop=outcomes[0].event_loop,
        worker_schedule_delay_p99_ms=[_delay_p99(o, window) for o in outcomes],
    )


def _delay_p99(outcome: DriveOutcome, window: Window) -> float | None:
    delays = [
        r.schedule_delay_s
        for r in outcome.records
        if r.schedule_delay_s is not None and r.sent_s in window
    ]
    return summarize(np.asarray(delays, dtype=np.float64), 1000.0).p99 if delays else None


def _timeline(outcomes: Sequence[DriveOutcome]) -> list[TimelineEntry]:
    """The workers' seconds added up, second by second (each samples once a second)."""
    rows: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for o in outcomes:
        for p in o.timeline:
            row = rows[round(p.t_s)]
            row[0] += p.in_flight
            row[1] += p.sessions
            row[2] += p.completed
            row[3] += p.failed
    return [
        TimelineEntry(t_s=float(t), in_flight=r[0], sessions=r[1], completed=r[2], failed=r[3])
        for t, r in sorted(rows.items())
    ]


def _input_accuracy(
    records: Sequence[RequestRecord], window: Window, check: InputCheck
) -> InputTokenAccuracy:
    errors = [
        100.0
        * (r.input_tokens - check.base_tokens[r.session_id] - check.asked[r.session_id])
        / check.asked[r.session_id]
        for r in records
        if r.opens_session
        and r.ok
        and r.sent_s in window
        and r.input_tokens is not None
        and r.token_source != "estimate"
        and check.asked.get(r.session_id)
    ]
    absolute = np.abs(np.asarray(errors, dtype=np.float64))
    return InputTokenAccuracy(
        method=check.method,
        tokens_per_word=check.tokens_per_word,
        requests=len(errors),
        error_pct_p50=float(np.median(errors)) if errors else None,
        error_pct_max=float(absolute.max()) if errors else None,
    )


def merged_result(
    outcomes: Sequence[DriveOutcome],
    *,
    slos: SLOs | None = None,
    target_rate: float | None = None,
    concurrency: int | None = None,
    thresholds: Thresholds = Thresholds(),
    input_check: InputCheck | None = None,
) -> PointResult:
    """One point's figures from the outcomes of its workers (one or more)."""
    window = _window(outcomes)
    records = [r for o in outcomes for r in o.records]
    client = _client(outcomes, window)
    reasons: list[str] = []
    lag_p99 = client.event_loop_lag_ms.p99
    if lag_p99 is not None and lag_p99 > thresholds.max_loop_lag_ms:
        reasons.append(
            f"the load generator's event loop lagged: p99 {lag_p99:.1f} ms above "
            f"{thresholds.max_loop_lag_ms:g} ms, so latencies include the client's own delay"
        )
    spun = any(o.spins for o in outcomes)
    if client.max_worker_cpu >= thresholds.max_worker_cpu and not spun:
        reasons.append(
            f"the load generator was CPU-bound ({client.max_worker_cpu:.2f} of a core in its "
            "busiest worker): the client, not the server, may have set the pace; add --workers "
            "or lower the load"
        )
    if client.held_by_max_concurrency:
        reasons.append(
            f"--max-concurrency held back {client.held_by_max_concurrency} arrivals: the "
            "offered load was below the target"
        )
    refused = sum(o.quota_refused for o in outcomes)
    if refused:
        asked = max((o.quota_asked_s or 0.0 for o in outcomes), default=0.0)
        reasons.append(
            f"{counted(refused, 'request')} failed with "
            f"QuotaExhausted: the server asked to wait "
            f"{asked:g} s (Retry-After), more than max_retry_after, so a quota is probably "
            "used up; the run stopped there, and its figures do not show what the server "
            "can serve"
        )
    paused = _paused_s(outcomes, window)
    rate_notes: list[str] = []
    if paused > 0:
        share = paused / window.duration_s
        said = (
            f"429 answers paused sending for {paused:.1f} s of the {window.duration_s:.1f} s "
            f"window ({share:.0%}, Retry-After)"
        )
        if share > thresholds.max_paused_share:
            reasons.append(f"{said}: the run measured the rate limit, not the server")
        else:
            rate_notes.append(said)
    stopped = {o.stopped_by for o in outcomes}
    if "max_errors" in stopped:
        reasons.append("the run stopped at --max-errors")
    point = point_result(
        records,
        window,
        slos=slos,
        target_rate=target_rate,
        max_schedule_delay_ms=thresholds.max_schedule_delay_ms,
        min_rate_ratio=thresholds.min_rate_ratio,
        invalid_reasons=reasons,
    )
    conversations, good_conversations = _conversations(outcomes, records, window, slos)
    goodput = point.goodput
    if goodput is not None and good_conversations is not None:
        goodput = Goodput(
            requests_per_s=goodput.requests_per_s, conversations_per_s=good_conversations
        )
    first = [r for r in ("max_errors", "quota_exhausted", "interrupted") if r in stopped]
    stopped_by = first[0] if first else min(stopped)
    interrupted = any(o.interrupted for o in outcomes)
    return point.model_copy(
        update={
            "goodput": goodput,
            "conversations": conversations,
            "client": client,
            "input_tokens": None
            if input_check is None
            else _input_accuracy(records, window, input_check),
            "stopped_by": stopped_by,
            "concurrency": concurrency,
            "notes": [n for o in outcomes for n in o.notes]
            + rate_notes
            + _token_notes(records)
            + (
                [
                    "sends were timed by spinning the last 1.5 ms before each, so the client's "
                    "CPU includes waiting and is not used to judge saturation (the send delay "
                    "and the event loop's lag are)"
                ]
                if spun and client.max_worker_cpu >= thresholds.max_worker_cpu
                else []
            ),
            "timeline": _timeline(outcomes),
            "partial": interrupted,
            "partial_reason": "interrupted" if interrupted else None,
        }
    )


def _paused_s(outcomes: Sequence[DriveOutcome], window: Window) -> float:
    """Seconds of ``window`` in which 429s kept some worker's key paused (the union of
    the workers' pauses)."""
    clipped = sorted(
        Pause(max(p.start_s, window.start_s), min(p.end_s, window.end_s))
        for o in outcomes
        for p in o.pauses
        if p.end_s > window.start_s and p.start_s < window.end_s
    )
    total, reach = 0.0, window.start_s
    for start, end in clipped:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _token_notes(records: list[RequestRecord]) -> list[str]:
    """What the token figures rest on, when not on the server's own counts."""
    done = [r for r in records if r.ok]
    tokenized = sum(1 for r in done if r.token_source == "tokenizer")
    estimated = sum(1 for r in done if r.token_source == "estimate")
    notes = []
    if tokenized:
        notes.append(
            f"{tokenized} of {counted(len(done), 'answer')} came without usage: their tokens "
            "were counted "
            "with the server's tokenizer"
        )
    if estimated:
        notes.append(
            f"{estimated} of {counted(len(done), 'answer')} came without usage and the server "
            "has no "
            "tokenize endpoint: their tokens are estimates (output: the streamed chunks, "
            "one token each on llama.cpp and vLLM, else four characters a token; input: four "
            "characters a token)"
        )
    return notes
