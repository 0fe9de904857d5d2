"""The intervals convsim reported before its bootstrap was vectorised, pinned.

Each figure below was computed with the earlier code (a pure-Python bootstrap drawing
with ``random.Random(seed).choices`` for the summary; numpy loops for ``compare`` and the
judge) and is hard-coded here: the one bootstrap must give the same intervals on the same
seed. The check is to 1e-9, far inside the three decimals a report prints.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest

from convsim.metrics._aggregate import bootstrap_ci
from convsim.metrics._judge import reliability
from convsim.results._compare import _bootstrap


def _spread(n: int) -> list[float]:
    """Uneven values in [0, 1] (a metric's scores)."""
    return [((i * 7919 + 13) % 101) / 100 for i in range(n)]


def _binary(n: int) -> list[float]:
    """Pass/fail scores, 40% passing."""
    return [float((i * 37) % 5 < 2) for i in range(n)]


DATA = {"spread": _spread, "binary": _binary}

#: (data, n, seed, low, high) from the earlier ``bootstrap_ci``.
SUMMARY_CIS = [
    ("spread", 2, 0, 0.13, 0.54),
    ("spread", 2, 1, 0.13, 0.54),
    ("spread", 2, 42, 0.13, 0.54),
    ("spread", 3, 0, 0.13, 0.9499999999999998),
    ("spread", 3, 1, 0.13, 0.9499999999999998),
    ("spread", 3, 42, 0.13, 0.9499999999999998),
    ("spread", 5, 0, 0.3, 0.792),
    ("spread", 5, 1, 0.3, 0.792),
    ("spread", 5, 42, 0.3, 0.792),
    ("spread", 10, 0, 0.381, 0.7310000000000001),
    ("spread", 10, 1, 0.381, 0.744),
    ("spread", 10, 42, 0.381, 0.738),
    ("spread", 50, 0, 0.41619999999999996, 0.579),
    ("spread", 50, 1, 0.41759999999999997, 0.5861999999999999),
    ("spread", 50, 42, 0.41479999999999995, 0.5804),
    ("spread", 200, 0, 0.45990000000000003, 0.5399499999999999),
    ("spread", 200, 1, 0.4569, 0.5417000000000001),
    ("spread", 200, 42, 0.4595, 0.5398),
    ("spread", 1000, 0, 0.48139, 0.51749),
    ("spread", 1000, 1, 0.48272000000000004, 0.51825),
    ("spread", 1000, 42, 0.48116000000000003, 0.5179900000000001),
    ("spread", 5000, 0, 0.491986, 0.50767),
    ("spread", 5000, 1, 0.49198400000000003, 0.508134),
    ("spread", 5000, 42, 0.49188999999999994, 0.508142),
    ("binary", 2, 0, 0.0, 1.0),
    ("binary", 2, 1, 0.0, 1.0),
    ("binary", 2, 42, 0.0, 1.0),
    ("binary", 3, 0, 0.0, 1.0),
    ("binary", 3, 1, 0.0, 1.0),
    ("binary", 3, 42, 0.0, 1.0),
    ("binary", 5, 0, 0.0, 0.8),
    ("binary", 5, 1, 0.0, 0.8),
    ("binary", 5, 42, 0.0, 0.8),
    ("binary", 10, 0, 0.1, 0.7),
    ("binary", 10, 1, 0.1, 0.7),
    ("binary", 10, 42, 0.1, 0.7),
    ("binary", 50, 0, 0.26, 0.54),
    ("binary", 50, 1, 0.26, 0.54),
    ("binary", 50, 42, 0.28, 0.54),
    ("binary", 200, 0, 0.33, 0.47),
    ("binary", 200, 1, 0.33, 0.47),
    ("binary", 200, 42, 0.335, 0.47),
    ("binary", 1000, 0, 0.371, 0.431),
    ("binary", 1000, 1, 0.369, 0.428),
    ("binary", 1000, 42, 0.368, 0.431),
    ("binary", 5000, 0, 0.3864, 0.4132),
    ("binary", 5000, 1, 0.3868, 0.4136),
    ("binary", 5000, 42, 0.3856, 0.4136),
]

#: (n, interval) from the earlier paired bootstrap of ``compare``.
COMPARE_CIS = [
    (2, [-0.87, 0.54]),
    (3, [-0.87, 0.9499999999999998]),
    (7, [-0.5385714285714286, 0.5814285714285715]),
    (40, [-0.10425625, 0.30201249999999974]),
    (500, [0.049078500000000004, 0.15066049999999997]),
]

#: (samples per turn, combine, interval) from the earlier judge reliability.
JUDGE_CIS: list[tuple[list[list[int]], Literal["mean", "majority"], list[float] | None]] = [
    ([[3]], "mean", None),
    ([[3, 4]], "mean", [0.5, 0.75]),
    ([[1], [5]], "mean", [0.0, 1.0]),
    ([[2, 3, 3], [4, 5, 4], [1, 2, 2]], "mean", [0.1667, 0.8333]),
    ([[2, 3, 3], [4, 5, 4], [1, 2, 2]], "majority", [0.1667, 0.8333]),
    ([[5, 4, 5, 3, 5], [1, 2], [3], [4, 4, 4]], "majority", [0.1875, 0.875]),
    (
        [
            [1, 2, 3],
            [2, 3, 4],
            [3, 4, 5],
            [4, 5, 1],
            [5, 1, 2],
            [1, 2, 3],
            [2, 3, 4],
            [3, 4, 5],
            [4, 5, 1],
            [5, 1, 2],
            [1, 2, 3],
            [2, 3, 4],
        ],
        "mean",
        [0.3125, 0.6389],
    ),
]


@pytest.mark.parametrize(("data", "n", "seed", "low", "high"), SUMMARY_CIS)
def test_the_summary_interval_is_the_one_reported_before(
    data: str, n: int, seed: int, low: float, high: float
) -> None:
    got = bootstrap_ci(DATA[data](n), seed=seed)
    assert got.low == pytest.approx(low, abs=1e-9)
    assert got.high == pytest.approx(high, abs=1e-9)


@pytest.mark.parametrize(("n", "interval"), COMPARE_CIS)
def test_the_compare_interval_is_the_one_reported_before(n: int, interval: list[float]) -> None:
    diffs = np.array(_spread(n)) - np.array(_binary(n))
    assert _bootstrap(diffs) == pytest.approx(interval, abs=1e-9)


@pytest.mark.parametrize(("samples", "combine", "interval"), JUDGE_CIS)
def test_the_judge_interval_is_the_one_reported_before(
    samples: list[list[int]], combine: Literal["mean", "majority"], interval: list[float] | None
) -> None:
    assert reliability(samples, combine)["ci95"] == interval
