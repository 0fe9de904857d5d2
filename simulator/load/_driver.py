"""The load driver: sessions against a model adapter, closed or open loop, measured.

Closed loop: ``concurrency`` slots, each running one session after another; a session
holds its slot through all its turns and think times. Open loop: sessions start on an
arrival schedule computed in advance, each at ``start + offset`` however late the others
are (no coordinated omission); ``max_concurrency`` caps the sessions alive at once and
every arrival it held back is counted.

Every request becomes a :class:`RequestRecord` (cheap, unvalidated) with its scheduled
and actual send times: for a session's first turn its arrival, for a later turn the end
of the turn before plus the think time. The measured window leaves out ramp-up and
warm-up at the start and the cool-down at the end.

A :class:`~convsim.load._stop.StopRequest` ends a run early: sending stops, the requests
in flight get ``interrupt_grace`` (none on a second request), and the window ends where
sending stopped; the outcome says it was interrupted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel
import numpy as np

from convsim._errors import AdapterError, ConfigError, QuotaExhausted, RateLimited
from convsim._gauges import InFlight, LoopMonitor
from convsim._telemetry import Telemetry, using_telemetry
from convsim._types import Completion, GenerationParams, Message, ToolSpec
from convsim.adapters import ModelAdapter

from .._plural import counted
from ._arrivals import ArrivalPattern, Schedule, arrival_schedule
from ._distributions import Distribution, Fixed
from ._monitor import Progress, TimelinePoint
from ._records import RequestRecord
from ._result import Window
from ._stop import NothingMeasured, StopRequest
from ._workloads import SessionScript, TurnScript, Workload

__all__ = [
    "LoadShape",
    "SessionRecord",
    "SessionTranscript",
    "TranscriptTurn",
    "DriveOutcome",
    "Pause",
    "drive",
    "open_schedule",
    "ramped",
]

_SPIN_S = 0.0015
"""Sends are timed by sleeping until this much before they are due, then yielding to
the loop until they are: asyncio's timers wake up to a millisecond late."""


