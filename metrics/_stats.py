"""Small statistics shared by metrics, reports and load tests: the one percentile
function every figure of convsim is read with, and the mean."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["percentile", "mean", "PercentileMethod"]

PercentileMethod = Literal["linear", "lower", "higher"]
"""How a percentile between two ranks is read: interpolated linearly between them
(numpy's default), or the lower or the higher of the two."""


@overload
def percentile(
    values: Sequence[float] | npt.NDArray[np.floating],
    q: float,
    *,
    method: PercentileMethod = "linear",
) -> float: ...


@overload
def percentile(
    values: Sequence[float] | npt.NDArray[np.floating],
    q: Sequence[float],
    *,
    method: PercentileMethod = "linear",
) -> list[float]: ...


def percentile(
    values: Sequence[float] | npt.NDArray[np.floating],
    q: float | Sequence[float],
    *,
    method: PercentileMethod = "linear",
) -> float | list[float]:
    """The ``q``-th percentile (0-100) of ``values``, or one per ``q`` given several
    (the values are ordered once for all of them); ``values`` non-empty.

    The rank of ``q`` is ``(len(values) - 1) * (q / 100)``; ``method`` says how a rank
    between two values is read. A list or tuple is read here, without numpy: the
    runtime's metrics call this on the event loop, which must not wait for numpy to be
    imported; anything else (an array) is read by numpy's methods of the same names,
    which give the same figures to the last bit.

    Raises:
        ValueError: no values, or a ``q`` outside 0-100.
    """
    ranks = list(q) if isinstance(q, Sequence) else [q]
    for rank in ranks:
        if not 0 <= rank <= 100:
            raise ValueError(f"a percentile is within 0-100, not {rank}")
    if isinstance(values, (list, tuple)):
        if not values:
            raise ValueError("percentile of no values")
        data = sorted(values)
        read = [_read(data, rank, method) for rank in ranks]
    else:
        import numpy as np

        array = np.asarray(values, dtype=np.float64).ravel()
        if array.size == 0:
            raise ValueError("percentile of no values")
        read = [float(v) for v in np.percentile(array, ranks, method=method)]
    return read if isinstance(q, Sequence) else read[0]


def _read(data: Sequence[float], q: float, method: PercentileMethod) -> float:
    """The ``q``-th percentile of sorted ``data``, computed as numpy computes it."""
    rank = (len(data) - 1) * (q / 100)
    low = math.floor(rank)
    if method == "lower":
        return float(data[low])
    high = math.ceil(rank)
    if method == "higher":
        return float(data[high])
    weight = rank - low
    below, above = data[low], data[high]
    if weight < 0.5:
        return float(below + (above - below) * weight)
    return float(above - (above - below) * (1 - weight))


def mean(values: Sequence[float]) -> float:
    """The mean, the values summed exactly (``math.fsum``); ``values`` non-empty."""
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)
