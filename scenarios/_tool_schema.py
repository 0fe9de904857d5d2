"""The file formats of tools in a pack, as pydantic models.

A multi-turn pack declares its tools in ``tools.yml`` (:class:`ToolsFile`): each tool's
name, description and JSON-schema parameters, and how it is answered, all data by
default. A tool answers from declared ``responses`` (matched on its arguments), through
``operations`` on the conversation's environment (a JSON document, reset for every
conversation from the pack's ``environment`` or the scenario's own), or, only with
``allow_code``, by a Python function (``python: module:function``). Scenarios name the
calls they expect and the state the environment should end in (:class:`StateCheck`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "STATE_TESTS",
    "StateCheck",
    "ToolResponse",
    "ToolOperation",
    "ToolDefinition",
    "ToolsFile",
    "ExpectedToolCall",
    "TrajectoryMode",
    "TOOL_NAME_PATTERN",
]

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""What OpenAI and Anthropic accept as a tool's name."""

TrajectoryMode = Literal["strict", "unordered", "subset", "superset"]
"""How ``trajectory_match`` compares the calls made with the calls expected: the same
calls in the same order (strict), in any order (unordered), only expected ones, perhaps
not all (subset), or all expected ones, perhaps with others (superset)."""

STATE_TESTS = ("equals", "not_equals", "exists", "one_of", "at_least", "at_most")
"""The tests a :class:`StateCheck` may make; it makes exactly one."""


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StateCheck(_Input):
    """One condition on the environment document: a precondition of a tool's operation,
    a scenario's expected final state, or a goal criterion of kind ``state``.

    ``path`` is a dotted key path (``orders.A-1001.status``; list items by index); in a
    precondition, ``{name}`` placeholders take the call's arguments. It makes exactly one
    test: ``equals``, ``not_equals``, ``exists`` (true: the path exists; false: it does
    not), ``one_of`` (a list), ``at_least`` or ``at_most`` (numbers).
    """

    path: str = Field(min_length=1)
    equals: Any = None
    not_equals: Any = None
    exists: bool | None = None
    one_of: list[Any] | None = None
    at_least: float | None = None
    at_most: float | None = None
    error: str | None = None
    """What the model is told when a precondition does not hold (a default says which
    condition failed)."""

    @model_validator(mode="after")
    def _one_test(self) -> StateCheck:
        made = [name for name in STATE_TESTS if name in self.model_fields_set]
        if len(made) != 1:
            listed = ", ".join(STATE_TESTS)
            found = ", ".join(made) if made else "none"
            raise ValueError(f"give exactly one of {listed} (found {found})")
        return self

    @property
    def test(self) -> str:
        """The test this check makes (one of :data:`STATE_TESTS`)."""
        return next(name for name in STATE_TESTS if name in self.model_fields_set)

    @property
    def expected(self) -> Any:
        """The value its test compares with."""
        return getattr(self, self.test)


class ToolResponse(_Input):
    """A declared answer: used when the call's arguments include every ``match`` pair
    (numbers compared as numbers, strings exactly); ``result`` is what the tool returns,
    or ``error`` what it fails with."""

    match: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None

    @model_validator(mode="after")
    def _result_or_error(self) -> ToolResponse:
        if self.error is not None and "result" in self.model_fields_set:
            raise ValueError("give a result or an error, not both")
        return self


class ToolOperation(_Input):
    """One change or read of the environment document.

    ``path`` and string ``value``s may hold ``{name}`` placeholders: a string that is
    one placeholder alone takes the argument's value as it is (a number stays a
    number); inside a longer string it is written as text. ``get`` reads the value at
    the path, ``set`` writes ``value`` there, ``append`` adds it to the list there, and
    ``remove`` deletes the key or item. Every precondition of every operation of a call
    is checked before any operation runs: a call that fails one changes nothing.
    """

    op: Literal["get", "set", "append", "remove"]
    path: str = Field(min_length=1)
    value: Any = None
    preconditions: list[StateCheck] = Field(default_factory=list)

    @model_validator(mode="after")
    def _value_where_needed(self) -> ToolOperation:
        if self.op in ("set", "append") and "value" not in self.model_fields_set:
            raise ValueError(f"op {self.op!r} needs a value")
        if self.op in ("get", "remove") and "value" in self.model_fields_set:
            raise ValueError(f"op {self.op!r} takes no value")
        return self


class ToolDefinition(_Input):
    """One tool of a pack (an item of ``tools.yml``'s ``tools``).

    Exactly one of ``responses``, ``operations`` and ``python`` says how it answers.
    ``result`` (with operations) is what the model is told after they ran, placeholders
    filled; without it, the value a ``get`` read, else ``{"ok": true}``.
    """

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """The arguments' JSON schema (an object schema); calls whose arguments fail it get
    an ``invalid_arguments`` error and run nothing."""
    responses: list[ToolResponse] | None = None
    default: ToolResponse | None = None
    """With ``responses``: the answer when none matches (without it, an error saying
    no declared answer matches)."""
    operations: list[ToolOperation] | None = None
    result: Any = None
    python: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """``package.module:function``, called with the arguments as keywords and the
    environment document as ``environment`` if it takes one; runs only with
    ``allow_code``."""
    timeout: float = Field(default=10.0, gt=0, le=600)
    """Seconds the tool may take before the model is told it timed out."""

    @model_validator(mode="after")
    def _one_way_to_answer(self) -> ToolDefinition:
        ways = [n for n in ("responses", "operations", "python") if getattr(self, n) is not None]
        if len(ways) != 1:
            found = ", ".join(ways) if ways else "none"
            raise ValueError(
                f"tool {self.name!r}: give exactly one of responses, operations, python "
                f"(found {found})"
            )
        if self.default is not None and self.responses is None:
            raise ValueError(f"tool {self.name!r}: default goes with responses")
        if "result" in self.model_fields_set and self.operations is None:
            raise ValueError(f"tool {self.name!r}: result goes with operations")
        return self


class ToolsFile(_Input):
    """A pack's ``tools.yml``."""

    environment: dict[str, Any] = Field(default_factory=dict)
    """The environment document every conversation starts from (a scenario's own
    ``environment`` replaces it)."""
    tools: list[ToolDefinition] = Field(min_length=1)


class ExpectedToolCall(_Input):
    """A call a scenario expects the model to make: the tool, and the arguments it
    must pass (others it passes are not held against it); ``turn_id`` when the call
    belongs to one turn."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    turn_id: str | None = None
