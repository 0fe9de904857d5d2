"""The load driver: closed and open loop, absolute schedules, think time, stop conditions,
the invalid-run flag, and the exact merge of workers' measurements."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from convsim import QuotaExhausted, RateLimited, ServerError
from convsim._types import CallTimings, Completion, GenerationParams, Message, Usage
from convsim.adapters import ModelAdapter
from convsim.load import (
    Fixed,
    LoadShape,
    Schedule,
    SyntheticSessions,
    Thresholds,
    Window,
    drive,
    merged_result,
    parse_slos,
    parse_synthetic,
    summarize,
)
from convsim.load._driver import DriveOutcome, Pause, SessionRecord
from convsim.load._records import RequestRecord
from convsim.load._stop import NothingMeasured, StopRequest

pytestmark = pytest.mark.anyio


class FakeModel(ModelAdapter):
    """Answers at once with ``max_tokens`` words, or as ``hook`` decides."""

    def __init__(self, hook: Callable[[int], object] | None = None) -> None:
        self.calls: list[tuple[int, GenerationParams]] = []
        self.hook = hook

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        number = len(self.calls)
        self.calls.append((len(messages), params))
        if self.hook is not None:
            waited = self.hook(number)
            if waited is not None:
                await waited  # type: ignore[misc]
        words = params.max_tokens or 4
        return Completion(
            text=" ".join(["word"] * words),
            usage=Usage(
                prompt_tokens=sum(len(m.content.split()) for m in messages),
                completion_tokens=words,
                total_tokens=0,
            ),
            timings=CallTimings(ttft_s=0.0, total_s=0.0),
        )


def _synthetic(spec: str = "turns=1,input_tokens=8,output_tokens=4") -> SyntheticSessions:
    return SyntheticSessions(parse_synthetic(spec))


def _schedule(offsets: Sequence[float]) -> Schedule:
    none: tuple[int | None, ...] = (None,) * len(offsets)
    return Schedule(np.asarray(offsets, dtype=np.float64), none, none)


async def test_open_loop_keeps_its_schedule_while_a_request_is_stuck() -> None:
    """No coordinated omission: a request that never ends does not hold back the
    arrivals after it; each session is sent at its own scheduled time."""
    release = anyio.Event()
    others = 0

    def hook(number: int) -> object:
        nonlocal others
        if number == 0:
            return release.wait()
        others += 1
        if others == 19:
            release.set()
        return None

    offsets = [i * 0.004 for i in range(20)]
    model = FakeModel(hook)
    outcome = await drive(model, _synthetic(), LoadShape(schedule=_schedule(offsets)))

    firsts = sorted(outcome.records, key=lambda r: r.scheduled_s or 0.0)
    assert [r.scheduled_s for r in firsts] == offsets
    stuck = firsts[0]
    # every later session was sent while the first was still waiting for its answer
    assert all(r.sent_s < stuck.end_s for r in firsts[1:])
    assert all(r.sent_s >= r.scheduled_s for r in firsts if r.scheduled_s is not None)
    assert stuck.e2e_s >= firsts[-1].scheduled_s - stuck.sent_s


async def test_closed_loop_holds_each_slot_through_a_sessions_turns_and_think_time() -> None:
    model = FakeModel()
    shape = LoadShape(concurrency=2, max_requests=12, think_time=Fixed(0.002))
    outcome = await drive(model, _synthetic("turns=3,input_tokens=8,output_tokens=4"), shape)
    assert outcome.max_sessions == 2
    by_session: dict[str, list[RequestRecord]] = {}
    for r in outcome.records:
        by_session.setdefault(r.session_id, []).append(r)
    for records in by_session.values():
        records.sort(key=lambda r: r.turn_index)
        # a turn is sent only after the one before ended and the think time passed
        for before, after in itertools.pairwise(records):
            assert after.sent_s >= before.end_s + 0.002
            assert after.history_messages == before.history_messages + 2
    # the model saw each real answer: the third turn carries five messages
    assert any(n == 5 for n, _ in model.calls)
    assert outcome.stopped_by == "max_requests"


async def test_a_finite_workload_ends_the_closed_loop() -> None:
    class Three(SyntheticSessions):
        @property
        def size(self) -> int | None:
            return 3

    model = FakeModel()
    outcome = await drive(
        model,
        Three(parse_synthetic("turns=2,input_tokens=4,output_tokens=2")),
        LoadShape(concurrency=8),
    )
    assert {r.session_id for r in outcome.records} == {"s0", "s1", "s2"}
    assert len(outcome.records) == 6
    assert outcome.stopped_by == "workload"
    assert [s.turns_done for s in sorted(outcome.sessions, key=lambda s: s.session_id)] == [2, 2, 2]


async def test_exact_output_asks_for_min_tokens_and_ignore_eos() -> None:
    model = FakeModel()
    await drive(model, _synthetic(), LoadShape(concurrency=1, max_requests=2))
    params = model.calls[0][1]
    assert (params.max_tokens, params.min_tokens, params.ignore_eos) == (4, 4, True)
    loose = SyntheticSessions(parse_synthetic("input_tokens=8,output_tokens=4"), exact_output=False)
    model = FakeModel()
    await drive(model, loose, LoadShape(concurrency=1, max_requests=1))
    assert (model.calls[0][1].min_tokens, model.calls[0][1].ignore_eos) == (None, None)


async def test_max_concurrency_holds_arrivals_back_and_says_so() -> None:
    release = anyio.Event()
    started = 0

    def hook(number: int) -> object:
        nonlocal started
        started += 1
        if started == 3:
            # the cap is full: let the answers come once the next arrival has had to wait
            async def later() -> None:
                await anyio.sleep(0.02)
                release.set()

            return _both(release.wait(), later())
        return release.wait()

    shape = LoadShape(schedule=_schedule([i * 0.002 for i in range(6)]), max_concurrency=3)
    outcome = await drive(FakeModel(hook), _synthetic(), shape)
    assert outcome.held_by_cap >= 1
    assert len(outcome.records) == 6
    point = merged_result([outcome], target_rate=500.0)
    assert not point.valid
    assert any("--max-concurrency" in reason for reason in point.invalid_reasons)


async def _both(first: object, second: object) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: second)  # type: ignore[arg-type,return-value]
        await first  # type: ignore[misc]


async def test_a_client_that_blocks_its_loop_marks_the_run_invalid() -> None:
    """Injected client overload: each call holds the event loop for 15 ms while
    arrivals are due every 2 ms, so sends fall behind and the loop lags."""
    import time as _time

    def busy(number: int) -> object:
        end = _time.perf_counter() + 0.015
        while _time.perf_counter() < end:
            pass
        return None

    shape = LoadShape(schedule=_schedule([i * 0.002 for i in range(30)]))
    outcome = await drive(FakeModel(busy), _synthetic(), shape)
    point = merged_result([outcome], target_rate=500.0)
    assert not point.valid
    assert point.schedule_delay_ms.p99 is not None and point.schedule_delay_ms.p99 > 10
    assert any("lagged its schedule" in r for r in point.invalid_reasons)
    assert any("event loop lagged" in r for r in point.invalid_reasons)


def test_send_delay_and_loop_lag_invalidate_only_above_their_thresholds() -> None:
    """What a blocked loop leads to, on hand-built measurements (a measured calm run
    lags too on a busy machine): a delay or lag at its threshold is fine, above it the
    point is invalid and says which."""
    late = 2**-7  # 7.8125 ms, exact in binary

    def judged(delay_s: float, lag_s: float, limit_ms: float) -> list[str]:
        records = [_record(i, i * 0.25, 0.01, 0.02, delay=delay_s) for i in range(40)]
        outcome = _outcome(records, [lag_s] * 100, cpu=1.0)
        thresholds = Thresholds(max_schedule_delay_ms=limit_ms, max_loop_lag_ms=limit_ms)
        point = merged_result([outcome], target_rate=4.0, thresholds=thresholds)
        assert point.valid == (not point.invalid_reasons)
        return point.invalid_reasons

    assert judged(0.0, 0.0, 7.8125) == []
    assert judged(late, late, 7.8125) == []
    assert judged(late, 0.0, 7.5) == [
        "the client lagged its schedule: send delay p99 7.8 ms is above 7.5 ms"
    ]
    assert judged(0.0, late, 7.5) == [
        "the load generator's event loop lagged: p99 7.8 ms above 7.5 ms, so latencies "
        "include the client's own delay"
    ]


async def test_max_errors_stops_the_run_and_invalidates_it() -> None:
    def fail(number: int) -> object:
        raise ServerError("injected")

    outcome = await drive(
        FakeModel(fail), _synthetic(), LoadShape(concurrency=2, max_errors=5, max_requests=100)
    )
    assert outcome.stopped_by == "max_errors"
    assert 5 <= len(outcome.records) <= 6
    assert all(r.error == "ServerError" for r in outcome.records)
    point = merged_result([outcome])
    assert not point.valid and "the run stopped at --max-errors" in point.invalid_reasons
    assert point.requests.errors_by_class == {"ServerError": len(outcome.records)}


async def test_warmup_is_left_out_of_the_window() -> None:
    shape = LoadShape(schedule=_schedule([0.0, 0.01, 0.05, 0.06]), warmup=0.03)
    outcome = await drive(FakeModel(), _synthetic(), shape)
    point = merged_result([outcome])
    assert outcome.window.start_s == pytest.approx(0.03)
    # the two due after the warm-up count; one due in it counts only if a busy machine
    # sent it late, after the warm-up ended
    after = [r for r in outcome.records if r.sent_s >= 0.03]
    assert {0.05, 0.06} <= {r.scheduled_s for r in after} and len(outcome.records) == 4
    assert point.requests.completed == len(after)


async def test_a_used_up_quota_stops_the_run_and_invalidates_it() -> None:
    """A 429 asking for a day (past max_retry_after) ends the sending at once: what
    follows would only be refusals. The result says why it is not valid."""

    def quota(number: int) -> object:
        if number == 20:
            raise QuotaExhausted(
                "asked for a day", retry_after=86400.0, paused_s=60.0, max_retry_after=60.0,
                sent=True, status_code=429,
            )  # fmt: skip
        return None

    outcome = await drive(FakeModel(quota), _synthetic(), LoadShape(concurrency=2, duration=30))
    assert outcome.stopped_by == "quota_exhausted"
    assert outcome.quota_refused == 1 and outcome.quota_asked_s == 86400
    assert len(outcome.records) <= 22  # stopped at once, not after the 30 s asked
    point = merged_result([outcome])
    assert not point.valid and point.stopped_by == "quota_exhausted"
    assert any(
        "QuotaExhausted" in r and "asked to wait 86400 s" in r for r in point.invalid_reasons
    )


async def test_a_429_pause_is_noted_and_a_dominating_one_invalidates() -> None:
    """Each 429 that paused the key is timed from the error: a short pause is a note; a
    pause over most of the window means the rate limit, not the server, was measured."""

    def limited(paused: float) -> Callable[[int], object]:
        def hook(number: int) -> object:
            if number == 0:
                raise RateLimited("busy", retry_after=paused, paused_s=paused, status_code=429)
            return anyio.sleep(0.001)

        return hook

    short = await drive(
        FakeModel(limited(0.01)), _synthetic(), LoadShape(concurrency=1, duration=0.2)
    )
    assert [p.end_s - p.start_s for p in short.pauses] == [pytest.approx(0.01)]
    point = merged_result([short])
    assert not any("429" in r for r in point.invalid_reasons)
    assert any(n.startswith("429 answers paused sending for 0.0 s") for n in point.notes)

    long = await drive(
        FakeModel(limited(5.0)), _synthetic(), LoadShape(concurrency=1, duration=0.2)
    )
    point = merged_result([long])
    reasons = [r for r in point.invalid_reasons if r.startswith("429 answers paused sending")]
    assert len(reasons) == 1 and reasons[0].endswith(
        "Retry-After): the run measured the rate limit, not the server"
    )
    assert [p.end_s - p.start_s for p in long.pauses] == [pytest.approx(5.0)]


def test_overlapping_pauses_count_once_and_only_inside_the_window() -> None:
    outcome = _outcome([_record(i, i * 0.1, 0.01, 0.02) for i in range(50)], [0.0], cpu=1.0)
    outcome.pauses = [Pause(-2.0, 1.0), Pause(0.5, 2.0), Pause(4.0, 5.0), Pause(9.0, 12.0)]
    point = merged_result([outcome])  # window 0-10 s: 2 + 1 + 1 seconds paused
    assert "429 answers paused sending for 4.0 s of the 10.0 s window (40%, Retry-After)" in (
        point.notes
    )
    assert point.valid


class ManualClock:
    """A run clock that moves only when told: the driver and the model read the same
    time, however late a busy machine lets either run. Steps are powers of two, exact
    in binary."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TimedModel(FakeModel):
    """A fake model on ``clock`` whose timings say how long each call took (as a
    server's would): about a millisecond each, plus what ``hook`` lets pass."""

    def __init__(self, clock: ManualClock, hook: Callable[[int], object]) -> None:
        super().__init__(hook)
        self.clock = clock

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        started = self.clock()
        completion = await super().generate(messages, params)
        self.clock.now += 2**-10
        took = self.clock() - started
        return completion.model_copy(update={"timings": CallTimings(ttft_s=took, total_s=took)})


