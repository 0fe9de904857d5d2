"""The ``convsim`` command line: one module per command family."""

from __future__ import annotations

from ._main import main as main

__all__ = ["main"]
