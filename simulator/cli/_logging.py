"""structlog set-up for the command line (library code never configures logging)."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

from .._secrets import MASK, is_secret_key, looks_like_url, redact_url

__all__ = ["configure_logging", "redact_secrets", "is_secret_key"]


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
