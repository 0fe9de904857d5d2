"""Prefix-cache hit rates from the cached prompt tokens servers report per call
(``usage.cached_tokens``): overall and by turn depth, where multi-turn conversations
should show the cache at work (a later turn resends the earlier ones).

A hit rate is cached tokens over prompt tokens, summed over the calls that reported
cached tokens; calls that did not say are counted apart, never as misses.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, ConfigDict

__all__ = ["TurnHitRate", "PrefixCacheFigures", "PrefixCacheFold", "NOT_REPORTED"]

NOT_REPORTED = (
    "no completed call reported cached prompt tokens (OpenAI-compatible servers send "
    "usage.prompt_tokens_details.cached_tokens, vLLM with --enable-prompt-tokens-details; "
    "Anthropic cache_read_input_tokens)"
)
"""Why there is no hit rate when no call reported cached tokens."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _rate(cached: int, prompt: int) -> float | None:
    return cached / prompt if prompt else None


class TurnHitRate(_Model):
    """The calls at one turn depth that reported cached tokens."""

    turn_index: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float | None
    """``cached_tokens / prompt_tokens``; null without prompt tokens."""


class PrefixCacheFigures(_Model):
    """How much of the prompts the server's prefix cache held."""

    requests: int
    """Completed calls that reported cached tokens (zero included)."""
    unreported: int
    """Completed calls that did not say: left out of every figure here."""
    prompt_tokens: int
    """Prompt tokens of the reporting calls."""
    cached_tokens: int
    hit_rate: float | None
    """``cached_tokens / prompt_tokens``; null when no call reported (see ``reason``)."""
    hit_rate_by_turn: list[TurnHitRate]
    """By turn depth (0: a conversation's first turn), the calls of a turn's tool
    rounds together."""
    reason: str | None = None
    """Why ``hit_rate`` is null."""


class PrefixCacheFold:
    """Sums calls' prompt and cached tokens by turn depth, one call at a time."""

    def __init__(self) -> None:
        self._prompt: dict[int, int] = defaultdict(int)
        self._cached: dict[int, int] = defaultdict(int)
        self._requests: dict[int, int] = defaultdict(int)
        self._unreported = 0

    def add(self, turn_index: int, prompt_tokens: int, cached_tokens: int | None) -> None:
        """One completed call; ``cached_tokens`` None when its server did not say."""
        if cached_tokens is None:
            self._unreported += 1
            return
        self._requests[turn_index] += 1
        self._prompt[turn_index] += prompt_tokens
        self._cached[turn_index] += cached_tokens

    @property
    def reported(self) -> bool:
        """Whether any call reported cached tokens."""
        return bool(self._requests)

    def figures(self) -> PrefixCacheFigures:
        """The hit rates of everything added so far."""
        turns = [
            TurnHitRate(
                turn_index=turn,
                requests=self._requests[turn],
                prompt_tokens=self._prompt[turn],
                cached_tokens=self._cached[turn],
                hit_rate=_rate(self._cached[turn], self._prompt[turn]),
            )
            for turn in sorted(self._requests)
        ]
        prompt, cached = sum(self._prompt.values()), sum(self._cached.values())
        rate = _rate(cached, prompt)
        reason = None
        if not turns:
            reason = NOT_REPORTED
        elif rate is None:
            reason = "the calls that reported cached tokens had no prompt tokens"
        return PrefixCacheFigures(
            requests=sum(self._requests.values()),
            unreported=self._unreported,
            prompt_tokens=prompt,
            cached_tokens=cached,
            hit_rate=rate,
            hit_rate_by_turn=turns,
            reason=reason,
        )
