"""What every ``convsim`` command shares: its consoles, exit codes and error handling.

Exit codes: 0 the work finished (failures that are the model's own, such as
``model_error``, included); 2 bad input (files, options, settings, a descriptor limit
too low for the concurrency); 3 conversations failed for infrastructure reasons beyond
``--max-failure-rate``; 4 a model endpoint is unreachable, refused the key or has a
wrong URL (found before the run), or went away during it (the circuit breaker stopped
the run); 5 conversations hit their conversation timeout beyond ``--max-failure-rate``
(the model is too slow for the timeout: a setting, not an outage); 6 ``--max-cost``
stopped the run (``--resume`` runs the rest); 70 convsim crashed (an unexpected
exception: a bug; the traceback is printed); 100 a gate failed (``--fail-under`` or
``--fail-if-worse``, their metric scored on fewer than ``--min-scored`` conversations
included; ``load --fail-on-slo`` or ``--fail-on-invalid``); 130 interrupted.
When several apply, the first of 4, 3, 5 wins, and each of them comes before 100: a
gate is judged only on a run that finished.

Gate failures and crashes have codes of their own so that CI can tell "the model
regressed" (100, as promptfoo) from "convsim broke" (70, sysexits' ``EX_SOFTWARE``);
neither is 1, which Python gives any uncaught exception.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from .._errors import ConvsimError, EndpointError
from .._plural import counted
from ._logging import JsonLines

if TYPE_CHECKING:
    from .._runtime._handle import RunStatistics

__all__ = [
    "EXIT_OK",
    "EXIT_BAD_INPUT",
    "EXIT_INFRASTRUCTURE_FAILURES",
    "EXIT_ENDPOINT_UNREACHABLE",
    "EXIT_TIMEOUTS",
    "EXIT_MAX_COST",
    "EXIT_CRASHED",
    "EXIT_GATE_FAILED",
    "EXIT_THRESHOLD_FAILED",
    "EXIT_INTERRUPTED",
    "RunVerdict",
    "LOG_FORMAT",
    "clear_errors",
    "json_logs",
    "print_error",
    "run_verdict",
    "timeout_line",
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
EXIT_TIMEOUTS = 5
"""More conversations hit their conversation timeout than ``--max-failure-rate``
allows: the model answers too slowly for the timeout (raise ``--conversation-timeout``).
Timeouts are counted apart from infrastructure failures, each against the rate."""
EXIT_MAX_COST = 6
"""``--max-cost`` stopped the run before its last conversation (``--resume`` runs the
rest)."""
EXIT_CRASHED = 70
"""An unexpected exception ended the command (a bug in convsim or a plugin): its
traceback is printed. sysexits' ``EX_SOFTWARE``."""
EXIT_GATE_FAILED = 100
"""A quality gate failed: the run finished and was judged, and the figures are below
what was asked (``--fail-under``, ``--fail-if-worse``, ``--min-scored``); one ``gate
failed:`` line each. The code promptfoo gives its failed assertions."""
EXIT_THRESHOLD_FAILED = 99
"""A load test's gate failed (``--fail-on-slo``, ``--fail-on-invalid``): apart from
quality gates, so that CI tells "too slow" from "answers got worse". The code k6 gives
its failed thresholds."""
EXIT_INTERRUPTED = 130
P = ParamSpec("P")
R = TypeVar("R")


LOG_FORMAT = "convsim.log_format"
"""Where the context keeps ``--log-format`` (its ``meta``, shared by every command)."""


def stdout() -> Console:
    # emoji=False: "scenarios.jsonl:100:" would otherwise print as "scenarios.jsonl💯"
    return Console(soft_wrap=True, emoji=False)


def json_logs() -> bool:
    """Whether the command runs with ``--log-format json``."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.meta.get(LOG_FORMAT) == "json"


def stderr() -> Console:
    """The console for messages: on stderr, as JSON events with ``--log-format json``
    (every line of stderr is then JSON), as text otherwise."""
    if json_logs():
        return Console(file=JsonLines(), soft_wrap=True, emoji=False, no_color=True)
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


def run_verdict(
    stats: RunStatistics,
    *,
    interrupted: bool,
    max_failure_rate: float,
    users_timeout: bool = False,
) -> RunVerdict:
    """The exit code of a run from its statistics: interrupted 130; stopped by the
    circuit breaker 4; infrastructure failures (FAILED with ``infrastructure_error``)
    above ``max_failure_rate`` of the conversations it finished 3; conversations that
    hit their conversation timeout (TIMED_OUT) above ``max_failure_rate`` 5; otherwise 0.

    Timeouts count against ``max_failure_rate`` on their own, not with infrastructure
    failures: a run is too slow for its timeout, or its endpoint fails, and CI can tell
    which. ``users_timeout`` says the timeout was the user's (``--conversation-timeout``)
    rather than the pack's, for the timeout line (:func:`timeout_line`).
    """
    if interrupted:
        return RunVerdict(EXIT_INTERRUPTED, None)
    if stats.stopped == "max_cost":
        return RunVerdict(EXIT_MAX_COST, None)  # the run says so itself
    if stats.stopped_early is not None:
        left = stats.total - stats.started
        return RunVerdict(
            EXIT_ENDPOINT_UNREACHABLE,
            f"stopped early: {stats.stopped_early}; {counted(left, 'conversation')} not "
            "started — "
            "run again with --resume --retry-failed once the endpoint is back",
        )
    attempted = stats.done + stats.failed + stats.timed_out
    failures = stats.infrastructure_failures
    if attempted and failures / attempted > max_failure_rate:
        return RunVerdict(
            EXIT_INFRASTRUCTURE_FAILURES,
            f"{failures} of {counted(attempted, 'conversation')} failed for infrastructure "
            "reasons "
            f"({failures / attempted:.0%}), above --max-failure-rate {max_failure_rate:g}",
        )
    if attempted and stats.timed_out / attempted > max_failure_rate:
        return RunVerdict(EXIT_TIMEOUTS, timeout_line(stats, users_timeout=users_timeout))
    return RunVerdict(EXIT_OK, None)


def timeout_line(stats: RunStatistics, *, users_timeout: bool) -> str | None:
    """The line that says how many conversations hit their conversation timeout, which
    timeout (the user's or the pack's), how long the slowest turn took and how to raise
    it; None when none timed out."""
    if not stats.timed_out:
        return None
    attempted = stats.done + stats.failed + stats.timed_out
    limits = stats.timeouts_s
    if not limits:
        limit = ""
    elif len(limits) == 1:
        limit = f"the {_seconds(limits[0])} s "
    else:
        limit = f"the {_seconds(min(limits))} to {_seconds(max(limits))} s "
    whose = "yours" if users_timeout else "the pack's"
    slowest = (
        "no turn finished within it"
        if stats.slowest_turn_s is None
        else f"the slowest turn took {_seconds(stats.slowest_turn_s)} s"
    )
    return (
        f"{stats.timed_out} of {counted(attempted, 'conversation')} hit "
        f"{limit or 'the '}conversation "
        f"timeout ({whose}); {slowest} — raise it with --conversation-timeout"
    )


def _seconds(value: float) -> str:
    """Seconds as a person reads them: 240, 131, 3.5, 0.05."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"
