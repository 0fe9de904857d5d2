"""Arrival schedules: absolute offsets, Poisson statistics, burstiness, seeds, traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from convsim import ConfigError
from convsim.load import arrival_schedule, read_trace


def test_constant_offsets_are_absolute_times() -> None:
    schedule = arrival_schedule("constant", 4.0, count=5)
    assert schedule.offsets.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert schedule.input_tokens == (None,) * 5


def test_the_schedule_is_data_not_a_sleep_after_each_send() -> None:
    # a driver that slept one gap after each send would push every later session back
    # by a stall; due times computed in advance stay where they were
    offsets = arrival_schedule("poisson", 10.0, count=100, seed=3).offsets
    again = arrival_schedule("poisson", 10.0, count=100, seed=3).offsets
    assert np.array_equal(offsets, again) and offsets[0] == 0.0
    gaps = np.diff(offsets)
    stall = np.where(np.arange(99) == 10, 5.0, 0.0)  # send 10 went out 5 s late
    sleep_after_send = np.concatenate([[0.0], np.cumsum(gaps + stall)])
    assert np.all(sleep_after_send[11:] - offsets[11:] == pytest.approx(5.0))
    assert np.all(np.diff(offsets) >= 0)


def test_poisson_gaps_are_exponential_at_the_rate() -> None:
    rate = 50.0
    offsets = arrival_schedule("poisson", rate, count=5000, seed=7).offsets
    gaps = np.diff(offsets)
    ks = stats.kstest(gaps, "expon", args=(0, 1 / rate))
    assert ks.pvalue > 0.01
    assert abs(len(gaps) / offsets[-1] - rate) / rate < 0.05


def test_duration_keeps_arrivals_before_it() -> None:
    offsets = arrival_schedule("poisson", 100.0, duration=20.0, seed=1).offsets
    assert offsets.max() < 20.0 and abs(offsets.size / 20.0 - 100.0) < 10.0
    assert arrival_schedule("constant", 2.0, duration=2.0).offsets.tolist() == [0, 0.5, 1, 1.5]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_the_coefficient_of_variation(burstiness: float) -> None:
    schedule = arrival_schedule("gamma", 20.0, count=20000, burstiness=burstiness, seed=2)
    gaps = np.diff(schedule.offsets)
    assert abs(gaps.mean() - 1 / 20.0) < 0.1 / 20.0
    assert abs(gaps.std() / gaps.mean() - 1 / np.sqrt(burstiness)) < 0.05


def test_seeds_reproduce() -> None:
    a = arrival_schedule("gamma", 5.0, count=50, burstiness=0.5, seed=11).offsets
    b = arrival_schedule("gamma", 5.0, count=50, burstiness=0.5, seed=11).offsets
    c = arrival_schedule("gamma", 5.0, count=50, burstiness=0.5, seed=12).offsets
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pattern": "bursty", "rate": 1.0, "count": 1}, "unknown arrival pattern"),
        ({"pattern": "poisson", "rate": 0.0, "count": 1}, "rate must be a positive"),
        ({"pattern": "gamma", "rate": 1.0, "count": 1, "burstiness": -1}, "burstiness"),
        ({"pattern": "poisson", "rate": 1.0}, "exactly one"),
        ({"pattern": "poisson", "rate": 1.0, "count": 1, "duration": 1.0}, "exactly one"),
        ({"pattern": "poisson", "rate": float("inf"), "count": 1}, "positive"),
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        arrival_schedule(**kwargs)


def test_a_trace_of_timestamps_and_json_lines(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "# arrivals\n100.5\n\n"
        '{"timestamp": 101, "input_tokens": 300, "output_tokens": 20, "hash_ids": [1]}\n'
        '{"timestamp": 101.25, "output_tokens": 7}\n',
        encoding="utf-8",
    )
    schedule = read_trace(trace)
    assert schedule.offsets.tolist() == [0.0, 0.5, 0.75]
    assert schedule.input_tokens == (None, 300, None)
    assert schedule.output_tokens == (None, 20, 7)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("1\nsoon\n", r"trace.txt:2: expected a timestamp"),
        ('1\n{"timestamp": 2, "input_tokens": -3}\n', r"trace.txt:2: input_tokens"),
        ('1\n{"timestamp": 2, "input_tokens": 2.5}\n', r"trace.txt:2: input_tokens"),
        ('{"input_tokens": 3}\n', r"trace.txt:1: timestamp"),
        ('{"timestamp": "x"}\n', r"trace.txt:1: timestamp"),
        ("{broken\n", r"trace.txt:1: line"),
        ("2\n1\n", r"trace.txt:2: timestamp: 1.0 is earlier"),
        ("nan\n", r"trace.txt:1: timestamp: must be a finite"),
        ("# nothing\n\n", r"trace.txt: the trace holds no arrivals"),
    ],
)
def test_a_bad_trace_line_is_located(tmp_path: Path, text: str, where: str) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=where):
        read_trace(trace)


def test_a_missing_trace_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the trace"):
        read_trace(tmp_path / "none.txt")
