"""A pack's tools: their declarations and the environment conversations start from."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from convsim._types import ToolSpec

from ._schema import Scenario
from ._tool_schema import ToolDefinition

__all__ = ["ToolSet"]


@dataclass(frozen=True)
class ToolSet:
    """The tools a pack declares (``tools.yml``), shared by its conversations."""

    definitions: tuple[ToolDefinition, ...]
    environment: dict[str, Any] = field(default_factory=dict)
    """The pack's environment document (a scenario may bring its own)."""
    source: str = "tools.yml"
    """Where they were declared, for messages."""

    def __post_init__(self) -> None:
        names = [d.name for d in self.definitions]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{self.source}: tools declared twice: {', '.join(twice)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.definitions)

    def get(self, name: str) -> ToolDefinition | None:
        """The tool called ``name``; None when the pack has none by that name."""
        return next((d for d in self.definitions if d.name == name), None)

    def specs(self, names: Sequence[str] | None = None) -> tuple[ToolSpec, ...]:
        """What the model is told of the tools ``names`` (every tool when None), in
        the order they are declared."""
        wanted = None if names is None else frozenset(names)
        return tuple(
            ToolSpec(name=d.name, description=d.description, parameters=d.parameters)
            for d in self.definitions
            if wanted is None or d.name in wanted
        )

    def initial_environment(self, scenario: Scenario) -> dict[str, Any]:
        """A fresh copy of the document ``scenario``'s conversations start from: its
        own ``environment``, else the pack's."""
        start = scenario.environment if scenario.environment is not None else self.environment
        return copy.deepcopy(start)
