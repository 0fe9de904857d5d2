"""What the mock server is told (:class:`MockServerConfig`) and what it reports
(:class:`MockServerStatistics`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._delay import Delay
from ._faults import DEFAULT_FAULTS, FAULT_KINDS, FaultKind

__all__ = ["MockServerConfig", "MockServerStatistics"]


class MockServerConfig(BaseModel):
    """How the mock server listens, answers, waits and fails."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port; 0 picks a free one (read it from ``MockModelServer.url``)."""
    ttft_ms: Delay = Delay()
    """Time to the first token: a number of ms or a Delay form such as ``"uniform:20,80"``."""
    itl_ms: Delay = Delay()
    """Inter-token latency: the gap between streamed tokens (same forms as ``ttft_ms``)."""
    output_tokens: int | None = Field(default=None, gt=0)
    """Every answer has exactly this many words: the reply, then filler (None: the reply)."""
    reasoning_tokens: int = Field(default=0, ge=0)
    """Chat answers reason first: this many words of ``reasoning_content`` (streamed one
    event a word, ``itl_ms`` apart, before the answer), counted in the completion
    tokens and reported as ``completion_tokens_details.reasoning_tokens``."""
    fault_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of generation requests that get an injected fault (decided by the seed)."""
    faults: dict[FaultKind, float] = Field(
        default_factory=lambda: dict.fromkeys(DEFAULT_FAULTS, 1.0)
    )
    """Relative weight of each fault kind; kinds left out never happen (by default every
    kind but ``malformed_tool_args``, equally)."""
    retry_after_s: float = Field(default=1.0, ge=0.0)
    """Retry-After of an injected 429, in seconds."""
    rpm: int | None = Field(default=None, ge=1)
    """Generation requests allowed per sliding 60 s window; more get 429 (None: no limit)."""
    memory_turns: int | None = Field(default=None, ge=1)
    """The model sees only the last K user messages, so it forgets older facts."""
    seed: int = 0
    """Seeds the delays, the faults, and answers of requests that give no seed."""
    model: str = "mock-model"
    """The model id listed by ``/v1/models`` (answers echo the requested model)."""
    message_overhead_tokens: int = Field(default=0, ge=0)
    """Tokens a chat template adds per message, counted in chat prompts' usage (and by
    ``/tokenize`` for messages): a server whose prompt count is more than the words."""
    usage: bool = True
    """Report token usage. False: answers carry ``"usage": null`` and streams ignore
    ``stream_options.include_usage``, as some servers do."""
    tokenize: bool = True
    """Serve ``POST /tokenize``. False: it answers 404, as on a server with no
    tokenizer endpoint."""
    prefix_cache: bool = True
    """Simulate a prefix cache (:mod:`convsim.adapters.mock._prefix_cache`) and report
    each chat answer's cached prompt tokens as ``usage.prompt_tokens_details.cached_tokens``.
    False: no ``prompt_tokens_details``, as a server that does not report them."""
    prefix_cache_entries: int = Field(default=65536, ge=0)
    """Blocks of 16 tokens the prefix cache holds at most (then the least recently used
    are forgotten)."""
    kv_cache_tokens: int = Field(default=262144, gt=0)
    """The simulated KV cache's size in tokens: ``/metrics`` reports the running
    requests' tokens over it as ``vllm:kv_cache_usage_perc``."""
    max_running: int | None = Field(default=None, ge=1)
    """Requests answered at once at most, as a server's batch limit: the others wait in
    arrival order, their time to first token including the wait, and ``/metrics`` counts
    them as ``vllm:num_requests_waiting``. None: no limit."""
    api_key: str | None = Field(default=None, repr=False)
    """When set, requests need ``Authorization: Bearer <api_key>`` or get 401."""

    @field_validator("faults")
    @classmethod
    def _some_fault_weight(cls, value: dict[FaultKind, float]) -> dict[FaultKind, float]:
        if any(w < 0 or not math.isfinite(w) for w in value.values()):
            raise ValueError("fault weights must be finite and >= 0")
        if not any(value.values()):
            raise ValueError(f"give at least one fault kind a positive weight: {FAULT_KINDS}")
        return value


@dataclass(frozen=True, slots=True)
class MockServerStatistics:
    """A snapshot of what a :class:`MockModelServer` has served."""

    requests: int
    """Every request received, including refused ones and unknown paths."""
    by_endpoint: dict[str, int]
    """Requests per known endpoint path."""
    faults_injected: dict[str, int]
    """Injected faults by kind (a stream-only kind in a non-streaming call counts as what
    it got instead: see :data:`FaultKind`)."""
    rate_limited: int
    """429s from the ``rpm`` limit (injected 429s are under ``faults_injected``)."""
    unauthorized: int
    """401s for a missing or wrong API key."""
