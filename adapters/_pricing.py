"""Model prices: the bundled pricing file, extended or overridden by the user's.

Prices are USD per million tokens. An entry is ``[input, output]``,
``[input, output, cached_input]`` or ``{"input": .., "output": .., "cached_input": ..}``;
``cached_input`` prices the prompt tokens a server read from its prompt cache. A user's
file (the ``pricing_file`` adapter argument, or the file :data:`PRICING_ENV` names) has
the bundled file's shape: its entries replace the bundled ones of the same name and add
the others.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from convsim._errors import ConfigError

__all__ = ["PRICING_ENV", "PRICING_FILE", "Price", "PriceTable", "price_of", "price_table"]

PRICING_FILE = Path(__file__).parent / "pricing.json"
PRICING_ENV = "CONVSIM_PRICING_FILE"
"""The environment variable that names a user's price file."""


class Price(NamedTuple):
    """What a model costs, in USD per million tokens."""

    input_per_mtok: float
    """Per million prompt tokens."""
    output_per_mtok: float
    """Per million completion tokens."""
    cached_input_per_mtok: float | None = None
    """Per million prompt tokens read from the server's prompt cache; None: not listed
    (cached tokens are then priced as any prompt token, never below what was paid)."""


# what may follow a listed name and still be the same model: a date or "-latest"
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
_FIELDS = ("input", "output", "cached_input")


@dataclass(frozen=True)
class PriceTable:
    """Prices by provider, then by model name."""

    prices: Mapping[str, Mapping[str, Price]]
    source: str
    """The files the table was read from, for messages."""

    def price_of(self, provider: str, model: str) -> Price | None:
        """The price of a listed model or a dated snapshot of one (``gpt-4o-2024-08-06``,
        ``claude-3-5-haiku-20241022``); None otherwise, so an unlisted variant (``o1-pro``)
        is never priced as its family."""
        models = self.prices.get(provider, {})
        if model in models:
            return models[model]
        return models.get(_SNAPSHOT.sub("", model))

    def extended(self, other: PriceTable) -> PriceTable:
        """This table with ``other``'s entries added, each replacing one of the same name."""
        merged = {p: dict(m) for p, m in self.prices.items()}
        for provider, models in other.prices.items():
            merged.setdefault(provider, {}).update(models)
        return PriceTable(merged, f"{self.source} + {other.source}")


def read_price_file(path: str | Path) -> PriceTable:
    """The prices of one file, checked.

    Raises:
        ConfigError: naming the file and the field that is wrong.
    """
    where = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the price file ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not a JSON price file ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a price file is a JSON object of providers")
    prices: dict[str, dict[str, Price]] = {}
    for provider, models in data.items():
        if provider.startswith("_"):  # comments
            continue
        if not isinstance(models, dict):
            raise ConfigError(f"{where}: {provider}: an object of model prices, not {models!r}")
        prices[provider] = {
            model: _entry(entry, f"{where}: {provider}.{model}") for model, entry in models.items()
        }
    return PriceTable(prices, where)


def _entry(entry: Any, field: str) -> Price:
    """One model's price from its list or object form."""
    if isinstance(entry, list):
        if not 2 <= len(entry) <= 3:
            raise ConfigError(
                f"{field}: give [input, output] or [input, output, cached_input], not {entry!r}"
            )
        values = dict(zip(_FIELDS, entry, strict=False))
    elif isinstance(entry, dict):
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise ConfigError(
                f"{field}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})"
            )
        missing = [f for f in _FIELDS[:2] if f not in entry]
        if missing:
            raise ConfigError(f"{field}: '{missing[0]}' is missing")
        values = entry
    else:
        raise ConfigError(f"{field}: give [input, output] USD per million tokens, not {entry!r}")
    checked: dict[str, float] = {}
    for name, value in values.items():
        if value is None and name == "cached_input":
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigError(
                f"{field}.{name}: {value!r} is not a price (USD per million tokens, >= 0)"
            )
        checked[name] = float(value)
    return Price(checked["input"], checked["output"], checked.get("cached_input"))


@cache
def _table(path: str | None) -> PriceTable:
    bundled = read_price_file(PRICING_FILE)
    return bundled if path is None else bundled.extended(read_price_file(path))


def price_table(path: str | Path | None = None) -> PriceTable:
    """The bundled prices, extended by the file at ``path`` when one is given (each file
    is read once per process).

    Raises:
        ConfigError: the file cannot be read, or an entry is wrong (file and field named).
    """
    return _table(None if path is None else str(path))


def price_of(provider: str, model: str) -> Price | None:
    """The bundled price of ``model`` (see :meth:`PriceTable.price_of`)."""
    return price_table().price_of(provider, model)
