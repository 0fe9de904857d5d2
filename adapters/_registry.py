"""Adapter registry and model specs (``scripted``, ``openai:MODEL``, ``module:Class``).

A model spec ``TYPE[:MODEL]`` names a registered model type (built-in, or declared in
the entry-point group ``convsim.adapters``). A spec whose ``TYPE`` is no registered type
but which reads as ``package.module:ClassName`` names an adapter class to import (a
user's own, such as one written from the guide), built with its ``--model-arg`` values
as a :class:`~convsim.adapters.ModelConfiguration`. The guide's ``MODEL_ADAPTERS`` and
``get_model_adapter(model_type, config)`` read and fill the same registry.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from convsim._errors import ConfigError, RegistryError
from convsim._registry import Registry

from ._model_configuration import ModelConfiguration
from ._protocol import ModelAdapter, is_bridged

__all__ = [
    "ADAPTERS",
    "MODEL_ADAPTERS",
    "AdapterTypes",
    "ModelSpec",
    "parse_model_spec",
    "parse_model_args",
    "get_model_adapter",
    "build_adapter",
    "create_adapter",
]

ADAPTERS: Registry[ModelAdapter] = Registry("model type", group="convsim.adapters")
"""The default adapter registry; third parties add types via entry points."""
ADAPTERS.register("scripted", "convsim.adapters._scripted:ScriptedAdapter")
ADAPTERS.register("openai", "convsim.adapters._openai:OpenAIAdapter")
ADAPTERS.register("openai-compatible", "convsim.adapters._openai:OpenAICompatibleAdapter")
ADAPTERS.register("anthropic", "convsim.adapters._anthropic:AnthropicAdapter")
ADAPTERS.register("http", "convsim.adapters._custom_http:CustomHttpAdapter")
ADAPTERS.register("custom", "convsim.adapters._custom_http:GuideCustomAdapter")
ADAPTERS.register("litellm", "convsim.adapters._litellm:LitellmAdapter")
ADAPTERS.register("python", "convsim.adapters._app:python_app")

_SPEC = re.compile(r"^(?P<type>[A-Za-z][A-Za-z0-9_\-.]*)(?::(?P<model>.+))?$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class AdapterTypes(MutableMapping[str, Callable[..., ModelAdapter]]):
    """A registry seen as the guide's ``MODEL_ADAPTERS`` dict: model type -> adapter
    class (or factory), imported on first use. ``MODEL_ADAPTERS["mine"] = MyAdapter``
    registers a type (replacing one of that name); ``del`` forgets it; a missing type
    raises :class:`~convsim.RegistryError`, a KeyError and a ValueError listing the
    known types."""

    def __init__(self, registry: Registry[ModelAdapter]) -> None:
        self.registry = registry

    def __getitem__(self, model_type: str) -> Callable[..., ModelAdapter]:
        return self.registry.get(model_type)

    def __setitem__(self, model_type: str, factory: Callable[..., ModelAdapter]) -> None:
        if not isinstance(model_type, str) or not _SPEC.match(model_type) or ":" in model_type:
            raise ConfigError(f"{model_type!r} is not a model type name (letters, digits, -_.)")
        self.registry.register(model_type, factory, replace=True)

    def __delitem__(self, model_type: str) -> None:
        self.registry.unregister(model_type)

    def __contains__(self, model_type: object) -> bool:
        return model_type in self.registry

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry.names())

    def __len__(self) -> int:
        return len(self.registry.names())

    def __repr__(self) -> str:
        return f"AdapterTypes({self.registry.names()!r})"


MODEL_ADAPTERS = AdapterTypes(ADAPTERS)
"""The guide's name for the adapter registry (:data:`ADAPTERS`), as a dict."""


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec: ``type`` picks the adapter, ``model`` names the model."""

    type: str
    model: str | None = None

    def __str__(self) -> str:
        return self.type if self.model is None else f"{self.type}:{self.model}"

    def names_a_class(self) -> bool:
        """Whether the spec reads as ``package.module:ClassName``."""
        return (
            self.model is not None and self.model.isidentifier() and bool(_MODULE.match(self.type))
        )


def parse_model_spec(spec: str) -> ModelSpec:
    """Split ``TYPE[:MODEL]``; raise ConfigError when it has another shape."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ConfigError(
            f"invalid model spec {spec!r}: expected TYPE or TYPE:MODEL, e.g. 'scripted' "
            "or 'openai:gpt-4o-mini', or module:Class for an adapter class of your own"
        )
    return ModelSpec(match["type"], match["model"])


def parse_model_args(pairs: Iterable[str]) -> dict[str, str]:
    """Turn ``["key=value", ...]`` into a dict; raise ConfigError on a malformed pair."""
    args: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ConfigError(f"invalid model argument {pair!r}: expected KEY=VALUE")
        if key in args:
            raise ConfigError(f"model argument {key!r} given twice")
        args[key] = value
    return args


