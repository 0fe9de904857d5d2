"""What the task files written by ``convsim lm-eval-tasks`` import.

Their utils modules score answers and run conversations through these names, so the
files keep working from one version of convsim to the next.
"""

from __future__ import annotations

from ._export import NeedsConvsimModel as NeedsConvsimModel
from ._export import conversation_request as conversation_request
from ._export import conversation_scores as conversation_scores
from ._export import require_convsim_model as require_convsim_model
from ._export import std as std
from ._export import with_std as with_std

__all__ = [
    "NeedsConvsimModel",
    "conversation_request",
    "conversation_scores",
    "require_convsim_model",
    "std",
    "with_std",
]
