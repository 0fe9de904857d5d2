"""A pack source a third-party package registers (entry-point group
``convsim.pack_sources``): ``mirror:NAME`` is the bundled pack NAME, loaded again."""

from __future__ import annotations

from convsim.scenarios import LoadOptions, Pack, load_pack


def mirror_pack(spec: str, options: LoadOptions) -> Pack:
    return load_pack(spec.removeprefix("mirror:"), metric_names=options.metric_names)
