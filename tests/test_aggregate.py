"""The aggregation maths: properties that must hold for any data."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convsim.metrics._aggregate import BOOTSTRAP_MAX_N, aggregate, bootstrap_ci

scores = st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(scores)
def test_mean_std_and_stderr_agree_with_the_statistics_module(values: list[float]) -> None:
    agg = aggregate(values)
    assert agg.n == len(values)
    assert agg.mean == pytest.approx(statistics.fmean(values))
    expected_std = statistics.stdev(values) if len(values) > 1 else 0.0
    assert agg.std == pytest.approx(expected_std, abs=1e-12)
    assert agg.stderr == pytest.approx(expected_std / math.sqrt(len(values)), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(scores)
def test_the_interval_lies_within_the_data_and_holds_the_mean(values: list[float]) -> None:
    agg = aggregate(values)
    assert min(values) - 1e-12 <= agg.ci_low <= agg.ci_high <= max(values) + 1e-12
    assert agg.ci_low - 1e-9 <= agg.mean <= agg.ci_high + 1e-9


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=-5, max_value=5, allow_nan=False), st.integers(1, 40))
def test_constant_data_has_a_point_interval(value: float, n: int) -> None:
    agg = aggregate([value] * n)
    assert agg.ci_low == pytest.approx(value) and agg.ci_high == pytest.approx(value)
    assert agg.std == pytest.approx(0.0, abs=1e-12)


def test_the_interval_narrows_with_more_data_and_is_deterministic() -> None:
    small = [0.0, 1.0] * 10
    large = [0.0, 1.0] * 500
    low_s, high_s = bootstrap_ci(small, seed=1)
    low_l, high_l = bootstrap_ci(large, seed=1)
    assert high_l - low_l < (high_s - low_s) / 3
    assert bootstrap_ci(small, seed=1) == (low_s, high_s)
    assert 0.45 < low_l < 0.5 < high_l < 0.55


def test_large_samples_use_the_normal_approximation() -> None:
    values = [i % 2 for i in range(BOOTSTRAP_MAX_N + 2)]
    low, high = bootstrap_ci(values)
    half = 1.959964 * statistics.stdev(values) / math.sqrt(len(values))
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-4)


def test_no_values_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError):
        aggregate([])
    with pytest.raises(ValueError):
        bootstrap_ci([])
