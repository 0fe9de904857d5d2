"""Distributions of token counts and think times, written as short text on the command line.

Forms (:mod:`convsim._distribution_text`, the mock server's delays read the same):
``64`` or ``fixed:64``, ``uniform:MIN,MAX``, ``normal:MEAN,STD[,MIN,MAX]``,
``lognormal:MEAN,STD[,MIN,MAX]`` (MEAN and STD of the values themselves, not of their
logarithm) and ``exp:MEAN``. Every quantity here is a count or a duration, so samples
are clipped to ``[MIN, MAX]`` with MIN 0 by default. Token counts are sampled as
integers (rounded to the nearest). The old spelling with colons (``uniform:1:3``) is
read with a :class:`DeprecationWarning`.

:func:`parse_synthetic` reads ``--synthetic turns=3,input_tokens=256,output_tokens=64``.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from convsim._distribution_text import FORMS, DeprecatedSpelling, read_distribution
from convsim._errors import ConfigError

__all__ = [
    "Distribution",
    "Fixed",
    "Uniform",
    "Normal",
    "LogNormal",
    "Exponential",
    "AnyDistribution",
    "parse_distribution",
    "SyntheticWorkload",
    "parse_synthetic",
]


@runtime_checkable
class Distribution(Protocol):
    """Something to draw ``n`` values from."""

    @property
    def integer(self) -> bool:
        """True when samples are whole numbers (token counts)."""
        ...

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64 | np.int64]:
        """``n`` values drawn with ``rng``."""
        ...


def _finish(
    values: npt.NDArray[np.float64], low: float, high: float, integer: bool
) -> npt.NDArray[np.float64 | np.int64]:
    clipped = np.clip(values, low, high)
    return np.rint(clipped).astype(np.int64) if integer else clipped


def _num(value: float) -> str:
    return f"{value:g}"


def _bounds(low: float, high: float) -> str:
    return "" if (low, high) == (0.0, math.inf) else f",{_num(low)},{_num(high)}"


@dataclass(frozen=True)
class Fixed:
    """Always ``value``."""

    value: float
    integer: bool = False
    kind: Literal["fixed"] = "fixed"

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64 | np.int64]:
        return _finish(np.full(n, self.value, dtype=np.float64), 0.0, math.inf, self.integer)

    def __str__(self) -> str:
        return _num(self.value)


@dataclass(frozen=True)
class Uniform:
    """Uniform between ``low`` and ``high`` (integers: each of them equally likely)."""

    low: float
    high: float
    integer: bool = False
    kind: Literal["uniform"] = "uniform"

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64 | np.int64]:
        if self.integer:
            return rng.integers(int(self.low), int(self.high), n, endpoint=True, dtype=np.int64)
        return rng.uniform(self.low, self.high, n)

    def __str__(self) -> str:
        return f"uniform:{_num(self.low)},{_num(self.high)}"


@dataclass(frozen=True)
class Normal:
    """Normal of ``mean`` and ``std``, clipped to ``[low, high]``."""

    mean: float
    std: float
    low: float = 0.0
    high: float = math.inf
    integer: bool = False
    kind: Literal["normal"] = "normal"

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64 | np.int64]:
        return _finish(rng.normal(self.mean, self.std, n), self.low, self.high, self.integer)

    def __str__(self) -> str:
        return f"normal:{_num(self.mean)},{_num(self.std)}{_bounds(self.low, self.high)}"


@dataclass(frozen=True)
class LogNormal:
    """Log-normal whose values have ``mean`` and ``std``, clipped to ``[low, high]``."""

    mean: float
    std: float
    low: float = 0.0
    high: float = math.inf
    integer: bool = False
    kind: Literal["lognormal"] = "lognormal"

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64 | np.int64]:
        sigma2 = math.log1p((self.std / self.mean) ** 2)
        mu = math.log(self.mean) - sigma2 / 2
        values = rng.lognormal(mu, math.sqrt(sigma2), n)
        return _finish(values, self.low, self.high, self.integer)

    def __str__(self) -> str:
        return f"lognormal:{_num(self.mean)},{_num(self.std)}{_bounds(self.low, self.high)}"


@dataclass(frozen=True)
class Exponential:
    """Exponential of ``mean`` (think times between a session's turns, say)."""

    mean: float
    integer: bool = False
    kind: Literal["exp"] = "exp"

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64 | np.int64]:
        return _finish(rng.exponential(self.mean, n), 0.0, math.inf, self.integer)

    def __str__(self) -> str:
        return f"exp:{_num(self.mean)}"


