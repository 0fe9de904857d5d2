"""Load once per process: the models and files metrics need, built by one caller while
the others wait.

``functools.cache`` does not lock: callers that ask for a value at the same time each
compute it. Scorers run in worker threads, so conversations that finished together each
loaded their own copy of the same model, all held at once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import Generic, ParamSpec, TypeVar

__all__ = ["LoadedOnce"]

P = ParamSpec("P")
T = TypeVar("T")


class LoadedOnce(Generic[P, T]):
    """Decorator: ``load``'s value for each set of (hashable) arguments, loaded by the
    first caller under a lock and kept for the life of the process.

    Callers that arrive while it loads wait for that load instead of loading too.

    A load that raises keeps nothing: its exception goes, unchanged, to the caller
    whose load it was, and the next caller (one that was waiting included) loads
    again. A failure that passes (a file being replaced, memory short for a moment) is
    not remembered for good; one that lasts is met by each caller in turn, each with
    the loader's own error. Loads of different arguments also take turns. ``load``
    must not call the function it is wrapped in (the lock is not reentrant).
    """

    def __init__(self, load: Callable[P, T]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._values: dict[Hashable, T] = {}
        functools.update_wrapper(self, load)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        key = (args, tuple(sorted(kwargs.items())))
        try:
            return self._values[key]  # loaded already: no lock to take
        except KeyError:
            pass
        with self._lock:
            if key not in self._values:
                self._values[key] = self._load(*args, **kwargs)
            return self._values[key]

    def cache_clear(self) -> None:
        """Forget every value: the next call loads again (for tests)."""
        with self._lock:
            self._values.clear()
