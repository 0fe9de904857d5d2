"""One plugin hook call, isolated from the run it watches.

A hook must not end, stall or corrupt a run. Each call:

- has a time limit. An ``async`` hook is cancelled when it is reached; a sync hook runs
  in a daemon thread of its own and is abandoned (a thread cannot be killed; a daemon
  one does not keep the process from exiting). Waiting for a thread slot
  (:data:`HOOK_THREADS` at once) does not count;
- is cut short by its run's stop (:class:`RunStop`), and is not started after it;
- turns whatever the hook raises into its outcome, ``SystemExit`` and
  ``KeyboardInterrupt`` included, except the run's own cancellation, which goes
  through. A Ctrl-C reaches a run as a cancellation (the command line's signal
  handling, asyncio's and anyio's runners) and never inside a worker thread; only
  where Python raises it as ``KeyboardInterrupt`` in the thread running an ``async``
  hook (its default SIGINT handler, on the main thread) is one let through, as the
  user's.
"""

from __future__ import annotations

import contextvars
import inspect
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["HOOK_THREADS", "HookOutcome", "RunStop", "call_hook", "hook_threads"]

HOOK_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Sync hooks running at once (the standard library's default for a thread pool):
enough for hooks that wait on I/O, few enough for hooks that compute."""


def hook_threads() -> anyio.CapacityLimiter:
    """The limiter for one run's sync hooks. An abandoned hook gives its slot back."""
    return anyio.CapacityLimiter(HOOK_THREADS)


@dataclass(frozen=True)
class HookOutcome:
    """How one hook call ended: its value, or what went wrong."""

    value: Any = None
    error: str | None = None
    """What went wrong, as recorded: the exception, the time-out, the stop."""
    timed_out: bool = False
    """It overran its time limit (and may still be running, abandoned)."""
    called: bool = True
    """False: never started (the run was stopped, or the plugin is called no more)."""


class RunStop:
    """A run's stop as its hooks see it: a deadline that cuts running hook calls short
    and keeps later ones from starting."""

    def __init__(self) -> None:
        self.deadline = math.inf
        self._scopes: set[anyio.CancelScope] = set()

    def stop(self, deadline: float) -> None:
        """Hooks end by ``deadline`` (``anyio.current_time()`` seconds); an earlier
        deadline than before wins."""
        self.deadline = min(self.deadline, deadline)
        for scope in self._scopes:
            scope.deadline = min(scope.deadline, self.deadline)

    @property
    def stopped(self) -> bool:
        return anyio.current_time() >= self.deadline

    @contextmanager
    def scope(self) -> Iterator[anyio.CancelScope]:
        """A cancel scope that this stop cuts short, now or later."""
        with anyio.CancelScope(deadline=self.deadline) as scope:
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)


@dataclass
class _Box:
    """What a hook's thread hands back."""

    value: Any = None
    error: BaseException | None = None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _ctrl_c_raises_here() -> bool:
    """Whether a Ctrl-C would be raised as KeyboardInterrupt in this thread (Python's
    default SIGINT handler, on the main thread): then one may be the user's."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )


async def _in_own_thread(fn: Callable[..., Any], args: tuple[Any, ...], name: str) -> _Box:
    """``fn(*args)`` in a new daemon thread (with this task's context variables); its
    value or exception. Cancelling the wait abandons the thread."""
    token = anyio.lowlevel.current_token()
    finished = anyio.Event()
    box = _Box()

    def work() -> None:
        try:
            box.value = fn(*args)
        except BaseException as exc:  # the hook's own, whatever it is: the caller's to judge
            box.error = exc
        finally:
            with suppress(RuntimeError):  # the event loop is gone: nobody is waiting
                anyio.from_thread.run_sync(finished.set, token=token)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(work,), name=name, daemon=True).start()
    await finished.wait()
    return box


async def call_hook(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    limit: float,
    stop: RunStop,
    threads: anyio.CapacityLimiter,
    name: str,
) -> HookOutcome:
    """Call the hook ``fn(*args)`` in isolation (see the module); never raises but for
    the run's own cancellation (or a Ctrl-C, as the module says)."""
    if stop.stopped:
        return HookOutcome(error="not called: the run was stopped", called=False)
    on_loop = inspect.iscoroutinefunction(fn)
    with stop.scope(), anyio.CancelScope() as own:
        try:
            if on_loop:
                own.deadline = anyio.current_time() + limit
                return HookOutcome(await fn(*args))
            async with threads:
                own.deadline = anyio.current_time() + limit
                box = await _in_own_thread(fn, args, name)
            if box.error is not None:
                return HookOutcome(error=_describe(box.error))
            return HookOutcome(box.value)
        except anyio.get_cancelled_exc_class() as exc:
            # a real cancellation is delivered again at this checkpoint; one the hook
            # raised by itself is not, and is the hook's failure
            await anyio.lowlevel.checkpoint_if_cancelled()
            return HookOutcome(error=_describe(exc) + " (raised by the hook)")
        except BaseException as exc:  # the hook's: SystemExit and the like end nothing
            if isinstance(exc, KeyboardInterrupt) and _ctrl_c_raises_here():
                raise
            return HookOutcome(error=_describe(exc))
    if own.cancelled_caught:
        return HookOutcome(error=f"timed out after {limit:g} s", timed_out=True)
    return HookOutcome(error="cut short: the run was stopped")