async def test_a_stop_ends_sending_and_the_window_and_lets_in_flight_requests_finish() -> None:
    stop = StopRequest()
    clock = ManualClock()
    done_at_stop = 0

    async def answer_later() -> None:
        await anyio.lowlevel.checkpoint()
        clock.now += 2**-7

    def hook(number: int) -> object:
        nonlocal done_at_stop
        if number == 5:  # the sixth request is in flight when the run is stopped
            done_at_stop = number
            clock.now += 2**-11
            stop.ask()
            return answer_later()  # it ends within the grace
        return None

    shape = LoadShape(concurrency=2, duration=600, interrupt_grace=60)
    with anyio.fail_after(10):
        outcome = await drive(
            TimedModel(clock, hook),
            _synthetic("turns=3,input_tokens=8,output_tokens=4"),
            shape,
            clock=clock,
            stop=stop,
        )
    assert outcome.interrupted and outcome.stopped_by == "interrupted"
    assert 0 < outcome.window.end_s < 1  # where sending stopped, not the 600 s asked for
    assert all(r.sent_s <= outcome.window.end_s for r in outcome.records)  # none after
    assert len(outcome.records) == done_at_stop + 1 and all(r.ok for r in outcome.records)
    assert max(r.end_s for r in outcome.records) > outcome.window.end_s  # it was let finish
    assert not outcome.notes
    point = merged_result([outcome])
    assert point.partial and point.partial_reason == "interrupted"
    assert point.stopped_by == "interrupted" and point.requests.completed == done_at_stop + 1


