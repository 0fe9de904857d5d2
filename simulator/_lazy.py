"""Lazy package roots (PEP 562): a public name is imported when it is first used.

``import convsim.adapters`` then costs only the package itself, and ``convsim --help``
imports none of what a command does not need. A package writes each public name once,
as an import under ``if TYPE_CHECKING:``: type checkers read that block, and
:func:`lazy_module` reads the same block (from the package's source, on first use) to
learn which module defines each name.

A public class or function takes its public path as ``__module__`` when the package
hands it out (``convsim.Simulator.__module__ == "convsim"``), as httpx's classes do, so
that reprs, tracebacks and pickles name the path users import. Its annotations are
resolved first, while its private module is still the namespace they are read in.

A name that moved to a package above can stay reachable where it used to be through the
entry-point group ``convsim.exports`` (``convsim.scenarios.AdvancedTask =
convsim.lm_eval:AdvancedTask``): the upper package declares the alias, so the lower one
never names it. The package's ``__all__`` lists those aliases too, so a star import
still gets every name it used to; it is worked out on first use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from functools import cache
from importlib.metadata import entry_points
from types import FunctionType
from typing import Any, NamedTuple

__all__ = ["LazyModule", "PublicName", "lazy_module", "public_names", "publish"]

ALIAS_GROUP = "convsim.exports"


class LazyModule(NamedTuple):
    """What a lazy package puts at its module level: ``__getattr__`` and ``__dir__``
    (which also answer ``__all__``)."""

    getattr: Callable[[str], Any]
    dir: Callable[[], list[str]]


class PublicName(NamedTuple):
    """One name of a package's ``TYPE_CHECKING`` block: where it comes from."""

    name: str
    module: str  # as written: absolute, or relative to the package ("._runtime._config")
    attribute: str


@cache
def _table(file: str) -> dict[str, PublicName]:
    """A package's public names, read from its source once."""
    with open(file, encoding="utf-8") as fh:
        return {entry.name: entry for entry in public_names(fh.read())}


@cache
def _aliases() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ALIAS_GROUP)}


def public_names(source: str) -> list[PublicName]:
    """The names imported under the top-level ``if TYPE_CHECKING:`` of ``source``."""
    import ast  # on first use only: ``import convsim`` stays as light as it was

    from ._python_ast import parse  # the first use may be in a worker thread

    names: list[PublicName] = []
    for node in parse(source).body:
        if not (isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom):
                module = "." * statement.level + (statement.module or "")
                for alias in statement.names:
                    names.append(PublicName(alias.asname or alias.name, module, alias.name))
    return names


def lazy_module(package: str, namespace: dict[str, Any], *, also: Iterable[str] = ()) -> LazyModule:
    """``__getattr__`` and ``__dir__`` for ``package``, from its ``TYPE_CHECKING`` block.

    Args:
        package: the package's ``__name__``.
        namespace: the package's ``globals()``; each name is cached there once imported.
        also: public names the package defines itself (listed first in ``__all__``).
    """
    also = list(also)

    def table() -> dict[str, PublicName]:
        return _table(namespace["__file__"])

    def aliases() -> list[str]:
        prefix = package + "."
        names = (k[len(prefix) :] for k in _aliases() if k.startswith(prefix))
        return [n for n in names if "." not in n]  # a subpackage's aliases are its own

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            public = [*also, *table()]
            value: Any = [*public, *(a for a in aliases() if a not in public)]
            namespace[name] = value
            return value
        entry = table().get(name)
        if entry is not None:
            value = getattr(importlib.import_module(entry.module, package), entry.attribute)
            publish(value, name, package)
        else:
            alias = _aliases().get(f"{package}.{name}")
            if alias is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            from ._registry import import_object  # only for an alias: keeps roots light

            value = import_object(alias)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *also, *table(), *aliases()})

    return LazyModule(__getattr__, __dir__)


def publish(value: object, name: str, package: str) -> None:
    """Give ``value``, handed out by ``package`` as ``name``, its public path as
    ``__module__``: the nearest public package above its defining module that exports
    it under that name, else ``package``. Values defined in public modules keep theirs."""
    if not isinstance(value, (type, FunctionType)):
        return
    module: str = getattr(value, "__module__", "") or ""
    parts = module.split(".")
    if parts[0] != "convsim" or not any(part.startswith("_") for part in parts):
        return
    while parts and parts[-1].startswith("_"):
        parts.pop()
    home = ".".join(parts)
    if home != package:
        nearest = sys.modules.get(home) or importlib.import_module(home)
        file = getattr(nearest, "__file__", None)
        if file is None or name not in _table(file):
            home = package
    if isinstance(value, type):
        _resolve_annotations(value, sys.modules[module].__dict__)
    value.__module__ = home


def _resolve_annotations(cls: type, module_namespace: dict[str, Any]) -> None:
    """Evaluate ``cls``'s string annotations in its defining module, so that reading
    them later (pydantic, dataclasses, ``typing.get_type_hints``) does not depend on
    ``__module__``. A name only a type checker sees stays a string."""
    rebuild = getattr(cls, "model_rebuild", None)
    if rebuild is not None and not getattr(cls, "__pydantic_complete__", True):
        rebuild(_types_namespace=module_namespace)
    own = cls.__dict__.get("__annotations__")  # noqa: RUF063 - changed in place
    if not isinstance(own, dict):
        return
    local = dict(vars(cls))
    for key, annotation in own.items():
        if isinstance(annotation, str):
            try:
                own[key] = eval(annotation, module_namespace, local)
            except Exception:  # a name imported under TYPE_CHECKING only
                continue