@dataclass(frozen=True)
class LoadShape:
    """How load is offered, and when the run stops.

    Exactly one of ``concurrency`` (closed loop), ``rate`` (open loop at a generated
    schedule) and ``schedule`` (open loop at given arrivals: a trace, or one worker's
    share) is set.
    """

    concurrency: int | None = None
    rate: float | None = None
    arrival: ArrivalPattern = "poisson"
    burstiness: float = 1.0
    schedule: Schedule | None = None
    max_concurrency: int | None = None
    duration: float | None = None
    """Seconds of the measured window (after ramp-up and warm-up)."""
    max_requests: int | None = None
    """Measured requests to send; then the run stops sending."""
    max_errors: int | None = None
    """Failed requests after which the run stops, marked invalid."""
    warmup: float = 0.0
    ramp_up: float = 0.0
    cooldown: float = 0.0
    think_time: Distribution = field(default_factory=lambda: Fixed(0.0))
    seed: int = 0
    drain_timeout: float = 60.0
    """Seconds the requests still in flight at the end get to finish."""
    interrupt_grace: float = 5.0
    """Seconds the requests in flight get when a stop request ends the run early."""
    session_offset: int = 0
    session_stride: int = 1
    """This worker runs sessions ``offset, offset + stride, ...`` of the workload."""
    keep_transcripts: bool = False
    """Keep each completed session's turns, to score them after the run."""

    def __post_init__(self) -> None:
        modes = sum(x is not None for x in (self.concurrency, self.rate, self.schedule))
        if modes != 1:
            raise ConfigError("give exactly one of --concurrency and --rate (or a trace)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        for name in ("warmup", "ramp_up", "cooldown"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be 0 or more, got {value}")
        if self.duration is not None and not self.duration > 0:
            raise ConfigError(f"--duration must be above 0, got {self.duration}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ConfigError(f"--max-requests must be at least 1, got {self.max_requests}")

    @property
    def open_loop(self) -> bool:
        return self.concurrency is None

    @property
    def lead_in(self) -> float:
        """Seconds before the measured window starts."""
        return self.ramp_up + self.warmup


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One session: when it was due and started (run clock), how it ended."""

    session_id: str
    scheduled_s: float | None
    started_s: float
    ended_s: float
    turns_planned: int
    turns_done: int
    failed: bool


class _Answer(NamedTuple):
    """A turn's answer; not ``whole`` when sending stopped between its tool rounds."""

    text: str
    whole: bool = True


@dataclass(frozen=True, slots=True)
class TranscriptTurn:
    """One turn of a kept transcript: what was said, and how the call went."""

    turn_id: str | None
    user: str
    answer: str
    latency_s: float
    ttft_s: float | None
    input_tokens: int | None
    output_tokens: int | None


@dataclass(frozen=True, slots=True)
class SessionTranscript:
    """A session that ran all its turns (``LoadShape.keep_transcripts``)."""

    session_id: str
    system: str | None
    turns: tuple[TranscriptTurn, ...]


class Pause(NamedTuple):
    """When 429s kept the provider key from sending, on the run clock (seconds)."""

    start_s: float
    end_s: float


@dataclass
class DriveOutcome:
    """Everything one drive measured. Times are on the run clock (seconds from start)."""

    records: list[RequestRecord]
    sessions: list[SessionRecord]
    window: Window
    target_rate: float | None
    loop_lag_s: list[float]
    cpu_s: float
    """CPU seconds this process used during the measured window."""
    spins: int
    """Sends in the window timed by spinning the last moments before them: the CPU
    figure then includes waiting, and does not show saturation."""
    mean_in_flight: float
    max_in_flight: int
    mean_sessions: float
    max_sessions: int
    held_by_cap: int
    """Arrivals that waited for a slot under ``max_concurrency``."""
    stopped_by: str
    """``duration``, ``max_requests``, ``max_errors``, ``quota_exhausted``, ``workload``,
    ``interrupted`` or ``cancelled``."""
    timeline: list[TimelinePoint]
    notes: list[str]
    event_loop: str = "asyncio"
    """``uvloop`` or ``asyncio``."""
    transcripts: list[SessionTranscript] = field(default_factory=list)
    """Completed sessions' turns, when the shape keeps them."""
    pauses: list[Pause] = field(default_factory=list)
    """When 429s paused the key (from the failed requests' errors), merged where they
    overlap: time in which the client offered no load."""
    quota_refused: int = 0
    """Requests that failed with QuotaExhausted: a 429 asked for a wait beyond the
    adapter's max_retry_after (a quota used up), or came while the key refused calls."""
    quota_asked_s: float | None = None
    """The longest wait those 429s asked for, in seconds."""
    interrupted: bool = False
    """A stop request ended the run before its end: the figures are partial."""


def ramped(offsets: np.ndarray, ramp_up: float) -> np.ndarray:
    """Arrival offsets at a rate that grows linearly from 0 over ``ramp_up`` seconds,
    then stays: each offset of the full-rate schedule is mapped through the inverse of
    the ramped arrival count (the schedule stays the same random draw)."""
    if ramp_up <= 0:
        return offsets
    half = ramp_up / 2
    return np.where(offsets < half, np.sqrt(2 * ramp_up * offsets), offsets + half)


def open_schedule(shape: LoadShape) -> Schedule:
    """The arrivals of an open-loop shape: its given schedule, or one generated for its
    rate over the whole run (lead-in, window and cool-down), ramped up."""
    if shape.schedule is not None:
        return shape.schedule
    if shape.rate is None:
        raise ConfigError("a closed-loop shape has no arrival schedule")
    horizon = (
        shape.lead_in + shape.duration + shape.cooldown if shape.duration is not None else None
    )
    if horizon is not None:
        full = arrival_schedule(
            shape.arrival,
            shape.rate,
            duration=horizon,
            burstiness=shape.burstiness,
            seed=shape.seed,
        )
    elif shape.max_requests is not None:
        # sessions hold one request or more: this many arrivals outlast max_requests
        count = shape.max_requests + math.ceil(shape.rate * shape.lead_in) + 1
        full = arrival_schedule(
            shape.arrival, shape.rate, count=count, burstiness=shape.burstiness, seed=shape.seed
        )
    else:
        raise ConfigError("an open-loop run needs --duration or --max-requests")
    offsets = ramped(full.offsets, shape.ramp_up)
    if horizon is not None:
        offsets = offsets[offsets < horizon]
    none: tuple[int | None, ...] = (None,) * offsets.size
    return Schedule(offsets, none, none)


class _Gauges(NamedTuple):
    """In-flight requests and alive sessions over the measured window."""

    mean_in_flight: float
    max_in_flight: int
    mean_sessions: float
    max_sessions: int


class _Driver:
    def __init__(
        self,
        adapter: ModelAdapter,
        workload: Workload,
        shape: LoadShape,
        *,
        clock: Callable[[], float],
        start_at: float | None,
        on_progress: Callable[[Progress], None] | None = None,
        label: str = "",
        stop_request: StopRequest | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.stop_request = stop_request or StopRequest()
        self.telemetry = telemetry
        """Where each request is traced (a span each); None: not traced."""
        self.model_name: tuple[str, str] | None = None
        """The model and provider spans name (found at the first traced request)."""
        self.on_progress = on_progress
        self.label = label
        self.adapter = adapter
        self.workload = workload
        self.shape = shape
        self.clock = clock
        self.aligned = start_at is not None
        self.t0 = start_at if start_at is not None else clock()
        self.records: list[RequestRecord] = []
        self.sessions: list[SessionRecord] = []
        self.monitor = LoopMonitor(clock=clock)
        self.in_flight = InFlight(clock)
        self.alive = InFlight(clock)
        self.window_start = shape.lead_in
        self.window_end = math.inf if shape.duration is None else shape.lead_in + shape.duration
        self.send_until = self.window_end + shape.cooldown
        self.sending = True
        self.stopped_by = "workload"
        self.measured_sent = 0
        self.failed = 0
        self.completed = 0
        self.held_by_cap = 0
        self.next_session = 0
        self.think_rng = np.random.default_rng([shape.seed, shape.session_offset, 0x7417])
        self.stop_event = anyio.Event()
        self.cpu_at_window: float | None = None
        self.spins = 0
        """Sends timed by spinning in the measured window (CPU spent waiting)."""
        self.cpu_s = 0.0
        self.timeline: list[TimelinePoint] = []
        self.notes: list[str] = []
        self.last_send = 0.0
        self.params_by_length: dict[tuple[int | None, bool], GenerationParams] = {}
        self.gauges: _Gauges | None = None
        self.transcripts: list[SessionTranscript] = []
        self.pauses: list[Pause] = []
        self.quota_refused = 0
        self.quota_asked_s: float | None = None
        self.interrupted = False
        self.stopped_at = math.inf
        """When sending stopped (run clock)."""
        self.drain_until = math.inf
        """When the requests still in flight after sending stopped are cancelled."""
        self.drain_moved = anyio.Event()
        self.starting = anyio.CancelScope()
        """The endpoint check and the wait for the clock's zero: a stop ends them."""
        self.offering = anyio.CancelScope()
        """The open loop's arrivals: a stop ends the wait for the next one."""

    # -- time -----------------------------------------------------------------------

    def now(self) -> float:
        return self.clock() - self.t0

    async def until(self, at: float) -> None:
        """Sleep until ``at`` on the run clock: a timer to just before, then yields."""
        delay = at - self.now() - _SPIN_S
        if delay > 0:
            await anyio.sleep(delay)
        if self.now() < at and self.cpu_at_window is not None:
            self.spins += 1
        while self.now() < at:
            await anyio.lowlevel.checkpoint()

    def stop(self, reason: str) -> None:
        if self.sending:
            self.sending = False
            self.stopped_by = reason
            self.stopped_at = self.now()
            self.stop_event.set()
            self.offering.cancel()
            self.gauges = self.read_gauges()  # the window's, not the drain's after it

    def interrupt(self, at_once: bool) -> None:
        """A stop request: stop sending; the requests in flight get the grace, or are
        cancelled at once."""
        self.interrupted = True
        self.starting.cancel()
        self.stop("interrupted")
        self.end_drain_within(0.0 if at_once else self.shape.interrupt_grace)

    def end_drain_within(self, seconds: float) -> None:
        self.drain_until = min(self.drain_until, self.now() + seconds)
        self.drain_moved.set()

    def read_gauges(self) -> _Gauges:
        return _Gauges(
            self.in_flight.mean(), self.in_flight.peak, self.alive.mean(), self.alive.peak
        )

    # -- sessions ---------------------------------------------------------------------

    def take_session(self) -> SessionScript | None:
        size = self.workload.size
        k = self.next_session
        index = self.shape.session_offset + k * self.shape.session_stride
        if size is not None and index >= size:
            return None
        self.next_session += 1
        return self.workload.session(index)

    async def run_session(self, script: SessionScript, scheduled: float | None) -> None:
        self.alive.change(+1)
        started = self.now()
        done = 0
        failed = False
        messages: list[Message] = []
        if script.system:
            messages.append(Message(role="system", content=script.system))
        due = scheduled if scheduled is not None else started
        kept: list[TranscriptTurn] | None = [] if self.shape.keep_transcripts else None
        try:
            for index, turn in enumerate(script.turns):
                if index:
                    think = float(self.shape.think_time.sample(self.think_rng, 1)[0])
                    due = self.now() + think
                    if think > 0:
                        await self.until(due)
                if not self.sending or self.now() >= self.send_until:
                    break
                text = turn.user if isinstance(turn.user, str) else turn.user(messages)
                messages.append(Message(role="user", content=text))
                answer = await self.answer(script, index, messages, turn, due)
                if answer is None:
                    failed = True
                    break
                if not answer.whole:
                    break
                done += 1
                messages.append(Message(role="assistant", content=answer.text))
                if kept is not None:
                    kept.append(_transcript_turn(turn, text, answer.text, self.records[-1]))
        finally:
            if kept is not None and done == len(script.turns):
                self.transcripts.append(
                    SessionTranscript(script.session_id, script.system, tuple(kept))
                )
            self.alive.change(-1)
            self.sessions.append(
                SessionRecord(
                    script.session_id,
                    scheduled,
                    started,
                    self.now(),
                    len(script.turns),
                    done,
                    failed,
                )
            )

    async def answer(
        self,
        script: SessionScript,
        index: int,
        messages: list[Message],
        turn: TurnScript,
        due: float,
    ) -> _Answer | None:
        """One turn's answer: one request, or for a tool turn as many as the model's
        calls for tools take (each answered with the workload's results, appended to
        ``messages``, and sent at once), each measured as a request; None when one
        failed."""
        completion = await self.request(script, index, messages, turn, due)
        rounds = 0
        while (
            completion is not None
            and completion.tool_calls
            and turn.tools
            and rounds < turn.max_tool_rounds
        ):
            if not self.sending or self.now() >= self.send_until:
                return _Answer(completion.text, whole=False)
            messages.append(
                Message(role="assistant", content=completion.text, tool_calls=completion.tool_calls)
            )
            messages.extend(turn.tool_message(call) for call in completion.tool_calls)
            rounds += 1
            completion = await self.request(
                script, index, messages, turn, self.now(), tool_round=rounds
            )
        return None if completion is None else _Answer(completion.text)

    async def request(
        self,
        script: SessionScript,
        index: int,
        messages: Sequence[Message],
        turn: TurnScript,
        due: float,
        *,
        tool_round: int = 0,
    ) -> Completion | None:
        params = self.params(turn.max_tokens, turn.exact_output, turn.tools)
        called = self.now()
        measured = called >= self.window_start
        if measured:
            self.measured_sent += 1
            if (
                self.shape.max_requests is not None
                and self.measured_sent >= self.shape.max_requests
            ):
                self.stop("max_requests")
        self.last_send = called
        self.in_flight.change(+1)
        try:
            if self.telemetry is None:
                completion = await self.adapter.generate(messages, params)
            else:
                completion = await self.traced(script, index, tool_round, messages, params)
        except AdapterError as exc:
            end = self.now()
            self.records.append(
                RequestRecord(
                    script.session_id,
                    index,
                    len(messages),
                    due,
                    called,
                    None,
                    None,
                    (),
                    end,
                    None,
                    None,
                    type(exc).__name__,
                    tool_round=tool_round,
                    offered_tools=bool(turn.tools),
                    request_ids=exc.request_ids,
                )
            )
            self.failed += 1
            if isinstance(exc, RateLimited):
                self.rate_limited(exc, end)
            if self.shape.max_errors is not None and self.failed >= self.shape.max_errors:
                self.stop("max_errors")
            return None
        finally:
            self.in_flight.change(-1)
        timings = completion.timings
        # the answer ended before the adapter counted its tokens (a server with no usage)
        end = self.now() - timings.count_s
        # the wire send of the answering attempt; queueing in the client counts as delay
        sent = max(called, end - timings.total_s)
        # the adapter's figures, as `convsim run` records them: the server's, its
        # tokenizer's, or an estimate (a stream's chunks), each with its source
        usage = completion.usage
        from_chunks = usage.source == "estimate" and timings.ttft_s is not None
        self.records.append(
            RequestRecord(
                script.session_id,
                index,
                len(messages),
                due,
                sent,
                timings.ttft_s,
                timings.ttft_s,
                timings.inter_token_s,
                end,
                usage.prompt_tokens,
                usage.completion_tokens,
                output_from_chunks=from_chunks,
                token_source=usage.source,
                ttfot_s=timings.ttfot_s,
                reasoning_tokens=completion.reasoning_tokens,
                tool_round=tool_round,
                tool_calls=len(completion.tool_calls),
                offered_tools=bool(turn.tools),
                request_ids=completion.request_ids,
                cached_tokens=usage.cached_tokens,
            )
        )
        self.completed += 1
        return completion

    async def traced(
        self,
        script: SessionScript,
        index: int,
        tool_round: int,
        messages: Sequence[Message],
        params: GenerationParams,
    ) -> Completion:
        """One request, in a span (a trace) of its own."""
        assert self.telemetry is not None
        if self.model_name is None:
            info = self.adapter.model_info()
            self.model_name = (info.model_id.removeprefix(f"{info.provider}/"), info.provider)
        model, provider = self.model_name
        with self.telemetry.load_request(
            model=model,
            provider=provider,
            session_id=script.session_id,
            turn_index=index,
            tool_round=tool_round,
        ) as span:
            completion = await self.adapter.generate(messages, params)
            span.finish(completion)
            return completion

    def rate_limited(self, exc: RateLimited, at: float) -> None:
        """Note the pause a 429 caused; a used-up quota stops the run (the server asked
        not to come back for longer than the adapter waits: what follows would measure
        nothing but refusals)."""
        if isinstance(exc, QuotaExhausted):
            self.quota_refused += 1
            if exc.retry_after is not None:
                self.quota_asked_s = max(self.quota_asked_s or 0.0, exc.retry_after)
            self.stop("quota_exhausted")
        if exc.paused_s:
            end = at + exc.paused_s
            last = self.pauses[-1] if self.pauses else None
            if last is not None and at <= last.end_s:  # overlapping: one longer pause
                self.pauses[-1] = Pause(last.start_s, max(last.end_s, end))
            else:
                self.pauses.append(Pause(at, end))

    def params(
        self, max_tokens: int | None, exact: bool, tools: tuple[ToolSpec, ...] = ()
    ) -> GenerationParams:
        """The settings of a request, made once per length (validated, then shared);
        a tool turn's each time (a tool's schema is a dict: no key for a cache)."""
        if tools:
            return self.params(max_tokens, exact).model_copy(update={"tools": tools})
        key = (max_tokens, exact)
        params = self.params_by_length.get(key)
        if params is None:
            params = self.params_by_length[key] = GenerationParams(
                max_tokens=max_tokens,
                min_tokens=max_tokens if exact else None,
                ignore_eos=True if exact else None,
            )
        return params

    # -- the two loops ------------------------------------------------------------------

    async def closed_slot(self, slot: int, count: int) -> None:
        if self.shape.ramp_up > 0:
            await self.until(self.shape.ramp_up * slot / count)
        while self.sending and self.now() < self.send_until:
            script = self.take_session()
            if script is None:
                return
            await self.run_session(script, self.now())

    async def open_arrivals(self, offsets: np.ndarray, tg: Any) -> None:
        cap = self.shape.max_concurrency
        freed = anyio.Event()
        alive = 0

        async def session(script: SessionScript, at: float) -> None:
            nonlocal alive, freed
            try:
                await self.run_session(script, at)
            finally:
                alive -= 1
                freed.set()

        with self.offering:
            for offset in offsets:
                at = float(offset)
                if at >= self.send_until:
                    break
                script = self.take_session()  # built before it is due, not on its time
                if script is None:
                    break
                await self.until(at)
                if not self.sending:
                    break
                if cap is not None and alive >= cap:
                    self.held_by_cap += 1
                    while alive >= cap and self.sending:
                        freed = anyio.Event()
                        await freed.wait()
                    if not self.sending:
                        break
                alive += 1
                tg.start_soon(session, script, at)

    # -- the run ------------------------------------------------------------------------

    async def watch(self) -> None:
        """Open and close the window, stop at the duration, and sample the timeline."""
        opened = False
        next_point = 0.0
        while True:
            now = self.now()
            if not opened and now >= self.window_start:
                opened = True
                self.in_flight.reset()
                self.alive.reset()
                self.monitor.recording = True
                self.cpu_at_window = time.process_time()
            if now >= self.send_until:
                self.stop("duration")
            if self.on_progress is not None:
                self.on_progress(self.progress(now, opened))
            if now >= next_point:
                self.timeline.append(
                    TimelinePoint(
                        round(now, 3),
                        self.in_flight.now,
                        self.alive.now,
                        self.completed,
                        self.failed,
                    )
                )
                next_point = math.floor(now) + 1.0  # a loop blocked for seconds skips them
            wake = min(next_point, self.window_start if not opened else math.inf, self.send_until)
            if self.on_progress is not None:
                wake = min(wake, now + 0.5)
            with anyio.move_on_after(max(0.0, wake - self.now())):
                await self.stop_event.wait()
            if not self.sending and opened:
                return

    def progress(self, now: float, measuring: bool) -> Progress:
        recent = [r for r in self.records[-200:] if r.ok]
        ttfts = [r.ttft_s for r in recent if r.ttft_s is not None]
        return Progress(
            self.label,
            now,
            measuring,
            self.completed,
            self.failed,
            self.in_flight.now,
            self.alive.now,
            float(np.median(ttfts)) * 1000 if ttfts else None,
            float(np.median([r.e2e_s for r in recent])) * 1000 if recent else None,
        )

    async def run(self) -> DriveOutcome:
        with self.stop_request.listening(self.interrupt):
            return await self.run_measured()

    async def run_measured(self) -> DriveOutcome:
        shape = self.shape
        if shape.open_loop:
            offsets = open_schedule(shape).offsets
            target = shape.rate if shape.schedule is None else None
            if shape.schedule is not None and len(shape.schedule) > 1:
                span = float(offsets[-1] - offsets[0])
                target = (len(offsets) - 1) / span if span > 0 else None
        else:
            if shape.duration is None and shape.max_requests is None and self.workload.size is None:
                raise ConfigError(
                    "a closed-loop run needs --duration, --max-requests or a finite workload "
                    "(--repeat)"
                )
            target = None
        # the client's first connection and lazy set-up happen before the clock starts
        with self.starting:
            await self.adapter.preflight()
            if not self.aligned:
                self.t0 = self.clock()
            elif self.t0 > self.clock():
                await anyio.sleep(self.t0 - self.clock())
        if self.interrupted:
            raise NothingMeasured("stopped before the run started: nothing was measured")
        async with anyio.create_task_group() as background:
            background.start_soon(self.monitor.run)
            background.start_soon(self.watch)
            async with anyio.create_task_group() as tg:
                background.start_soon(self.drain_guard, tg.cancel_scope)
                if shape.open_loop:
                    await self.open_arrivals(offsets, tg)
                else:
                    count = shape.concurrency or 1
                    for slot in range(count):
                        tg.start_soon(self.closed_slot, slot, count)
                # leaving the group waits for the sessions still running
            if self.sending:
                self.stop("workload")
            self.cpu_s = (
                time.process_time() - self.cpu_at_window if self.cpu_at_window is not None else 0.0
            )
            background.cancel_scope.cancel()
        gauges = self.gauges or self.read_gauges()
        end = self.now()
        window_end = min(self.window_end, end) if math.isfinite(self.window_end) else end
        if self.interrupted:  # nothing was offered after the stop: the window ends there
            window_end = min(window_end, self.stopped_at)
        if window_end <= self.window_start and self.interrupted:
            raise NothingMeasured(
                f"stopped after {self.stopped_at:.2f} s, before the measured window began "
                f"(ramp-up and warm-up take {self.window_start:g} s): nothing was measured"
            )
        if window_end <= self.window_start:
            raise ConfigError(
                f"the run ended after {end:.2f} s, before its measured window began "
                f"(ramp-up and warm-up take {self.window_start:g} s); lengthen the run"
            )
        return DriveOutcome(
            records=self.records,
            sessions=self.sessions,
            window=Window(self.window_start, window_end),
            target_rate=target,
            loop_lag_s=self.monitor.lags_s,
            cpu_s=self.cpu_s,
            spins=self.spins,
            mean_in_flight=gauges.mean_in_flight,
            max_in_flight=gauges.max_in_flight,
            mean_sessions=gauges.mean_sessions,
            max_sessions=gauges.max_sessions,
            held_by_cap=self.held_by_cap,
            stopped_by=self.stopped_by,
            timeline=self.timeline,
            notes=self.notes,
            event_loop=_event_loop_name(),
            transcripts=self.transcripts,
            pauses=self.pauses,
            quota_refused=self.quota_refused,
            quota_asked_s=self.quota_asked_s,
            interrupted=self.interrupted,
        )

    async def drain_guard(self, sessions: anyio.CancelScope) -> None:
        """Once the run stops sending, give the requests in flight the drain timeout to
        end (after a stop request, its grace), then cancel what is left."""
        await self.stop_event.wait()
        self.end_drain_within(self.shape.drain_timeout)
        while (left := self.drain_until - self.now()) > 0:
            self.drain_moved = anyio.Event()
            with anyio.move_on_after(left):
                await self.drain_moved.wait()
        waited = self.now() - self.stopped_at
        if not self.interrupted:
            self.notes.append(
                f"{counted(self.in_flight.now, 'request')} still in flight "
                f"{self.shape.drain_timeout:g} s after the run stopped sending: cancelled"
            )
        elif self.in_flight.now:
            self.notes.append(
                f"the run was stopped early: {counted(self.in_flight.now, 'request')} in "
                f"flight, cancelled {waited:.1f} s after it stopped sending (not counted)"
            )
        sessions.cancel()


def _transcript_turn(turn: Any, user: str, answer: str, record: RequestRecord) -> TranscriptTurn:
    return TranscriptTurn(
        turn.turn_id,
        user,
        answer,
        record.e2e_s,
        record.ttft_s,
        record.input_tokens,
        record.output_tokens,
    )


def _event_loop_name() -> str:
    loop = type(asyncio.get_running_loop())
    return "uvloop" if loop.__module__.startswith("uvloop") else "asyncio"


async def drive(
    adapter: ModelAdapter,
    workload: Workload,
    shape: LoadShape,
    *,
    clock: Callable[[], float] = time.perf_counter,
    start_at: float | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    label: str = "",
    stop: StopRequest | None = None,
    telemetry: Telemetry | None = None,
) -> DriveOutcome:
    """Offer ``workload`` to ``adapter`` as ``shape`` says and measure every request.

    ``start_at`` (on ``clock``) aligns workers on one schedule: the run clock's zero.
    ``on_progress`` gets a snapshot about twice a second. ``stop`` ends the run early:
    the outcome is then ``interrupted`` and its window ends where sending stopped.
    ``telemetry`` traces each request (a trace each, its attempts within).

    Raises:
        NothingMeasured: ``stop`` came before the measured window began.
        ConfigError: the run ended before its measured window began.
    """
    driver = _Driver(
        adapter,
        workload,
        shape,
        clock=clock,
        start_at=start_at,
        on_progress=on_progress,
        label=label,
        stop_request=stop,
        telemetry=telemetry,
    )
    if telemetry is None:
        return await driver.run()
    with using_telemetry(telemetry):  # the adapter's attempts are traced too
        return await driver.run()
