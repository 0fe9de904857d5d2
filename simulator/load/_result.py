"""The JSON result of a load run: a versioned schema, and the figures built from records.

Field names are a contract (plots, dashboards and CI checks read them): ``valid``,
``invalid_reasons``, ``target_rate``, ``achieved_rate``, ``requests``, ``throughput``,
``latency_ms``, ``schedule_delay_ms``, ``goodput``, ``by_turn``, ``reasoning_tokens``,
``tools``, ``target_request_rate``, ``prefix_cache``, ``server_metrics``; a run has
``server_metrics_timeline``; a sweep has ``points`` and ``max_rate_meeting_slo``;
``partial`` and ``partial_reason`` say that a run was stopped early. Raise
:data:`SCHEMA_VERSION` when one changes meaning.

A request belongs to the measured window when it was sent inside it, so warm-up and
cool-down are left out by time. Latencies are those of the completed requests in the
window; rates are per second of the window.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from .._plural import counted
from ..results._prefix_cache import PrefixCacheFigures, PrefixCacheFold
from ._records import RequestRecord
from ._server_figures import ServerFigures, ServerSample
from ._slo import Goodput, SLOs, goodput
from ._stats import LatencySummary, summarize

__all__ = [
    "SCHEMA_VERSION",
    "Window",
    "RequestCounts",
    "Throughput",
    "LatencyMs",
    "ReasoningTokens",
    "ToolFigures",
    "TurnLatency",
    "TurnFigures",
    "ConversationFigures",
    "ClientFigures",
    "InputTokenAccuracy",
    "TimelineEntry",
    "PointResult",
    "LoadResult",
    "SweepResult",
    "point_result",
    "sweep_result",
]

SCHEMA_VERSION = 1
"""The version of the result schema written as ``schema_version``."""

_MS = 1000.0


@dataclass(frozen=True)
class Window:
    """The measured part of a run, ``[start_s, end_s)`` on the run's clock."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not self.end_s > self.start_s:
            raise ValueError(f"a window must end after it starts, got {self}")

    @property
    def duration_s(self) -> float:
        """How long the window lasts."""
        return self.end_s - self.start_s

    def __contains__(self, time_s: float) -> bool:
        return self.start_s <= time_s < self.end_s


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RequestCounts(_Model):
    """Requests sent in the window: completed, failed, and failures by error class."""

    completed: int
    failed: int
    errors_by_class: dict[str, int]


class Throughput(_Model):
    """Completed requests and their tokens per second (where the counts came from:
    :attr:`PointResult.token_sources`)."""

    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


class LatencyMs(_Model):
    """Latencies of the completed requests, in ms. ``itl`` pools every inter-token gap.
    ``ttft`` is the time to the first token of any kind, ``ttfot`` to the first answer
    token (after a reasoning model's thoughts; the same as ``ttft`` for a model that
    does not reason aloud; no samples in a result written before it was measured)."""

    ttft: LatencySummary
    tpot: LatencySummary
    itl: LatencySummary
    e2e: LatencySummary
    ttfot: LatencySummary = LatencySummary()


class ReasoningTokens(_Model):
    """The reasoning tokens of the completed requests whose server reported them
    (``completion_tokens_details.reasoning_tokens``): a part of their output tokens."""

    requests: int
    """Completed requests that reported reasoning tokens (zero included)."""
    total: int
    per_request: LatencySummary
    """Each reporting request's count (tokens, not ms)."""


class ToolFigures(_Model):
    """Tool turns' requests in the window (the workload answers every tool call with
    its given result: no tool runs, so these are the model's figures alone)."""

    requests: int
    """Completed requests that offered tools."""
    replies_with_tool_calls: int
    """Of those, the replies that asked for tools rather than answering in text."""
    tool_calls: int
    """Tool calls those replies asked for (several per reply with parallel calls)."""
    tool_rounds: int
    """Completed requests sent with the tool results of a previous reply."""
    failed: int
    """Requests that offered tools and failed."""


class TurnLatency(_Model):
    """Median and 99th percentile, in ms."""

    p50: float | None
    p99: float | None


class TurnFigures(_Model):
    """Latency at one turn depth: how context length moves TTFT and end-to-end latency."""

    turn_index: int
    count: int
    """Completed requests at this turn."""
    mean_history_messages: float
    ttft_ms: TurnLatency
    e2e_ms: TurnLatency
    ttfot_ms: TurnLatency = TurnLatency(p50=None, p99=None)
    """To the first answer token (null in a result written before it was measured)."""


