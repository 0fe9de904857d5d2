"""Model prices from the bundled pricing file (USD per million tokens)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

__all__ = ["Price", "price_of", "PRICING_FILE"]

PRICING_FILE = Path(__file__).parent / "pricing.json"


class Price(NamedTuple):
    """What a model costs, in USD per million tokens."""

    input_per_mtok: float
    """Per million prompt tokens."""
    output_per_mtok: float
    """Per million completion tokens."""


@cache
def _table() -> dict[str, dict[str, Price]]:
    data = json.loads(PRICING_FILE.read_text(encoding="utf-8"))
    return {
        provider: {model: Price(float(p[0]), float(p[1])) for model, p in models.items()}
        for provider, models in data.items()
        if not provider.startswith("_")
    }


# what may follow a listed name and still be the same model: a date or "-latest"
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def price_of(provider: str, model: str) -> Price | None:
    """The price of a listed model or a dated snapshot of one (``gpt-4o-2024-08-06``,
    ``claude-3-5-haiku-20241022``); None otherwise, so an unlisted variant (``o1-pro``)
    is never priced as its family."""
    models = _table().get(provider, {})
    if model in models:
        return models[model]
    base = _SNAPSHOT.sub("", model)
    return models.get(base)
