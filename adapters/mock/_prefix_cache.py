"""The mock server's simulated prefix cache: which part of a chat prompt a server with
prefix caching (vLLM's automatic prefix caching, SGLang's radix cache) would not
compute again.

As in vLLM, the prompt is a run of tokens cut into blocks (16 tokens, vLLM's default),
and a block is known by its tokens and everything before it (a chain of hashes): a
prompt's cached tokens are its leading blocks the cache holds, never the whole prompt (a
server computes at least its last token). Only whole blocks are held. A prompt's blocks
are remembered when it is served, and so are those of the prompt followed by its answer:
the next turn of the same conversation sends exactly that back before its new user
message. So a conversation's later turns hit, and so do prompts that share a long
leading text (traces whose requests declare shared prefixes). Memory is bounded: the
least recently used blocks are forgotten first.

The mock's tokens are a message's words (its text split on whitespace), led by a marker
of its role and filled up to the count the server bills for it.
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
    tokens: tuple[object, ...]
    """The prompt's tokens, to remember its answer after (:meth:`PrefixCache.answered`)."""


def message_tokens(turn: Turn, count: int) -> list[object]:
    """The ``count`` tokens of one message: a marker of its role, then its words, then
    fillers that only this message's text makes."""
    tokens: list[object] = [("role", turn.role), *turn.text.split()]
    if len(tokens) < count:
        tokens += [(hash(turn), i) for i in range(count - len(tokens))]
    return tokens[:count]


class PrefixCache:
    """Blocks of prompts seen, least recently used first out.

    Args:
        entries: how many blocks are held at most (0: none are, every prompt misses).
        block_tokens: tokens per block.
    """

    def __init__(self, entries: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if entries < 0 or block_tokens < 1:
            raise ValueError("entries must be >= 0 and block_tokens >= 1")
        self._entries = entries
        self._block = block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, turns: Sequence[Turn], tokens: Sequence[int]) -> Lookup:
        """The cached tokens of the prompt ``turns`` (``tokens[i]``: message i's token
        count), remembering its blocks.

        Raises:
            ValueError: ``tokens`` does not give one count per message.
        """
        if len(tokens) != len(turns):
            raise ValueError("give one token count per message")
        stream: list[object] = []
        for turn, count in zip(turns, tokens, strict=True):
            stream += message_tokens(turn, count)
        held = 0
        for key in self._remember(stream):
            if not key.was_held:
                break
            held += self._block
        held = min(held, max(0, len(stream) - 1))
        return Lookup(held - held % self._block, tuple(stream))

    def answered(self, lookup: Lookup, answer: str, tokens: int) -> None:
        """Remember the prompt of ``lookup`` followed by ``answer`` (``tokens`` long) as
        the assistant's message: what the conversation's next turn starts with."""
        self._remember([*lookup.tokens, *message_tokens(Turn("assistant", answer), tokens)])

    def _remember(self, stream: Sequence[object]) -> list[_Block]:
        """Each whole block of ``stream`` in order, whether it was held; each is held
        now (the most recently used), as far as room allows."""
        blocks: list[_Block] = []
        key = 0
        for start in range(0, len(stream) - self._block + 1, self._block):
            key = hash((key, *stream[start : start + self._block]))
            was_held = key in self._blocks
            blocks.append(_Block(key, was_held))
            if not self._entries:
                continue
            self._blocks[key] = None
            self._blocks.move_to_end(key)
            if len(self._blocks) > self._entries:
                self._blocks.popitem(last=False)
        return blocks


class _Block(NamedTuple):
    key: int
    was_held: bool
