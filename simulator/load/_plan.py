"""A whole load run: settings, the adapter, calibration, workers, sweep, and the result.

:func:`run_load` is what ``convsim load`` and Python callers run. With ``workers`` above
1, each worker is a process with its own event loop, adapter and share of the work: an
open-loop schedule is computed once here and dealt out arrival by arrival, a closed
loop's sessions are split, and rate budgets (``rpm``, ``tpm``) are divided so that the
workers together keep to them. Their raw measurements are merged exactly.

A :class:`StopRequest` (what ``convsim load`` makes of SIGINT and SIGTERM) ends the run
early wherever it runs: no point starts after it, the running one keeps what it
measured until then, and the result is marked partial.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from convsim._errors import ConfigError, ConvsimError, MissingExtra
from convsim._extras import needs_extra
from convsim._log import get_logger
from convsim.adapters import ModelPool, split_limits, takes_argument

from ._arrivals import ArrivalPattern, Schedule, read_trace
from ._calibrate import Calibration, calibrate
from ._distributions import parse_distribution, parse_synthetic
from ._driver import DriveOutcome, LoadShape, drive, open_schedule
from ._figures import InputCheck, Thresholds, merged_result
from ._hf_dataset import HF_PREFIX, read_hf_dataset
from ._monitor import Progress
from ._mooncake import (
    DEFAULT_BLOCK_SIZE,
    MooncakeSessions,
    MooncakeTrace,
    is_mooncake,
    read_mooncake,
)
from ._names import DEFAULT_SYNTHETIC
from ._offered import session_requests
from ._quality import check_metrics, score_transcripts
from ._records import RequestRecord
from ._result import LoadResult, PointResult, QualitySummary, SweepResult, sweep_result
from ._scraper import ServerScraper, check_prometheus_extra, metrics_url
from ._slo import merge_objectives, parse_slos
from ._stop import NothingMeasured, StopRequest, ThreadedStop
from ._workers import Ended, Job, collect, run_processes
from ._workloads import PackSessions, ShareGPTSessions, SyntheticSessions, Workload, read_sharegpt

__all__ = ["LoadPlan", "LoadRun", "Progress", "run_load", "DEFAULT_SYNTHETIC"]

log = get_logger("convsim.load")

_OPEN_LOOP_POOL = 4096
_KILL_AFTER_S = 5.0
"""Seconds workers get to answer a stop at once before they are killed."""


class LoadPlan(BaseModel):
    """Everything a load run needs, as plain data (it is sent to worker processes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "openai-compatible:mock-model"
    model_args: dict[str, str] = Field(default_factory=dict)
    synthetic: str | None = None
    pack: str | None = None
    dataset: str | None = None
    """A ShareGPT file, or ``hf:NAME[:SPLIT]``: a dataset of the ``datasets`` library."""
    columns: str | None = None
    """With ``hf:``: convsim's fields and the dataset's columns (``prompt=COL,...``)."""
    dataset_turns: Literal["all", "first"] = "all"
    """``first``: each conversation's first user turn alone (as vLLM sends ShareGPT)."""
    repeat: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    """max_tokens for pack and dataset turns (synthetic sessions say their own)."""
    exact_output: bool = True
    concurrency: int | None = Field(default=None, ge=1)
    rate: float | None = Field(default=None, gt=0)
    """Open loop: session arrivals per second (a session sends all its turns)."""
    request_rate: float | None = Field(default=None, gt=0)
    """Open loop in requests per second, as vLLM counts: for workloads whose sessions
    send one request each, where it is the same as :attr:`rate`."""
    arrival: ArrivalPattern = "poisson"
    burstiness: float = Field(default=1.0, gt=0)
    trace: str | None = None
    """Arrival times (one per line), or a Mooncake trace (JSON lines with ``hash_ids``),
    which brings its requests' prompts too."""
    block_size: int | None = Field(default=None, ge=1)
    """Tokens per hash id of a Mooncake trace (512 when not given)."""
    max_concurrency: int | None = Field(default=None, ge=1)
    duration: float | None = Field(default=None, gt=0)
    max_requests: int | None = Field(default=None, ge=1)
    max_errors: int | None = Field(default=None, ge=1)
    warmup: float = Field(default=0.0, ge=0)
    ramp_up: float = Field(default=0.0, ge=0)
    cooldown: float = Field(default=0.0, ge=0)
    think_time: str = "0"
    seed: int = 0
    workers: int = Field(default=1, ge=1)
    backend: Literal["local", "ray"] = "local"
    """``ray``: the workers are Ray tasks (``--actors``), on a local Ray or a cluster."""
    ray_address: str | None = None
    loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The event loop: uvloop where installed (``auto``), or as named."""
    sweep: str | None = None
    slo: str | None = None
    goodput: str | None = None
    """vLLM's form of objectives (``ttft:500 tpot:50``, ms), beside :attr:`slo`."""
    calibrate: bool = True
    preflight: bool = True
    max_schedule_delay_ms: float = 10.0
    max_loop_lag_ms: float = 10.0
    metrics: str | None = None
    """Metrics (comma-separated) to score each completed pack conversation with, after
    each point has run."""
    drain_timeout: float = Field(default=60.0, gt=0)
    interrupt_grace: float = Field(default=5.0, ge=0)
    """Seconds the requests in flight get when the run is stopped early (a first SIGINT
    or SIGTERM); a second stop cancels them at once."""
    otel: Literal["otlp", "console"] | None = None
    """Trace every request with OpenTelemetry (the extra ``otel``): in this process
    through the application's global providers (``convsim load --otel`` sets them up to
    export as named), in worker processes through providers each sets up to export to
    ``otlp`` (the ``OTEL_EXPORTER_OTLP_*`` variables) or the ``console``. None: off."""
    server_metrics: str | None = None
    """Scrape the server's Prometheus metrics from this URL during the run; ``auto``:
    the base URL's origin with ``/metrics``, given up on (and said so) when it is not
    there. None: not scraped."""
    server_metrics_interval: float = Field(default=5.0, gt=0)
    """Seconds between two scrapes within a point (each point is also scraped at its
    start and its end)."""

    @property
    def objectives(self) -> str | None:
        """The objectives of :attr:`slo` and :attr:`goodput` together, as ``--slo``
        text; None without either.

        Raises:
            ConfigError: either is invalid, or both set one metric.
        """
        return merge_objectives(self.slo, self.goodput)


# -- building the pieces ------------------------------------------------------------


_ROLE = "model under test"


def _model_args(
    plan: LoadPlan, worker: int = 0, workers: int = 1, *, stream: bool = True
) -> dict[str, Any]:
    """The adapter's arguments in worker ``worker`` of ``workers``: its share of rpm
    and tpm, streamed (a probe is not), never retried (a retried request hides what
    the server did), and over the lean HTTP/1.1 seam where the adapter has one (the
    client's CPU per request caps what one worker can drive; ``http=aiohttp`` keeps
    aiohttp)."""
    args = split_limits(plan.model_args, workers)[worker]
    args["stream"] = args.get("stream", "true") if stream else "false"
    args.setdefault("max_retries", "0")
    if "http" not in args and takes_argument(plan.model, "http"):
        args["http"] = "lean"
    return args


def _mooncake(plan: LoadPlan) -> MooncakeTrace | None:
    """The plan's trace when it is in Mooncake's form (it then brings the prompts).

    Raises:
        ConfigError: a bad Mooncake trace, or ``block_size`` without one.
    """
    if plan.trace is not None and is_mooncake(plan.trace):
        return read_mooncake(plan.trace, plan.block_size or DEFAULT_BLOCK_SIZE)
    if plan.block_size is not None:
        raise ConfigError("--block-size goes with a Mooncake trace (--trace FILE with hash_ids)")
    return None


def _trace_schedule(plan: LoadPlan) -> Schedule:
    assert plan.trace is not None
    trace = _mooncake(plan)
    return trace.schedule() if trace is not None else read_trace(plan.trace)


def _workload(plan: LoadPlan, calibration: Calibration | None) -> Workload:
    given = [x for x in (plan.synthetic, plan.pack, plan.dataset) if x is not None]
    if len(given) > 1:
        raise ConfigError("give one workload: --synthetic, --pack or --dataset")
    text = calibration.text if calibration is not None else None
    exact = plan.exact_output and (calibration is None or calibration.exact_output)
    trace = _mooncake(plan)
    if trace is not None:
        if given:
            raise ConfigError(
                "a Mooncake trace brings its requests' prompts: drop --synthetic, --pack "
                "or --dataset"
            )
        return MooncakeSessions(
            trace, seed=plan.seed, exact_output=exact, **({} if text is None else {"text": text})
        )
    if plan.pack is not None:
        from convsim.scenarios import load_pack

        pack = load_pack(plan.pack, seed=plan.seed)  # dataset.size samples by the seed
        return PackSessions(
            pack.conversations, repeat=plan.repeat, seed=plan.seed, max_tokens=plan.output_tokens
        )
    hf = plan.dataset is not None and plan.dataset.startswith(HF_PREFIX)
    if plan.columns is not None and not hf:
        raise ConfigError("--columns goes with --dataset hf:NAME (a datasets dataset)")
    if plan.dataset is not None:
        conversations = tuple(
            read_hf_dataset(plan.dataset, plan.columns) if hf else read_sharegpt(plan.dataset)
        )
        kwargs: dict[str, Any] = {} if text is None else {"text": text}
        return ShareGPTSessions(
            conversations,
            seed=plan.seed,
            repeat=plan.repeat,
            max_tokens=plan.output_tokens,
            exact_output=exact,
            first_turn_only=plan.dataset_turns == "first",
            **kwargs,
        )
    if plan.dataset_turns != "all":
        raise ConfigError("--dataset-turns goes with --dataset")
    workload = parse_synthetic(plan.synthetic or DEFAULT_SYNTHETIC)
    kwargs = {} if text is None else {"text": text}
    return SyntheticSessions(workload, seed=plan.seed, exact_output=exact, **kwargs)


def _pool_size(plan: LoadPlan, concurrency: int | None) -> int:
    if concurrency is not None:
        return concurrency
    return plan.max_concurrency or _OPEN_LOOP_POOL


def _shape(plan: LoadPlan, *, concurrency: int | None, rate: float | None) -> LoadShape:
    think = parse_distribution(plan.think_time, what="--think-time")
    schedule = _trace_schedule(plan) if plan.trace is not None and rate is None else None
    if concurrency is None and rate is None and schedule is None:
        raise ConfigError("give --concurrency N (closed loop), --rate R (open loop) or --trace")
    return LoadShape(
        concurrency=concurrency,
        rate=rate if concurrency is None else None,
        arrival=plan.arrival,
        burstiness=plan.burstiness,
        schedule=schedule,
        max_concurrency=plan.max_concurrency,
        duration=plan.duration,
        max_requests=plan.max_requests,
        max_errors=plan.max_errors,
        warmup=plan.warmup,
        ramp_up=plan.ramp_up,
        cooldown=plan.cooldown,
        think_time=think,
        seed=plan.seed,
        drain_timeout=plan.drain_timeout,
        interrupt_grace=plan.interrupt_grace,
        keep_transcripts=bool(plan.metrics),
    )


def _metric_names(plan: LoadPlan) -> list[str]:
    return [n.strip() for n in (plan.metrics or "").split(",") if n.strip()]


def _pack_conversations(plan: LoadPlan) -> list[Any]:
    from convsim.scenarios import load_pack

    assert plan.pack is not None
    return list(load_pack(plan.pack).conversations)


def _check_metrics(plan: LoadPlan) -> None:
    """Fail before any request on metrics a load run cannot score."""
    if not plan.metrics:
        return
    if plan.pack is None:
        raise ConfigError(
            "--metrics needs --pack: the scorers check what the pack's scenarios declare "
            "(facts, goals)"
        )
    if not _metric_names(plan):
        raise ConfigError("--metrics: give one metric name or more, comma-separated")
    check_metrics(_metric_names(plan), _pack_conversations(plan))


async def _quality(
    plan: LoadPlan, outcomes: Sequence[DriveOutcome]
) -> dict[str, QualitySummary] | None:
    """The point's completed conversations scored, in a worker thread after the point."""
    if not plan.metrics:
        return None
    conversations = {c.conversation_id: c for c in _pack_conversations(plan)}
    metrics = check_metrics(_metric_names(plan), list(conversations.values()))
    transcripts = [t for o in outcomes for t in o.transcripts]
    return await anyio.to_thread.run_sync(score_transcripts, transcripts, conversations, metrics)


def _input_check(
    outcomes: Sequence[DriveOutcome], workload: Workload, calibration: Calibration | None
) -> InputCheck | None:
    if calibration is None or calibration.method == "none":
        return None
    if not isinstance(workload, SyntheticSessions):
        return None
    base: dict[str, float] = {}
    asked: dict[str, int] = {}
    for outcome in outcomes:
        for record in outcome.records:
            if not record.opens_session or record.session_id in asked:
                continue
            index = int(record.session_id[1:])
            script = workload.session(index)
            turn = script.turns[0]
            if turn.input_tokens is None:
                continue
            asked[record.session_id] = turn.input_tokens
            base[record.session_id] = calibration.first_turn_base(script.prefix_tokens)
    return InputCheck(calibration.method, calibration.tokens_per_word, base, asked)


# -- one point, in this process or in workers ------------------------------------------


@dataclass(frozen=True)
class _Share:
    """One worker's part of a point."""

    index: int
    workers: int
    concurrency: int | None
    schedule: Schedule | None
    start_at_wall: float


def _split(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def _worker_shape(shape: LoadShape, share: _Share) -> LoadShape:
    max_concurrency = shape.max_concurrency
    if max_concurrency is not None:
        max_concurrency = max(1, _split(max_concurrency, share.workers, share.index))
    max_requests = shape.max_requests
    if max_requests is not None:
        max_requests = max(1, _split(max_requests, share.workers, share.index))
    max_errors = shape.max_errors
    if max_errors is not None:
        max_errors = max(1, _split(max_errors, share.workers, share.index))
    return replace(
        shape,
        concurrency=share.concurrency,
        rate=None,
        schedule=share.schedule,
        max_concurrency=max_concurrency,
        max_requests=max_requests,
        max_errors=max_errors,
        session_offset=share.index,
        session_stride=share.workers,
    )


async def _drive_here(
    plan: LoadPlan,
    shape: LoadShape,
    calibration: Calibration | None,
    start_at: float | None,
    worker: int = 0,
    workers: int = 1,
    on_progress: Callable[[Progress], None] | None = None,
    label: str = "",
    stop: StopRequest | None = None,
) -> DriveOutcome:
    workload = _workload(plan, calibration)
    telemetry = None
    if plan.otel is not None:
        from convsim._otel import OpenTelemetry

        telemetry = OpenTelemetry()
    async with ModelPool(concurrency=_pool_size(plan, shape.concurrency)) as models:
        adapter = models.get(plan.model, _model_args(plan, worker, workers), role=_ROLE)
        return await drive(
            adapter,
            workload,
            shape,
            start_at=start_at,
            on_progress=on_progress,
            label=label,
            stop=stop,
            telemetry=telemetry,
        )


async def _drive_stoppable(
    plan: LoadPlan,
    shape: LoadShape,
    calibration: Calibration | None,
    start_at: float,
    share: _Share,
    stops: ThreadedStop,
) -> DriveOutcome:
    async with stops.serves() as stop:
        return await _drive_here(
            plan, shape, calibration, start_at, share.index, share.workers, stop=stop
        )


def _worker_main(
    plan: LoadPlan,
    shape: LoadShape,
    share: _Share,
    calibration: Calibration | None,
    stops: ThreadedStop,
) -> DriveOutcome:
    """A worker (a process, or a Ray actor's thread): its own event loop on the shared
    run clock; ``stops`` brings it the parent's stop requests."""
    from convsim._gc import tune_gc_for_throughput

    tune_gc_for_throughput()
    worker_shape = _worker_shape(shape, share)
    start_at = time.perf_counter() + (share.start_at_wall - time.time())
    exported = None
    if plan.otel is not None:  # a process of its own: its own providers
        from convsim._otel import set_up_sdk

        exported = set_up_sdk(plan.otel)
    try:
        return anyio.run(
            _drive_stoppable,
            plan,
            worker_shape,
            calibration,
            start_at,
            share,
            stops,
            backend_options=event_loop_options(plan.loop),
        )
    finally:
        if exported is not None:
            exported.shutdown()


def event_loop_options(choice: str) -> dict[str, Any]:
    """anyio's options for the event loop ``choice`` names (``auto``: uvloop where it
    is installed, as it makes the client's own share of each request smaller).

    Raises:
        MissingExtra: ``uvloop`` asked for and not installed (the ``uvloop`` extra).
    """
    if choice == "asyncio":
        return {}
    try:
        with needs_extra("uvloop", "--loop uvloop"):
            import uvloop  # noqa: F401
    except MissingExtra:
        if choice == "uvloop":
            raise
        return {}
    return {"use_uvloop": True}


def _deal(schedule: Schedule, workers: int) -> list[Schedule]:
    """Arrival ``i`` goes to worker ``i % workers``: each share spans the whole run."""
    return [
        Schedule(
            schedule.offsets[w::workers],
            schedule.input_tokens[w::workers],
            schedule.output_tokens[w::workers],
        )
        for w in range(workers)
    ]


@dataclass(frozen=True)
class _Measured:
    """What the workers of a point measured, and what the figures leave out."""

    outcomes: list[DriveOutcome]
    notes: list[str] = field(default_factory=list)


def _measured(ends: Sequence[Ended]) -> _Measured:
    """The workers' outcomes; a worker stopped before the window measured nothing, and
    one killed after a stop at once lost its share (a note says so).

    Raises:
        ConvsimError: a worker raised it, or ended without an answer unasked.
    """
    outcomes: list[DriveOutcome] = []
    notes: list[str] = []
    for index, end in enumerate(ends):
        if isinstance(end.error, NothingMeasured):
            continue
        if end.error is not None:
            raise end.error
        if end.killed:
            notes.append(
                f"worker {index} did not answer within {_KILL_AFTER_S:g} s of the stop and "
                "was killed: its share of the load is not in the figures"
            )
        elif not end.answered:
            raise ConvsimError(
                f"load worker {index} ended without a result (exit code {end.exit_code}); "
                "its measurements are lost"
            )
        else:
            outcomes.append(end.value)
    return _Measured(outcomes, notes)


async def _drive_workers(
    plan: LoadPlan, shape: LoadShape, calibration: Calibration | None, stop: StopRequest
) -> _Measured:
    workers = plan.workers
    # time for the processes (or Ray's workers) to start before the shared clock's zero
    start_at_wall = time.time() + (5.0 if plan.backend == "ray" else 1.0) + 0.2 * workers
    if shape.open_loop:
        shares = [
            _Share(w, workers, None, s, start_at_wall)
            for w, s in enumerate(_deal(open_schedule(shape), workers))
        ]
    else:
        assert shape.concurrency is not None
        if shape.concurrency < workers:
            raise ConfigError(
                f"--concurrency {shape.concurrency} is below --workers {workers}: each worker "
                "needs at least one session"
            )
        shares = [
            _Share(w, workers, _split(shape.concurrency, workers, w), None, start_at_wall)
            for w in range(workers)
        ]
    if plan.backend == "ray":
        return _measured(await _drive_on_ray(plan, shape, shares, calibration, stop))
    jobs = [Job(_worker_main, (plan, shape, share, calibration)) for share in shares]
    return _measured(await run_processes(jobs, stop, kill_after=_KILL_AFTER_S))


async def _drive_on_ray(
    plan: LoadPlan,
    shape: LoadShape,
    shares: list[_Share],
    calibration: Calibration | None,
    stop: StopRequest,
) -> list[Ended]:
    """The same shares as worker processes, as Ray actors: each runs its own event loop
    on the shared wall-clock start (its share of the schedule, or of the sessions)."""
    from convsim.distributed._ray import ensure_ray

    ray = ensure_ray(plan.ray_address, num_cpus=max(2, len(shares)))
    # a second thread hears stop requests while the first runs the share
    actor: Any = ray.remote(num_cpus=1, max_concurrency=2)(_RayLoadWorker)
    actors: list[Any] = [actor.remote() for _ in shares]
    try:
        # the clock's zero is set once every worker has started and imported what it
        # runs: a worker still starting would send its first requests late
        with anyio.CancelScope() as starting, stop.listening(lambda _: starting.cancel()):
            await anyio.to_thread.run_sync(
                ray.get, [a.ready.remote() for a in actors], abandon_on_cancel=True
            )
        if stop.asked:
            return []
        start_at_wall = time.time() + 1.0
        workers = [
            _RayWorker(
                ray,
                a,
                a.run.remote(plan, shape, replace(share, start_at_wall=start_at_wall), calibration),
            )
            for a, share in zip(actors, shares, strict=True)
        ]
        return await collect(workers, stop, kill_after=_KILL_AFTER_S)
    finally:
        for a in actors:
            ray.kill(a)


class _RayLoadWorker:
    """A Ray actor running one share of a load test (see :func:`_worker_main`)."""

    def __init__(self) -> None:
        self.stops = ThreadedStop()

    def ready(self) -> bool:
        return True  # this module and its imports are loaded: the actor can start at once

    def run(
        self, plan: LoadPlan, shape: LoadShape, share: _Share, calibration: Calibration | None
    ) -> DriveOutcome:
        return _worker_main(plan, shape, share, calibration, self.stops)

    def stop(self, at_once: bool) -> None:
        self.stops.ask(at_once)


@dataclass(frozen=True)
class _RayWorker:
    """A :class:`_RayLoadWorker` running its share, as :func:`collect` drives it."""

    ray: Any
    actor: Any
    ref: Any

    def tell(self, at_once: bool) -> None:
        self.actor.stop.remote(at_once)

    def result(self) -> Ended:
        try:
            return Ended(self.ray.get(self.ref))
        except self.ray.exceptions.RayActorError:
            return Ended(answered=False)
        except self.ray.exceptions.RayTaskError as exc:
            return Ended(error=exc)

    def kill(self) -> None:
        self.ray.kill(self.actor)


@dataclass(frozen=True)
class _Point:
    result: PointResult
    records: list[RequestRecord]


async def _run_point(
    plan: LoadPlan,
    *,
    concurrency: int | None,
    rate: float | None,
    calibration: Calibration | None,
    on_progress: Callable[[Progress], None] | None = None,
    label: str = "",
    stop: StopRequest,
) -> _Point | None:
    """One point's figures; None when it was stopped before measuring anything."""
    shape = _shape(plan, concurrency=concurrency, rate=rate)
    if plan.workers > 1:
        measured = await _drive_workers(plan, shape, calibration, stop)
    else:
        try:
            here = await _drive_here(
                plan, shape, calibration, None, on_progress=on_progress, label=label, stop=stop
            )
        except NothingMeasured:
            return None
        measured = _Measured([here])
    outcomes = measured.outcomes
    if not outcomes:
        return None
    objectives = plan.objectives
    slos = parse_slos(objectives) if objectives else None
    target = rate if concurrency is None and rate is not None else outcomes[0].target_rate
    if concurrency is not None:
        target = None
    result = merged_result(
        outcomes,
        slos=slos,
        target_rate=target,
        concurrency=concurrency,
        thresholds=Thresholds(
            max_schedule_delay_ms=plan.max_schedule_delay_ms,
            max_loop_lag_ms=plan.max_loop_lag_ms,
        ),
        input_check=_input_check(outcomes, _workload(plan, calibration), calibration),
    )
    if result.target_rate is not None:
        per_session = session_requests(_workload(plan, calibration)).mean
        if per_session is not None:
            result = result.model_copy(
                update={"target_request_rate": result.target_rate * per_session}
            )
    notes = list(calibration.notes) if calibration is not None else []
    notes.extend(measured.notes)
    if stop.asked and plan.metrics:
        notes.append("the run was stopped early: its conversations were not scored (--metrics)")
    quality = None if stop.asked else await _quality(plan, outcomes)
    result = result.model_copy(update={"notes": [*notes, *result.notes], "quality": quality})
    return _Point(result, [r for o in outcomes for r in o.records])


# -- sweeps -----------------------------------------------------------------------------


def _sweep_values(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(
            f"invalid --sweep {text!r}: expected 'auto', 'auto:N' or a list of numbers"
        ) from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise ConfigError(f"invalid --sweep {text!r}: every value must be above 0")
    return values


def _saturated(point: PointResult, first: PointResult) -> bool:
    """The server no longer kept up at ``point``: its median end-to-end latency is three
    times that of the sweep's lightest point, or a tenth of its requests failed."""
    sent = point.requests.completed + point.requests.failed
    if sent and point.requests.failed / sent > 0.1:
        return True
    now, base = point.latency_ms.e2e.p50, first.latency_ms.e2e.p50
    return now is not None and base is not None and now > 3 * base


_Measure = Callable[..., Awaitable[_Point | None]]
"""Measures one point: called as :func:`_run_point` is."""


@dataclass
class _Runner:
    """Runs the points of one plan, keeping every request for the per-request file.

    ``measure`` is :func:`_run_point`; a test passes points built from records it wrote,
    so that what the sweep decides does not hang on a busy machine's timings.
    """

    plan: LoadPlan
    calibration: Calibration | None
    report: Callable[[str], None]
    on_progress: Callable[[Progress], None] | None
    records: list[tuple[int, RequestRecord]]
    stop: StopRequest
    points: list[PointResult] = field(default_factory=list)
    measure: _Measure = _run_point
    scraper: ServerScraper | None = None
    """Reads the server's ``/metrics`` over each point (``--server-metrics``)."""

    async def point(self, *, concurrency: int | None, rate: float | None) -> PointResult | None:
        """The next point, kept in :attr:`points`; None when a stop came before it
        measured anything."""
        if self.stop.asked:
            return None
        index = len(self.points)
        if concurrency is not None:
            label = f"concurrency {concurrency}"
        elif rate is not None:
            label = f"rate {rate:.3g}/s"
        else:
            label = "trace"
        async with self.scraper.watching(index) if self.scraper is not None else _nothing():
            done = await self.measure(
                self.plan,
                concurrency=concurrency,
                rate=rate,
                calibration=self.calibration,
                on_progress=self.on_progress,
                label=label,
                stop=self.stop,
            )
        if done is None:
            return None
        result = done.result
        if self.scraper is not None:
            result = result.model_copy(update={"server_metrics": self.scraper.figures(index)})
        self.records.extend((index, r) for r in done.records)
        self.points.append(result)
        return result

    async def sweep(self) -> SweepResult | None:
        """The sweep's points (those measured before a stop, if one came)."""
        await self.sweep_points()
        if not self.points:
            return None
        return sweep_result(self.points, partial_reason="interrupted" if self.stop.asked else None)

    async def sweep_points(self) -> None:
        plan = self.plan
        assert plan.sweep is not None
        text = plan.sweep.strip().lower()
        if text.startswith("auto"):
            _, _, n = text.partition(":")
            try:
                count = int(n) if n else 3
            except ValueError:
                raise ConfigError(f"invalid --sweep {plan.sweep!r}: expected auto:N") from None
            if count < 1:
                raise ConfigError("--sweep auto:N needs N of at least 1")
            self.report("sweep: measuring the synchronous rate (concurrency 1)")
            sync = await self.point(concurrency=1, rate=None)
            saturation = plan.concurrency or 64
            if sync is None or self.stop.asked:
                return
            self.report(f"sweep: measuring the saturated rate (concurrency {saturation})")
            top = await self.point(concurrency=saturation, rate=None)
            if top is None or self.stop.asked:
                return
            low, high = sync.achieved_rate, top.achieved_rate
            if not (high > low > 0):
                raise ConfigError(
                    f"--sweep auto: the saturated rate ({high:.3g}/s) is not above the "
                    f"synchronous one ({low:.3g}/s); give the rates with --sweep R1,R2,..."
                )
            values = [low + (high - low) * (k + 1) / (count + 1) for k in range(count)]
            by_concurrency = False
        else:
            values = _sweep_values(text)
            by_concurrency = plan.concurrency is not None
        for value in values:
            if by_concurrency:
                self.report(f"sweep: concurrency {int(value)}")
                point = await self.point(concurrency=int(value), rate=None)
            else:
                self.report(f"sweep: rate {value:.3g}/s")
                point = await self.point(concurrency=None, rate=value)
            if point is None or self.stop.asked:
                return
            if _saturated(point, self.points[0]):
                self.report("sweep: the server saturated; stopping")
                return


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


# -- the run ---------------------------------------------------------------------------------


def _per_request(plan: LoadPlan) -> LoadPlan:
    """``plan`` with its ``request_rate`` as the session rate: the same, for sessions
    of one request each.

    Raises:
        ConfigError: beside ``--rate`` or ``--concurrency``, or with sessions that send
            more than one request.
    """
    if plan.rate is not None:
        raise ConfigError(
            "give one of --rate (sessions per second) and --request-rate (requests per second)"
        )
    if plan.concurrency is not None:
        raise ConfigError("give one of --concurrency (closed loop) and --request-rate (open loop)")
    requests = session_requests(_workload(plan, None))
    if not requests.single:
        sends = (
            "tool turns, whose requests depend on the model's calls"
            if requests.mean is None
            else f"{requests.mean:.3g} requests per session on average"
        )
        raise ConfigError(
            f"--request-rate counts requests per second, for sessions of one request each; "
            f"this workload's sessions send more ({sends}): give --rate in sessions per "
            "second, or a single-turn workload (--synthetic turns=1, --dataset-turns first)"
        )
    return plan.model_copy(update={"rate": plan.request_rate})


@dataclass(frozen=True)
class LoadRun:
    """A finished load run: its result, and every request it sent (with the index of
    the point it belongs to, 0 without a sweep)."""

    result: LoadResult | SweepResult | None
    """None only when a stop request came before anything was measured; after one that
    came later, the result is ``partial``."""
    requests: list[tuple[int, RequestRecord]]


async def run_load(
    plan: LoadPlan,
    *,
    report: Callable[[str], None] = lambda _line: None,
    on_progress: Callable[[Progress], None] | None = None,
    stop: StopRequest | None = None,
) -> LoadRun:
    """Run the load test ``plan`` describes.

    ``report`` gets a line at each step (calibration, each sweep point); ``on_progress``
    a snapshot about twice a second while a point runs in this process. ``stop`` ends
    the run early (``stop.ask()``, from this event loop): sending stops, the requests in
    flight get ``plan.interrupt_grace`` (none after a second ask), worker processes and
    actors are stopped (and killed if they do not answer), and what was measured comes
    back marked partial.

    Raises:
        ConfigError: settings that do not fit together, or a workload that cannot load.
        EndpointError: the preflight check found the server unusable.
    """
    if plan.request_rate is not None:
        plan = _per_request(plan)
    if plan.sweep is None and plan.concurrency is None and plan.rate is None and not plan.trace:
        raise ConfigError("give --concurrency N (closed loop), --rate R (open loop) or --trace")
    if plan.concurrency is not None and plan.rate is not None:
        raise ConfigError("give one of --concurrency (closed loop) and --rate (open loop)")
    if plan.objectives:
        parse_slos(plan.objectives)  # fail before any request
    if plan.sweep is not None and not plan.sweep.strip().lower().startswith("auto"):
        _sweep_values(plan.sweep)
    parse_distribution(plan.think_time, what="--think-time")
    if plan.trace is not None:
        _trace_schedule(plan)
    if plan.workers > (os.cpu_count() or 1) * 4:
        raise ConfigError(f"--workers {plan.workers} is far above this machine's CPUs")
    _workload(plan, None)  # a bad pack or dataset fails before any request
    _check_metrics(plan)
    if plan.server_metrics is not None:
        check_prometheus_extra()
    stop = stop or StopRequest()
    calibration: Calibration | None = None
    base_url: str | None = None
    async with ModelPool(concurrency=8) as models:
        # probes are not streamed: some servers (llama-cpp-python) send usage only then
        probe = models.get(plan.model, _model_args(plan, stream=False), role=_ROLE)
        base_url = _base_url(plan, probe)
        # nothing is measured yet: a stop ends the checks at once
        with anyio.CancelScope() as probing, stop.listening(lambda _: probing.cancel()):
            if plan.preflight:
                await models.preflight()
            if plan.calibrate:
                report("calibrating input lengths against the server")
                calibration = await calibrate(probe, exact_output=plan.exact_output)
    runner = _Runner(plan, calibration, report, on_progress, [], stop)
    async with AsyncExitStack() as stack:
        if plan.server_metrics is not None:
            url = metrics_url(plan.server_metrics, base_url)
            if url is None:
                report(
                    "server metrics: the model has no base URL to find /metrics by; "
                    "give it: --server-metrics URL. Going on without them"
                )
            else:
                runner.scraper = await stack.enter_async_context(
                    ServerScraper(url, interval_s=plan.server_metrics_interval, report=report)
                )
        if plan.sweep is not None:
            result: LoadResult | SweepResult | None = await runner.sweep()
        else:
            point = await runner.point(concurrency=plan.concurrency, rate=plan.rate)
            result = None if point is None else LoadResult.of(point)
    if result is not None and runner.scraper is not None:
        result = result.model_copy(update={"server_metrics_timeline": runner.scraper.timeline()})
    return LoadRun(result, runner.records)


def _base_url(plan: LoadPlan, adapter: Any) -> str | None:
    """The model's base URL: given in its arguments, or its adapter's default."""
    given = plan.model_args.get("base_url")
    if given:
        return given
    config = getattr(adapter, "config", None)
    url = getattr(config, "base_url", None)
    return url if isinstance(url, str) else None