class ConversationFigures(_Model):
    """Sessions (conversations) of the window: those that ended in it, by outcome."""

    started: int
    """Sessions whose first request was sent in the window."""
    completed: int
    """Sessions that ended in the window with every turn answered."""
    failed: int
    """Sessions that ended in the window on a failed request."""
    per_s: float
    """Completed conversations per second of the window."""
    meeting_slo_share: float | None
    """Share of the completed conversations whose every request met every SLO; null
    without SLOs or without a completed conversation."""


class ClientFigures(_Model):
    """The load generator measuring itself: when it set the pace, the run is invalid."""

    workers: int
    cpu_cores: float
    """CPU the load generator used in the window, in cores (all workers together)."""
    max_worker_cpu: float
    """The busiest worker's CPU, in cores (1.0: saturated)."""
    event_loop_lag_ms: LatencySummary
    """How late the workers' event loops woke for a 10 ms tick (pooled)."""
    mean_in_flight: float
    """Requests in flight, time-weighted mean over the window (all workers)."""
    max_in_flight: int
    mean_sessions: float
    """Sessions alive (holding a slot, also while thinking), time-weighted mean."""
    max_sessions: int
    held_by_max_concurrency: int
    """Arrivals that waited because ``--max-concurrency`` sessions were alive."""
    event_loop: str = "asyncio"
    """The workers' event loop: ``asyncio`` or ``uvloop``."""
    worker_schedule_delay_p99_ms: list[float | None] = []
    """Each worker's send delay p99 (ms), in worker order: one overloaded worker (or Ray
    node) shows here even when the pooled figure hides it."""


class InputTokenAccuracy(_Model):
    """How close first turns' prompts came to the input length asked, in the server's
    tokens: ``(prompt tokens - expected) / asked input`` per request, in percent."""

    method: str
    """How text was sized: ``tokenize`` (the server's endpoint), ``usage`` (probes'
    prompt counts) or ``none`` (one word per token assumed)."""
    tokens_per_word: float
    requests: int
    error_pct_p50: float | None
    error_pct_max: float | None
    """Largest absolute error."""


class TimelineEntry(_Model):
    """The run second by second (run clock): for throughput and in-flight plots."""

    t_s: float
    in_flight: int
    sessions: int
    completed: int
    failed: int


class QualitySummary(_Model):
    """One metric over the conversations a point completed (``--metrics``), scored after
    the point ran, so scoring never shares the event loop with the timings."""

    scored: int
    """Conversations with a value."""
    not_applicable: int
    failed: int
    mean: float | None
    p10: float | None
    p50: float | None
    p90: float | None


class PointResult(_Model):
    """The figures of one run, or of one point of a sweep."""

    valid: bool
    invalid_reasons: list[str]
    target_rate: float | None
    """Session arrivals per second asked for; null in closed loop."""
    achieved_rate: float
    """Sessions started per second in the window."""
    duration_s: float
    requests: RequestCounts
    throughput: Throughput
    latency_ms: LatencyMs
    schedule_delay_ms: LatencySummary
    """Actual minus scheduled send time: how far the client lagged its schedule."""
    goodput: Goodput | None
    """Null when no SLOs were given."""
    meets_slo: bool | None
    """Whether the point meets every SLO (:meth:`~convsim.load.SLOs.judge`): null
    without SLOs, and for an invalid point, whose figures judge nothing."""
    by_turn: list[TurnFigures]
    conversations: ConversationFigures | None = None
    client: ClientFigures | None = None
    input_tokens: InputTokenAccuracy | None = None
    reasoning_tokens: ReasoningTokens | None = None
    """Null when no completed request of the window reported reasoning tokens: nothing
    was measured (a server that does not report them, or a model that does not reason)."""
    tools: ToolFigures | None = None
    """Null when no request of the window offered tools."""
    token_sources: dict[str, int] = {}
    """Completed requests by where their token counts came from: ``server`` (its
    usage), ``tokenizer`` (its tokenize endpoint, as ``convsim run`` counts) or
    ``estimate``; sources with no request are left out."""
    stopped_by: str | None = None
    """What ended the sending: duration, max_requests, max_errors, workload."""
    concurrency: int | None = None
    """Sessions asked for in closed loop; null in open loop."""
    notes: list[str] = []
    timeline: list[TimelineEntry] = []
    quality: dict[str, QualitySummary] | None = None
    """Each ``--metrics`` metric over the point's completed conversations; null without."""
    partial: bool = False
    """The point was stopped before its end: its figures are those of what was measured
    until then (the window ends where sending stopped; requests cut short are left out)."""
    partial_reason: str | None = None
    """Why it is partial: ``interrupted`` (SIGINT or SIGTERM, or a caller's stop request)."""
    target_request_rate: float | None = None
    """Requests per second the target session rate offers: ``target_rate`` times the
    workload's mean requests per session (equal to it for single-turn sessions); null
    in closed loop, and with tool turns, whose requests depend on the model's calls."""
    prefix_cache: PrefixCacheFigures | None = None
    """The server's prefix-cache hit rate over the completed requests of the window that
    reported cached tokens, overall and by turn depth (``hit_rate`` null, with a
    ``reason``, when none did); null in a result written before it was measured."""
    server_metrics: ServerFigures | None = None
    """The server's own figures scraped from its ``/metrics`` over the point
    (``--server-metrics``); null when not asked or not available."""