AnyDistribution = Annotated[
    Fixed | Uniform | Normal | LogNormal | Exponential, Field(discriminator="kind")
]


def _error(text: str, what: str, reason: str) -> ConfigError:
    return ConfigError(f"invalid {what} {text!r}: {reason}; expected one of: {FORMS}")


def _whole(text: str, what: str, integer: bool, *values: float) -> None:
    if integer and not all(v == int(v) for v in values if math.isfinite(v)):
        raise _error(text, what, "token counts and their bounds must be whole numbers")


def parse_distribution(
    text: str, *, integer: bool = False, what: str = "distribution"
) -> Fixed | Uniform | Normal | LogNormal | Exponential:
    """The distribution written as ``text`` (see the module docstring for the forms).

    Args:
        text: the distribution as written (``"uniform:1,3"``).
        integer: sample whole numbers (token counts); the numbers given must be whole.
        what: what the value is for, to name it in errors (``"--think-time"``).

    Raises:
        ConfigError: naming ``text`` and the forms expected.
    """
    text = text.strip()
    try:
        read = read_distribution(text)
    except ValueError as exc:
        raise _error(text, what, str(exc)) from None
    if read.respelled is not None:
        warnings.warn(
            f"{what} {text!r}: numbers apart with ':' are deprecated; write {read.respelled!r}",
            DeprecatedSpelling,
            stacklevel=2,
        )
    n = read.numbers
    if read.kind == "fixed":
        _whole(text, what, integer, n[0])
        return Fixed(n[0], integer)
    if read.kind == "uniform":
        _whole(text, what, integer, *n)
        return Uniform(n[0], n[1], integer)
    if read.kind == "exp":
        return Exponential(n[0], integer)
    low, high = (n[2], n[3]) if len(n) == 4 else (0.0, math.inf)
    _whole(text, what, integer, low, high)
    if read.kind == "normal":
        return Normal(n[0], n[1], low, high, integer)
    return LogNormal(n[0], n[1], low, high, integer)


class SyntheticWorkload(BaseModel):
    """Synthetic sessions: how many turns, and how many tokens each turn sends and asks
    for; ``prefix_tokens`` is a system prompt shared by every session (prefix caching)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turns: AnyDistribution = Field(default=Fixed(1, integer=True))
    """Turns per session (at least 1)."""
    input_tokens: AnyDistribution
    """Tokens of new user input per turn, in the server's tokens."""
    output_tokens: AnyDistribution
    """Tokens asked of the model per turn (``max_tokens``)."""
    prefix_tokens: AnyDistribution = Field(default=Fixed(0, integer=True))
    """Tokens of the shared system prompt; 0 for none."""


_SYNTHETIC_KEYS = tuple(SyntheticWorkload.model_fields)
_GUIDELLM_SPREAD = ("stdev", "min", "max")
_GUIDELLM_KEYS = (
    "prompt_tokens",
    *(f"{name}_{part}" for name in ("prompt_tokens", "output_tokens") for part in _GUIDELLM_SPREAD),
)
"""guidellm's synthetic-data spelling: ``prompt_tokens`` for ``input_tokens``, and a
count's spread as ``_stdev`` (normal), or ``_min``/``_max`` alone (uniform)."""


def _synthetic_pairs(text: str, what: str, expected: str) -> dict[str, str]:
    """``KEY=VALUE,...`` (a value may hold commas: a distribution's numbers), or
    guidellm's JSON object form, as raw text values by key."""
    keys = (*_SYNTHETIC_KEYS, *_GUIDELLM_KEYS)
    pairs: dict[str, str] = {}
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid {what} {text!r}: not a JSON object: {exc.msg}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"invalid {what} {text!r}: {expected}")
        for key, value in data.items():
            if key not in keys:
                raise ConfigError(f"invalid {what} {text!r}: unknown key {key!r}; {expected}")
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ConfigError(f"invalid {what} {text!r}: {key}: expected a number or text")
            pairs[key] = str(value)
        return pairs
    last: str | None = None
    for piece in text.split(","):
        key, sep, value = piece.partition("=")
        if sep:  # a new key; otherwise the piece continues a distribution's numbers
            last = key.strip()
            if last not in keys:
                raise ConfigError(f"invalid {what} {text!r}: unknown key {last!r}; {expected}")
            if last in pairs:
                raise ConfigError(f"invalid {what} {text!r}: {last} given twice")
            pairs[last] = value
        elif last is None:
            raise ConfigError(f"invalid {what} {text!r}: {expected}")
        else:
            pairs[last] += "," + piece
    return pairs


