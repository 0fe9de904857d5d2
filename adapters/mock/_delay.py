"""Delays of the mock server: fixed or drawn from a distribution, parsed from text."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["Delay", "format_number"]

_DELAY_FORMS = '"MS", "fixed:MS", "uniform:LO:HI", "exp:MEAN" or "normal:MEAN:SD"'


def format_number(value: float) -> str:
    """``value`` without a trailing ``.0`` when it is whole (``2.0`` -> ``"2"``)."""
    return str(int(value)) if value == int(value) else repr(value)


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"delay {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"delay {spec!r}: {text!r} is not a finite number")
    return value


@dataclass(frozen=True, slots=True)
class Delay:
    """A delay in milliseconds, fixed or drawn from a distribution.

    Build one with :meth:`parse` from a number (fixed milliseconds) or a string:
    ``"fixed:MS"``, ``"uniform:LO:HI"``, ``"exp:MEAN"`` (exponential) or
    ``"normal:MEAN:SD"`` (draws below zero count as zero). Draws come from the
    ``random.Random`` passed to :meth:`sample`, so a seeded server repeats its timings.
    """

    kind: Literal["fixed", "uniform", "exp", "normal"] = "fixed"
    params: tuple[float, ...] = (0.0,)

    @classmethod
    def parse(cls, value: Delay | float | str) -> Delay:
        """A delay from a number of milliseconds or one of the string forms.

        Raises:
            ValueError: the value is not one of the forms, or a bound is negative.
        """
        if isinstance(value, Delay):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"a delay is a number of milliseconds or {_DELAY_FORMS}")
        if not isinstance(value, str):
            spec = str(value)
            if not math.isfinite(value):
                raise ValueError(f"delay {spec!r} is not a finite number")
            return cls._checked("fixed", (float(value),), spec)
        spec = value.strip()
        kind, _, rest = spec.partition(":")
        if not rest:
            try:
                ms = float(spec)
            except ValueError:
                raise ValueError(f"delay {value!r}: expected {_DELAY_FORMS}") from None
            return cls._checked("fixed", (ms,), value)
        arity = {"fixed": 1, "uniform": 2, "exp": 1, "normal": 2}
        if kind not in arity:
            raise ValueError(f"delay {value!r}: unknown kind {kind!r}; expected {_DELAY_FORMS}")
        parts = rest.split(":")
        if len(parts) != arity[kind]:
            raise ValueError(f"delay {value!r}: {kind} takes {arity[kind]} number(s)")
        return cls._checked(kind, tuple(_number(p, value) for p in parts), value)  # type: ignore[arg-type]

    @classmethod
    def _checked(
        cls,
        kind: Literal["fixed", "uniform", "exp", "normal"],
        params: tuple[float, ...],
        spec: str,
    ) -> Delay:
        if not all(math.isfinite(p) for p in params):
            raise ValueError(f"delay {spec!r} is not a finite number")
        if kind in ("fixed", "exp") and params[0] < 0:
            raise ValueError(f"delay {spec!r} is negative")
        if kind == "uniform" and not 0 <= params[0] <= params[1]:
            raise ValueError(f"delay {spec!r}: uniform needs 0 <= LO <= HI")
        if kind == "normal" and params[1] < 0:
            raise ValueError(f"delay {spec!r}: the standard deviation is negative")
        return cls(kind, params)

    @property
    def is_zero(self) -> bool:
        """True when every draw is zero (then the server never sleeps for it)."""
        if self.kind == "uniform":
            return self.params[1] == 0
        if self.kind == "normal":
            return self.params[0] <= 0 and self.params[1] == 0
        return self.params[0] == 0

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
            return rng.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0
        return max(0.0, rng.gauss(p[0], p[1]))

    def __str__(self) -> str:
        return ":".join([self.kind, *map(format_number, self.params)])

    @classmethod
    def __get_pydantic_core_schema__(
        cls, _source: Any, _handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )
