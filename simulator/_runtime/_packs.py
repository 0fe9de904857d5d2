"""Loading packs for the runtime: the scenario loader with convsim's metric names."""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path

from convsim.metrics import METRICS
from convsim.scenarios import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_LINE_BYTES, Pack
from convsim.scenarios import load_pack as _load_pack

__all__ = ["load_pack"]


def load_pack(
    name_or_path: str | Path,
    *,
    num_fewshot: int = 0,
    context_mode: str | None = None,
    metric_names: Container[str] | None = None,
    include_path: str | Path | None = None,
    allow_code: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    seed: int | None = None,
) -> Pack:
    """Load and validate a pack (see :func:`convsim.scenarios.load_pack`), checking the
    metrics it names against ``metric_names``: convsim's metric registry by default, so
    an unknown metric is reported with its file, line and field."""
    return _load_pack(
        name_or_path,
        num_fewshot=num_fewshot,
        context_mode=context_mode,
        metric_names=METRICS if metric_names is None else metric_names,
        include_path=include_path,
        allow_code=allow_code,
        max_file_bytes=max_file_bytes,
        max_line_bytes=max_line_bytes,
        seed=seed,
    )
