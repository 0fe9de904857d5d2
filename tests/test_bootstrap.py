"""The one bootstrap and the one percentile function: the draws, the means, the ranks."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convsim.metrics import percentile
from convsim.metrics._aggregate import bootstrap_ci
from convsim.metrics._bootstrap import choices_draw, integers_draw, resample_means
from convsim.metrics._stats import PercentileMethod

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@pytest.mark.parametrize("seed", [0, 1, 42, 2**40, -3, "run-7"])
@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_choices_draw_gives_the_indices_python_random_choices_draws(
    seed: int | str, n: int
) -> None:
    rng = random.Random(seed)
    expected = [rng.choices(range(n), k=n) for _ in range(5)]
    draw = choices_draw(seed)
    # in two calls: the second continues the stream where the first stopped
    got = np.vstack([draw(2, n), draw(3, n)])
    assert got.tolist() == expected


def test_integers_draw_gives_numpys_default_generator_in_blocks_or_not() -> None:
    expected = np.random.default_rng(5).integers(0, 13, size=(7, 13))
    draw = integers_draw(5)
    assert np.array_equal(np.vstack([draw(3, 13), draw(4, 13)]), expected)


@settings(max_examples=40, deadline=None)
@given(st.lists(finite, min_size=1, max_size=40), st.integers(1, 50), st.integers(0, 2**32 - 1))
def test_resample_means_are_the_means_of_the_drawn_resamples(
    values: list[float], resamples: int, seed: int
) -> None:
    rng = random.Random(seed)
    expected = [
        math.fsum(rng.choices(values, k=len(values))) / len(values) for _ in range(resamples)
    ]
    got = resample_means(values, choices_draw(seed), resamples=resamples)
    assert got.shape == (resamples,)
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_resample_means_of_many_values_go_one_row_a_block() -> None:
    values = np.arange(70_000, dtype=np.float64) % 10  # more values than one block holds
    means = resample_means(values, integers_draw(0), resamples=3)
    idx = np.random.default_rng(0).integers(0, values.size, size=(3, values.size))
    assert np.allclose(means, values[idx].mean(axis=1), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("values", "resamples", "message"),
    [([], 10, "no values"), ([[1.0, 2.0]], 10, "no values"), ([1.0], 0, "at least 1")],
)
def test_resample_means_refuse_no_values_and_no_resamples(
    values: Sequence[float], resamples: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        resample_means(values, integers_draw(0), resamples=resamples)


def test_the_summary_interval_draws_vectorised_not_one_python_call_per_resample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object, **kwargs: object) -> list[object]:
        raise AssertionError("a resample drawn with random.Random.choices")

    monkeypatch.setattr(random.Random, "choices", refuse)
    low, high = bootstrap_ci([0.0, 1.0] * 50, seed=3)
    assert 0.35 < low < 0.5 < high < 0.65


def _linear(values: Sequence[float], q: float) -> float:
    """The reading of a percentile convsim has always printed (latency p50/p95/p99)."""
    data = sorted(values)
    rank = (len(data) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return data[low] + (data[high] - data[low]) * (rank - low)


@settings(max_examples=80, deadline=None)
@given(st.lists(finite, min_size=1, max_size=50), st.floats(min_value=0, max_value=100))
def test_percentile_interpolates_linearly_between_ranks(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(_linear(values, q), rel=1e-12, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=50), st.floats(min_value=0, max_value=100))
def test_lower_and_higher_are_the_values_at_the_ranks_either_side(
    values: list[float], q: float
) -> None:
    data = sorted(values)
    rank = (len(data) - 1) * q / 100.0
    low, high = percentile(values, q, method="lower"), percentile(values, q, method="higher")
    assert low in data and high in data and low <= percentile(values, q) + 1e-9 and low <= high
    assert low == data[math.floor(rank)] or math.isclose(rank, round(rank), abs_tol=1e-9)
    assert high == data[math.ceil(rank)] or math.isclose(rank, round(rank), abs_tol=1e-9)


def test_percentile_reads_several_ranks_at_once_and_takes_arrays() -> None:
    assert percentile([4, 1, 3, 2], [0, 50, 100]) == [1.0, 2.5, 4.0]
    assert percentile(np.array([[1.0, 2.0], [3.0, 4.0]]), 50) == 2.5
    assert isinstance(percentile(np.array([1, 2, 3]), 50), float)


@pytest.mark.parametrize(
    ("values", "q"), [([], 50), (np.array([]), [50]), ([1, 2], 101), ([1], -1)]
)
def test_percentile_of_no_values_or_outside_0_100_is_an_error(
    values: Sequence[float], q: float | list[float]
) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(finite, min_size=1, max_size=50),
    st.floats(min_value=0, max_value=100),
    st.sampled_from(["linear", "lower", "higher"]),
)
def test_a_list_and_an_array_give_the_same_percentile_to_the_last_bit(
    values: list[float], q: float, method: PercentileMethod
) -> None:
    from_list = percentile(values, q, method=method)
    assert from_list == percentile(np.array(values), q, method=method)
    assert percentile(tuple(values), [q, 100 - q], method=method)[0] == from_list


def test_a_run_with_the_default_metrics_leaves_numpy_unimported() -> None:
    # the latency metric reads its percentiles on the event loop: a list needs no numpy
    code = (
        "import sys, convsim\n"
        "(result,) = convsim.run_sync('single_turn_qa', 'scripted', limit=1)\n"
        "assert result.scores['latency'].details['p95_s'] > 0\n"
        "assert 'numpy' not in sys.modules, 'numpy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
