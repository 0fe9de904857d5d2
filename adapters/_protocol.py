"""The contract every model adapter fulfils."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ._types import Completion, Cost, GenerationParams, Message, ModelInfo, RateLimits, Usage

__all__ = ["ModelAdapter"]


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