class LoadResult(PointResult):
    """A whole run's result, as written to ``--out``."""

    schema_version: int = SCHEMA_VERSION
    server_metrics_timeline: list[ServerSample] | None = None
    """Each scrape of the server's ``/metrics`` over the run (``--server-metrics``)."""

    @classmethod
    def of(cls, point: PointResult) -> LoadResult:
        """The run result holding ``point``'s figures."""
        return cls(**dict(point))


class SweepResult(_Model):
    """A sweep: one point per rate or concurrency, and the highest rate meeting the SLOs."""

    schema_version: int = SCHEMA_VERSION
    valid: bool
    invalid_reasons: list[str]
    points: list[PointResult]
    max_rate_meeting_slo: float | None
    """The highest rate (target, or achieved in closed loop) of a point whose
    ``meets_slo`` is true (valid, and meeting every SLO); null without SLOs or when no
    point met them."""
    partial: bool = False
    """The sweep was stopped before its end: ``points`` holds what was measured."""
    partial_reason: str | None = None
    """Why it is partial: ``interrupted``."""
    server_metrics_timeline: list[ServerSample] | None = None
    """Each scrape of the server's ``/metrics`` over the sweep (``--server-metrics``)."""


def _prefix_cache(done: Sequence[RequestRecord]) -> PrefixCacheFigures:
    fold = PrefixCacheFold()
    for r in done:
        fold.add(r.turn_index, r.input_tokens or 0, r.cached_tokens)
    return fold.figures()


def _turn_latency(values: Sequence[float]) -> TurnLatency:
    summary = summarize(values, _MS)
    return TurnLatency(p50=summary.p50, p99=summary.p99)


def _by_turn(done: Sequence[RequestRecord]) -> list[TurnFigures]:
    groups: dict[int, list[RequestRecord]] = defaultdict(list)
    for record in done:
        groups[record.turn_index].append(record)
    return [
        TurnFigures(
            turn_index=turn,
            count=len(group),
            mean_history_messages=sum(r.history_messages for r in group) / len(group),
            ttft_ms=_turn_latency([r.ttft_s for r in group if r.ttft_s is not None]),
            e2e_ms=_turn_latency([r.e2e_s for r in group]),
            ttfot_ms=_turn_latency([r.ttfot_s for r in group if r.ttfot_s is not None]),
        )
        for turn, group in sorted(groups.items())
    ]


def _reasoning_tokens(done: Sequence[RequestRecord]) -> ReasoningTokens | None:
    counts = [r.reasoning_tokens for r in done if r.reasoning_tokens is not None]
    if not counts:
        return None
    return ReasoningTokens(requests=len(counts), total=sum(counts), per_request=summarize(counts))


def _tool_figures(measured: Sequence[RequestRecord]) -> ToolFigures | None:
    offered = [r for r in measured if r.offered_tools]
    if not offered:
        return None
    done = [r for r in offered if r.ok]
    return ToolFigures(
        requests=len(done),
        replies_with_tool_calls=sum(1 for r in done if r.tool_calls),
        tool_calls=sum(r.tool_calls for r in done),
        tool_rounds=sum(1 for r in done if r.tool_round),
        failed=len(offered) - len(done),
    )


