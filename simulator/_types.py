"""Typed values exchanged with model adapters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.dataclasses import dataclass

__all__ = [
    "Role",
    "Message",
    "Usage",
    "CallTimings",
    "Completion",
    "GenerationParams",
    "ModelInfo",
    "RateLimits",
    "Cost",
]

Role = Literal["system", "user", "assistant"]


# Messages and usage are created for every turn and held for a conversation's life:
# slotted pydantic dataclasses keep them validated but small (no __dict__, no field set).
_COMPACT = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True, config=_COMPACT)
class Message:
    """One chat message."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True, config=_COMPACT)
class Usage:
    """Token counts of one call (or a sum of calls)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = False
    """True when the counts are a client-side estimate, not the server's figures."""
    cached_prompt_tokens: int = 0
    """Of ``prompt_tokens``, those the server read from its prompt cache (as it reports
    them), priced at the model's cached-input rate."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            estimated=self.estimated or other.estimated,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
        )


class CallTimings(BaseModel):
    """Where the time of one model call went, in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_wait_s: float = 0.0
    """Time spent waiting for a rate budget or a concurrency slot."""
    retry_wait_s: float = 0.0
    """Time spent on failed attempts and the back-off between them."""
    ttft_s: float | None = None
    """Time to the first content byte; None when the call did not stream."""
    total_s: float = 0.0
    """From sending the request (after the queue) to the last byte."""
    inter_token_s: tuple[float, ...] = ()
    """Gaps between streamed chunks; empty when the call did not stream."""


class Completion(BaseModel):
    """What a model call returned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    finish_reason: str | None = "stop"
    usage: Usage = Field(default_factory=Usage)
    timings: CallTimings = Field(default_factory=CallTimings)
    attempts: int = 1
    model: str | None = None
    replaced_chars: int = 0
    """Characters of the answer that were not valid Unicode (lone UTF-16 surrogates:
    half an emoji) and were replaced with U+FFFD; 0 for a clean answer."""


class GenerationParams(BaseModel):
    """Sampling settings for one call; None leaves the backend's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: tuple[str, ...] | None = None
    min_tokens: int | None = Field(default=None, gt=0)
    """At least this many tokens (vLLM, SGLang): with ``max_tokens``, an exact output
    length for load tests. Sent by OpenAI-compatible adapters; others ignore it."""
    ignore_eos: bool | None = None
    """Keep generating past the end-of-sequence token (vLLM, SGLang, llama.cpp)."""
    seed: int | None = None
    """Per-conversation seed derived from the run seed; backends that accept one get it."""
    reference: str | None = None
    """A reference answer the pack gives for this turn. Offline adapters (scripted) may
    answer with it; adapters that call a real model never send it."""
    metadata: Mapping[str, str] = Field(default_factory=dict)
    """conversation_id, scenario_id, turn_id and role, for tracing; never sent as text."""

    def merged(self, overrides: GenerationParams | Mapping[str, Any]) -> GenerationParams:
        """Return a copy where every non-None field of ``overrides`` wins."""
        data = overrides.model_dump() if isinstance(overrides, BaseModel) else dict(overrides)
        update = {k: v for k, v in data.items() if v is not None and v != {}}
        return self.model_copy(update=update) if update else self


class ModelInfo(BaseModel):
    """What an adapter says about the model behind it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str
    model_type: str
    provider: str
    capabilities: tuple[str, ...] = ("text_generation",)
    context_length: int | None = None
    supports_streaming: bool = False


class RateLimits(BaseModel):
    """The budgets an adapter runs under; None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    requests_per_day: float | None = None
    concurrency: int | None = None


class Cost(BaseModel):
    """Estimated price of some usage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_cost: float = 0.0
    completion_cost: float = 0.0
    total_cost: float = 0.0
    currency: str = "USD"
