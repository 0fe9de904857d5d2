"""A lazy name -> factory registry, extensible through entry points."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from functools import partial
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from ._errors import RegistryError

__all__ = ["Registry", "import_object"]

T = TypeVar("T")


def import_object(reference: str) -> object:
    """The object a ``"package.module:attr"`` string names, imported now."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{reference!r} is not a 'package.module:attr' reference")
    return getattr(importlib.import_module(module_name), attr)


class Registry(Generic[T]):
    """Maps names to factories without importing them until first use.

    A factory is registered as a callable or as ``"package.module:attr"``, imported on
    first lookup so optional dependencies stay optional. A prefix (``judge:``) maps every
    name that starts with it to ``factory(name)``. Packages add names through the
    entry-point group ``group`` and prefixes through ``prefix_group`` (the entry point
    ``lm_eval`` registers the prefix ``lm_eval:``); entry points in ``source_group`` name
    callables that register names of their own making into the registry they are given
    (``source(registry)``: metric engines whose metrics are known only once built). All
    are read on the first miss or listing, never at import time. This is how a layer reaches code
    above it: by a name the upper layer declares, never by an import. Each registry is its
    own object: tests and applications can copy one and register names without touching
    the default.
    """

    def __init__(
        self,
        kind: str,
        group: str | None = None,
        *,
        prefix_group: str | None = None,
        source_group: str | None = None,
    ):
        self.kind = kind
        self.group = group
        self.prefix_group = prefix_group
        self.source_group = source_group
        self._factories: dict[str, Callable[..., T] | str] = {}
        self._prefixes: dict[str, Callable[[str], T] | str] = {}
        self._origins: dict[str, str] = {}
        """Names and prefixes an entry point registered: the distribution it is in."""
        self._entry_points_loaded = group is None and prefix_group is None and source_group is None

    def register(
        self,
        name: str,
        factory: Callable[..., T] | str,
        *,
        replace: bool = False,
        origin: str | None = None,
    ) -> None:
        """Register ``factory`` under ``name``; refuse to shadow a name unless ``replace``.
        ``origin``: where it comes from when that is not convsim's own code (a package,
        a class of the caller's), as :meth:`origin` tells."""
        if name in self._factories and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._factories[name] = factory
        if origin is not None:
            self._origins[name] = origin
        else:
            self._origins.pop(name, None)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (entry points are read first, so it stays forgotten).

        Raises:
            RegistryError: no such name.
        """
        self._load_entry_points()
        if name not in self._factories:
            raise RegistryError(self.kind, name, list(self._factories))
        del self._factories[name]
        self._origins.pop(name, None)

    def register_prefix(self, prefix: str, factory: Callable[[str], T] | str) -> None:
        """Names starting with ``prefix`` (e.g. ``judge:``) are built by ``factory(name)``;
        ``factory`` may be a ``"package.module:attr"`` string, imported on first use."""
        self._prefixes[prefix] = factory

    def get(self, name: str) -> Callable[..., T]:
        """The factory for ``name``; raises RegistryError listing the known names."""
        prefix = self._prefix_of(name)
        if prefix is None and name not in self._factories and not self._entry_points_loaded:
            self._load_entry_points()
            prefix = self._prefix_of(name)
        if prefix is not None:
            return partial(self._resolved_prefix(prefix), name)
        try:
            factory = self._factories[name]
        except KeyError:
            known = [*self._factories, *(f"{p}<...>" for p in self._prefixes)]
            raise RegistryError(self.kind, name, known) from None
        if isinstance(factory, str):
            factory = self._factories[name] = _imported(factory)
        return factory

    def names(self) -> list[str]:
        """Every registered name, entry points included, sorted (prefixes not listed)."""
        self._load_entry_points()
        return sorted(self._factories)

    def prefixes(self) -> list[str]:
        """Every registered prefix, entry points included, sorted."""
        self._load_entry_points()
        return sorted(self._prefixes)

    def prefix_factory(self, prefix: str) -> Callable[[str], T]:
        """The factory of a registered prefix (``judge:``), imported now.

        Raises:
            RegistryError: no such prefix.
        """
        self._load_entry_points()
        if prefix not in self._prefixes:
            raise RegistryError(self.kind, prefix, list(self._prefixes))
        return self._resolved_prefix(prefix)

    def origin(self, name: str) -> str | None:
        """The distribution whose entry point registered ``name`` (a name, or a prefix
        such as ``lm_eval:``), or the ``origin`` it was registered with; None for one
        registered in convsim's code."""
        self._load_entry_points()
        return self._origins.get(name)

    def reference(self, name: str) -> str | None:
        """The ``"package.module:attr"`` string ``name`` is registered as, while it is
        not imported yet (an entry point's, or one registered as a string); else None."""
        if name not in self._factories:
            self._load_entry_points()
        factory = self._factories.get(name)
        return factory if isinstance(factory, str) else None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if self._prefix_of(name) is not None or name in self._factories:
            return True
        self._load_entry_points()
        return self._prefix_of(name) is not None or name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def copy(self) -> Registry[T]:
        """An independent registry with the same names."""
        clone: Registry[T] = Registry(
            self.kind, self.group, prefix_group=self.prefix_group, source_group=self.source_group
        )
        clone._factories = dict(self._factories)
        clone._prefixes = dict(self._prefixes)
        clone._origins = dict(self._origins)
        clone._entry_points_loaded = self._entry_points_loaded
        return clone

    def _prefix_of(self, name: str) -> str | None:
        for prefix in self._prefixes:
            if name.startswith(prefix) and len(name) > len(prefix):
                return prefix
        return None

    def _resolved_prefix(self, prefix: str) -> Callable[[str], T]:
        factory = self._prefixes[prefix]
        if isinstance(factory, str):
            factory = self._prefixes[prefix] = _imported(factory)
        return factory

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        if self.group is not None:
            for ep in entry_points(group=self.group):
                if ep.name not in self._factories:
                    self._factories[ep.name] = ep.value
                    self._origins[ep.name] = ep.dist.name if ep.dist else self.group
        if self.prefix_group is not None:
            for ep in entry_points(group=self.prefix_group):
                prefix = ep.name + ":"
                if prefix not in self._prefixes:
                    self._prefixes[prefix] = ep.value
                    self._origins[prefix] = ep.dist.name if ep.dist else self.prefix_group
        if self.source_group is not None:
            for ep in entry_points(group=self.source_group):
                source = _imported(ep.value)
                source(self)


def _imported(reference: str) -> Callable[..., T]:
    factory = import_object(reference)
    if not callable(factory):
        raise TypeError(f"{reference!r} is not callable")
    return factory
