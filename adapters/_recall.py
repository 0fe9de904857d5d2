"""A deterministic, rule-based "model" that answers from the conversation it can see.

It restates the latest user message and recalls the earlier user sentence that shares
the most content words with it. With ``memory_turns=K`` it only sees the last K user
messages, so it forgets facts introduced earlier: a model with known behaviour that
retention metrics can be checked against.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from convsim._types import Message

__all__ = ["recall_reply"]

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-.]*[A-Za-z0-9]|[A-Za-z0-9]")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_STOPWORDS = frozenset(
    """a an and are as at be but by can could did do does for from had has have how i i'm in
    is it its me my of on or our please so that the their them then there these this to was
    we were what when where which who why will with would you your""".split()
)
_OPENINGS = ("Understood.", "Thanks for the details.", "Got it.", "Sure.")


@lru_cache(maxsize=8192)
def _content_words(text: str) -> frozenset[str]:
    return frozenset(w for w in map(str.lower, _WORD.findall(text)) if w not in _STOPWORDS)


class _Sentence(NamedTuple):
    text: str
    words: frozenset[str]
    """Its content words (stopwords left out), lower case."""


@lru_cache(maxsize=8192)
def _sentences(text: str) -> tuple[_Sentence, ...]:
    """Each sentence of ``text`` with its content words (messages recur turn after turn)."""
    return tuple(_Sentence(s, _content_words(s)) for s in _SENTENCE.split(text.strip()))


def _first_sentence(text: str, limit: int = 160) -> str:
    sentence = _SENTENCE.split(text.strip(), maxsplit=1)[0]
    return sentence if len(sentence) <= limit else sentence[: limit - 3].rstrip() + "..."


def recall_reply(messages: Sequence[Message], *, memory_turns: int | None, seed: int) -> str:
    """Answer the last user message from the last ``memory_turns`` user messages."""
    user_texts = [m.content for m in messages if m.role == "user"]
    if not user_texts:
        return _OPENINGS[seed % len(_OPENINGS)] + " How can I help?"
    visible = user_texts if memory_turns is None else user_texts[-memory_turns:]
    latest = visible[-1]
    parts = [_OPENINGS[(seed + len(user_texts)) % len(_OPENINGS)]]
    parts.append(f"You wrote: {_first_sentence(latest)}")
    wanted = _content_words(latest)
    best, best_overlap = "", 0
    for text in visible[:-1]:
        for sentence in _sentences(text):
            overlap = len(wanted & sentence.words)
            if overlap > best_overlap:
                best, best_overlap = sentence.text, overlap
    if best:
        parts.append(f"Earlier you said: {best}")
    elif len(visible) > 1:
        parts.append(f"Earlier you said: {_first_sentence(visible[0])}")
    return " ".join(parts)