def _whole_number(text: str, what: str, key: str, value: str) -> int:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number == int(number) and number >= 0):
        raise ConfigError(
            f"invalid {what} {text!r}: {key}={value.strip()!r}: guidellm's spelling takes a "
            "whole number of 0 or more"
        )
    return int(number)


def _from_guidellm(pairs: dict[str, str], text: str, what: str) -> dict[str, str]:
    """``pairs`` in convsim's keys: ``prompt_tokens`` renamed ``input_tokens``, and a
    count given with guidellm's ``_stdev``/``_min``/``_max`` turned into a distribution
    as guidellm samples it: normal of that deviation, clipped to ``[min, max]`` (by
    default 5 deviations either side, at least 1); without a deviation, uniform over
    ``[min, max]`` (each bound by default the count itself).

    Raises:
        ConfigError: a key in both spellings, a spread without its count, a spread
            beside a count written as a distribution, or bounds the wrong way round.
    """
    out = dict(pairs)
    if "prompt_tokens" in out:
        if "input_tokens" in out:
            raise ConfigError(
                f"invalid {what} {text!r}: input_tokens and prompt_tokens (guidellm's name "
                "for it) both given; keep one"
            )
        out["input_tokens"] = out.pop("prompt_tokens")
    for guidellm, ours in (("prompt_tokens", "input_tokens"), ("output_tokens", "output_tokens")):
        spread = {
            part: out.pop(f"{guidellm}_{part}")
            for part in _GUIDELLM_SPREAD
            if f"{guidellm}_{part}" in out
        }
        if not spread:
            continue
        given = ", ".join(f"{guidellm}_{part}" for part in spread)
        if ours not in out:
            raise ConfigError(f"invalid {what} {text!r}: {given} without {guidellm}=N")
        if ":" in out[ours]:
            raise ConfigError(
                f"invalid {what} {text!r}: {given} spread a plain count (guidellm's "
                f"{guidellm}=N), but {ours} is the distribution {out[ours].strip()!r}; "
                "give one or the other"
            )
        count = _whole_number(text, what, ours, out[ours])
        numbers = {p: _whole_number(text, what, f"{guidellm}_{p}", v) for p, v in spread.items()}
        stdev = numbers.get("stdev", 0)
        if stdev:
            low = numbers.get("min", max(1, count - 5 * stdev))
            high = numbers.get("max", count + 5 * stdev)
        else:
            low, high = numbers.get("min", count), numbers.get("max", count)
        if low > high:
            raise ConfigError(
                f"invalid {what} {text!r}: {guidellm}_min {low} is above {guidellm}_max {high}"
            )
        if stdev:
            out[ours] = f"normal:{count},{stdev},{low},{high}"
        else:
            out[ours] = str(low) if low == high else f"uniform:{low},{high}"
    return out


def parse_synthetic(text: str) -> SyntheticWorkload:
    """``turns=3,input_tokens=256,output_tokens=64[,prefix_tokens=N]`` as a workload; a
    value may be a distribution (``input_tokens=uniform:128,512``).

    guidellm's spelling is read too, as ``KEY=VALUE`` pairs or its JSON object:
    ``prompt_tokens=256,prompt_tokens_stdev=32,output_tokens=64,output_tokens_min=16``
    (see :func:`_from_guidellm`).

    Raises:
        ConfigError: an unknown or repeated key, a key in both spellings, a missing
            ``input_tokens`` or ``output_tokens``, a bad distribution, or fewer than one
            turn.
    """
    what = "--synthetic"
    expected = (
        f"expected KEY=VALUE pairs with keys {', '.join(_SYNTHETIC_KEYS)} "
        f"(or guidellm's {', '.join(_GUIDELLM_KEYS)})"
    )
    pairs = _from_guidellm(_synthetic_pairs(text, what, expected), text, what)
    missing = [k for k in ("input_tokens", "output_tokens") if k not in pairs]
    if missing:
        raise ConfigError(f"invalid {what} {text!r}: missing {', '.join(missing)}; {expected}")
    fields = {
        key: parse_distribution(value, integer=True, what=f"{what} {key}")
        for key, value in pairs.items()
    }
    turns = fields.get("turns")
    if turns is not None and _smallest(turns) < 1:
        raise ConfigError(f"invalid {what} {text!r}: turns must be at least 1")
    return SyntheticWorkload(**fields)


def _smallest(dist: Fixed | Uniform | Normal | LogNormal | Exponential) -> float:
    """The smallest value ``dist`` can give."""
    if isinstance(dist, Fixed):
        return dist.value
    if isinstance(dist, Uniform):
        return dist.low
    if isinstance(dist, Normal | LogNormal):
        return dist.low
    return 0.0
