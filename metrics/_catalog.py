"""The catalogue of registered metrics: what ``convsim metrics`` lists.

Each metric of a registry (those registered in code, by entry points, and each prefix
that builds metrics by name) is described by what it declares: its kind and what it
reads (:class:`~convsim.metrics.MetricTraits`), its direction and a line of what it
measures (its ``description``). A metric that cannot be built here (an extra missing)
is listed with the reason instead of being left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from convsim._registry import Registry

from ._protocol import Metric, MetricTraits
from ._registry import METRICS

__all__ = [
    "MetricInfo",
    "MetricSource",
    "describe_metric",
    "first_sentence",
    "registered_metrics",
]

MetricSource = Literal["built-in", "entry point", "prefix", "plugin"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def _plain(docstring: str) -> str:
    """A docstring as text: on one line, without reStructuredText's literal quotes."""
    return " ".join(docstring.replace("``", "").split())


def first_sentence(text: str) -> str:
    """The first sentence of ``text``, on one line."""
    return _SENTENCE_END.split(_plain(text), maxsplit=1)[0]


@dataclass(frozen=True)
class MetricInfo:
    """One registered metric as ``convsim metrics`` lists it."""

    name: str
    """Its name; a prefix reads ``judge:<...>``."""
    source: MetricSource
    provider: str | None
    """The distribution of its entry point, or the plugin that scores it; None for a
    metric of convsim registered in code."""
    traits: MetricTraits | None
    """None when the metric does not declare them."""
    higher_is_better: bool | None
    description: str
    """What it measures, in full."""
    unavailable: str | None = None
    """Why it cannot be built here (an extra it needs is not installed)."""

    @property
    def summary(self) -> str:
        """What it measures, in short: the description's first sentence, up to its
        first semicolon."""
        clause = first_sentence(self.description).split("; ", 1)[0]
        return clause if clause.endswith((".", "?", "!")) else clause + "."

    def as_json(self) -> dict[str, Any]:
        traits = self.traits
        return {
            "name": self.name,
            "source": self.source,
            "provider": self.provider,
            "kind": None if traits is None else traits.kind,
            "needs": None if traits is None else sorted(traits.needs),
            "uses": None if traits is None else sorted(traits.uses),
            "needs_judge": _says(traits, "judge"),
            "needs_reference": _says(traits, "reference"),
            "needs_facts": _says(traits, "facts"),
            "higher_is_better": self.higher_is_better,
            "description": self.description,
            "unavailable": self.unavailable,
        }


def _says(traits: MetricTraits | None, what: str) -> bool | Literal["optional"] | None:
    """Whether a metric needs ``what``: True, False, "optional" (read when given), or
    None when it does not say."""
    if traits is None:
        return None
    if what in traits.needs:
        return True
    return "optional" if what in traits.uses else False


def describe_metric(
    name: str, metric: Metric, source: MetricSource, provider: str | None
) -> MetricInfo:
    """``metric``, built, as the catalogue lists it."""
    traits = getattr(metric, "traits", None)
    return MetricInfo(
        name=name,
        source=source,
        provider=provider,
        traits=traits if isinstance(traits, MetricTraits) else None,
        higher_is_better=metric.higher_is_better,
        description=_plain(str(metric.description)),
    )


def _unbuilt(
    name: str, factory: Callable[..., Any] | None, source: MetricSource, provider: str | None,
    error: Exception,
) -> MetricInfo:  # fmt: skip
    """A metric that could not be built: what its class declares, and why."""
    traits = getattr(factory, "traits", None)
    doc = _plain(getattr(factory, "__doc__", None) or "")
    return MetricInfo(
        name=name,
        source=source,
        provider=provider,
        traits=traits if isinstance(traits, MetricTraits) else None,
        higher_is_better=None,
        description=doc,
        unavailable=str(error) or type(error).__name__,
    )


def _prefix(prefix: str, registry: Registry[Metric]) -> MetricInfo:
    """A prefix: its class's declarations, or the metric its factory builds for a
    placeholder name (``judge:<...>`` is a rubric metric)."""
    name = f"{prefix}<...>"
    provider = registry.origin(prefix)
    factory: Callable[..., Any] | None = None
    try:
        factory = registry.prefix_factory(prefix)
        if isinstance(factory, type):  # its name must be a real one (lm_eval:bleu)
            traits = getattr(factory, "traits", None)
            return MetricInfo(
                name=name,
                source="prefix",
                provider=provider,
                traits=traits if isinstance(traits, MetricTraits) else None,
                higher_is_better=None,
                description=_plain(factory.__doc__ or ""),
            )
        return describe_metric(name, factory(name), "prefix", provider)
    except Exception as exc:  # a third party's prefix that cannot be built here
        return _unbuilt(name, factory, "prefix", provider, exc)


def registered_metrics(registry: Registry[Metric] = METRICS) -> list[MetricInfo]:
    """Every metric of ``registry``: its names (those of convsim's code first, then
    those of entry points), then its prefixes, each sorted by name."""
    return [*_named(registry), *(_prefix(p, registry) for p in registry.prefixes())]


def _named(registry: Registry[Metric]) -> Iterator[MetricInfo]:
    names = registry.names()
    origins = {name: registry.origin(name) for name in names}
    ordered = sorted(names, key=lambda n: (origins[n] is not None, n))
    for name in ordered:
        source: MetricSource = "built-in" if origins[name] is None else "entry point"
        factory: Callable[..., Any] | None = None
        try:
            factory = registry.get(name)
            yield describe_metric(name, factory(), source, origins[name])
        except Exception as exc:  # a third party's metric that cannot be built here
            yield _unbuilt(name, factory, source, origins[name], exc)
