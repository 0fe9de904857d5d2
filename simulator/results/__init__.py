"""Results as data: results files as pandas DataFrames, and as flat rows.

``convsim.results.load("run.jsonl")`` gives ``.conversations``, ``.turns`` and
``.scores``, flat tables joined across files; it replaces
``pandas.read_json("run.jsonl", lines=True)``, whose turns and scores stay nested in
object columns. pandas is optional: ``pip install 'convsim[pandas]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._frames import Results as Results
    from ._frames import load as load
    from ._rows import CONVERSATION_COLUMNS as CONVERSATION_COLUMNS
    from ._rows import conversation_columns as conversation_columns
    from ._rows import conversation_row as conversation_row
    from ._rows import score_rows as score_rows
    from ._rows import turn_rows as turn_rows

__getattr__, __dir__ = _lazy_module(__name__, globals())
