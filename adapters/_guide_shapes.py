"""The developer guide's dictionaries for what an adapter says and returns, and their
conversions to and from convsim's typed values.

The guide's adapters speak in plain dicts (``get_model_info()``, ``generate_response``,
``get_default_config()``, ``get_rate_limits()``, ``estimate_cost(prompt_tokens,
completion_tokens)``); convsim's speak in frozen models (:class:`~convsim.adapters.ModelInfo`,
:class:`~convsim.adapters.Completion`, ...). A dict read from an adapter is checked here,
and a bad one raises :class:`~convsim.ConfigError` naming the method and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from typing_extensions import NotRequired, TypedDict

from convsim._errors import ConfigError, describe_validation_error
from convsim._types import Completion, Cost, GenerationParams, ModelInfo, RateLimits

__all__ = [
    "ModelInfoDict",
    "UsageDict",
    "ResponseDict",
    "ConfigValidation",
    "CostDict",
    "RateLimitsDict",
    "GUIDE_SETTINGS",
    "info_dict",
    "info_from_dict",
    "settings_dict",
    "params_from_dict",
    "unknown_settings",
    "limits_dict",
    "limits_from_dict",
    "cost_dict",
    "cost_from_dict",
    "response_dict",
]


class ModelInfoDict(TypedDict):
    """``get_model_info()``: what the adapter says about its model."""

    model_id: str
    model_type: str
    provider: str
    capabilities: list[str]
    context_length: int | None
    supports_streaming: bool


class UsageDict(TypedDict):
    """The ``usage`` of a :class:`ResponseDict`."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseDict(TypedDict):
    """``generate_response(prompt, config)``: one answer."""

    text: str
    usage: UsageDict
    model: str
    finish_reason: str | None


class ConfigValidation(TypedDict):
    """``validate_config(config)``: ``{"valid": True}``, or ``{"valid": False, "error":
    "what is wrong"}``."""

    valid: bool
    error: NotRequired[str]


class CostDict(TypedDict):
    """``estimate_cost(prompt_tokens, completion_tokens)``: the price of a call."""

    prompt_cost: float
    completion_cost: float
    total_cost: float
    currency: str


class RateLimitsDict(TypedDict):
    """``get_rate_limits()``: the budgets the adapter runs under (None: unlimited)."""

    requests_per_minute: float | None
    tokens_per_minute: float | None
    requests_per_day: float | None
    concurrency: int | None


GUIDE_SETTINGS = ("temperature", "max_tokens", "top_p", "frequency_penalty", "presence_penalty")
"""The keys of the guide's ``get_default_config()``, always present in convsim's (None:
the backend's own default)."""

M = TypeVar("M", bound=BaseModel)

_NOT_SENT = frozenset({"reference", "metadata"})
"""GenerationParams fields that are never settings of a model call."""


def _checked(model: type[M], data: Any, what: str, *, known_only: bool = True) -> M:
    """``data`` as a ``model``; with ``known_only``, keys the model does not have are
    left out (what an adapter says may carry more than convsim reads), else refused."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what} returned {type(data).__name__}, not a dict")
    if known_only:
        data = {k: v for k, v in data.items() if k in model.model_fields}
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, what)) from None


def unknown_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a ``get_default_config()`` dict that GenerationParams has no
    field for (``top_k``, ``repetition_penalty``, ...): a guide-style adapter gets them
    back in every call's config, as its own defaults."""
    return {k: v for k, v in data.items() if k not in GenerationParams.model_fields}


def info_dict(info: ModelInfo) -> ModelInfoDict:
    """``info`` as the guide's ``get_model_info()`` dict."""
    return {
        "model_id": info.model_id,
        "model_type": info.model_type,
        "provider": info.provider,
        "capabilities": list(info.capabilities),
        "context_length": info.context_length,
        "supports_streaming": info.supports_streaming,
    }


def info_from_dict(data: Any, fallback: ModelInfo) -> ModelInfo:
    """A ``get_model_info()`` dict as a ModelInfo; keys it leaves out are ``fallback``'s,
    keys ModelInfo has no field for are left out.

    Raises:
        ConfigError: not a dict, or a value of the wrong type.
    """
    if isinstance(data, Mapping):
        data = {**info_dict(fallback), **data}
    return _checked(ModelInfo, data, "get_model_info()")


def settings_dict(params: GenerationParams) -> dict[str, Any]:
    """``params`` as the guide's settings dict: the five keys of its
    ``get_default_config()`` always (None: the backend's default), then every other
    setting that is set (``stop`` as a list); never the reference or metadata."""
    data = params.model_dump(exclude=set(_NOT_SENT))
    settings: dict[str, Any] = {name: data.pop(name) for name in GUIDE_SETTINGS}
    for name, value in data.items():
        if value is not None:
            settings[name] = list(value) if name == "stop" else value
    return settings


def params_from_dict(data: Any, what: str, *, known_only: bool = False) -> GenerationParams:
    """A settings dict (a turn's config, ``get_default_config()``) as GenerationParams;
    None values are left to the backend. With ``known_only``, settings GenerationParams
    has no field for are left out (an adapter's own, see :func:`unknown_settings`).

    Raises:
        ConfigError: not a dict, an unknown setting (unless ``known_only``), or a value
            out of range.
    """
    if isinstance(data, Mapping):
        data = {k: v for k, v in data.items() if v is not None}
        if isinstance(data.get("stop"), list):
            data["stop"] = tuple(data["stop"])
        unknown = sorted(set(data) & _NOT_SENT)
        if unknown:
            raise ConfigError(f"invalid {what}: {', '.join(unknown)} is not a model setting")
    return _checked(GenerationParams, data, what, known_only=known_only)


def limits_dict(limits: RateLimits) -> RateLimitsDict:
    """``limits`` as the guide's ``get_rate_limits()`` dict (with the concurrency cap)."""
    return {
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "requests_per_day": limits.requests_per_day,
        "concurrency": limits.concurrency,
    }


def limits_from_dict(data: Any) -> RateLimits:
    """A ``get_rate_limits()`` dict as RateLimits (other keys left out).

    Raises:
        ConfigError: not a dict, or a value of the wrong type.
    """
    return _checked(RateLimits, data, "get_rate_limits()")


def cost_dict(cost: Cost) -> CostDict:
    """``cost`` as the guide's ``estimate_cost(prompt_tokens, completion_tokens)`` dict."""
    return {
        "prompt_cost": cost.prompt_cost,
        "completion_cost": cost.completion_cost,
        "total_cost": cost.total_cost,
        "currency": cost.currency,
    }


def cost_from_dict(data: Any) -> Cost:
    """An ``estimate_cost(prompt_tokens, completion_tokens)`` dict as a Cost (other
    keys left out).

    Raises:
        ConfigError: not a dict, or a value of the wrong type.
    """
    return _checked(Cost, data, "estimate_cost()")


def response_dict(completion: Completion, model: str) -> ResponseDict:
    """``completion`` as the guide's ``generate_response`` dict; ``model`` names the
    model when the completion does not."""
    usage = completion.usage
    return {
        "text": completion.text,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
        "model": completion.model or model,
        "finish_reason": completion.finish_reason,
    }
