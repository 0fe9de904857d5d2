"""A task's own test cases for code answers: ``metadata.tests`` of a scenario or problem.

The ``validate_logic`` metric runs them against the Python in the answers, in a
subprocess with limits, and only when the pack was loaded with ``allow_code``. A pack
names them in its data, so that bundled formats need no new field::

    {"question": "Write add(a, b).", ..., "metadata": {"tests": ["assert add(2, 3) == 5"]}}

or, with the optional settings::

    "metadata": {"tests": {"cases": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"],
                           "setup": "import math", "turn_id": "fix", "timeout_s": 5}}

Each case is Python that passes when it runs without raising, after the answer's code and
the setup. Loading a pack checks that every case compiles (compiling runs nothing), so a
broken test is reported with its file, line and field before any answer is scored.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ._criteria import CriterionProblem

__all__ = ["CodeTests", "TESTS_FIELD", "code_tests", "code_tests_problems"]

TESTS_FIELD = "tests"
"""The key of ``metadata`` that holds the test cases."""


def _python(code: str) -> str:
    """``code``, checked to compile (compiling runs nothing)."""
    try:
        compile(code, "<test>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ValueError(f"not Python: {exc.msg} (line {exc.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, deep nesting
        raise ValueError(f"not Python: {type(exc).__name__}") from None
    return code


def _case(code: str) -> str:
    if not code.strip():
        raise ValueError("an empty test case tests nothing")
    return _python(code)


Case = Annotated[str, AfterValidator(_case)]


class CodeTests(BaseModel):
    """The test cases of one scenario or problem, and how they run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cases: tuple[Case, ...] = Field(min_length=1, max_length=200)
    """Python statements; a case passes when it runs without raising."""
    setup: Annotated[str, AfterValidator(_python)] = ""
    """Python run once after the answer's code and before the cases (imports, data)."""
    turn_id: str | None = None
    """The turn whose answer is tested; None: the code of every answered turn, in turn
    order (a later definition replaces an earlier one, as when pasting them in order)."""
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    """Seconds each step may take: each block of the answer's code, the setup, each case."""
    memory_mb: int = Field(default=512, ge=64, le=16384)
    """The address space the process may use, in MiB."""


def code_tests(metadata: Mapping[str, Any]) -> CodeTests | None:
    """The test cases ``metadata`` holds, or None when it holds none.

    Raises:
        ValueError: ``metadata.tests`` is not a list of cases nor a mapping of the
            fields of :class:`CodeTests` (a pydantic ValidationError is a ValueError).
    """
    raw = metadata.get(TESTS_FIELD)
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        return CodeTests(cases=tuple(raw))
    if isinstance(raw, Mapping):
        return CodeTests.model_validate(dict(raw))
    raise ValueError(
        f"expected a list of test cases or a mapping with 'cases', not {type(raw).__name__}"
    )


def code_tests_problems(
    metadata: Mapping[str, Any], turn_ids: Collection[str] | None = None
) -> Iterator[CriterionProblem]:
    """What is wrong with the test cases of ``metadata`` (fields ``metadata.tests...``);
    ``turn_ids``: the turns a ``turn_id`` may name."""
    where = f"metadata.{TESTS_FIELD}"
    try:
        tests = code_tests(metadata)
    except ValidationError as exc:
        errors = exc.errors()
        inner = [e["loc"] for e in errors]
        for error in errors:
            loc_parts = error["loc"]
            if error["type"] == "too_short" and any(
                len(other) > len(loc_parts) and other[: len(loc_parts)] == loc_parts
                for other in inner
            ):
                continue  # a case that failed its own check is not also "too few cases"
            loc = ".".join(str(p) for p in loc_parts)
            message = str(error["msg"]).removeprefix("Value error, ")
            yield CriterionProblem(f"{where}.{loc}" if loc else where, message)
        return
    except ValueError as exc:
        yield CriterionProblem(where, str(exc))
        return
    if tests is None or tests.turn_id is None or turn_ids is None:
        return
    if tests.turn_id not in turn_ids:
        yield CriterionProblem(f"{where}.turn_id", f"unknown turn {tests.turn_id!r}")
