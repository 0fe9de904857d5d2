"""Run-level aggregation of per-conversation scores: mean, spread, confidence interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

from ._bootstrap import choices_draw, resample_means
from ._stats import percentile

__all__ = ["Aggregate", "Interval", "aggregate", "bootstrap_ci"]

BOOTSTRAP_RESAMPLES = 2000
#: Above this many values the bootstrap gives way to the normal approximation, which
#: is as good there and keeps reports fast.
BOOTSTRAP_MAX_N = 5000


@dataclass(frozen=True)
class Aggregate:
    """How a metric came out over many conversations."""

    n: int
    mean: float
    std: float
    """Sample standard deviation (n - 1); 0 for a single value."""
    stderr: float
    ci_low: float
    ci_high: float
    """The 95% confidence interval of the mean (percentile bootstrap)."""


class Interval(NamedTuple):
    """A confidence interval."""

    low: float
    high: float


def bootstrap_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Interval:
    """Percentile-bootstrap interval of the mean; deterministic for a seed.

    The resamples are those ``random.Random(seed).choices`` draws (drawn vectorised), and
    the bounds are resample means, never interpolated: the one at or just above the
    lower rank and the one at or just below the upper rank of the sorted means.
    """
    n = len(values)
    if n == 0:
        raise ValueError("a confidence interval of no values")
    if n == 1:
        return Interval(float(values[0]), float(values[0]))
    alpha = (1 - confidence) / 2
    if n > BOOTSTRAP_MAX_N:
        mean = math.fsum(values) / n
        half = NormalDist().inv_cdf(1 - alpha) * _std(values, mean) / math.sqrt(n)
        return Interval(mean - half, mean + half)
    means = resample_means(values, choices_draw(seed), resamples=resamples)
    low = percentile(means, 100 * alpha, method="higher")
    high = percentile(means, 100 * (1 - alpha), method="lower")
    return Interval(low, high)


def aggregate(values: Sequence[float], *, seed: int = 0) -> Aggregate:
    """Mean, standard deviation, standard error and bootstrap 95% CI of ``values``."""
    n = len(values)
    if n == 0:
        raise ValueError("an aggregate of no values")
    mean = math.fsum(values) / n
    std = _std(values, mean)
    low, high = bootstrap_ci(values, seed=seed)
    return Aggregate(n=n, mean=mean, std=std, stderr=std / math.sqrt(n), ci_low=low, ci_high=high)


def _std(values: Sequence[float], mean: float) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
