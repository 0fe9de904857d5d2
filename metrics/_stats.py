"""Small statistics shared by metrics and reports."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "mean"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; ``values`` non-empty."""
    if not values:
        raise ValueError("percentile of no values")
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)
