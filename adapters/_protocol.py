"""The contract every model adapter fulfils: one method that does the work, and hooks
with safe defaults for everything the runtime asks of an adapter."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from convsim._errors import AdapterError, ConfigError, parse_config
from convsim._types import (
    Completion,
    Cost,
    GenerationParams,
    Message,
    ModelInfo,
    RateLimits,
    Usage,
)

if TYPE_CHECKING:
    from ._budget import Budgets

__all__ = [
    "ModelAdapter",
    "PromptLogprobs",
    "PromptScorer",
    "LogprobsUnsupported",
    "can_score_prompts",
]


class LogprobsUnsupported(ConfigError, NotImplementedError):
    """The adapter cannot return prompt logprobs (what loglikelihood requests need)."""


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


class ModelAdapter(ABC):
    """An async model backend.

    Subclass it and implement :meth:`generate`; every other method is a hook with a safe
    default, overridden where a backend has more to say (its name and price, its rate
    budgets, streaming, prompt scoring). Adapters are shared services: one instance
    serves many conversations at once, so ``generate`` must be safe to call
    concurrently. A failed call raises an :class:`~convsim.AdapterError` subclass, never
    returns a sentinel.
    """

    supports_streaming: ClassVar[bool] = False
    """Whether :meth:`stream` works (and ``stream=true`` may be asked for)."""

    @abstractmethod
    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """Answer the conversation ``messages`` with the next assistant message."""

    # -- what the adapter says about its model ------------------------------------------

    def model_info(self) -> ModelInfo:
        """Describe the model: id, type, provider, capabilities, context length."""
        name = type(self).__name__
        return ModelInfo(
            model_id=name,
            model_type=name,
            provider="custom",
            supports_streaming=self.supports_streaming,
        )

    def default_config(self) -> GenerationParams:
        """Sampling settings used where a turn sets none (default: the backend's)."""
        return GenerationParams()

    def validate_config(self, config: Mapping[str, Any]) -> GenerationParams:
        """Check a turn's sampling settings; raise ConfigError naming the bad field."""
        return parse_config(GenerationParams, config, "generation config")

    def estimate_cost(self, usage: Usage) -> Cost | None:
        """Price ``usage``; None when the adapter has no pricing for its model."""
        return None

    def rate_limits(self) -> RateLimits:
        """The request and token budgets this adapter runs under (default: none)."""
        return RateLimits()

    async def aclose(self) -> None:
        """Release connections and other resources."""
        return None

    # -- what the runtime asks of it -------------------------------------------------

    def cache_identity(self) -> Mapping[str, Any]:
        """What, beside the request, decides this adapter's answers: part of every
        response-cache key. Never a key or other secret. Default: the class, and the
        model's type, provider and id."""
        info = self.model_info()
        return {
            "adapter": type(self).__qualname__,  # its module varies with how it was imported
            "model_type": info.model_type,
            "provider": info.provider,
            "model": info.model_id,
        }

    def connection_key(self) -> str | None:
        """Adapters with the same key share one rate budget (same API, same key);
        None when the adapter has no budget to share."""
        return None

    def share_budgets(self, budgets: Budgets) -> None:
        """Take the rate budgets of the application that runs this adapter: adapters
        with the same :meth:`connection_key` share one budget. Called by the
        :class:`~convsim.adapters.ModelPool` that holds the adapter, before the first
        call. Default: the adapter has no budgets to share."""
        return None

    def size_pool(self, concurrency: int) -> None:
        """Take the number of calls the application makes at once as the size of this
        adapter's connection pool and its concurrency cap, unless the adapter was
        configured with its own. Called by the :class:`~convsim.adapters.ModelPool`
        that built the adapter, before the first call (never for an adapter a caller
        built). Default: nothing to size."""
        return None

    async def preflight(self) -> None:
        """Check, with one cheap call, that the endpoint can serve a run; called once
        before the first conversation. Raise :class:`~convsim.EndpointError` saying what
        to fix when it cannot (unreachable, key refused, wrong URL); anything less
        certain passes. Default: nothing to check."""
        return None

    def should_retry(self, error: AdapterError) -> bool:
        """Whether a failed attempt is worth trying again (default: what the error
        declares, ``error.retryable``)."""
        return error.retryable

    async def stream(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        on_text: Callable[[str], None],
    ) -> Completion:
        """Like :meth:`generate`, streaming: ``on_text`` gets each piece as it arrives.

        Raises:
            ConfigError: the adapter does not stream (:attr:`supports_streaming`).
        """
        raise ConfigError(f"{self.model_info().model_type} models do not stream")

    async def count_tokens(self, text: str) -> int | None:
        """The tokens of ``text`` by the model's own tokenizer (the server's tokenize
        endpoint, or a local tokenizer), for answers that came without usage; None when
        the adapter has none (the default)."""
        return None

    @property
    def supports_prompt_logprobs(self) -> bool:
        """Whether this adapter, as configured, can score a prompt
        (:meth:`prompt_logprobs`, what lm-eval's loglikelihood tasks need)."""
        return False

    def no_prompt_logprobs_reason(self) -> str:
        """Why this adapter, as configured, cannot score prompts."""
        return f"the {self.model_info().model_type} adapter returns no prompt logprobs"

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs:
        """Score ``prompt``: each of its tokens with its logprob.

        Raises:
            LogprobsUnsupported: the adapter cannot (:attr:`supports_prompt_logprobs`).
        """
        raise LogprobsUnsupported(self.no_prompt_logprobs_reason())


@runtime_checkable
class PromptScorer(Protocol):
    """What scoring a prompt takes (``echo`` + ``logprobs`` on OpenAI-compatible
    completions servers such as vLLM); every :class:`ModelAdapter` has it, and says with
    ``supports_prompt_logprobs`` whether it works."""

    async def count_tokens(self, text: str) -> int | None:
        """The tokens of ``text`` by the model's own tokenizer (the server's tokenize
        endpoint, or a local tokenizer), for answers that came without usage; None when
        the adapter has none (the default)."""
        return None

    @property
    def supports_prompt_logprobs(self) -> bool: ...

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs: ...


def can_score_prompts(adapter: ModelAdapter) -> bool:
    """True when ``adapter`` says it can score prompts, so callers can refuse at once
    instead of failing on every request."""
    return adapter.supports_prompt_logprobs
