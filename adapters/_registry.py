"""Adapter registry and model specs (``scripted``, ``openai:MODEL``, ...)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from convsim._errors import ConfigError
from convsim._registry import Registry

from ._protocol import ModelAdapter

__all__ = [
    "ADAPTERS",
    "ModelSpec",
    "parse_model_spec",
    "parse_model_args",
    "get_model_adapter",
    "create_adapter",
]

ADAPTERS: Registry[ModelAdapter] = Registry("model type", group="convsim.adapters")
"""The default adapter registry; third parties add types via entry points."""
ADAPTERS.register("scripted", "convsim.adapters._scripted:ScriptedAdapter")
ADAPTERS.register("openai", "convsim.adapters._openai:OpenAIAdapter")
ADAPTERS.register("openai-compatible", "convsim.adapters._openai:OpenAICompatibleAdapter")
ADAPTERS.register("anthropic", "convsim.adapters._anthropic:AnthropicAdapter")
ADAPTERS.register("http", "convsim.adapters._custom_http:CustomHttpAdapter")
ADAPTERS.register("litellm", "convsim.adapters._litellm:LitellmAdapter")

_SPEC = re.compile(r"^(?P<type>[A-Za-z][A-Za-z0-9_\-]*)(?::(?P<model>.+))?$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec: ``type`` picks the adapter, ``model`` names the model."""

    type: str
    model: str | None = None

    def __str__(self) -> str:
        return self.type if self.model is None else f"{self.type}:{self.model}"


def parse_model_spec(spec: str) -> ModelSpec:
    """Split ``TYPE[:MODEL]``; raise ConfigError when it has another shape."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ConfigError(
            f"invalid model spec {spec!r}: expected TYPE or TYPE:MODEL, e.g. 'scripted' "
            "or 'openai:gpt-4o-mini'"
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
    config: Mapping[str, Any] | None = None,
    *,
    registry: Registry[ModelAdapter] = ADAPTERS,
) -> ModelAdapter:
    """Build the adapter registered as ``model_type`` from ``config``."""
    factory = registry.get(model_type)
    return factory(dict(config or {}))


def create_adapter(
    spec: str | ModelSpec,
    args: Mapping[str, Any] | None = None,
    *,
    registry: Registry[ModelAdapter] = ADAPTERS,
) -> ModelAdapter:
    """Build an adapter from a model spec and its ``--model-arg`` values."""
    parsed = parse_model_spec(spec) if isinstance(spec, str) else spec
    config = dict(args or {})
    if parsed.model is not None:
        config.setdefault("model", parsed.model)
    return get_model_adapter(parsed.type, config, registry=registry)