async def test_a_second_stop_cancels_the_requests_in_flight_at_once() -> None:
    stop = StopRequest()
    stuck = anyio.Event()  # never set: a server that does not answer
    asked = anyio.Event()

    def hook(number: int) -> object:
        if number == 3:
            stop.ask()  # the grace below is far longer than the test may take
            asked.set()
        return stuck.wait() if number >= 3 else None

    async def ask_again() -> None:
        await asked.wait()
        stop.ask()

    shape = LoadShape(concurrency=2, duration=600, interrupt_grace=600)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask_again)
            outcome = await drive(FakeModel(hook), _synthetic(), shape, stop=stop)
    assert stop.at_once and outcome.interrupted
    assert len(outcome.records) == 3  # the stuck ones are not counted as answered or failed
    assert any("in flight, cancelled" in n and "stopped early" in n for n in outcome.notes)
    assert merged_result([outcome]).partial


@pytest.mark.parametrize("when", ["before the start", "in the warm-up"])
async def test_a_stop_before_the_window_measured_nothing(when: str) -> None:
    stop = StopRequest()
    if when == "before the start":
        stop.ask()

    def hook(number: int) -> object:
        if number == 2:
            stop.ask()
        return None

    model = FakeModel(hook)
    shape = LoadShape(concurrency=1, duration=600, warmup=600)
    with anyio.fail_after(10), pytest.raises(NothingMeasured, match="nothing was measured"):
        await drive(model, _synthetic(), shape, stop=stop)
    assert len(model.calls) == (0 if when == "before the start" else 3)


def _outcome(
    records: list[RequestRecord], lags: list[float], cpu: float, spins: int = 0
) -> DriveOutcome:
    sessions = [
        SessionRecord(r.session_id, r.scheduled_s, r.sent_s, r.end_s, 1, int(r.ok), not r.ok)
        for r in records
    ]
    return DriveOutcome(
        records=records,
        sessions=sessions,
        window=Window(0.0, 10.0),
        target_rate=None,
        loop_lag_s=lags,
        cpu_s=cpu,
        spins=spins,
        mean_in_flight=2.0,
        max_in_flight=4,
        mean_sessions=2.0,
        max_sessions=4,
        held_by_cap=0,
        stopped_by="duration",
        timeline=[],
        notes=[],
    )


def test_a_saturated_cpu_invalidates_unless_it_was_spent_spinning() -> None:
    """A worker at a full core set the pace, unless sends were timed by spinning: then
    the CPU includes waiting, the send delay judges, and a note says why."""
    records = [_record(i, i * 0.1, 0.01, 0.02) for i in range(50)]
    busy = merged_result([_outcome(records, [0.0], cpu=10.0)])
    assert any("CPU-bound" in r for r in busy.invalid_reasons)
    spun = merged_result([_outcome(records, [0.0], cpu=10.0, spins=50)])
    assert not any("CPU-bound" in r for r in spun.invalid_reasons)
    assert any("spinning" in n for n in spun.notes)
    calm = merged_result([_outcome(records, [0.0], cpu=1.0, spins=50)])
    assert not any("spinning" in n for n in calm.notes)


