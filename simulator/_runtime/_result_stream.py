"""The results of one run as they finish: what a run handle is iterated for."""

from __future__ import annotations

import math

import anyio

from .._records import ConversationResult

__all__ = ["ResultStream"]


class ResultStream:
    """Results sent as conversations finish, read by iterating; the run's error, if it
    failed, raised at the end of the iteration. Base of the run handles (one process,
    or Ray)."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[ConversationResult](math.inf)
        self._error: BaseException | None = None
        self._finished = anyio.Event()

    def __aiter__(self) -> ResultStream:
        return self

    async def __anext__(self) -> ConversationResult:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop delivering results to this handle (the run and its sink go on)."""
        self._receive.close()
