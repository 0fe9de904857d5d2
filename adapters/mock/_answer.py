"""What the mock model answers: the reply of :mod:`convsim.adapters._recall`, padded
with filler to the length asked, then cut at a stop string or ``max_tokens``."""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Literal, NamedTuple

from convsim._types import Message

from .._recall import recall_reply
from ._wire import Params, Turn

__all__ = ["Answer", "answer", "Cut", "cut"]

# Words appended after the model's reply when ``output_tokens`` asks for a longer answer.
_FILLER = tuple(
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua".split()
)


class Answer(NamedTuple):
    """The mock model's answer to a conversation."""

    words: tuple[str, ...]
    """The reply, a word a token."""
    prompt_tokens: int
    """The conversation's length in tokens (words)."""


@lru_cache(maxsize=2048)
def answer(
    turns: tuple[Turn, ...], memory_turns: int | None, seed: int, length: int | None
) -> Answer:
    """The reply to ``turns``; conversations repeat, so cached."""
    messages = [Message(role=t.role, content=t.text) for t in turns if t.role]  # type: ignore[arg-type]
    words = recall_reply(messages, memory_turns=memory_turns, seed=seed).split()
    if length is not None:
        words = [
            *words[:length],
            *itertools.islice(itertools.cycle(_FILLER), max(0, length - len(words))),
        ]
    prompt_tokens = sum(len(t.text.split()) for t in turns)
    return Answer(tuple(words), prompt_tokens)


class Cut(NamedTuple):
    """The reply as sent: cut at a stop string or max_tokens."""

    words: tuple[str, ...]
    finish_reason: Literal["stop", "length"]


def cut(words: tuple[str, ...], params: Params) -> Cut:
    """Apply stop strings (cut at the first) and max_tokens (then ``length``); pad with
    filler up to ``min_tokens``, or to ``max_tokens`` with ``ignore_eos``."""
    least = params.max_tokens if params.ignore_eos and params.max_tokens else params.min_tokens
    if least and len(words) < least:
        words = (*words, *itertools.islice(itertools.cycle(_FILLER), least - len(words)))
    if params.stop:
        text = " ".join(words)
        at = min((i for i in map(text.find, params.stop) if i >= 0), default=-1)
        if at >= 0:
            words = tuple(text[:at].split())
    if params.max_tokens is not None and (
        len(words) > params.max_tokens or (params.ignore_eos and len(words) == params.max_tokens)
    ):
        return Cut(words[: params.max_tokens], "length")
    return Cut(words, "stop")
