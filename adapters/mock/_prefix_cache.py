"""The mock server's simulated prefix cache: which part of a chat prompt a server with
prefix caching (vLLM's automatic prefix caching, SGLang's radix cache) would not
compute again.

A prompt is seen as its messages. Every leading run of messages of a prompt served is
remembered, and so is the whole prompt followed by the answer given to it: the next
turn of the same conversation sends exactly that back before its new user message. A
prompt's cached tokens are those of its longest remembered leading run, counted in
whole blocks (16 tokens, as vLLM's default block) and never the whole prompt (a server
computes at least its last token). Memory is bounded: the least recently used runs are
forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from ._wire import Turn

__all__ = ["PrefixCache", "Lookup", "BLOCK_TOKENS"]

BLOCK_TOKENS = 16
"""Tokens per cache block: only whole blocks are cached (vLLM's default block size)."""


class Lookup(NamedTuple):
    """What the cache held of one prompt."""

    cached_tokens: int
    """The prompt's leading tokens the cache held, in whole blocks."""
    key: int
    """The whole prompt's key, to remember its answer under (:meth:`PrefixCache.answered`)."""


class PrefixCache:
    """Leading runs of messages seen, least recently used first out.

    Args:
        entries: how many runs are remembered at most (0: nothing is, every prompt
            misses).
        block_tokens: tokens per block.
    """

    def __init__(self, entries: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if entries < 0 or block_tokens < 1:
            raise ValueError("entries must be >= 0 and block_tokens >= 1")
        self._entries = entries
        self._block = block_tokens
        self._runs: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def lookup(self, turns: Sequence[Turn], tokens: Sequence[int]) -> Lookup:
        """The cached tokens of the prompt ``turns`` (``tokens[i]``: message i's token
        count), remembering each of its leading runs.

        Raises:
            ValueError: ``tokens`` does not give one count per message.
        """
        if len(tokens) != len(turns):
            raise ValueError("give one token count per message")
        key = 0
        covered = 0
        hit = 0
        matching = True  # a hit is a run from the start: it ends at the first miss
        for turn, count in zip(turns, tokens, strict=True):
            key = hash((key, turn))
            covered += count
            if key in self._runs:
                self._runs.move_to_end(key)
                if matching:
                    hit = covered
            else:
                matching = False
                self._remember(key)
        whole = sum(tokens)
        hit = min(hit, whole - 1) if whole else 0
        return Lookup(hit - hit % self._block, key)

    def answered(self, lookup: Lookup, answer: str) -> None:
        """Remember the prompt of ``lookup`` followed by ``answer`` as the assistant's
        message: what the conversation's next turn starts with."""
        self._remember(hash((lookup.key, Turn("assistant", answer))))

    def _remember(self, key: int) -> None:
        if not self._entries:
            return
        self._runs[key] = None
        self._runs.move_to_end(key)
        if len(self._runs) > self._entries:
            self._runs.popitem(last=False)
