"""Style of Python, checked by pycodestyle (PEP 8).

pycodestyle runs with its defaults (its usual rules, its usual ignore list) and the
line length given, reading no configuration file of the machine it runs on. A snippet
taken from an answer lacks a final newline more often than not because of how it was
cut out, so one is added before the check (W292 would otherwise flag every snippet).

The score is the share of the code's lines that no issue points at: 1.0 for clean
code, lower as more of its lines break a rule. Code with no line has no score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from convsim._extras import needs_extra

__all__ = ["StyleIssue", "StyleReport", "check_style", "DEFAULT_MAX_LINE_LENGTH"]

DEFAULT_MAX_LINE_LENGTH = 88
"""The line length the guide's style check allows (and black's)."""


@dataclass(frozen=True)
class StyleIssue:
    """One rule broken, and where."""

    line: int
    column: int
    """1-based."""
    rule: str
    """pycodestyle's code: ``E501``, ``W291``..."""
    type: Literal["error", "warning"]
    """pycodestyle's kind of rule: E (error) or W (warning)."""
    message: str


@dataclass(frozen=True)
class StyleReport:
    """What pycodestyle found in one piece of Python."""

    issues: tuple[StyleIssue, ...]
    lines: int
    """Lines checked."""
    score: float | None
    """The share of lines no issue points at; None without lines."""
    max_line_length: int
    checker: str = "pycodestyle"


def check_style(code: str, *, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> StyleReport:
    """``code`` checked against PEP 8 (see the module).

    Raises:
        MissingExtra: pycodestyle is not installed (the ``code`` extra).
    """
    with needs_extra("code", "the code_analysis plugin's style check"):
        import pycodestyle

    if code and not code.endswith("\n"):
        code += "\n"
    lines = code.splitlines(keepends=True)
    guide = pycodestyle.StyleGuide(
        quiet=True, parse_argv=False, config_file=False, max_line_length=max_line_length
    )
    found: list[StyleIssue] = []

    class Collect(pycodestyle.BaseReport):
        def error(self, line_number: int, offset: int, text: str, check: Any) -> str | None:
            rule = super().error(line_number, offset, text, check)
            if rule is not None:
                kind: Literal["error", "warning"] = "warning" if rule[0] == "W" else "error"
                found.append(StyleIssue(line_number, offset + 1, rule, kind, text[5:]))
            return rule

    report = Collect(guide.options)
    pycodestyle.Checker(lines=lines, options=guide.options, report=report).check_all()
    flagged = {issue.line for issue in found if 1 <= issue.line <= len(lines)}
    score = None if not lines else 1.0 - len(flagged) / len(lines)
    return StyleReport(
        issues=tuple(sorted(found, key=lambda i: (i.line, i.column, i.rule))),
        lines=len(lines),
        score=score,
        max_line_length=max_line_length,
    )
