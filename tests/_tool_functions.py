"""Python tools for the ToolBox tests (``python: _tool_functions:NAME``)."""

from __future__ import annotations

from typing import Any

import anyio

GATES: dict[str, anyio.Event] = {}
"""Events a test registers: ``started`` is set when :func:`slow` begins, and it waits
for ``release``."""


async def slow(environment: dict[str, Any]) -> dict[str, Any]:
    GATES["started"].set()
    await GATES["release"].wait()
    environment["touched"] = True
    return {"done": True}


def add_note(note: str, environment: dict[str, Any]) -> dict[str, Any]:
    environment.setdefault("notes", []).append(note)
    return {"notes": len(environment["notes"])}


async def shout(text: str) -> str:
    return text.upper()


def fails(order_id: str, environment: dict[str, Any]) -> None:
    environment["half"] = "done"
    raise LookupError(f"no order {order_id}")


def returns_a_set() -> Any:
    return {1, 2}


def big() -> str:
    return "é" * 40_000