def get_model_adapter(
    model_type: str,
    config: ModelConfiguration | Mapping[str, Any] | None = None,
    *,
    registry: Registry[ModelAdapter] = ADAPTERS,
) -> ModelAdapter:
    """Build the adapter registered as ``model_type`` from ``config`` (the guide's
    ``get_model_adapter``); ``custom`` is the guide's custom HTTP backend.

    An adapter written in the guide's style gets ``config`` as a ModelConfiguration
    (a dict is made one), and its own ``validate_config`` is asked about it.

    Raises:
        RegistryError: no such model type (a KeyError and a ValueError too).
        ConfigError: ``config`` is invalid for the adapter.
    """
    factory = registry.get(model_type)
    adapter = _built(factory, config)
    if isinstance(adapter, ModelAdapter):
        adapter.registered_type = model_type
        adapter.check_configuration()
    return adapter


def _built(
    factory: Callable[..., ModelAdapter], config: ModelConfiguration | Mapping[str, Any] | None
) -> ModelAdapter:
    if isinstance(config, ModelConfiguration):
        return factory(config)
    if isinstance(factory, type) and issubclass(factory, ModelAdapter) and is_bridged(factory):
        return factory(ModelConfiguration(config))
    return factory(dict(config or {}))


def build_adapter(
    spec: ModelSpec,
    args: ModelConfiguration | Mapping[str, Any] | None = None,
    *,
    registry: Registry[ModelAdapter] = ADAPTERS,
) -> ModelAdapter:
    """Build the adapter a parsed spec names, with ``args``: a registered type (the
    spec's model, if any, as its ``model`` argument), else an adapter class named
    ``package.module:ClassName`` (imported now; its arguments as they are).

    Raises:
        RegistryError: no such model type, and the spec names no importable class.
        ConfigError: the class is not a ModelAdapter, or the arguments are invalid.
    """
    if spec.type in registry or not spec.names_a_class():
        if isinstance(args, ModelConfiguration):
            config: ModelConfiguration | dict[str, Any] = args
        else:
            config = dict(args or {})
            if spec.model is not None:
                config.setdefault("model", spec.model)
        return get_model_adapter(spec.type, config, registry=registry)
    adapter_class = _adapter_class(spec, registry)
    adapter = _built(adapter_class, args)
    adapter.registered_type = str(spec)
    adapter.check_configuration()
    return adapter


def _adapter_class(spec: ModelSpec, registry: Registry[ModelAdapter]) -> type[ModelAdapter]:
    """The class ``module:Class`` names; RegistryError when the module does not exist
    (an unknown type, most likely), ConfigError when it is not an adapter class."""
    assert spec.model is not None
    try:
        module = importlib.import_module(spec.type)
    except ModuleNotFoundError as exc:
        if exc.name != spec.type and not spec.type.startswith(f"{exc.name}."):
            raise ConfigError(f"{spec}: importing {spec.type} failed: {exc}") from exc
        unknown = RegistryError(registry.kind, spec.type, registry.names())
        unknown.args = (
            f"{unknown.args[0]}; nor is there a module {spec.type!r} for an adapter class "
            f"{spec} (is its folder on PYTHONPATH?)",
        )
        raise unknown from None
    except Exception as exc:  # the module's own code failed: say so, with its error
        raise ConfigError(f"{spec}: importing {spec.type} failed: {exc!r}") from exc
    found = getattr(module, spec.model, None)
    if not (isinstance(found, type) and issubclass(found, ModelAdapter)):
        what = "nothing" if found is None else f"a {type(found).__name__}"
        raise ConfigError(
            f"{spec}: {spec.type}.{spec.model} is {what}, not a subclass of "
            "convsim.adapters.ModelAdapter"
        )
    return found


def takes_argument(
    spec: str | ModelSpec, name: str, *, registry: Registry[ModelAdapter] = ADAPTERS
) -> bool:
    """Whether the registered adapter type ``spec`` names declares the argument ``name``
    in its ``Config`` (False for an unknown type or a ``module:Class`` spec): a caller
    can then give a default for it without breaking adapters that lack it."""
    parsed = parse_model_spec(spec) if isinstance(spec, str) else spec
    if parsed.type not in registry:
        return False
    config = getattr(registry.get(parsed.type), "Config", None)
    fields = getattr(config, "model_fields", None)
    return isinstance(fields, dict) and name in fields


def create_adapter(
    spec: str | ModelSpec,
    args: Mapping[str, Any] | None = None,
    *,
    registry: Registry[ModelAdapter] = ADAPTERS,
) -> ModelAdapter:
    """Build an adapter from a model spec and its ``--model-arg`` values."""
    parsed = parse_model_spec(spec) if isinstance(spec, str) else spec
    return build_adapter(parsed, args, registry=registry)
