"""structlog set-up for the command line (library code never configures logging)."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

from .._secrets import MASK, is_secret_key, looks_like_url, redact_url

__all__ = ["JsonLines", "configure_logging", "redact_secrets", "is_secret_key"]


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace the value of any field named like a secret, and the credentials inside
    any URL, so keys never reach a log."""
    for key, value in event.items():
        if is_secret_key(key) and value is not None:
            event[key] = MASK
        elif looks_like_url(value):
            event[key] = redact_url(value)
    return event


def configure_logging(fmt: Literal["console", "json"] = "console", level: str = "warning") -> None:
    """Send structlog events to stderr as console text or JSON lines."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


_LEVELS = {"error:": "error", "warning:": "warning"}
"""A line that starts so is said at that level; any other at info."""


class JsonLines(io.StringIO):
    """What a console writes, as JSON events on stderr (``--log-format json``): each
    message one line, beside structlog's own, so that every line there is JSON.

    An event is ``{"event": "cli_message", "message": ..., "level": ...,
    "timestamp": ...}``; the level is the message's own ``error:`` or ``warning:``
    (taken off the message), else info. Messages are never filtered by
    ``--log-level``: they are what the command says, not debug detail.
    """

    def __init__(self) -> None:
        super().__init__()
        self._pending = ""
        self._stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)

    def write(self, text: str) -> int:
        self._pending += text
        if self._pending.endswith("\n"):  # a console writes each message whole
            message, self._pending = self._pending.rstrip("\n"), ""
            if message.strip():
                self._emit(message)
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def _emit(self, message: str) -> None:
        level = "info"
        for prefix, name in _LEVELS.items():
            if message.startswith(prefix):
                level, message = name, message[len(prefix) :].lstrip()
        event: dict[str, Any] = {"event": "cli_message", "message": message, "level": level}
        event = dict(self._stamp(None, "", event))
        sys.stderr.write(json.dumps(event, ensure_ascii=False) + "\n")
