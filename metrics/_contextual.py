"""The contextual (NLI) pair classifier as the metrics see it, and what they share.

``consistency``, ``context_retention`` (its reference-free check) and ``nli_coherence``
score sentence pairs with the process's NLI cross-encoder when one is present
(:func:`pair_classifier`: the ``nli`` extra installed and a model configured); without
one the first two keep their pattern backends and score exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from ._nli import nli_classifier

__all__ = [
    "CONTRADICTS",
    "PairScorer",
    "classify_contradiction",
    "pair_classifier",
    "sentences",
]

CONTRADICTS = 0.5
"""The contradiction probability from which a pair counts as a contradiction (the
classifier's own decision: no other label can then be more likely)."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[A-Za-z0-9]")


class PairScorer(Protocol):
    """A sequence-pair classifier: three probabilities per (premise, hypothesis) pair."""

    model_id: str

    def classify(self, pairs: Sequence[tuple[str, str]]) -> Sequence[Any]:
        """One result per pair, with ``entailment``, ``neutral`` and ``contradiction``."""
        ...


def pair_classifier() -> PairScorer | None:
    """The process's NLI classifier, or None when there is none (the extra not
    installed, no model configured). A model that is configured but cannot be loaded
    raises ``NliUnavailable`` (a ``ConfigError``) with how to place it."""
    return nli_classifier()


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` that hold a word, split where a sentence ends."""
    return [s.strip() for s in _SENTENCE_END.split(text) if _WORD.search(s)]


def classify_contradiction(scorer: PairScorer, pairs: Sequence[tuple[str, str]]) -> list[float]:
    """The contradiction probability of each (premise, hypothesis) pair, in order."""
    if not pairs:
        return []
    return [float(r.contradiction) for r in scorer.classify(list(pairs))]
