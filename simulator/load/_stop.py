"""Stopping a load run early: what a signal asks for, heard wherever the run is driven.

A :class:`StopRequest` lives in the event loop running the run. The first request
stops sending; the requests in flight get the shape's ``interrupt_grace``. A second
one (or one ``at_once``) cancels them. What was measured before is kept and marked
partial. :class:`ThreadedStop` carries requests into that loop from another thread:
a worker process's pipe reader, or a Ray actor's second thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from anyio.from_thread import BlockingPortal

from convsim._errors import ConfigError

__all__ = ["StopRequest", "ThreadedStop", "NothingMeasured"]

Listener = Callable[[bool], None]
"""Called with ``at_once`` on each request."""


class NothingMeasured(ConfigError):
    """The run ended (or was stopped) before its measured window began."""


class StopRequest:
    """A request to end a load run before its end, made in the loop that runs it."""

    def __init__(self) -> None:
        self.asked = False
        """A stop was asked for: what was measured is partial."""
        self.at_once = False
        """The requests in flight are cancelled without a grace."""
        self._listeners: list[Listener] = []

    def ask(self, *, at_once: bool = False) -> None:
        """Stop the run: gracefully the first time, at once the second time (or when
        ``at_once``). Every listener hears it."""
        at_once = at_once or self.asked
        if self.at_once or (self.asked and not at_once):
            return
        self.asked, self.at_once = True, at_once
        for listener in list(self._listeners):
            listener(at_once)

    @contextlib.contextmanager
    def listening(self, listener: Listener) -> Iterator[None]:
        """Call ``listener(at_once)`` on each request while the block runs; at once
        with the request made so far, if one was."""
        self._listeners.append(listener)
        try:
            if self.asked:
                listener(self.at_once)
            yield
        finally:
            self._listeners.remove(listener)


class ThreadedStop:
    """Stop requests from another thread, delivered to the :class:`StopRequest` of a
    loop while it :meth:`serves`; a request made before (or between) is kept and
    delivered when serving starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._request: StopRequest | None = None
        self._pending: bool | None = None
        """A request made while no loop served: its ``at_once``."""

    def ask(self, at_once: bool) -> None:
        """Ask for a stop (from any thread but the serving loop's)."""
        with self._lock:
            portal, request = self._portal, self._request
            if portal is None or request is None:
                self._pending = at_once or self._pending is not None  # a second ask
                return
        with contextlib.suppress(RuntimeError):  # the loop stopped serving meanwhile
            portal.call(functools.partial(request.ask, at_once=at_once))

    @contextlib.asynccontextmanager
    async def serves(self) -> AsyncIterator[StopRequest]:
        """The stop request of the running loop, fed with this object's requests. An
        error of the block comes out as it was raised (not in an exception group)."""
        request = StopRequest()
        error: Exception | None = None
        async with BlockingPortal() as portal:
            with self._lock:
                self._portal, self._request = portal, request
                pending, self._pending = self._pending, None
            if pending is not None:
                request.ask(at_once=pending)
            try:
                yield request
            except Exception as exc:  # re-raised outside the portal's task group
                error = exc
            finally:
                with self._lock:
                    self._portal = self._request = None
        if error is not None:
            raise error
