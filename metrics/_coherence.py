"""Coherence, its lexical forerunner, the guide's conversation flow, and semantic similarity.

``coherence`` judges each response in its context with semantic embeddings (WordLlama,
whose weights ship in its wheel; TF-IDF where it is not installed):

- fit: the mean of the response's similarity to the user message it answers and to
  everything said before it;
- echo: a response that adds almost nothing new (under a fifth of its content words are
  new to the conversation) only repeats what was said, and its fit is scaled down in
  proportion. Measured against people, relevance rewards parroting otherwise: FED's
  pattern-matching bot echoes its users and gets the lowest coherence ratings;
- the conversation score is the 25th percentile of the turn scores: a few incoherent
  responses spoil a conversation, one outlier does not. Chosen by measurement on the one
  dialogue-level human-rated set at hand (FED "Coherent": mean +0.32, minimum +0.37,
  25th percentile +0.40 Spearman).

``lexical_coherence`` is the earlier scorer: TF-IDF fitted on the conversation's own
texts, a weighted mean of per-turn components:

- relevance (0.4): the response against the user message it answers;
- context (0.2): the response against everything said before it;
- continuity (0.2): the response against the previous response (1 - topic drift);
- consistency (0.2): of the responses that state a tracked fact (its value, or another
  value for it), the share that do not contradict it (only when the scenario declares
  facts and some response states one: a response silent on the facts checks nothing;
  the other weights are scaled up if not).

Blind spots: TF-IDF sees shared words, not meaning (a fitting paraphrase scores zero, an
echo scores high); static embeddings see topic, not logic (a fluent non sequitur on the
same topic fits, and a contradiction of an earlier statement is not seen: that is
``consistency``'s job).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from convsim._records import Score, TurnRecord, TurnStatus

from ._embedding import NO_WORDS, Embedder, TfidfEmbedder, cosine, default_embedder
from ._protocol import MetricTraits
from ._retention import fact_recalled, stated_values
from ._stats import mean, percentile
from ._stop_words import ENGLISH_STOP_WORDS

_WORDS = re.compile(r"[a-z0-9][a-z0-9'-]*")
_HAS_WORD = re.compile(r"\w")

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = [
    "CoherenceMetric",
    "LexicalCoherenceMetric",
    "ConversationFlowMetric",
    "SemanticSimilarityMetric",
    "COHERENCE_WEIGHTS",
]

COHERENCE_WEIGHTS = {"relevance": 0.4, "context": 0.2, "continuity": 0.2, "consistency": 0.2}


@dataclass
class _Turns:
    """The completed turns of a conversation, gathered as they arrive."""

    users: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)

    def add(self, turn: TurnRecord) -> bool:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return False
        self.users.append(turn.user_message or "")
        self.responses.append(turn.response)
        return True


ECHO_NOVELTY = 0.2
"""A response with fewer new content words than this share only repeats what was said."""


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` that are not English stop words."""
    return {w for w in _WORDS.findall(text.lower()) if w not in ENGLISH_STOP_WORDS}


class CoherenceMetric:
    """Each response's semantic fit to what it answers and to the conversation so far,
    scaled down for echoes; the conversation's 25th percentile."""

    name = "coherence"
    traits: ClassVar[MetricTraits] = MetricTraits("conversation")
    higher_is_better = True
    cpu_heavy = True
    description = (
        "Per response: the mean of its semantic similarity (WordLlama) to the user "
        "message and to everything before it, scaled down when under a fifth of its "
        "content words are new (an echo); the conversation scores the 25th percentile "
        "of its responses (details: by_turn). Blind to logic and to contradictions."
    )

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or default_embedder()

    def scorer(self, conversation: Conversation) -> _SemanticCoherenceScorer:
        return _SemanticCoherenceScorer(self.embedder)


