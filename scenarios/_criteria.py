"""Checking a goal's criteria when a pack or transcript is validated, so that what
passes validation also works when it is scored.

``regex`` patterns must compile with RE2; ``number`` values must be numbers;
``json_schema`` values must be valid schemas with RE2 patterns and local ``$ref``s
only; ``state`` values must be state checks (``{"path": ..., "equals": ...}``) and name
no turn (they check the tools' environment document after the conversation);
``python`` criteria name code (``module:function``) and are refused unless the
caller allows code from packs, in which case the function must import and be callable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple

from pydantic import ValidationError

from ._regex import RegexError, compile_pack_regex
from ._schema import Criterion, Goal
from ._tool_schema import StateCheck

__all__ = ["CriterionProblem", "goal_problems", "CODE_REFUSED"]

CODE_REFUSED = (
    "code from a pack runs only when allowed (--allow-code, or allow_code=True); "
    "allow it only for packs you trust"
)
"""The end of every refusal of code a pack names."""


class CriterionProblem(NamedTuple):
    """What is wrong with one criterion's field (``goal.all_of.0.value``)."""

    field: str
    message: str


def goal_problems(goal: Goal | None, *, allow_code: bool) -> Iterator[CriterionProblem]:
    """Every criterion of ``goal`` that could not be checked as written."""
    if goal is None:
        return
    for group in ("all_of", "any_of"):
        for i, criterion in enumerate(getattr(goal, group)):
            wrong = _criterion_problem(criterion, allow_code)
            if wrong is not None:
                yield CriterionProblem(f"goal.{group}.{i}.value", wrong)
            if criterion.kind == "state" and criterion.turn_id is not None:
                yield CriterionProblem(
                    f"goal.{group}.{i}.turn_id",
                    "a state criterion checks the tools' environment after the conversation: "
                    "it names no turn",
                )


def _criterion_problem(criterion: Criterion, allow_code: bool) -> str | None:
    """What is wrong with a criterion's value for its kind, if anything."""
    value = criterion.value
    if criterion.kind in ("contains", "regex", "judge") and not isinstance(value, str):
        return f"a {criterion.kind} criterion needs text, not {type(value).__name__}"
    if criterion.kind == "regex":
        try:
            compile_pack_regex(value)
        except RegexError as exc:
            return str(exc)
    elif criterion.kind == "number":
        if isinstance(value, bool):
            return f"a number criterion needs a number, not {value!r}"
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return f"a number criterion needs a number, not {value!r}"
        if not math.isfinite(number):
            return f"a number criterion needs a finite number, not {value!r}"
    elif criterion.kind == "json_schema":
        return _schema_problem(value)
    elif criterion.kind == "python":
        return _code_problem(value, allow_code)
    elif criterion.kind == "state":
        return _state_problem(value)
    return None


def _state_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"a state criterion needs a state check object, not {type(value).__name__}"
    try:
        StateCheck.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"not a state check: {where + ': ' if where else ''}{first['msg']}"
    return None


def _code_problem(value: Any, allow_code: bool) -> str | None:
    if not allow_code:
        return f"{value!r} runs Python code: {CODE_REFUSED}"
    module, sep, attr = str(value).partition(":")
    if not isinstance(value, str) or not sep or not module or not attr:
        return f"a python criterion names a function as 'module:function', not {value!r}"
    from convsim._registry import import_object

    try:
        checker = import_object(value)
    except AttributeError:
        return f"module {module!r} has no {attr!r}"
    except Exception as exc:  # importing runs the module: anything can go wrong
        return f"cannot import {value!r}: {type(exc).__name__}: {exc}"
    if not callable(checker):
        return f"{value!r} is not callable"
    return None


_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
"""Schema keywords that point at another schema: a pack's stay inside its own."""


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, (dict, bool)):
        return f"a json_schema criterion needs a JSON schema object, not {type(schema).__name__}"
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(top)"
        return f"not a valid JSON schema at {where}: {exc.message}"
    for key, value in _schema_items(schema):
        if key in _REFERENCES and isinstance(value, str) and not value.startswith("#"):
            return f"{key} {value!r}: only references inside the schema ('#/...') are allowed"
        patterns = (
            [value] if key == "pattern" else list(value) if key == "patternProperties" else []
        )
        for pattern in patterns:
            if isinstance(pattern, str):
                try:
                    compile_pack_regex(pattern, ignore_case=False)
                except RegexError as exc:
                    return f"{key} {pattern!r}: {exc}"
    return None


def _schema_items(schema: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of every mapping in a schema, without recursion."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                yield key, value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
