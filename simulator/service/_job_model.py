"""The model a job calls, as a tenant may ask for it, and its adapter, as the operator
allows it.

A job names an operator's endpoint (``endpoint: NAME``, the server's key, the
operator's arguments) or brings its own model (``model: TYPE:MODEL`` with its own
``base_url`` under the operator's ``allow_base_url`` and its own ``api_key``). Either
way the tenant never chooses an environment variable, a limit above its key's, or a
transport; and an adapter built for a tenant's own model sees an empty environment, so
no key of the server can reach the tenant's host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from convsim._errors import ConfigError, EgressRefused, RegistryError
from convsim._log import get_logger
from convsim._secrets import redact_url
from convsim.adapters import ADAPTERS, EgressPolicy, ModelAdapter, create_adapter, parse_model_spec
from convsim.adapters._http_adapter import HttpModelAdapter

from ._settings import KeyLimits, ServiceSettings

log = get_logger("convsim.service")

__all__ = ["JobModel", "Refused", "choose_model", "build_adapter", "URL_ARGS"]

URL_ARGS = ("base_url", "api_endpoint")
"""Arguments that hold the URL a tenant's own model is called at."""

_SECRET_ARGS = frozenset({"api_key", *URL_ARGS})
"""Stored encrypted and never shown (a URL may carry credentials): shown redacted."""

_GENERATION_ARGS = frozenset(
    {"temperature", "top_p", "max_tokens", "stream", "frequency_penalty", "presence_penalty"}
)
"""What a tenant may set on an operator's endpoint."""

_HTTP_ARGS = _GENERATION_ARGS | {
    "model", "base_url", "api_key", "timeout", "connect_timeout", "max_retries",
    "max_retry_time", "rpm", "tpm", "rpd", "input_price", "output_price", "context_length",
    "max_body_bytes", "max_event_bytes",
    "endpoint", "stream_usage",  # openai
    "anthropic_version", "default_max_tokens",  # anthropic
    "api_endpoint", "model_name",  # http (the guide's names)
}  # fmt: skip
"""What a tenant may set on its own HTTP model; anything else (``api_key_env``,
``http``, ``concurrency``, ...) is the operator's."""

_SCRIPTED_ARGS = frozenset({"model", "latency", "memory_turns", "use_references", "fail_rate"})

_CAPPED = {
    "max_tokens": "max_tokens",
    "default_max_tokens": "max_tokens",
    "max_body_bytes": "response_bytes",
    "max_event_bytes": "response_bytes",
}
"""Arguments a tenant may lower but not raise past its key's limit (by limit name)."""

_MAX_SCRIPTED_LATENCY = 60.0


@dataclass(frozen=True)
class Problem:
    """One refused part of a request, in FastAPI's shape for a 422."""

    loc: tuple[str | int, ...]
    msg: str

    def as_dict(self) -> dict[str, Any]:
        return {"loc": list(self.loc), "msg": self.msg, "type": "value_error"}


class Refused(ConfigError):
    """A job the tenant may not run; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class JobModel:
    """The model of a job as stored: what is shown, and what is sealed."""

    model: str
    """The spec, or ``endpoint:NAME`` for an operator's endpoint."""
    endpoint: str | None
    plain: dict[str, str] = field(default_factory=dict)
    secret: dict[str, str] = field(default_factory=dict)

    def shown_args(self) -> dict[str, str]:
        """The arguments as a tenant sees them: URLs redacted, keys masked."""
        shown = dict(self.plain)
        for name, value in self.secret.items():
            shown[name] = redact_url(value) if name in URL_ARGS else "***"
        return shown


def _arg(name: str) -> tuple[str, ...]:
    return ("body", "model_args", name)


def choose_model(
    model: str | None,
    endpoint: str | None,
    args: Mapping[str, str],
    settings: ServiceSettings,
    limits: KeyLimits,
) -> JobModel:
    """The job's model as the tenant asked for it, refused where it asks for what only
    the operator may set.

    Raises:
        Refused: naming each refused field.
    """
    problems: list[Problem] = []
    for name in args:
        if name.endswith("_env"):
            problems.append(Problem(_arg(name), "a job cannot name an environment variable "
                                    "of the server; give api_key, or use an endpoint"))  # fmt: skip
    if (model is None) == (endpoint is None):
        problems.append(Problem(("body",), "give model (your own) or endpoint (the operator's)"))
    if problems:
        raise Refused(problems)
    if endpoint is not None:
        if endpoint not in settings.endpoints:
            known = ", ".join(sorted(settings.endpoints)) or "none"
            raise Refused([Problem(("body", "endpoint"), f"no endpoint {endpoint!r}; the "
                                   f"server's endpoints: {known}")])  # fmt: skip
        allowed: frozenset[str] = _GENERATION_ARGS
        chosen = f"endpoint:{endpoint}"
    else:
        assert model is not None
        allowed = _allowed_args(model)
        chosen = model
    for name, value in args.items():
        if name not in allowed:
            where = "an operator's endpoint" if endpoint is not None else f"model {model}"
            problems.append(Problem(_arg(name), f"not allowed on {where}; allowed: "
                                    f"{', '.join(sorted(allowed))}"))  # fmt: skip
        elif name in _CAPPED:
            problems.extend(_over_limit(name, value, limits))
        elif name == "latency" and _number(value) > _MAX_SCRIPTED_LATENCY:
            problems.append(Problem(_arg(name), f"a number of seconds, at most "
                                    f"{_MAX_SCRIPTED_LATENCY:g}"))  # fmt: skip
    if problems:
        raise Refused(problems)
    plain = {k: v for k, v in args.items() if k not in _SECRET_ARGS}
    secret = {k: v for k, v in args.items() if k in _SECRET_ARGS}
    return JobModel(chosen, endpoint, plain, secret)


