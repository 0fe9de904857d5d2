"""Delays of the mock server: fixed or drawn from a distribution, parsed from text."""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from convsim._distribution_text import (
    FORMS,
    DeprecatedSpelling,
    DistributionKind,
    DistributionText,
    read_distribution,
)

__all__ = ["Delay", "format_number"]


def format_number(value: float) -> str:
    """``value`` without a trailing ``.0`` when it is whole (``2.0`` -> ``"2"``)."""
    return str(int(value)) if value == int(value) else repr(value)


@dataclass(frozen=True, slots=True)
class Delay:
    """A delay in milliseconds, fixed or drawn from a distribution.

    Build one with :meth:`parse` from a number (fixed milliseconds) or a string in the
    forms ``convsim load`` reads too: ``"MS"``, ``"fixed:MS"``, ``"uniform:MIN,MAX"``,
    ``"normal:MEAN,STD[,MIN,MAX]"``, ``"lognormal:MEAN,STD[,MIN,MAX]"`` or
    ``"exp:MEAN"``; draws are clipped to ``[MIN, MAX]``, MIN 0 by default. The old
    spelling with colons (``"uniform:20:80"``) is read with a :class:`DeprecationWarning`.
    Draws come from the ``random.Random`` passed to :meth:`sample`, so a seeded server
    repeats its timings.
    """

    kind: DistributionKind = "fixed"
    params: tuple[float, ...] = (0.0,)
    """The numbers of the form, in its order (see :class:`DistributionText`)."""

    @classmethod
    def parse(cls, value: Delay | float | str) -> Delay:
        """A delay from a number of milliseconds or one of the string forms.

        Raises:
            ValueError: the value is not one of the forms, or a number is negative.
        """
        if isinstance(value, Delay):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"a delay is a number of milliseconds or one of: {FORMS}")
        spec = value if isinstance(value, str) else str(value)
        try:
            read = read_distribution(spec)
        except ValueError as exc:
            raise ValueError(f"delay {spec!r}: {exc}; expected one of: {FORMS}") from None
        if read.respelled is not None:
            warnings.warn(
                f"delay {spec!r}: numbers apart with ':' are deprecated; write {read.respelled!r}",
                DeprecatedSpelling,
                stacklevel=2,
            )
        return cls(read.kind, read.numbers)

    @property
    def is_zero(self) -> bool:
        """True when every draw is zero (then the server never sleeps for it)."""
        p = self.params
        if self.kind == "uniform":
            return p[1] == 0
        if self.kind in ("normal", "lognormal") and len(p) == 4 and p[3] == 0:
            return True  # clipped to [0, 0]
        if self.kind == "normal":
            return p[0] == 0 and p[1] == 0
        return self.kind == "fixed" and p[0] == 0

    @property
    def is_fixed(self) -> bool:
        """True when every draw is the same."""
        return self.kind == "fixed" or self.is_zero

    def sample(self, rng: random.Random) -> float:
        """One draw in milliseconds (never negative)."""
        p = self.params
        if self.kind == "fixed":
            return p[0]
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1])
        if self.kind == "exp":
            return rng.expovariate(1.0 / p[0])
        low, high = (p[2], p[3]) if len(p) == 4 else (0.0, math.inf)
        if self.kind == "normal":
            draw = rng.gauss(p[0], p[1])
        else:  # lognormal: MEAN and STD of the values, not of their logarithm
            sigma2 = math.log1p((p[1] / p[0]) ** 2)
            draw = rng.lognormvariate(math.log(p[0]) - sigma2 / 2, math.sqrt(sigma2))
        return min(max(draw, low), high)

    def __str__(self) -> str:
        return str(DistributionText(self.kind, self.params))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, _source: Any, _handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )
