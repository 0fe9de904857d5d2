"""The offline adapter: deterministic answers with no network."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field

from convsim._errors import ServerError, parse_config
from convsim._types import (
    CallTimings,
    Completion,
    Cost,
    GenerationParams,
    Message,
    ModelInfo,
    RateLimits,
    ToolCall,
    Usage,
)

from ._prompt import tool_calls_text
from ._protocol import ModelAdapter
from ._recall import recall_reply
from ._tool_policy import next_tool_step

__all__ = ["ScriptedAdapter", "ScriptedConfig"]


class ScriptedConfig(BaseModel):
    """Arguments of the ``scripted`` model (``--model-arg KEY=VALUE``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "scripted"
    """Name reported in results."""
    latency: float = Field(default=0.0, ge=0.0)
    """Seconds each call takes, to slow runs down for tests and demos."""
    memory_turns: int | None = Field(default=None, ge=1)
    """Rule-based replies see only the last K user messages (None: all of them)."""
    use_references: bool = True
    """Answer with the pack's reference response for a turn where one is given."""
    fail_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of calls that fail with ServerError, chosen deterministically by seed."""


@lru_cache(maxsize=16384)
def _count_tokens(text: str) -> int:
    """Whitespace tokens; cached because each call re-counts the whole history."""
    return len(text.split())


class ScriptedAdapter(ModelAdapter):
    """Answers deterministically offline.

    Where the pack gives a reference response for the turn it answers with that;
    otherwise it replies by rule from the conversation it can see (see ``memory_turns``).
    Offered tools, it calls those the user's message names, one a call, with arguments
    taken from the message (:mod:`convsim.adapters._tool_policy`). The same seed and
    conversation always give the same answer.
    """

    def __init__(self, config: ScriptedConfig | Mapping[str, Any] | None = None) -> None:
        self.config = parse_config(ScriptedConfig, config, "scripted")

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            model_id=f"scripted/{self.config.model}",
            model_type="scripted",
            provider="convsim",
            capabilities=("text_generation",),
            context_length=None,
            supports_streaming=False,
        )

    def default_config(self) -> GenerationParams:
        return GenerationParams(temperature=0.0, max_tokens=512)

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        started = time.perf_counter()
        cfg = self.config
        if cfg.latency:
            await anyio.sleep(cfg.latency)
        seed = params.seed or 0
        if cfg.fail_rate and random.Random(f"{seed}:{len(messages)}").random() < cfg.fail_rate:
            raise ServerError(
                f"scripted failure (fail_rate={cfg.fail_rate})", model=cfg.model, status_code=500
            )
        reference = params.reference if cfg.use_references else None
        step = next_tool_step(messages, params.tools, params.tool_choice, reference)
        calls: tuple[ToolCall, ...] = ()
        if isinstance(step, ToolCall):
            text, calls = "", (step,)
        elif step is not None:
            text = step
        elif reference is not None:
            text = reference
        else:
            text = recall_reply(messages, memory_turns=cfg.memory_turns, seed=seed)
        finish_reason = "tool_calls" if calls else "stop"
        if params.max_tokens is not None and not calls:
            words = text.split()
            if len(words) > params.max_tokens:
                text, finish_reason = " ".join(words[: params.max_tokens]), "length"
        prompt_tokens = sum(
            _count_tokens(m.content) + _count_tokens(tool_calls_text(m.tool_calls))
            for m in messages
        )
        completion_tokens = _count_tokens(text + tool_calls_text(calls))
        return Completion(
            text=text,
            tool_calls=calls,
            finish_reason=finish_reason,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
            timings=CallTimings(total_s=time.perf_counter() - started),
            model=cfg.model,
        )

    def usage_cost(self, usage: Usage) -> Cost | None:
        return Cost()  # offline: free

    def rate_limits(self) -> RateLimits:
        return RateLimits()

    async def aclose(self) -> None:
        return None
