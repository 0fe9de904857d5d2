"""Consistency with the NLI backend: each assistant statement against what came before.

Every assistant sentence that states something (not a question, three words or more) is
a hypothesis; its premises are the earlier assistant sentences (previous turns), the
assistant's persona (``persona`` in the metadata), the simulated user's persona
(``scenario.user.persona``), the scenario's facts once the user has given them, and
what the user said about themself so far (their sentences with "I", "my", "me", "we").
Each pair is scored by the contextual pair classifier; the score is one minus the
highest contradiction probability, with the contradicting pair in the details.

Cost: at most :data:`PAIR_CAP` pairs per conversation. When more are available, the
pairs that share the most content words are kept (a contradiction speaks of the same
thing), the later statements first among equals; the details count the pairs available
and scored. The classifier runs in
``result()``, which the scoring session runs in a worker thread (the metric is
``cpu_heavy`` with this backend).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from convsim._records import Score, TurnRecord, TurnStatus

from ._contextual import CONTRADICTS, PairScorer, classify_contradiction, sentences
from ._stop_words import ENGLISH_STOP_WORDS

__all__ = ["PAIR_CAP", "NliConsistencyScorer", "Premise"]

PAIR_CAP = 64
"""Pairs scored per conversation at most: about 1.4 s on 2 cores for a DeBERTa-v3-xsmall
cross-encoder (about 22 ms a pair, tests/bench/bench_nli.py --sized)."""

_MIN_WORDS = 3
_ABOUT_ONESELF = re.compile(r"\b(?:i|i'm|im|my|me|mine|we|our|us)\b", re.I)
_WORDS = re.compile(r"[a-z0-9][a-z0-9'-]*")


class Premise(NamedTuple):
    """Something said before a statement: its text, who said it (``assistant``,
    ``persona``, ``user``, ``user_persona``, ``fact``) and where (a turn id, or the
    source for a persona)."""

    text: str
    source: str
    turn_id: str


def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORDS.findall(text.lower()) if w not in ENGLISH_STOP_WORDS)


def _states(sentence: str) -> bool:
    return not sentence.rstrip().endswith("?") and len(sentence.split()) >= _MIN_WORDS


class _Hypothesis(NamedTuple):
    text: str
    turn_id: str
    premises: int
    """How many premises (in order) precede it."""


@dataclass
class NliConsistencyScorer:
    """The NLI consistency scorer of one conversation."""

    classifier: PairScorer
    premises: list[Premise] = field(default_factory=list)
    """What was said, in order: personas first, then turn by turn."""
    facts: dict[str, list[Premise]] = field(default_factory=dict)
    """The scenario's facts by the turn whose user message gives them."""
    hypotheses: list[_Hypothesis] = field(default_factory=list)
    cap: int = PAIR_CAP

    @classmethod
    def for_conversation(
        cls,
        classifier: PairScorer,
        persona: list[str],
        user_persona: str,
        facts: list[Any],
        cap: int = PAIR_CAP,
    ) -> NliConsistencyScorer:
        scorer = cls(classifier, cap=cap)
        for line in persona:
            scorer.premises += [Premise(s, "persona", "persona") for s in sentences(line)]
        for s in sentences(user_persona):
            scorer.premises.append(Premise(s, "user_persona", "user_persona"))
        for fact in facts:
            text = f"{' '.join(fact.key.split('_'))}: {fact.value}"
            scorer.facts.setdefault(fact.introduced_in, []).append(
                Premise(text, "fact", fact.introduced_in)
            )
        return scorer

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        self.premises += self.facts.pop(turn.turn_id, [])
        for s in sentences(turn.user_message or ""):
            if _states(s) and _ABOUT_ONESELF.search(s):
                self.premises.append(Premise(s, "user", turn.turn_id))
        said = [s for s in sentences(turn.response) if _states(s)]
        before = len(self.premises)
        self.hypotheses += [_Hypothesis(s, turn.turn_id, before) for s in said]
        self.premises += [Premise(s, "assistant", turn.turn_id) for s in said]

    def result(self) -> Score:
        available = [(h, p) for h in self.hypotheses for p in self.premises[: h.premises]]
        if not available:
            return Score.not_applicable(
                "nothing to check: no assistant statement follows an earlier statement, a "
                "persona or something the user said about themself",
                backend="nli",
                model=self.classifier.model_id,
                statements=len(self.hypotheses),
            )
        chosen = available
        if len(available) > self.cap:
            overlap = [len(_content(h.text) & _content(p.text)) for h, p in available]
            ranked = sorted(range(len(available)), key=lambda i: (-overlap[i], -i))
            chosen = [available[i] for i in sorted(ranked[: self.cap])]
        probabilities = classify_contradiction(
            self.classifier, [(p.text, h.text) for h, p in chosen]
        )
        worst = max(range(len(chosen)), key=probabilities.__getitem__)
        hypothesis, premise = chosen[worst]
        details: dict[str, Any] = {
            "backend": "nli",
            "model": self.classifier.model_id,
            "statements": len(self.hypotheses),
            "pairs_scored": len(chosen),
            "pairs_available": len(available),
            "pair_cap": self.cap,
            "max_contradiction": probabilities[worst],
            "contradicting_pair": {
                "premise": premise.text,
                "premise_source": premise.source,
                "premise_turn": premise.turn_id,
                "statement": hypothesis.text,
                "turn_id": hypothesis.turn_id,
                "contradiction": probabilities[worst],
            },
            "contradictions": sum(p >= CONTRADICTS for p in probabilities),
        }
        return Score(value=1.0 - probabilities[worst], details=details)