@dataclass
class _SemanticCoherenceScorer:
    embedder: Embedder
    turns: _Turns = field(default_factory=_Turns)

    def update(self, turn: TurnRecord) -> None:
        self.turns.add(turn)  # cheap: the work is done once, in result()

    def result(self) -> Score:
        users, responses = self.turns.users, self.turns.responses
        n = len(responses)
        if not n:
            return Score.not_applicable("no completed turns")
        if not any(_HAS_WORD.search(t) for t in (*users, *responses)):
            return Score.not_applicable(NO_WORDS)
        before = [" ".join([*_interleaved(users[:i], responses[:i]), users[i]]) for i in range(n)]
        texts = [*responses, *users, *before]
        asked = [i for i in range(n) if users[i].strip()]
        framed = [i for i in range(n) if before[i].strip()]
        pairs = [(i, n + i) for i in asked] + [(i, 2 * n + i) for i in framed]
        sims = cosine(self.embedder, texts, pairs)
        if sims is None:
            return Score.not_applicable(NO_WORDS)
        relevance = dict(zip(asked, sims[: len(asked)], strict=True))
        context = dict(zip(framed, sims[len(asked) :], strict=True))
        scored = [i for i in range(n) if i in context]
        if not scored:
            return Score.not_applicable("no response follows anything said")
        by_turn: list[float] = []
        echoes = 0
        for i in scored:
            fit = mean([v for v in (relevance.get(i), context[i]) if v is not None])
            if not _HAS_WORD.search(responses[i]):
                fit = 0.0  # a blank or emoji-only answer says nothing that could fit
            said = content_words(responses[i])
            if said:
                novelty = len(said - content_words(before[i])) / len(said)
                if novelty < ECHO_NOVELTY:
                    echoes += 1
                    fit *= novelty / ECHO_NOVELTY
            by_turn.append(fit)
        value = percentile(by_turn, 25)
        embedder = getattr(self.embedder, "name", type(self.embedder).__name__)
        return Score(
            value=value,
            details={
                "by_turn": by_turn,
                "last_turn": by_turn[-1],
                "mean": mean(by_turn),
                "relevance": mean(list(relevance.values())) if relevance else None,
                "context": mean(list(context.values())),
                "echoes": echoes,
                "turns": len(by_turn),
                "aggregation": "p25",
                "embedder": embedder,
                # which kind of model scored: nli_coherence reports "nli"
                "backend": embedder if embedder in ("wordllama", "tfidf") else "embedding",
            },
        )


def _interleaved(users: Sequence[str], responses: Sequence[str]) -> list[str]:
    out: list[str] = []
    for user, response in zip(users, responses, strict=True):
        out += [user, response]
    return out


class LexicalCoherenceMetric:
    """The earlier coherence: TF-IDF relevance, context fit, continuity and consistency."""

    name = "lexical_coherence"
    traits: ClassVar[MetricTraits] = MetricTraits("conversation")
    higher_is_better = True
    cpu_heavy = True
    description = (
        "Weighted mean of per-turn relevance to the user turn (0.4), fit to the "
        "conversation so far (0.2), continuity with the previous response (0.2) "
        "and consistency with tracked facts (0.2); TF-IDF similarity: shared words, "
        "not meaning (an echo scores high, a paraphrase low)."
    )

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or TfidfEmbedder()

    def scorer(self, conversation: Conversation) -> _CoherenceScorer:
        return _CoherenceScorer(self.embedder, list(conversation.scenario.facts))


@dataclass
class _CoherenceScorer:
    embedder: Embedder
    facts: list[Any]
    turns: _Turns = field(default_factory=_Turns)

    def update(self, turn: TurnRecord) -> None:
        self.turns.add(turn)  # cheap: the work is done once, in result()

    def result(self) -> Score:
        users, responses = self.turns.users, self.turns.responses
        n = len(responses)
        if not n:
            return Score.not_applicable("no completed turns")
        histories = [" ".join([*users[:i], *responses[:i], users[i]]) for i in range(n)]
        texts = [*users, *responses, *histories]
        # a turn with no user message (an assistant opening) has nothing to be relevant to
        asked = [i for i in range(n) if users[i].strip()]
        framed = [i for i in range(n) if histories[i].strip()]
        pairs = [(n + i, i) for i in asked]  # response -> its user turn
        pairs += [(n + i, 2 * n + i) for i in framed]  # response -> everything before it
        pairs += [(n + i, n + i - 1) for i in range(1, n)]  # response -> previous response
        sims = cosine(self.embedder, texts, pairs)
        if sims is None:
            return Score.not_applicable(NO_WORDS)
        relevance = sims[: len(asked)]
        context = sims[len(asked) : len(asked) + len(framed)]
        continuity = sims[len(asked) + len(framed) :]
        if not relevance or not context:
            return Score.not_applicable("no turn answers a user message")
        parts = {"relevance": mean(relevance), "context": mean(context)}
        if continuity:
            parts["continuity"] = mean(continuity)
        checked = 0
        if self.facts:
            contradicted = [any(stated_values(f, r) for f in self.facts) for r in responses]
            stating = [
                bad or any(fact_recalled(f, r) for f in self.facts)
                for bad, r in zip(contradicted, responses, strict=True)
            ]
            checked = sum(stating)
            if checked:
                parts["consistency"] = 1.0 - sum(contradicted) / checked
        weight = sum(COHERENCE_WEIGHTS[k] for k in parts)
        value = sum(COHERENCE_WEIGHTS[k] * v for k, v in parts.items()) / weight
        details: dict[str, Any] = {
            **parts,
            "turns": n,
            "relevance_by_turn": relevance,
            "context_by_turn": context,
        }
        if continuity:
            details["topic_drift"] = 1.0 - parts["continuity"]
        if self.facts:
            details["consistency_checks"] = checked
        return Score(value=value, details=details)


