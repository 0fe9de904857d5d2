"""Beyond one process: convsim runs on Ray (``pip install 'convsim[ray]'``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._ray import RayProgress as RayProgress
    from ._ray import RayRun as RayRun
    from ._ray import RayRunHandle as RayRunHandle
    from ._ray import RaySimulator as RaySimulator
    from ._ray import run_on_ray as run_on_ray
    from ._ray import shard_of as shard_of

__getattr__, __dir__ = _lazy_module(__name__, globals())
