"""Names the command line needs before anything heavy (numpy) is imported."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["ArrivalPattern", "ARRIVAL_PATTERNS", "DEFAULT_SYNTHETIC"]

ArrivalPattern = Literal["constant", "poisson", "gamma"]
ARRIVAL_PATTERNS: tuple[str, ...] = get_args(ArrivalPattern)

DEFAULT_SYNTHETIC = "turns=3,input_tokens=256,output_tokens=64"
"""The sessions of ``convsim load`` when no workload is given."""
