"""SLOs, goodput, the JSON result and the sweep's choices, checked figure by figure on
hand-built records."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from convsim import ConfigError
from convsim.load import (
    SLO,
    LoadPlan,
    LoadResult,
    RequestRecord,
    StopRequest,
    SweepResult,
    Window,
    goodput,
    parse_slos,
    point_result,
    sweep_result,
)
from convsim.load._plan import _Point, _Runner


def record(
    session: str,
    turn: int,
    sent: float,
    end: float,
    *,
    scheduled: float | None = None,
    ttft: float | None = None,
    gaps: tuple[float, ...] = (),
    tokens: tuple[int | None, int | None] = (None, None),
    history: int = 1,
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        session_id=session,
        turn_index=turn,
        history_messages=history,
        scheduled_s=scheduled,
        sent_s=sent,
        ttfb_s=None if ttft is None else ttft / 2,
        ttft_s=ttft,
        ttfot_s=ttft,  # as the driver records a model that does not reason aloud
        inter_token_gaps_s=gaps,
        end_s=end,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        error=error,
    )


def test_parse_slos() -> None:
    slos = parse_slos("ttft_p99<=500ms, tpot_mean<50ms,E2E_P999<=10s,itl_p50<=.5s")
    assert slos.items == (
        SLO(metric="ttft", statistic="p99", threshold_ms=500.0),
        SLO(metric="tpot", statistic="mean", threshold_ms=50.0, inclusive=False),
        SLO(metric="e2e", statistic="p999", threshold_ms=10000.0),
        SLO(metric="itl", statistic="p50", threshold_ms=500.0),
    )
    assert str(slos) == "ttft_p99<=500ms,tpot_mean<50ms,e2e_p999<=10000ms,itl_p50<=500ms"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ttft_p99<=500", "invalid --slo 'ttft_p99<=500'"),
        ("latency_p99<=1s", "METRIC ttft, ttfot, tpot, itl or e2e"),
        ("ttft_p98<=1s", "invalid --slo"),
        ("ttft_p99>=1s", "invalid --slo"),
        ("ttft_p99<=1s,", "invalid --slo ''"),
        ("ttft_p99<=1s,ttft_p99<2s", "ttft_p99 given twice"),
    ],
)
def test_slo_parse_errors(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_slos(text)


def test_each_request_is_judged_by_its_own_values() -> None:
    fast = record("a", 0, 0.0, 1.0, ttft=0.25, gaps=(0.25, 0.25, 0.5), tokens=(1, 4))
    # e2e 1000 ms; tpot (1000 - 250) / 3 = 250 ms; its own gaps: p50 250, mean 333.3
    assert parse_slos("ttft_p99<=250ms,e2e_p50<=1s,tpot_p99<=250ms").met_by(fast)
    assert not parse_slos("ttft_p99<250ms").met_by(fast)
    assert parse_slos("itl_p50<=250ms").met_by(fast)
    assert not parse_slos("itl_mean<=300ms").met_by(fast)
    one_token = record("b", 0, 0.0, 1.0, ttft=1.0, tokens=(1, 1))
    assert parse_slos("tpot_p99<=1ms,itl_p99<=1ms").met_by(one_token)  # nothing to break
    failed = record("c", 0, 0.0, 0.5, error="Timeout")
    assert not parse_slos("e2e_p99<=10s").met_by(failed)


def test_goodput_counts_requests_and_whole_conversations() -> None:
    records = [
        record("s1", 0, 0.0, 1.0, ttft=0.25, tokens=(1, 4)),  # meets
        record("s1", 1, 2.0, 2.5, ttft=0.5, tokens=(1, 2)),  # meets (500 <= 500)
        record("s2", 0, 1.0, 3.0, ttft=1.0, tokens=(1, 1)),  # ttft too slow
        record("s2", 1, 3.0, 3.5, ttft=0.25, tokens=(1, 1)),  # meets, but s2 does not
        record("s3", 0, 1.5, 2.0, error="Timeout"),  # failed
    ]
    result = goodput(records, parse_slos("ttft_p99<=500ms,e2e_p99<2s"), duration_s=4.0)
    assert result.requests_per_s == 3 / 4
    assert result.conversations_per_s == 1 / 4
    with pytest.raises(ValueError, match="positive"):
        goodput(records, parse_slos("e2e_p99<2s"), duration_s=0.0)


RECORDS = [
    # warm-up: sent before the window opens, left out of every figure
    record("s0", 0, 0.5, 0.9, scheduled=0.0, ttft=0.125, tokens=(9, 9)),
    record("s1", 0, 1.0, 2.0, scheduled=1.0, ttft=0.25, gaps=(0.25,) * 3, tokens=(100, 4)),
    record("s1", 1, 3.0, 4.0, ttft=0.5, gaps=(0.5,), tokens=(200, 2), history=3),
    record("s2", 0, 2.0078125, 4.0078125, scheduled=2.0, ttft=1.0, tokens=(50, 1)),
    record("s3", 0, 3.0, 4.0, scheduled=3.0, error="Timeout"),
    # due inside the window, sent after it closed
    record("s4", 0, 5.5, 6.0, scheduled=4.5, ttft=0.25, tokens=(10, 2)),
]
SLOS = "ttft_p99<=1s,e2e_p99<=2s"


def test_point_result_figures_by_hand() -> None:
    point = point_result(RECORDS, Window(1.0, 5.0), slos=parse_slos(SLOS))
    assert point.valid and point.invalid_reasons == []
    assert point.target_rate is None and point.duration_s == 4.0
    assert point.achieved_rate == 3 / 4  # s1, s2, s3 started in the window
    assert point.requests.model_dump() == {
        "completed": 3,
        "failed": 1,
        "errors_by_class": {"Timeout": 1},
    }
    assert point.throughput.requests_per_s == 3 / 4
    assert point.throughput.output_tokens_per_s == 7 / 4
    assert point.throughput.total_tokens_per_s == (350 + 7) / 4
    latency = point.latency_ms
    assert latency.ttft.count == 3 and latency.ttft.p50 == 500.0
    assert latency.ttfot == latency.ttft  # no reasoning: TTFOT is TTFT
    assert point.reasoning_tokens is None  # none reported: none invented
    assert latency.ttft.mean == pytest.approx(1750 / 3)
    assert latency.ttft.p99 == pytest.approx(500 + 0.98 * 500)
    assert latency.tpot.count == 2 and latency.tpot.mean == 375.0  # 250 and 500
    assert latency.itl.count == 4 and latency.itl.mean == 312.5
    assert latency.itl.p90 == pytest.approx(425.0)
    assert latency.e2e.p50 == 1000.0 and latency.e2e.p99 == pytest.approx(1980.0)
    delay = point.schedule_delay_ms  # s1 0, s2 7.8125, s3 0 (s1's turn 1 had no schedule)
    assert delay.count == 3 and delay.mean == pytest.approx(7.8125 / 3)
    assert delay.p50 == 0.0 and delay.p99 == pytest.approx(0.98 * 7.8125)
    assert point.goodput is not None
    assert point.goodput.requests_per_s == 3 / 4  # s3 failed
    assert point.goodput.conversations_per_s == 2 / 4
    assert point.meets_slo is True
    [turn0, turn1] = point.by_turn
    assert turn0.model_dump() == {
        "turn_index": 0,
        "count": 2,
        "mean_history_messages": 1.0,
        "ttft_ms": {"p50": 625.0, "p99": pytest.approx(992.5)},
        "e2e_ms": {"p50": 1500.0, "p99": pytest.approx(1990.0)},
        "ttfot_ms": {"p50": 625.0, "p99": pytest.approx(992.5)},
    }
    assert (turn1.turn_index, turn1.count, turn1.mean_history_messages) == (1, 1, 3.0)
    assert turn1.ttft_ms.p50 == turn1.ttft_ms.p99 == 500.0


def test_the_client_falling_behind_or_lagging_invalidates_the_point() -> None:
    behind = point_result(RECORDS, Window(1.0, 5.0), target_rate=1.0)
    assert not behind.valid and behind.goodput is None and behind.meets_slo is None
    assert behind.invalid_reasons == [
        "the client fell behind: 3 sessions started in the window, 4 scheduled "
        "(0.75/s against 1.00/s)"
    ]
    lagging = point_result(RECORDS, Window(1.0, 5.0), max_schedule_delay_ms=5.0)
    assert lagging.invalid_reasons == [
        "the client lagged its schedule: send delay p99 7.7 ms is above 5 ms"
    ]
    extra = point_result(RECORDS, Window(1.0, 5.0), invalid_reasons=["CPU saturated"])
    assert extra.invalid_reasons == ["CPU saturated"]
    empty = point_result([], Window(0.0, 1.0))
    assert empty.invalid_reasons == ["no request completed in the measured window"]
    assert empty.latency_ms.ttft.p99 is None and empty.by_turn == []


def test_sweep_picks_the_highest_valid_rate_meeting_the_slos() -> None:
    slos = parse_slos(SLOS)
    low = point_result(RECORDS, Window(1.0, 5.0), slos=slos, target_rate=0.5, min_rate_ratio=0)
    high = point_result(RECORDS, Window(1.0, 5.0), slos=slos, target_rate=1.0)
    strict = point_result(RECORDS, Window(1.0, 5.0), slos=parse_slos("ttft_p99<=900ms"))
    sweep = sweep_result([low, high, strict])
    assert low.valid and not high.valid and strict.meets_slo is False
    assert sweep.max_rate_meeting_slo == 0.5
    assert not sweep.valid and sweep.invalid_reasons[0].startswith("point 1 (1/s): the client")
    assert sweep_result([strict]).max_rate_meeting_slo is None


def test_json_names_are_the_documented_ones() -> None:
    result = LoadResult.of(point_result(RECORDS, Window(1.0, 5.0), slos=parse_slos(SLOS)))
    data = json.loads(result.model_dump_json())
    assert data["schema_version"] == 1
    for key in (
        "valid",
        "invalid_reasons",
        "target_rate",
        "achieved_rate",
        "requests",
        "throughput",
        "latency_ms",
        "schedule_delay_ms",
        "goodput",
        "by_turn",
    ):
        assert key in data, key
    assert {"completed", "failed"} <= data["requests"].keys()
    assert {"requests_per_s", "output_tokens_per_s"} <= data["throughput"].keys()
    stats = {"mean", "std", "p50", "p90", "p95", "p99", "p999"}
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert stats <= data["latency_ms"][metric].keys()
    assert stats <= data["schedule_delay_ms"].keys()
    assert data["goodput"].keys() == {"requests_per_s", "conversations_per_s"}
    assert {"turn_index", "count", "ttft_ms", "e2e_ms"} <= data["by_turn"][0].keys()
    assert data["by_turn"][0]["ttft_ms"].keys() == {"p50", "p99"}
    sweep = json.loads(sweep_result([result]).model_dump_json())
    assert {"schema_version", "points", "max_rate_meeting_slo"} <= sweep.keys()
    assert LoadResult.model_validate(data) == result


# -- the sweep, on points measured from hand-built records ------------------------------


@dataclass(frozen=True)
class Behaviour:
    """How a server (and the client) fare at one rate, in seconds: every request of the
    point has these figures; ``failed`` of the sessions fail."""

    ttft: float = 0.125
    e2e: float = 0.25
    send_delay: float = 0.0
    failed: int = 0


def measured_from(behaviours: dict[float, Behaviour], asked: list[float]) -> Callable[..., Any]:
    """A point measure (as ``_run_point`` is called) that writes one second of one-turn
    sessions at each rate asked, arriving every ``1 / rate`` s, instead of sending any."""

    async def measure(plan: LoadPlan, *, rate: float | None, **_: Any) -> _Point:
        assert rate is not None
        asked.append(rate)
        how = behaviours[rate]
        records = []
        for k in range(int(rate)):
            at = k / rate
            sent = at + how.send_delay
            if k < how.failed:
                records.append(record(f"s{k}", 0, sent, sent + how.e2e, scheduled=at, error="X"))
            else:
                records.append(
                    record(f"s{k}", 0, sent, sent + how.e2e, scheduled=at, ttft=how.ttft)
                )
        slos = parse_slos(plan.slo) if plan.slo else None
        result = point_result(records, Window(0.0, 1.0), slos=slos, target_rate=rate)
        return _Point(result, records)

    return measure


class Swept(NamedTuple):
    """A sweep, the rates it measured, the lines it reported and the requests it kept."""

    sweep: SweepResult
    asked: list[float]
    lines: list[str]
    records: list[tuple[int, RequestRecord]]


async def run_sweep(behaviours: dict[float, Behaviour], slo: str = "ttft_p99<=300ms") -> Swept:
    """The sweep over ``behaviours``' rates (``--sweep``), with ``slo``."""
    asked: list[float] = []
    lines: list[str] = []
    rates = ",".join(f"{r:g}" for r in behaviours)
    plan = LoadPlan(rate=10, sweep=rates, slo=slo, duration=1, calibrate=False)
    runner = _Runner(
        plan, None, lines.append, None, [], StopRequest(), measure=measured_from(behaviours, asked)
    )
    sweep = await runner.sweep()
    assert sweep is not None
    return Swept(sweep, asked, lines, runner.records)


FINE = Behaviour()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("at_40", "best", "reasons"),
    [
        (FINE, 40, []),
        (Behaviour(ttft=0.5), 20, []),  # too slow for the SLO, but a valid point
        (
            Behaviour(send_delay=0.015625),
            20,
            [
                "point 2 (40/s): the client lagged its schedule: "
                "send delay p99 15.6 ms is above 10 ms"
            ],
        ),
    ],
    ids=["all-meet", "40-too-slow", "40-client-lagged"],
)
async def test_a_sweep_runs_each_rate_and_names_the_highest_valid_one_meeting_the_slos(
    at_40: Behaviour, best: float, reasons: list[str]
) -> None:
    sweep, asked, lines, records = await run_sweep({10: FINE, 20: FINE, 40: at_40})
    assert asked == [10, 20, 40]
    assert lines == ["sweep: rate 10/s", "sweep: rate 20/s", "sweep: rate 40/s"]
    assert [p.target_rate for p in sweep.points] == [10, 20, 40]
    assert sweep.max_rate_meeting_slo == best
    assert sweep.invalid_reasons == reasons and sweep.valid == (not reasons)
    assert not sweep.partial
    # every session of 10 and 20 met the SLO: goodput is the whole rate
    assert [p.goodput and p.goodput.requests_per_s for p in sweep.points] == [
        10,
        20,
        0 if at_40.ttft > 0.3 else 40,
    ]
    # each request is kept with the index of its point, for the per-request file
    assert [i for i, _ in records] == [0] * 10 + [1] * 20 + [2] * 40


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("at_20", "saturated"),
    [
        (Behaviour(e2e=0.75), False),  # three times the lightest point's median: not yet
        (Behaviour(e2e=0.75 + 2**-10), True),
        (Behaviour(failed=2), False),  # a tenth of the requests failed: not yet
        (Behaviour(failed=3), True),
    ],
    ids=["e2e-x3", "e2e-above-x3", "tenth-failed", "above-a-tenth-failed"],
)
async def test_a_sweep_stops_once_the_server_saturates(at_20: Behaviour, saturated: bool) -> None:
    sweep, asked, lines, _ = await run_sweep({10: FINE, 20: at_20, 40: FINE}, slo="e2e_p99<=2s")
    if saturated:
        assert asked == [10, 20] and lines[-1] == "sweep: the server saturated; stopping"
        assert sweep.max_rate_meeting_slo == 20 and not sweep.partial
    else:
        assert asked == [10, 20, 40] and not any("saturated" in line for line in lines)
        assert sweep.max_rate_meeting_slo == 40
