"""Open files: what a run may hold at once, checked against the process's limit before
it starts, so that running out shows up as advice rather than as failed calls."""

from __future__ import annotations

from typing import NamedTuple

from .._errors import ConfigError

try:
    import resource
except ImportError:  # pragma: no cover (Windows has no such limit to check)
    resource = None  # type: ignore[assignment]

__all__ = ["DESCRIPTOR_HEADROOM", "DescriptorLimit", "ensure_descriptors"]

DESCRIPTOR_HEADROOM = 100
"""Descriptors kept for all but connections: results and log files, the event loop,
worker threads, the standard streams."""


class DescriptorLimit(NamedTuple):
    """The open-file limit as a run found (and perhaps raised) it."""

    needed: int
    soft: int
    """The limit in force now (after raising it, if it was raised)."""
    hard: int
    raised: bool
    """Whether the soft limit was raised for the run."""


def ensure_descriptors(needed: int, *, concurrency: int) -> DescriptorLimit | None:
    """Make sure this process may open ``needed`` files at once.

    A soft limit below ``needed`` is raised to it when the hard limit allows.

    Returns:
        the limit in force, or None where the platform has none to check.

    Raises:
        ConfigError: the limit cannot be raised that far; says what to do instead.
    """
    if resource is None:  # pragma: no cover
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited or soft >= needed:
        return DescriptorLimit(needed, soft, hard, raised=False)
    refusal = ConfigError(
        f"--concurrency {concurrency} needs about {needed} open files (a connection per "
        f"call in flight, plus {DESCRIPTOR_HEADROOM}), but the limit is {soft} (hard limit "
        f"{'unlimited' if hard == unlimited else hard}): run `ulimit -n {needed}` first, "
        "or lower --concurrency"
    )
    if hard != unlimited and hard < needed:
        raise refusal
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    except (ValueError, OSError):
        raise refusal from None
    return DescriptorLimit(needed, needed, hard, raised=True)
