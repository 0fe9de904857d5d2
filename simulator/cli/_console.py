"""What every ``convsim`` command shares: its consoles, exit codes and error handling.

Exit codes: 0 the work finished (failures that are the model's own, such as
``model_error``, included); 2 bad input (files, options, settings, a descriptor limit
too low for the concurrency); 3 conversations failed for infrastructure reasons beyond
``--max-failure-rate``; 4 a model endpoint is unreachable, refused the key or has a
wrong URL (found before the run), or went away during it (the circuit breaker stopped
the run); 130 interrupted.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, ParamSpec, TypeVar

from rich.console import Console
from rich.markup import escape

from .._errors import ConvsimError, EndpointError

if TYPE_CHECKING:
    from .._runtime._simulator import RunStatistics

__all__ = [
    "EXIT_OK",
    "EXIT_BAD_INPUT",
    "EXIT_INFRASTRUCTURE_FAILURES",
    "EXIT_ENDPOINT_UNREACHABLE",
    "EXIT_INTERRUPTED",
    "RunVerdict",
    "clear_errors",
    "print_error",
    "run_verdict",
    "stderr",
    "stdout",
]

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INFRASTRUCTURE_FAILURES = 3
"""More conversations failed for infrastructure reasons than ``--max-failure-rate``
allows."""
EXIT_ENDPOINT_UNREACHABLE = 4
"""A model endpoint cannot be used: found before the run, or by the circuit breaker."""
EXIT_INTERRUPTED = 130
P = ParamSpec("P")
R = TypeVar("R")


def stdout() -> Console:
    # emoji=False: "scenarios.jsonl:100:" would otherwise print as "scenarios.jsonl💯"
    return Console(soft_wrap=True, emoji=False)


def stderr() -> Console:
    return Console(stderr=True, soft_wrap=True, emoji=False)


def print_error(message: str) -> None:
    """One ``error:`` line on stderr."""
    stderr().print(f"[bold red]error:[/] {escape(message)}", highlight=False)


def clear_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn convsim's own errors into one message on stderr and exit code 2 (4 for an
    endpoint that cannot be used)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except EndpointError as exc:
            print_error(str(exc))
            sys.exit(EXIT_ENDPOINT_UNREACHABLE)
        except ConvsimError as exc:
            print_error(str(exc))
            sys.exit(EXIT_BAD_INPUT)

    return wrapper


class RunVerdict(NamedTuple):
    """How a finished run exits, and the line that says why (None for a clean run)."""

    code: int
    message: str | None


def run_verdict(stats: RunStatistics, *, interrupted: bool, max_failure_rate: float) -> RunVerdict:
    """The exit code of a run from its statistics: interrupted 130; stopped by the
    circuit breaker 4; infrastructure failures (FAILED with ``infrastructure_error``,
    or TIMED_OUT) above ``max_failure_rate`` of the conversations it finished 3;
    otherwise 0."""
    if interrupted:
        return RunVerdict(EXIT_INTERRUPTED, None)
    if stats.stopped_early is not None:
        left = stats.total - stats.started
        return RunVerdict(
            EXIT_ENDPOINT_UNREACHABLE,
            f"stopped early: {stats.stopped_early}; {left} conversations not started — "
            "run again with --resume --retry-failed once the endpoint is back",
        )
    attempted = stats.done + stats.failed + stats.timed_out
    failures = stats.infrastructure_failures
    if attempted and failures / attempted > max_failure_rate:
        return RunVerdict(
            EXIT_INFRASTRUCTURE_FAILURES,
            f"{failures} of {attempted} conversations failed for infrastructure reasons "
            f"({failures / attempted:.0%}), above --max-failure-rate {max_failure_rate:g}",
        )
    return RunVerdict(EXIT_OK, None)
