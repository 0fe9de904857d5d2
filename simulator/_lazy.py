"""Lazy package roots (PEP 562): a public name is imported when it is first used.

``import convsim.adapters`` then costs only the package itself, and ``convsim --help``
imports none of what a command does not need. A package keeps its public names in a
table of ``module -> names``; type checkers read the same names from a
``TYPE_CHECKING`` block beside it.

A name that moved to a package above can stay reachable where it used to be through the
entry-point group ``convsim.exports`` (``convsim.scenarios.AdvancedTask =
convsim.lm_eval:AdvancedTask``): the upper package declares the alias, so the lower one
never names it. The package's ``__all__`` lists those aliases too, so a star import
still gets every name it used to; it is worked out on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Any, NamedTuple

__all__ = ["LazyModule", "lazy_module"]

ALIAS_GROUP = "convsim.exports"


class LazyModule(NamedTuple):
    """What a lazy package puts at its module level: ``__getattr__`` and ``__dir__``
    (which also answer ``__all__``)."""

    getattr: Callable[[str], Any]
    dir: Callable[[], list[str]]


@cache
def _aliases() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ALIAS_GROUP)}


def lazy_module(
    package: str,
    namespace: dict[str, Any],
    exports: Mapping[str, Iterable[str]],
    *,
    also: Iterable[str] = (),
) -> LazyModule:
    """``__getattr__`` and ``__dir__`` for ``package``.

    Args:
        package: the package's ``__name__``.
        namespace: the package's ``globals()``; each name is cached there once imported.
        exports: each module (absolute, or relative to ``package``) and the public names
            it defines, in the order ``__all__`` lists them.
        also: public names the package defines itself (listed first in ``__all__``).
    """
    where = {name: module for module, names in exports.items() for name in names}
    public = [*also, *(name for names in exports.values() for name in names)]

    def aliases() -> list[str]:
        prefix = package + "."
        return [k[len(prefix) :] for k in _aliases() if k.startswith(prefix)]

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            value: Any = [*public, *(a for a in aliases() if a not in public)]
            namespace[name] = value
            return value
        module = where.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module, package), name)
        else:
            alias = _aliases().get(f"{package}.{name}")
            if alias is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            from ._registry import import_object  # only for an alias: keeps roots light

            value = import_object(alias)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public, *aliases()})

    return LazyModule(__getattr__, __dir__)
