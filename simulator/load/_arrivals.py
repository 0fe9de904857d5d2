"""Open-loop arrival schedules, computed in advance as absolute offsets from the start.

The driver sends session ``i`` at ``start + offsets[i]`` however late the earlier sends
were: the schedule is data, never "sleep a gap after the last send", so a slow server or
a busy client cannot thin the load it is measured under (no coordinated omission).

- ``constant``: one arrival every ``1 / rate`` seconds.
- ``poisson``: exponential gaps of mean ``1 / rate``.
- ``gamma``: gamma gaps of shape ``burstiness`` and mean ``1 / rate``; burstiness 1 is
  Poisson, below 1 burstier (coefficient of variation ``1 / sqrt(burstiness)``), above 1
  more regular.
- a trace: timestamps read from a file (:func:`read_trace`), with optional token counts.

The first arrival is at offset 0 in every pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convsim._errors import ConfigError

from ._names import ARRIVAL_PATTERNS, ArrivalPattern

__all__ = ["ArrivalPattern", "ARRIVAL_PATTERNS", "Schedule", "arrival_schedule", "read_trace"]


@dataclass(frozen=True)
class Schedule:
    """When each session arrives, in seconds from the start, in order.

    ``input_tokens`` and ``output_tokens`` hold a trace's token counts per arrival (None
    where it gave none); generated schedules have None throughout.
    """

    offsets: npt.NDArray[np.float64]
    input_tokens: tuple[int | None, ...]
    output_tokens: tuple[int | None, ...]

    def __len__(self) -> int:
        return int(self.offsets.size)


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def _gaps(
    pattern: ArrivalPattern, rate: float, burstiness: float, rng: np.random.Generator, n: int
) -> npt.NDArray[np.float64]:
    if pattern == "constant":
        return np.full(n, 1.0 / rate)
    if pattern == "poisson":
        return rng.exponential(1.0 / rate, n)
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), n)


def arrival_schedule(
    pattern: ArrivalPattern,
    rate: float,
    *,
    count: int | None = None,
    duration: float | None = None,
    burstiness: float = 1.0,
    seed: int | None = None,
) -> Schedule:
    """The arrivals of ``count`` sessions, or of every session due before ``duration``
    seconds, at ``rate`` arrivals per second on average.

    Raises:
        ConfigError: an unknown pattern, a rate or burstiness that is not positive, or
            not exactly one of ``count`` and ``duration``.
    """
    if pattern not in ARRIVAL_PATTERNS:
        raise ConfigError(
            f"unknown arrival pattern {pattern!r}; expected one of {', '.join(ARRIVAL_PATTERNS)}"
        )
    _check_positive("the arrival rate", rate)
    _check_positive("burstiness", burstiness)
    if (count is None) == (duration is None):
        raise ConfigError("an arrival schedule needs exactly one of a count and a duration")
    rng = np.random.default_rng(seed)
    if count is not None:
        if count < 0:
            raise ConfigError(f"the number of arrivals must be 0 or more, got {count}")
        gaps = _gaps(pattern, rate, burstiness, rng, max(count - 1, 0))
        offsets = np.concatenate([np.zeros(min(count, 1)), np.cumsum(gaps)])
    else:
        assert duration is not None
        _check_positive("the duration", duration)
        # draw gaps in chunks until the schedule passes the duration
        chunk = max(16, int(rate * duration * 1.2) + 16)
        parts = [np.zeros(1)]
        last = 0.0
        while last < duration:
            part = last + np.cumsum(_gaps(pattern, rate, burstiness, rng, chunk))
            parts.append(part)
            last = float(part[-1])
        offsets = np.concatenate(parts)
        offsets = offsets[offsets < duration]
    nothing: tuple[int | None, ...] = (None,) * offsets.size
    return Schedule(offsets.astype(np.float64), nothing, nothing)


_Count = Annotated[int, Field(ge=0, strict=True)]


class _TraceLine(BaseModel):
    """One JSON line of a trace; other fields (ids, hashes) are allowed and ignored."""

    model_config = ConfigDict(extra="ignore")

    timestamp: Annotated[float, Field(strict=True, allow_inf_nan=False)]
    input_tokens: _Count | None = None
    output_tokens: _Count | None = None


def _parse_line(text: str, where: str) -> _TraceLine:
    if not text.startswith("{"):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(
                f"{where}: expected a timestamp in seconds or a JSON object with "
                f'"timestamp", got {text[:60]!r}'
            ) from None
        if not math.isfinite(value):
            raise ConfigError(f"{where}: timestamp: must be a finite number, got {text!r}")
        return _TraceLine(timestamp=value)
    try:
        return _TraceLine.model_validate_json(text)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "line"
        if err["type"] == "json_invalid":
            field = "line"
        raise ConfigError(f"{where}: {field}: {err['msg']}") from None


def read_trace(path: str | Path) -> Schedule:
    """Arrivals replayed from a file: one timestamp (seconds) per line, or JSON lines
    with ``timestamp`` and optional ``input_tokens`` / ``output_tokens``.

    Offsets are counted from the first timestamp; blank lines and lines starting with
    ``#`` are skipped.

    Raises:
        ConfigError: naming ``file:line`` and the field, for a line that is not a
            timestamp, a timestamp earlier than the line before, a bad token count, an
            unreadable file or a file without arrivals.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the trace: {exc}") from exc
    stamps: list[float] = []
    inputs: list[int | None] = []
    outputs: list[int | None] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path}:{number}"
        line = _parse_line(text, where)
        if stamps and line.timestamp < stamps[-1]:
            raise ConfigError(
                f"{where}: timestamp: {line.timestamp} is earlier than the line before "
                f"({stamps[-1]}); a trace must be in time order"
            )
        stamps.append(line.timestamp)
        inputs.append(line.input_tokens)
        outputs.append(line.output_tokens)
    if not stamps:
        raise ConfigError(f"{path}: the trace holds no arrivals")
    offsets = np.asarray(stamps, dtype=np.float64) - stamps[0]
    return Schedule(offsets, tuple(inputs), tuple(outputs))
