"""The scores plugins declare, as ``convsim metrics`` lists them beside the metrics."""

from __future__ import annotations

from convsim._registry import Registry
from convsim.metrics import MetricInfo

from ._base import BasePlugin
from ._manager import PLUGINS

__all__ = ["plugin_metrics"]


def plugin_metrics(registry: Registry[BasePlugin] = PLUGINS) -> list[MetricInfo]:
    """The scores every registered plugin declares (``BasePlugin.metrics``), by plugin;
    a plugin that cannot be imported here is listed with the reason."""
    found: list[MetricInfo] = []
    for name in registry.names():
        try:
            plugin = registry.get(name)
        except Exception as exc:  # a third party's plugin that cannot be imported here
            found.append(
                MetricInfo(
                    name=f"{name}:<...>",
                    source="plugin",
                    provider=name,
                    traits=None,
                    higher_is_better=None,
                    description="",
                    unavailable=str(exc) or type(exc).__name__,
                )
            )
            continue
        for declared in getattr(plugin, "metrics", ()):
            found.append(
                MetricInfo(
                    name=declared.name,
                    source="plugin",
                    provider=name,
                    traits=declared.traits,
                    higher_is_better=declared.higher_is_better,
                    description=declared.description,
                )
            )
    return found
