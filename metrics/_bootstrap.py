"""The one bootstrap behind every interval convsim reports, vectorised with numpy.

The run summary's interval of a mean (:func:`convsim.metrics._aggregate.bootstrap_ci`),
the paired interval of ``convsim compare`` and the judge's interval all draw their
resamples here, as matrices of indices a block of resamples at a time (memory stays
bounded however many values there are), and read their bounds with
:func:`convsim.metrics._stats.percentile`.

Two seeded sources of indices keep each interval the one convsim reported before:

- :func:`choices_draw` gives the indices ``random.Random(seed).choices`` gives: the
  summary drew with Python's generator, and the same Mersenne Twister state handed to
  numpy yields the same numbers, so its intervals stay unchanged on the same seed;
- :func:`integers_draw` gives ``numpy.random.default_rng(seed).integers``: ``compare``
  and the judge drew with it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Draw", "choices_draw", "integers_draw", "resample_means"]

#: Indices drawn per block. Small: each block's arrays (128 KiB) then come from the
#: allocator's pool and stay in the CPU caches; larger blocks are fresh pages, whose
#: faults cost more than the arithmetic (twice the CPU time at 64 Ki).
_BLOCK = 1 << 14


class Draw(Protocol):
    """A seeded source of resample indices; successive calls continue one stream."""

    def __call__(self, resamples: int, n: int) -> npt.NDArray[np.integer[Any]]:
        """``resamples`` rows of ``n`` indices in ``[0, n)``, drawn with replacement."""
        ...


class _ChoicesDraw:
    """Python's ``random.Random(seed)``, vectorised: its Mersenne Twister state runs in
    numpy, whose ``random()`` makes doubles as Python's does; ``choices`` then takes
    ``floor(random() * n)``, as here."""

    def __init__(self, seed: int | float | str | bytes) -> None:
        state = random.Random(seed).getstate()[1]
        bits = np.random.MT19937()
        bits.state = {
            "bit_generator": "MT19937",
            "state": {"key": np.asarray(state[:-1], dtype=np.uint32), "pos": state[-1]},
        }
        self._rng = np.random.Generator(bits)

    def __call__(self, resamples: int, n: int) -> npt.NDArray[np.integer[Any]]:
        uniform = self._rng.random((resamples, n))
        uniform *= n
        return uniform.astype(np.intp)  # truncation: the floor of a non-negative number


class _IntegersDraw:
    """numpy's default generator (PCG64), ``integers(0, n)``."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def __call__(self, resamples: int, n: int) -> npt.NDArray[np.integer[Any]]:
        return self._rng.integers(0, n, size=(resamples, n))


def choices_draw(seed: int | float | str | bytes) -> Draw:
    """Row after row, the indices ``random.Random(seed).choices(range(n), k=n)`` draws."""
    return _ChoicesDraw(seed)


def integers_draw(seed: int) -> Draw:
    """Row after row, ``numpy.random.default_rng(seed).integers(0, n, size=(rows, n))``."""
    return _IntegersDraw(seed)


def resample_means(
    values: Sequence[float] | npt.NDArray[np.float64], draw: Draw, *, resamples: int
) -> npt.NDArray[np.float64]:
    """The mean of each of ``resamples`` resamples of ``values`` (with replacement), in
    the order drawn; ``values`` non-empty, ``resamples`` positive."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0:
        raise ValueError("resamples of no values (or not one row of them)")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    n = data.size
    rows = max(1, _BLOCK // n)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        means[start : start + count] = data[draw(count, n)].mean(axis=1)
    return means
