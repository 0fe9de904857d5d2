"""Python tools for the agent turn tests (``python: _agent_tools:NAME``)."""

from __future__ import annotations

import anyio


async def wait_forever() -> str:
    """Never answers: the conversation's cancellation or deadline must end it."""
    await anyio.Event().wait()
    raise AssertionError("unreachable")  # pragma: no cover