def point_result(
    records: Iterable[RequestRecord],
    window: Window,
    *,
    slos: SLOs | None = None,
    target_rate: float | None = None,
    max_schedule_delay_ms: float = 10.0,
    min_rate_ratio: float = 0.95,
    invalid_reasons: Sequence[str] = (),
) -> PointResult:
    """The figures of the requests sent inside ``window``.

    The result is invalid, with a reason in words, when no request completed, when the
    schedule delay p99 exceeds ``max_schedule_delay_ms``, or when fewer sessions started
    than the schedule asked for in the window (below ``min_rate_ratio`` of it): the
    client, not the server, set the pace. ``invalid_reasons`` adds the driver's own
    (CPU saturated, a concurrency cap that bit).
    """
    every = list(records)
    measured = [r for r in every if r.sent_s in window]
    done = [r for r in measured if r.ok]
    errors = Counter(r.error for r in measured if r.error is not None)
    seconds = window.duration_s
    output_tokens = sum(r.output_tokens or 0 for r in done)
    input_tokens = sum(r.input_tokens or 0 for r in done)
    latency = LatencyMs(
        ttft=summarize([r.ttft_s for r in done if r.ttft_s is not None], _MS),
        tpot=summarize([t for r in done if (t := r.tpot_s) is not None], _MS),
        itl=summarize([g for r in done for g in r.inter_token_gaps_s], _MS),
        e2e=summarize([r.e2e_s for r in done], _MS),
        ttfot=summarize([r.ttfot_s for r in done if r.ttfot_s is not None], _MS),
    )
    delays = summarize([d for r in measured if (d := r.schedule_delay_s) is not None], _MS)
    started = sum(1 for r in measured if r.opens_session)
    reasons = list(invalid_reasons)
    if not done:
        reasons.append("no request completed in the measured window")
    if delays.p99 is not None and delays.p99 > max_schedule_delay_ms:
        reasons.append(
            f"the client lagged its schedule: send delay p99 {delays.p99:.1f} ms is above "
            f"{max_schedule_delay_ms:g} ms"
        )
    if target_rate is not None:
        due = sum(
            1
            for r in every
            if r.opens_session and r.scheduled_s is not None and r.scheduled_s in window
        )
        if due and started < min_rate_ratio * due:
            reasons.append(
                f"the client fell behind: {counted(started, 'session')} started in the "
                f"window, {due} scheduled ({started / seconds:.2f}/s against "
                f"{due / seconds:.2f}/s)"
            )
    return PointResult(
        valid=not reasons,
        invalid_reasons=reasons,
        target_rate=target_rate,
        achieved_rate=started / seconds,
        duration_s=seconds,
        requests=RequestCounts(
            completed=len(done), failed=len(measured) - len(done), errors_by_class=dict(errors)
        ),
        throughput=Throughput(
            requests_per_s=len(done) / seconds,
            output_tokens_per_s=output_tokens / seconds,
            total_tokens_per_s=(input_tokens + output_tokens) / seconds,
        ),
        latency_ms=latency,
        schedule_delay_ms=delays,
        goodput=None if slos is None else goodput(measured, slos, seconds),
        meets_slo=None if slos is None else slos.judge(dict(latency), valid=not reasons),
        by_turn=_by_turn(done),
        reasoning_tokens=_reasoning_tokens(done),
        tools=_tool_figures(measured),
        prefix_cache=_prefix_cache(done),
        token_sources=dict(Counter(r.token_source for r in done if r.token_source is not None)),
    )


def sweep_result(
    points: Sequence[PointResult], *, partial_reason: str | None = None
) -> SweepResult:
    """The sweep made of ``points``; it is valid when every point is. With
    ``partial_reason``, the sweep was stopped before its end."""
    reasons = [
        f"point {i} ({p.target_rate if p.target_rate is not None else p.achieved_rate:g}/s): "
        f"{reason}"
        for i, p in enumerate(points)
        for reason in p.invalid_reasons
    ]
    meeting = [
        p.target_rate if p.target_rate is not None else p.achieved_rate
        for p in points
        if p.meets_slo  # True only for a valid point (SLOs.judge)
    ]
    return SweepResult(
        valid=not reasons,
        invalid_reasons=reasons,
        points=list(points),
        max_rate_meeting_slo=max(meeting, default=None),
        partial=partial_reason is not None or any(p.partial for p in points),
        partial_reason=partial_reason
        or next((p.partial_reason for p in points if p.partial), None),
    )