def _allowed_args(model: str) -> frozenset[str]:
    try:
        spec = parse_model_spec(model)
        factory = ADAPTERS.get(spec.type)
    except (ConfigError, RegistryError) as exc:
        raise Refused([Problem(("body", "model"), str(exc))]) from None
    if spec.type == "scripted":
        return _SCRIPTED_ARGS
    if isinstance(factory, type) and issubclass(factory, HttpModelAdapter):
        return frozenset(_HTTP_ARGS)
    raise Refused([Problem(("body", "model"), f"model type {spec.type!r} cannot be run for a "
                           "tenant here (only HTTP model types and scripted)")])  # fmt: skip


def _number(value: str) -> float:
    """The value as a number for a limit's comparison: what is not a finite number
    compares as infinite (and is refused)."""
    try:
        number = float(value)
    except ValueError:
        return math.inf
    return number if math.isfinite(number) else math.inf


def _over_limit(name: str, value: str, limits: KeyLimits) -> list[Problem]:
    limit = getattr(limits, _CAPPED[name])
    if _number(value) > limit:
        return [Problem(_arg(name), f"a number, at most {limit} for this key")]
    return []


def _forced(limits: KeyLimits, concurrency: int) -> dict[str, Any]:
    """The operator's settings on every HTTP adapter of a job."""
    return {
        "max_tokens_cap": limits.max_tokens,
        "max_body_bytes": limits.response_bytes,
        "max_event_bytes": min(limits.response_bytes, 2**20),
        # the budget of answer bytes a job's adapter reads at once; one answer must fit
        "max_inflight_bytes": max(limits.inflight_bytes, limits.response_bytes),
        "concurrency": concurrency,
    }


def build_adapter(
    job: JobModel,
    settings: ServiceSettings,
    limits: KeyLimits,
    *,
    concurrency: int,
    egress: EgressPolicy,
) -> ModelAdapter:
    """The adapter a job calls, built as the operator allows.

    Raises:
        Refused: an argument's value is invalid or its URL is not allowed.
    """
    args: dict[str, Any] = {**job.plain, **job.secret}
    if job.endpoint is not None:
        declared = settings.endpoints[job.endpoint]
        spec = parse_model_spec(declared.model)
        factory = ADAPTERS.get(spec.type)
        merged = {**declared.args, **args}
        if isinstance(factory, type) and issubclass(factory, HttpModelAdapter):
            merged = _limited(merged, limits, concurrency)
        try:  # the operator's endpoint: the server's environment, no egress policy
            return create_adapter(declared.model, merged)
        except ConfigError as exc:
            log.error("endpoint_misconfigured", endpoint=job.endpoint, error=str(exc))
            raise Refused([Problem(("body", "endpoint"), "the endpoint is misconfigured on "
                                   "the server (its log says why)")]) from None  # fmt: skip
    spec = parse_model_spec(job.model)
    factory = ADAPTERS.get(spec.type)
    if spec.model is not None:
        args.setdefault("model", spec.model)
    if spec.type == "scripted":
        return create_adapter(job.model, args)
    if getattr(factory, "requires_key", False) and "api_key" not in args:
        raise Refused([Problem(_arg("api_key"), "this model needs an API key: give "
                               "model_args.api_key, or use an operator's endpoint")])  # fmt: skip
    try:
        return factory(_limited(args, limits, concurrency), env={}, egress=egress)
    except EgressRefused as exc:
        field_name = next((n for n in URL_ARGS if n in job.secret), "base_url")
        raise Refused([Problem(_arg(field_name), exc.reason)]) from None
    except ConfigError as exc:
        raise Refused([Problem(("body", "model_args"), str(exc))]) from None


def _limited(args: Mapping[str, Any], limits: KeyLimits, concurrency: int) -> dict[str, Any]:
    forced = _forced(limits, concurrency)
    merged = dict(args)
    for name in ("max_body_bytes", "max_event_bytes"):
        asked = _number(str(merged.get(name, "inf")))
        if asked < forced[name]:
            forced[name] = int(asked)  # lower is the tenant's to choose (the adapter checks it)
    merged.update(forced)
    return merged
