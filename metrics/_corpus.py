"""Corpus-level metrics: each conversation's score keeps an item, a report reduces them.

A corpus metric (lm-eval's ``bleu``, say) cannot be averaged over conversations. Its
score carries, in its details, the item of its conversation (``corpus_item``) and the
name of the aggregation that reduces the items of a whole run (``corpus_aggregation``,
e.g. ``lm_eval:bleu``). Aggregations are looked up by that name's prefix in
:data:`AGGREGATIONS`, which the package providing them fills through the entry-point
group ``convsim.corpus_aggregations``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from convsim._registry import Registry

__all__ = ["AGGREGATIONS", "CORPUS_AGGREGATION", "CORPUS_ITEM", "corpus_value"]

CORPUS_ITEM = "corpus_item"
CORPUS_AGGREGATION = "corpus_aggregation"

AGGREGATIONS: Registry[float] = Registry(
    "corpus aggregation", prefix_group="convsim.corpus_aggregations"
)
"""Prefix -> ``aggregate(name, items) -> float``."""


def corpus_value(aggregation: str, items: Sequence[Any]) -> float:
    """``items`` reduced by the aggregation called ``aggregation``.

    Raises:
        RegistryError: no aggregation of that name is registered.
    """
    return float(AGGREGATIONS.get(aggregation)(list(items)))
