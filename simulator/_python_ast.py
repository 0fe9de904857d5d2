"""Python syntax trees built in worker threads, one at a time.

CPython 3.11 keeps the AST constructor's recursion depth in state shared by the whole
interpreter, so two threads building syntax trees at once can fail with ``SystemError:
AST constructor recursion depth mismatch`` (python/cpython#106905 and its threads).
Plugin hooks and CPU-heavy scorers run in worker threads, and the libraries they call
(radon, bandit) parse too: whatever parses Python there holds :data:`PARSING` while it
does. Threads hold the GIL while they parse anyway, so nothing that could run in
parallel is serialised.
"""

from __future__ import annotations

import ast
import threading

__all__ = ["PARSING", "parse"]

PARSING = threading.RLock()
"""Held while a syntax tree is built; re-entrant, so a holder may call code that
parses again (the code analysis calls bandit)."""


def parse(code: str) -> ast.Module:
    """``ast.parse(code)`` under :data:`PARSING`."""
    with PARSING:
        return ast.parse(code)
