"""Latency statistics over raw samples, so that merging workers' measurements is exact.

Each worker keeps its raw latencies; the report concatenates them and summarises once.
Values are sorted before any figure is computed, so the summary does not depend on the
order in which workers' samples were merged (not even in the last bit of the mean).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from convsim.metrics import percentile

__all__ = ["LatencySummary", "Samples", "summarize"]


class LatencySummary(BaseModel):
    """Mean, standard deviation (population) and percentiles of one latency, in the unit
    of its samples; every figure is None when there were no samples."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int = 0
    mean: float | None = None
    std: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None


_PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def summarize(values: npt.ArrayLike, scale: float = 1.0) -> LatencySummary:
    """The summary of ``values`` multiplied by ``scale`` (1000 turns seconds into ms).

    Percentiles interpolate linearly between the closest ranks (convsim's one
    :func:`~convsim.metrics.percentile`, numpy's ``"linear"``).
    """
    data = np.sort(np.asarray(values, dtype=np.float64).ravel()) * scale
    if data.size == 0:
        return LatencySummary()
    points = percentile(data, list(_PERCENTILES.values()))
    return LatencySummary(
        count=int(data.size),
        mean=float(np.mean(data)),
        std=float(np.std(data)),
        **dict(zip(_PERCENTILES, points, strict=True)),
    )


@dataclass(frozen=True)
class Samples:
    """Raw samples of one quantity (seconds, say), mergeable without loss."""

    values: npt.NDArray[np.float64]

    @classmethod
    def of(cls, values: Iterable[float]) -> Samples:
        """Samples from any iterable of numbers."""
        return cls(np.fromiter(values, dtype=np.float64))

    @classmethod
    def merge(cls, parts: Iterable[Samples]) -> Samples:
        """All the samples of ``parts`` as one set (workers' measurements, say)."""
        arrays = [p.values for p in parts]
        return cls(np.concatenate(arrays) if arrays else np.empty(0, dtype=np.float64))

    def __len__(self) -> int:
        return int(self.values.size)

    def summary(self, scale: float = 1.0) -> LatencySummary:
        """See :func:`summarize`."""
        return summarize(self.values, scale)
