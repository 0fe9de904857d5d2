"""How many requests a workload's session sends: what a rate of sessions offers.

``--rate`` counts sessions per second, and a session sends every one of its turns, so
the requests per second it offers are the rate times the mean requests per session.
``--request-rate`` counts requests and so needs sessions of one request each.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ._distributions import Exponential, Fixed, LogNormal, Normal, Uniform
from ._mooncake import MooncakeSessions
from ._workloads import PackSessions, SessionScript, ShareGPTSessions, SyntheticSessions, Workload

__all__ = ["SessionRequests", "session_requests"]

_SAMPLED = 512
"""Sessions looked at for a workload whose sessions are drawn (synthetic ones)."""


class SessionRequests(NamedTuple):
    """The requests one session of a workload sends."""

    single: bool
    """Every session sends exactly one request (one turn, no tool rounds)."""
    mean: float | None
    """Requests per session on average; None when tool turns make it unknown (each
    tool call the model makes adds a request)."""


def _largest(dist: Fixed | Uniform | Normal | LogNormal | Exponential) -> float:
    if isinstance(dist, Fixed):
        return dist.value
    if isinstance(dist, Uniform | Normal | LogNormal):
        return dist.high
    return math.inf


def _of_scripts(scripts: list[SessionScript]) -> SessionRequests:
    if any(turn.tools for script in scripts for turn in script.turns):
        return SessionRequests(single=False, mean=None)
    counts = [len(script.turns) for script in scripts]
    mean = sum(counts) / len(counts) if counts else None
    return SessionRequests(single=bool(counts) and max(counts) == 1, mean=mean)


def session_requests(workload: Workload) -> SessionRequests:
    """The requests per session of ``workload``: exact for packs and datasets (each
    conversation once), estimated from the first sessions for synthetic ones."""
    if isinstance(workload, MooncakeSessions):
        return SessionRequests(single=True, mean=1.0)
    if isinstance(workload, SyntheticSessions):
        drawn = _of_scripts([workload.session(i) for i in range(_SAMPLED)])
        single = _largest(workload.workload.turns) <= 1
        return SessionRequests(single=single, mean=1.0 if single else drawn.mean)
    if isinstance(workload, ShareGPTSessions):
        n = len(workload.conversations)
        return _of_scripts([workload.session(i) for i in range(n)])
    if isinstance(workload, PackSessions):
        return _of_scripts([workload.session(i) for i in range(len(workload.conversations))])
    size = workload.size
    count = _SAMPLED if size is None else min(size, _SAMPLED)
    seen = _of_scripts([workload.session(i) for i in range(count)])
    if size is None or size > count:
        return SessionRequests(single=False, mean=seen.mean)
    return seen
