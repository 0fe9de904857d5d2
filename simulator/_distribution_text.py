"""The one way distributions are written: the mock server's delays, ``convsim load``'s
token counts and think times.

Forms: ``N`` or ``fixed:N``, ``uniform:MIN,MAX``, ``normal:MEAN,STD[,MIN,MAX]``,
``lognormal:MEAN,STD[,MIN,MAX]`` and ``exp:MEAN``. Every number is finite and 0 or more
(these are durations and counts), a ``MIN`` is never above its ``MAX``, and the MEAN of
``lognormal`` and ``exp`` is above 0. The mock server once wrote its numbers apart with
colons (``uniform:LO:HI``): that spelling is still read, and :func:`read_distribution`
says so (:attr:`DistributionText.respelled`) for the caller to warn about.

This module reads the text only; what a distribution means (sampling, whole numbers)
belongs to each caller.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

__all__ = [
    "FORMS",
    "DeprecatedSpelling",
    "DistributionKind",
    "DistributionText",
    "read_distribution",
]

FORMS = (
    "N, fixed:N, uniform:MIN,MAX, normal:MEAN,STD[,MIN,MAX], lognormal:MEAN,STD[,MIN,MAX], exp:MEAN"
)
"""The forms, as error messages list them."""


class DeprecatedSpelling(DeprecationWarning):
    """A distribution was written in the old spelling (``uniform:20:80``); the command
    line shows these on stderr."""


DistributionKind = Literal["fixed", "uniform", "normal", "lognormal", "exp"]


class DistributionText(NamedTuple):
    """A distribution as written: its kind and its numbers, in the order of its form."""

    kind: DistributionKind
    numbers: tuple[float, ...]
    """``fixed``: (N,); ``uniform``: (MIN, MAX); ``normal`` and ``lognormal``: (MEAN,
    STD) or (MEAN, STD, MIN, MAX); ``exp``: (MEAN,)."""
    respelled: str | None = None
    """The text in today's spelling when it was written in the deprecated one
    (``uniform:20:80`` gives ``uniform:20,80``); None otherwise."""

    def __str__(self) -> str:
        numbers = ",".join(_number_text(n) for n in self.numbers)
        return numbers if self.kind == "fixed" else f"{self.kind}:{numbers}"


def read_distribution(text: str) -> DistributionText:
    """The distribution written as ``text``.

    Raises:
        ValueError: what is wrong with it, in a few words (the caller names the
            option or field and lists :data:`FORMS`).
    """
    text = text.strip()
    name, sep, args = text.partition(":")
    if not sep:
        numbers = _numbers(text)
        if len(numbers) != 1:
            raise ValueError("a fixed value is one number")
        return DistributionText("fixed", numbers)
    name = name.strip().lower()
    respelled = ":" in args
    if respelled:  # the mock server's old spelling, uniform:LO:HI
        args = args.replace(":", ",")
    numbers = _numbers(args)
    if name == "fixed":
        if len(numbers) != 1:
            raise ValueError("fixed takes one number")
    elif name == "uniform":
        if len(numbers) != 2 or numbers[0] > numbers[1]:
            raise ValueError("uniform takes MIN,MAX with MIN <= MAX")
    elif name in ("normal", "lognormal"):
        if len(numbers) not in (2, 4):
            raise ValueError(f"{name} takes MEAN,STD or MEAN,STD,MIN,MAX")
        if len(numbers) == 4 and numbers[2] > numbers[3]:
            raise ValueError("MIN is above MAX")
        if name == "lognormal" and numbers[0] <= 0:
            raise ValueError("lognormal needs a MEAN above 0")
    elif name == "exp":
        if len(numbers) != 1 or numbers[0] <= 0:
            raise ValueError("exp takes one MEAN above 0")
    else:
        raise ValueError(f"unknown distribution {name!r}")
    read = DistributionText(name, numbers)  # type: ignore[arg-type]  # checked above
    return read._replace(respelled=str(read)) if respelled else read


def _numbers(args: str) -> tuple[float, ...]:
    try:
        values = tuple(float(a) for a in args.split(","))
    except ValueError:
        raise ValueError("not a number") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError("every number must be finite and 0 or more")
    return values


def _number_text(value: float) -> str:
    """``value`` as short as it reads, exactly (``2.0`` is ``2``)."""
    return str(int(value)) if value.is_integer() else repr(value)
