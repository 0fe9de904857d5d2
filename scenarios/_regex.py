"""Regular expressions from packs, run by RE2 in time linear in the text.

A backtracking engine (Python's ``re``) can take exponential time on a pattern such as
``(a+)+$``, and cannot be interrupted while it does, so a pack's pattern could hold a
run past its deadlines and past Ctrl-C. RE2 has no backreferences and no lookaround;
a pattern that needs them is refused when the pack is validated, with a hint.
Matching is case-insensitive, as goal criteria have always been.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

__all__ = ["RegexError", "compile_pack_regex", "pack_regex_search"]

_HINTS = (
    ("invalid escape sequence: \\1", "backreferences are not supported"),
    ("invalid escape sequence: \\Z", "write \\z for the end of the text"),
    ("invalid perl operator: (?<", "lookaround ((?<=...), (?<!...)) is not supported"),
    ("invalid perl operator: (?=", "lookaround ((?=...), (?!...)) is not supported"),
    ("invalid perl operator: (?!", "lookaround ((?=...), (?!...)) is not supported"),
    ("invalid repetition size", "repetition counts go up to 1000"),
)


class RegexError(ValueError):
    """A pattern RE2 cannot compile; the message says why and, where it can, what to do."""


def _options(ignore_case: bool) -> Any:
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False  # the error is raised, not also written to stderr
    return options


@functools.lru_cache(maxsize=1024)
def compile_pack_regex(pattern: str, *, ignore_case: bool = True) -> Any:
    """``pattern`` compiled by RE2 (case-insensitive unless told otherwise); cached.

    Raises:
        RegexError: RE2 cannot compile it (syntax it lacks, or too large).
    """
    try:
        return re2.compile(pattern, _options(ignore_case))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else str(exc)
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        hint = next((h for needle, h in _HINTS if needle in reason), None)
        extra = f": {hint}" if hint else ""
        raise RegexError(
            f"RE2 cannot compile this regular expression ({reason}){extra}; pack "
            "patterns use RE2 syntax, which runs in linear time"
        ) from None
    except UnicodeEncodeError:
        raise RegexError("the pattern holds a lone surrogate (not valid Unicode)") from None


def pack_regex_search(pattern: str, text: str, *, ignore_case: bool = True) -> bool:
    """Whether ``pattern`` (RE2, case-insensitive unless told otherwise) matches
    somewhere in ``text``.

    Text that is not valid Unicode (a lone surrogate) is matched with the bad
    characters replaced, rather than failing.
    """
    compiled = compile_pack_regex(pattern, ignore_case=ignore_case)
    try:
        return compiled.search(text) is not None
    except UnicodeEncodeError:
        cleaned = text.encode("utf-8", "replace").decode("utf-8")
        return compiled.search(cleaned) is not None