def _record(
    i: int, at: float, ttft: float, e2e: float, out: int = 11, delay: float = 0.0
) -> RequestRecord:
    """Session ``w{i}``'s one request, due at ``at`` and sent ``delay`` later."""
    sent = at + delay
    return RequestRecord(
        f"w{i}", 0, 1, at, sent, ttft, ttft, (0.001,) * (out - 1), sent + e2e, 10, out
    )


def test_workers_merge_exactly_as_the_pooled_samples() -> None:
    rng = np.random.default_rng(7)
    parts = []
    for w in range(3):
        ttfts = rng.lognormal(-3, 0.5, 200 + 50 * w)
        records = [
            _record(1000 * w + i, float(i % 9), float(t), float(t) + 0.1)
            for i, t in enumerate(ttfts)
        ]
        parts.append(_outcome(records, list(rng.uniform(0, 0.002, 30)), cpu=2.0 + w))
    merged = merged_result(parts)
    pooled = [r for p in parts for r in p.records]
    expected = summarize([r.ttft_s for r in pooled], 1000.0)
    assert merged.latency_ms.ttft == expected
    assert merged.requests.completed == len(pooled)
    lags = summarize(np.concatenate([p.loop_lag_s for p in parts]), 1000.0)
    assert merged.client is not None and merged.client.event_loop_lag_ms == lags
    assert merged.client.workers == 3
    assert merged.client.cpu_cores == pytest.approx((2 + 3 + 4) / 10)
    assert merged.client.max_worker_cpu == pytest.approx(0.4)
    assert merged.client.mean_in_flight == pytest.approx(6.0)
    # the merge does not depend on the order of the workers
    assert merged_result(parts[::-1]).latency_ms == merged.latency_ms


def test_goodput_counts_requests_and_whole_conversations_by_hand() -> None:
    slos = parse_slos("ttft_p99<=100ms")
    # session a: both requests fast; b: one slow; c: fast but failed later
    records = [
        RequestRecord("a", 0, 1, 1.0, 1.0, 0.05, 0.05, (), 1.2, 5, 5),
        RequestRecord("a", 1, 3, 2.0, 2.0, 0.05, 0.05, (), 2.2, 5, 5),
        RequestRecord("b", 0, 1, 1.0, 1.0, 0.05, 0.05, (), 1.2, 5, 5),
        RequestRecord("b", 1, 3, 2.0, 2.0, 0.20, 0.20, (), 2.4, 5, 5),
        RequestRecord("c", 0, 1, 3.0, 3.0, 0.05, 0.05, (), 3.2, 5, 5),
        RequestRecord("c", 1, 3, 4.0, 4.0, None, None, (), 4.1, None, None, "ServerError"),
    ]
    sessions = [
        SessionRecord("a", 1.0, 1.0, 2.2, 2, 2, False),
        SessionRecord("b", 1.0, 1.0, 2.4, 2, 2, False),
        SessionRecord("c", 3.0, 3.0, 4.1, 2, 1, True),
    ]
    outcome = replace(_outcome(records, [0.0], 0.0), sessions=sessions)
    point = merged_result([outcome], slos=slos)
    assert point.goodput is not None
    assert point.goodput.requests_per_s == pytest.approx(4 / 10)  # a0 a1 b0 c0
    assert point.goodput.conversations_per_s == pytest.approx(1 / 10)  # only a
    assert point.conversations is not None
    assert (point.conversations.completed, point.conversations.failed) == (2, 1)
    assert point.conversations.meeting_slo_share == pytest.approx(0.5)
