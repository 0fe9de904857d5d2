"""Pack sources: packs named by a prefix rather than a folder (``lm-eval:TASK``, ``task:NAME``).

A source is registered by the package that provides it, through the entry-point group
``convsim.pack_sources`` (the entry point ``lm-eval`` serves every name starting with
``lm-eval:``), or with :meth:`PACK_SOURCES.register_prefix`. The loader only knows the
names, never the code behind them.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from convsim._registry import Registry

from ._files import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_LINE_BYTES
from ._pack import Pack

__all__ = ["LoadOptions", "PackSource", "PACK_SOURCES"]


@dataclass(frozen=True)
class LoadOptions:
    """What :func:`~convsim.scenarios.load_pack` was asked besides the name; a source
    refuses the options that do not apply to it."""

    num_fewshot: int = 0
    context_mode: str | None = None
    include_path: Path | None = None
    metric_names: Container[str] | None = None
    """The metric names to accept; None accepts any (the caller checks them)."""
    allow_code: bool = False
    """Whether code the pack names may run (python goal criteria, lm-eval
    ``!function`` tags); never recorded, so loading a pack again asks again."""
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    """The largest file the pack may hold."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """The longest line of a JSONL file (or row of a CSV file) the pack may hold."""
    seed: int | None = None
    """The run's seed: which problems a single-turn pack's ``dataset.size`` samples
    (None: the default seed, 0)."""

    def recorded(self) -> dict[str, Any]:
        """The options that shape a pack, as a results manifest records them."""
        recorded: dict[str, Any] = {}
        if self.num_fewshot:
            recorded["num_fewshot"] = self.num_fewshot
        if self.context_mode is not None:
            recorded["context_mode"] = self.context_mode
        if self.include_path is not None:
            recorded["include_path"] = str(self.include_path)
        return recorded


class PackSource(Protocol):
    """Builds the pack called ``spec`` (the whole name, prefix included)."""

    def __call__(self, spec: str, options: LoadOptions) -> Pack: ...


PACK_SOURCES: Registry[Pack] = Registry("pack source", prefix_group="convsim.pack_sources")
"""Prefix -> :class:`PackSource`."""
