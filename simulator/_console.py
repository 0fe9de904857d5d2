"""What every ``convsim`` command shares: its consoles, exit codes and error handling."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape

from ._errors import ConvsimError

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "clear_errors", "stderr", "stdout"]

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
F = TypeVar("F", bound=Callable[..., Any])


def stdout() -> Console:
    # emoji=False: "scenarios.jsonl:100:" would otherwise print as "scenarios.jsonl💯"
    return Console(soft_wrap=True, emoji=False)


def stderr() -> Console:
    return Console(stderr=True, soft_wrap=True, emoji=False)


def clear_errors(func: F) -> F:
    """Turn convsim's own errors into one message on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConvsimError as exc:
            stderr().print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]
