"""Library logging: structured events that show nowhere unless the application asks.

convsim logs structlog events: a fixed snake_case name with key-value fields, bound
with ``run_id`` and ``conversation_id`` through contextvars. Where they go is the
application's choice, following structlog's and the standard library's conventions
for libraries:

- an application that configured structlog (``structlog.configure``; the command line
  does) gets them through its own configuration;
- otherwise each event goes to the standard-library logger of the same name
  (``convsim.runtime``, ...) as ``event key=value ...``. The ``convsim`` logger has a
  ``NullHandler``, so nothing is printed unless the application configures logging
  (``logging.basicConfig()``, or a handler on ``convsim``).

The choice is made at each event, so an application may configure logging before or
after importing convsim. An event below the enabled level costs one check.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["LibraryLogger", "get_logger"]

logging.getLogger("convsim").addHandler(logging.NullHandler())

_render = structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=False)


class LibraryLogger:
    """A logger for library code: structlog's when configured, else the standard
    library's (silent by default)."""

    __slots__ = ("_name", "_stdlib", "_structlog")

    def __init__(self, name: str) -> None:
        self._name = name
        self._stdlib = logging.getLogger(name)
        self._structlog = structlog.get_logger(name)

    def _log(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(self._structlog, method)(event, **fields)
        elif self._stdlib.isEnabledFor(level):
            merged = {**structlog.contextvars.get_contextvars(), **fields, "event": event}
            self._stdlib.log(level, _render(None, method, merged))

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, "error", event, fields)


def get_logger(name: str) -> LibraryLogger:
    """The logger library code uses for ``name`` (e.g. ``convsim.runtime``)."""
    return LibraryLogger(name)
