"""Model prices from the bundled pricing file (USD per million tokens)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

__all__ = ["price_of", "PRICING_FILE"]

PRICING_FILE = Path(__file__).parent / "pricing.json"


@cache
def _table() -> dict[str, dict[str, tuple[float, float]]]:
    data = json.loads(PRICING_FILE.read_text(encoding="utf-8"))
    return {
        provider: {model: (float(p[0]), float(p[1])) for model, p in models.items()}
        for provider, models in data.items()
        if not provider.startswith("_")
    }


def price_of(provider: str, model: str) -> tuple[float, float] | None:
    """(input, output) USD per million tokens; the longest listed prefix of ``model``
    wins, so dated snapshots (``gpt-4o-2024-08-06``) take their family's price."""
    models = _table().get(provider, {})
    if model in models:
        return models[model]
    matches = [name for name in models if model.startswith(name)]
    return models[max(matches, key=len)] if matches else None
