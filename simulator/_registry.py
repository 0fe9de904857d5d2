"""A lazy name -> factory registry, extensible through entry points."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from functools import partial
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from ._errors import RegistryError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories without importing them until first use.

    A factory is registered either as a callable or as ``"package.module:attr"``,
    imported on first lookup so optional dependencies stay optional. Third parties add
    names through the entry-point group ``group``; those are read on the first miss or
    listing, never at import time. Each registry is its own object: tests and
    applications can copy one and register names without touching the default.
    """

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._factories: dict[str, Callable[..., T] | str] = {}
        self._prefixes: dict[str, Callable[[str], T]] = {}
        self._entry_points_loaded = group is None

    def register(
        self, name: str, factory: Callable[..., T] | str, *, replace: bool = False
    ) -> None:
        """Register ``factory`` under ``name``; refuse to shadow a name unless ``replace``."""
        if name in self._factories and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._factories[name] = factory

    def register_prefix(self, prefix: str, factory: Callable[[str], T]) -> None:
        """Names starting with ``prefix`` (e.g. ``judge:``) are built by ``factory(name)``."""
        self._prefixes[prefix] = factory

    def get(self, name: str) -> Callable[..., T]:
        """The factory for ``name``; raises RegistryError listing the known names."""
        for prefix, prefixed in self._prefixes.items():
            if name.startswith(prefix) and len(name) > len(prefix):
                return partial(prefixed, name)
        if name not in self._factories:
            self._load_entry_points()
        try:
            factory = self._factories[name]
        except KeyError:
            known = [*self._factories, *(f"{p}<...>" for p in self._prefixes)]
            raise RegistryError(self.kind, name, known) from None
        if isinstance(factory, str):
            module_name, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module_name), attr)
            self._factories[name] = factory
        return factory

    def names(self) -> list[str]:
        """Every registered name, entry points included, sorted."""
        self._load_entry_points()
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and any(
            name.startswith(p) and len(name) > len(p) for p in self._prefixes
        ):
            return True
        if name not in self._factories:
            self._load_entry_points()
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def copy(self) -> Registry[T]:
        """An independent registry with the same names."""
        clone: Registry[T] = Registry(self.kind, self.group)
        clone._factories = dict(self._factories)
        clone._prefixes = dict(self._prefixes)
        clone._entry_points_loaded = self._entry_points_loaded
        return clone

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or self.group is None:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.group):
            self._factories.setdefault(ep.name, ep.value)