class ConversationFlowMetric:
    """The guide's conversation flow: topic consistency (0.4), response relevance (0.3)
    and progression (0.3: responses that do not repeat earlier ones)."""

    name = "conversation_flow"
    traits: ClassVar[MetricTraits] = MetricTraits("conversation")
    higher_is_better = True
    cpu_heavy = True
    description = (
        "0.4 x topic consistency (each response against the previous) + 0.3 x "
        "relevance to the user turn + 0.3 x progression (1 - the highest "
        "similarity to any earlier response); needs two or more turns."
    )

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or TfidfEmbedder()

    def scorer(self, conversation: Conversation) -> _FlowScorer:
        return _FlowScorer(self.embedder)


@dataclass
class _FlowScorer:
    embedder: Embedder
    turns: _Turns = field(default_factory=_Turns)

    def update(self, turn: TurnRecord) -> None:
        self.turns.add(turn)

    def result(self) -> Score:
        users, responses = self.turns.users, self.turns.responses
        n = len(responses)
        if n < 2:
            return Score.not_applicable("conversation flow needs two or more completed turns")
        texts = [*users, *responses]
        # a turn with no user message (an assistant opening) has nothing to be relevant to
        asked = [i for i in range(n) if users[i].strip()]
        if not asked:
            return Score.not_applicable("no turn answers a user message")
        pairs = [(n + i, i) for i in asked]
        pairs += [(n + i, n + j) for i in range(1, n) for j in range(i)]
        sims = cosine(self.embedder, texts, pairs)
        if sims is None:
            return Score.not_applicable(NO_WORDS)
        relevance = sims[: len(asked)]
        earlier = dict(zip(pairs[len(asked) :], sims[len(asked) :], strict=True))
        consistency = [earlier[(n + i, n + i - 1)] for i in range(1, n)]
        # a blank response does not move the conversation on, whatever came before it
        progression = [
            1.0 - max(earlier[(n + i, n + j)] for j in range(i)) if responses[i].strip() else 0.0
            for i in range(1, n)
        ]
        parts = {
            "topic_consistency": mean(consistency),
            "relevance": mean(relevance),
            "progression": mean(progression),
        }
        value = (
            0.4 * parts["topic_consistency"] + 0.3 * parts["relevance"] + 0.3 * parts["progression"]
        )
        return Score(value=value, details=parts)


class SemanticSimilarityMetric:
    """Similarity of each response to the turn's reference response."""

    name = "semantic_similarity"
    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"reference"}))
    higher_is_better = True
    cpu_heavy = True
    description = (
        "Mean cosine similarity of responses to the reference responses (WordLlama "
        "embeddings; TF-IDF where WordLlama is not installed)."
    )

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or default_embedder()

    def scorer(self, conversation: Conversation) -> _SimilarityScorer:
        return _SimilarityScorer(self.embedder, dict(conversation.scenario.reference_responses))


@dataclass
class _SimilarityScorer:
    embedder: Embedder
    references: dict[str, str]
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        reference = self.references.get(turn.turn_id)
        if reference is not None and turn.status is TurnStatus.COMPLETED and turn.response:
            self.pairs.append((turn.response, reference))

    def result(self) -> Score:
        if not self.references:
            return Score.not_applicable("the scenario gives no reference responses")
        if not self.pairs:
            return Score.not_applicable("no completed turn has a reference response")
        texts = [t for pair in self.pairs for t in pair]
        sims = cosine(self.embedder, texts, [(2 * i, 2 * i + 1) for i in range(len(self.pairs))])
        if sims is None:
            return Score.not_applicable(NO_WORDS)
        return Score(value=mean(sims), details={"n": len(sims)})
