"""structlog set-up for the command line (library code never configures logging)."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

__all__ = ["configure_logging", "redact_secrets", "is_secret_key"]

_SECRET_KEY = re.compile(r"(api[_-]?key|authorization|secret|password|token)$", re.IGNORECASE)


def is_secret_key(name: str) -> bool:
    """True for field names that hold credentials (api_key, authorization, token, ...)."""
    return _SECRET_KEY.search(name) is not None


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace the value of any field named like a secret, so keys never reach a log."""
    for key in event:
        if is_secret_key(key) and event[key] is not None:
            event[key] = "***"
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
