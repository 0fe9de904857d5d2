"""Checking a tool call's arguments against the tool's JSON schema (Draft 2020-12).

A pack's schema comes from someone else: its ``pattern`` and ``patternProperties`` run
on RE2 (linear time), as goal regexes do, and no reference is fetched (jsonschema
retrieves nothing it is not given).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema.protocols import Validator as ArgumentsValidator

from ._regex import compile_pack_regex, pack_regex_search

__all__ = ["ArgumentsValidator", "arguments_validator", "first_problem"]


def _search(pattern: str, text: str) -> bool:
    compile_pack_regex(pattern, ignore_case=False)  # RegexError: the loader refuses it first
    return pack_regex_search(pattern, text, ignore_case=False)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def arguments_validator(schema: dict[str, Any]) -> ArgumentsValidator:
    """A Draft 2020-12 validator for ``schema`` whose patterns run on RE2."""
    cls = jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        {"pattern": _pattern, "patternProperties": _pattern_properties},
    )
    validator: ArgumentsValidator = cls(schema)
    return validator


def first_problem(validator: ArgumentsValidator, instance: Any) -> str | None:
    """The most relevant way ``instance`` fails the schema, naming the field
    (``order_id: 'B-1' does not match ...``); None when it fits."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is None:
        return None
    field = ".".join(str(p) for p in error.absolute_path)
    return f"{field}: {error.message}" if field else error.message
