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

    The rank of ``q`` is ``(len(values) - 1) * q / 100``; ``method`` says how a rank
    between two values is read (numpy's methods of the same names).

    Raises:
        ValueError: no values, or a ``q`` outside 0-100.
    """
    import numpy as np  # here: importing the runtime must not cost numpy

    data = np.asarray(values, dtype=np.float64).ravel()
    if data.size == 0:
        raise ValueError("percentile of no values")
    if isinstance(q, Sequence):
        return [float(v) for v in np.percentile(data, list(q), method=method)]
    return float(np.percentile(data, q, method=method))


def mean(values: Sequence[float]) -> float:
    """The mean, the values summed exactly (``math.fsum``); ``values`` non-empty."""
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)
