"""Reading the tools' environment document by key path, and checking conditions on it.

One reading serves the three places a :class:`StateCheck` is used: a tool operation's
preconditions, a scenario's expected final state, and goal criteria of kind ``state``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._tool_schema import StateCheck

__all__ = [
    "MISSING",
    "PLACEHOLDER",
    "StateVerdict",
    "fill_placeholders",
    "resolve_path",
    "check_state",
    "same_json",
]

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A ``{name}`` placeholder of a tool's paths, values and results: a call's argument."""


class _Missing:
    """No value at a path (not the same as a JSON null)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class StateVerdict:
    """Whether a check held, and what the path held when it was made."""

    held: bool
    path: str
    """The path checked, placeholders filled."""
    actual: Any
    """The value found (:data:`MISSING` when there was none)."""
    message: str
    """One sentence: what was expected and what was found."""


def fill_placeholders(text: str, arguments: Mapping[str, Any]) -> str:
    """``text`` with each ``{name}`` replaced by the argument's value as text; KeyError
    names an argument the call did not pass."""
    return PLACEHOLDER.sub(lambda m: _as_text(arguments[m.group(1)]), text)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def resolve_path(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of ``document`` (list items by index);
    :data:`MISSING` when a step does not exist."""
    value = document
    for step in path.split("."):
        if isinstance(value, Mapping):
            if step not in value:
                return MISSING
            value = value[step]
        elif isinstance(value, list):
            if not re.fullmatch(r"-?\d+", step) or not -len(value) <= int(step) < len(value):
                return MISSING
            value = value[int(step)]
        else:
            return MISSING
    return value


def same_json(actual: Any, expected: Any) -> bool:
    """JSON equality, numbers by value (1 == 1.0) but never a bool for a number."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        return actual.keys() == expected.keys() and all(
            same_json(actual[k], expected[k]) for k in actual
        )
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            same_json(a, e) for a, e in zip(actual, expected, strict=True)
        )
    return bool(actual == expected)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def check_state(
    document: Any, check: StateCheck, arguments: Mapping[str, Any] | None = None
) -> StateVerdict:
    """Make ``check`` on ``document``; ``arguments`` fill the path's placeholders (a
    precondition), and a placeholder with no argument makes the check fail."""
    try:
        path = fill_placeholders(check.path, arguments or {})
    except KeyError as exc:
        return StateVerdict(
            False, check.path, MISSING, f"{check.path}: no argument {exc.args[0]!r} was passed"
        )
    actual = resolve_path(document, path)
    test, expected = check.test, check.expected
    found = "nothing" if actual is MISSING else _shown(actual)
    if test == "exists":
        held = (actual is not MISSING) == expected
        wanted = "to exist" if expected else "not to exist"
        return StateVerdict(held, path, actual, f"{path}: expected {wanted}, found {found}")
    if test == "equals":
        held = actual is not MISSING and same_json(actual, expected)
        wanted = _shown(expected)
    elif test == "not_equals":
        held = actual is MISSING or not same_json(actual, expected)
        wanted = f"anything but {_shown(expected)}"
    elif test == "one_of":
        held = actual is not MISSING and any(same_json(actual, e) for e in expected)
        wanted = f"one of {_shown(expected)}"
    else:
        number = _number(actual)
        if test == "at_least":
            held = number is not None and number >= expected
            wanted = f"at least {expected:g}"
        else:
            held = number is not None and number <= expected
            wanted = f"at most {expected:g}"
    return StateVerdict(held, path, actual, f"{path}: expected {wanted}, found {found}")


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
