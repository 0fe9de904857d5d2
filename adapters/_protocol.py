"""The contract every model adapter fulfils, and the optional prompt-scoring capability."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ._types import Completion, Cost, GenerationParams, Message, ModelInfo, RateLimits, Usage

__all__ = ["ModelAdapter", "PromptLogprobs", "PromptScorer", "can_score_prompts"]


@runtime_checkable
class ModelAdapter(Protocol):
    """An async model backend.

    ``generate`` is the one method that does work; the others describe the model and
    its budgets. Adapters are shared services: one instance serves many conversations
    at once, so ``generate`` must be safe to call concurrently. A failed call raises an
    :class:`~convsim.AdapterError` subclass, never returns a sentinel.
    """

    def model_info(self) -> ModelInfo:
        """Describe the model: id, type, provider, capabilities, context length."""
        ...

    def default_config(self) -> GenerationParams:
        """Sampling settings used where a turn sets none."""
        ...

    def validate_config(self, config: Mapping[str, Any]) -> GenerationParams:
        """Check sampling settings; raise ConfigError naming the bad field."""
        ...

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """Answer the conversation ``messages`` with the next assistant message."""
        ...

    def estimate_cost(self, usage: Usage) -> Cost | None:
        """Price ``usage``; None when the adapter has no pricing for its model."""
        ...

    def rate_limits(self) -> RateLimits:
        """The request and token budgets this adapter runs under."""
        ...

    async def aclose(self) -> None:
        """Release connections and other resources."""
        ...


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """The log-probability of every token of a prompt, as the model read it.

    The sequences run in parallel, one entry per token of the prompt (tokens the server
    generated after it are not included). The first token has no preceding context, so
    its logprob is usually None.
    """

    tokens: tuple[str, ...]
    """The prompt's tokens as the server's tokenizer split it."""
    token_logprobs: tuple[float | None, ...]
    """Natural-log probability of each token given the tokens before it."""
    text_offset: tuple[int, ...]
    """Character offset in the prompt where each token starts."""
    top_logprobs: tuple[Mapping[str, float] | None, ...] | None
    """The most likely tokens at each position with their logprobs (None where the
    server gave none); tells whether each token was the model's greedy choice."""
    usage: Usage
    """Tokens the scoring call used (the prompt, plus any generated token)."""
    attempts: int = 1
    """Attempts the call took, retries included."""


@runtime_checkable
class PromptScorer(Protocol):
    """An adapter that can score a prompt (``echo`` + ``logprobs`` on OpenAI-compatible
    completions servers such as vLLM): what lm-eval's loglikelihood tasks need."""

    @property
    def supports_prompt_logprobs(self) -> bool:
        """Whether this adapter, as configured, can return prompt logprobs."""
        ...

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs:
        """Score ``prompt``: each of its tokens with its logprob."""
        ...


def can_score_prompts(adapter: object) -> bool:
    """True when ``adapter`` implements :class:`PromptScorer` and says it can score,
    so callers can refuse at once instead of failing on every request."""
    return isinstance(adapter, PromptScorer) and adapter.supports_prompt_logprobs
