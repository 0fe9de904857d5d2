"""What the operator decides: endpoints, where tenants' URLs may go, and limits per key.

Settings come from ``convsim serve`` flags or a YAML file (``--config``); flags add to
the file. Tenants never choose an environment variable, a limit above the operator's, or
a URL outside ``allow_base_url``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from convsim._errors import ConfigError, describe_validation_error
from convsim.adapters import EgressPolicy, parse_model_args, parse_model_spec

__all__ = ["KeyLimits", "Endpoint", "ServiceSettings", "parse_endpoint", "parse_limits"]

_MIB = 2**20


class KeyLimits(BaseModel):
    """What one API key may use; the operator's defaults, overridden per key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs: int = Field(default=4, ge=1)
    """Jobs queued or running at once."""
    conversations: int = Field(default=2_000, ge=1)
    """Conversations in one job (trials included)."""
    concurrency: int = Field(default=16, ge=1)
    """Conversations of one job in flight at once."""
    max_tokens: int = Field(default=4_096, ge=1)
    """Tokens any one model call may ask for."""
    response_bytes: int = Field(default=4 * _MIB, ge=1024)
    """Bytes of one answer (after decompression)."""
    inflight_bytes: int = Field(default=64 * _MIB, ge=1024)
    """Bytes of answers one job reads at once."""
    trials: int = Field(default=10, ge=1)
    """Trials per scenario."""
    turns: int = Field(default=200, ge=1)
    """Turns of one conversation (after ``repeat``)."""
    transcript_chars: int = Field(default=1_000_000, ge=1_000)
    """Characters of one conversation's transcript (prompts and answers)."""
    results_bytes: int = Field(default=2**30, ge=2**20)
    """Bytes of one job's results file."""
    streams: int = Field(default=8, ge=1)
    """Result streams open at once."""
    uploads: int = Field(default=20, ge=0)
    """Uploaded packs kept at once."""
    upload_bytes: int = Field(default=64 * _MIB, ge=0)
    """Bytes of uploaded packs kept at once."""

    def merged(self, overrides: Mapping[str, Any]) -> KeyLimits:
        """These limits with a key's own values."""
        try:
            return KeyLimits.model_validate({**self.model_dump(), **overrides})
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "limit")) from None


def parse_limits(pairs: Iterable[str]) -> dict[str, int]:
    """``["jobs=4", ...]`` as values checked against :class:`KeyLimits`."""
    values = parse_model_args(pairs)
    unknown = sorted(set(values) - set(KeyLimits.model_fields))
    if unknown:
        raise ConfigError(
            f"unknown limit {', '.join(unknown)}; limits: {', '.join(KeyLimits.model_fields)}"
        )
    KeyLimits().merged(values)  # raises ConfigError naming the field
    return {name: int(value) for name, value in values.items()}


class Endpoint(BaseModel):
    """A model the operator declares (``--endpoint NAME=SPEC,KEY=VALUE,...``) and
    tenants name; its key comes from the server (``api_key_env``) and is never seen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    """A model spec: ``openai:gpt-4o-mini``, ``openai-compatible:llama``, ..."""
    args: dict[str, str] = Field(default_factory=dict)
    """Adapter arguments: base_url, api_key_env, rpm, tpm, ... (shared by every tenant)."""

    @field_validator("model")
    @classmethod
    def _spec(cls, value: str) -> str:
        parse_model_spec(value)
        return value


def parse_endpoint(text: str) -> tuple[str, Endpoint]:
    """``NAME=SPEC[,KEY=VALUE...]`` as a name and an :class:`Endpoint`."""
    name, sep, rest = text.partition("=")
    spec, *pairs = rest.split(",")
    if not sep or not name.strip() or not spec.strip():
        raise ConfigError(
            f"--endpoint {text!r}: expected NAME=SPEC[,KEY=VALUE...], e.g. "
            "gpt=openai:gpt-4o-mini,api_key_env=OPENAI_API_KEY,rpm=500"
        )
    try:
        return name.strip(), Endpoint(model=spec.strip(), args=parse_model_args(pairs))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"endpoint {name.strip()}")) from None


class ServiceSettings(BaseModel):
    """Everything the operator sets for ``convsim serve``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: dict[str, Endpoint] = Field(default_factory=dict)
    allow_base_url: list[str] = Field(default_factory=list)
    """URL prefixes tenants' own model URLs must fall under (none: no own URLs)."""
    limits: KeyLimits = KeyLimits()
    """Each key's limits unless the key has its own."""
    max_body_bytes: int = Field(default=_MIB, ge=1024)
    """The largest request body, however it is sent."""
    upload_retention_s: float = Field(default=86_400.0, ge=0)
    """How long an uploaded pack is kept after its job ends."""
    pack_sources: list[str] = Field(default_factory=lambda: ["task"])
    """Pack sources tenants may name: ``task`` (``task:NAME``, and a task class
    installed packages register, by its plain name), ``lm-eval`` for ``lm-eval:TASK``
    (whose loading takes seconds of a worker process each), or a source an installed
    package registers in the entry-point group ``convsim.pack_sources``. A source's
    code runs in a worker process for each job that names it: allow only sources you
    trust."""
    max_starts: int = Field(default=3, ge=1)
    """A job the server was running when it stopped this many times fails instead of
    starting again (a job that brings the server down cannot do it for ever)."""

    @field_validator("pack_sources")
    @classmethod
    def _sources(cls, value: list[str]) -> list[str]:
        from convsim.scenarios import PACK_SOURCES

        registered = {prefix.removesuffix(":") for prefix in PACK_SOURCES.prefixes()}
        unknown = sorted(set(value) - registered)
        if unknown:
            raise ValueError(
                f"unknown pack source {', '.join(unknown)}; registered sources: "
                f"{', '.join(sorted(registered))}"
            )
        return list(dict.fromkeys(value))

    @field_validator("allow_base_url")
    @classmethod
    def _prefixes(cls, value: list[str]) -> list[str]:
        EgressPolicy(value)  # raises ConfigError naming the bad prefix
        return value

    def egress(self) -> EgressPolicy:
        return EgressPolicy(self.allow_base_url)

    @classmethod
    def load(cls, path: Path | None, **flags: Any) -> ServiceSettings:
        """The YAML file at ``path`` (if any) with the flags' values added."""
        data: dict[str, Any] = {}
        if path is not None:
            import yaml

            try:
                loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"{path}: {exc}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: expected a mapping of settings")
            data = loaded
        endpoints = dict(data.get("endpoints") or {})
        endpoints.update(flags.pop("endpoints", {}) or {})
        data["endpoints"] = endpoints
        for listed in ("allow_base_url", "pack_sources"):
            added = flags.pop(listed, ()) or ()
            if added:
                default = cls.model_fields[listed].get_default(call_default_factory=True)
                data[listed] = [*data.get(listed, default), *added]
        limits = dict(data.get("limits") or {})
        limits.update(flags.pop("limits", {}) or {})
        data["limits"] = limits
        data.update({k: v for k, v in flags.items() if v is not None})
        where = str(path) if path is not None else "convsim serve"
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, f"setting in {where}")) from None
