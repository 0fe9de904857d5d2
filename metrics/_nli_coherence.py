"""``nli_coherence``: each response against its preceding context with the NLI model.

The option to ``coherence`` (which keeps WordLlama): a user asks for it by name, as for
``lexical_coherence``, since metrics take no arguments in the registry. It needs the
``nli`` extra and a model (``CONVSIM_NLI_MODEL``); asked for without one, it stops the run
before it starts (a ``ConfigError`` saying how to place it) rather than test nothing.

Per response the premise is its context, the last :data:`CONTEXT_UTTERANCES` utterances
before it (the user message it answers last: a cross-encoder truncates long inputs, so
the nearest context is what it must keep), and the turn score is one minus the
contradiction probability. Why not entailment: a fitting reply adds something new, which
NLI calls neutral, so entailment would reward echoes; and neutral also covers an
off-topic reply, so no weighting of it separates the two. Contradiction is what the
model sees that static embeddings do not. The conversation scores the 25th percentile of
its turns, as ``coherence`` does. Blind spot: a fluent non sequitur is neutral, not
contradictory, and scores high.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from convsim._errors import ConfigError
from convsim._records import Score, TurnRecord, TurnStatus

from . import _contextual
from ._contextual import PairScorer, classify_contradiction
from ._protocol import MetricTraits
from ._stats import mean, percentile

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = ["CONTEXT_UTTERANCES", "NliCoherenceMetric"]

CONTEXT_UTTERANCES = 3
"""Utterances of context before a response: the message it answers and the exchange
before it."""

NO_MODEL = (
    "nli_coherence needs an NLI model: pip install 'convsim[nli]' and set "
    "CONVSIM_NLI_MODEL=/path/to/folder (or a hub id)"
)


class NliCoherenceMetric:
    """Each response's coherence with its context as an NLI cross-encoder sees it: one
    minus the contradiction probability; the conversation's 25th percentile."""

    name = "nli_coherence"
    traits: ClassVar[MetricTraits] = MetricTraits("conversation")
    higher_is_better = True
    cpu_heavy = True
    description = (
        "Per response: 1 - the NLI contradiction probability of the response given the "
        "last three utterances before it; the conversation scores the 25th percentile "
        "(details: by_turn, backend, model). Needs the nli extra and CONVSIM_NLI_MODEL; "
        "a fluent non sequitur is neutral, not contradictory, and scores high."
    )

    def __init__(self, classifier: PairScorer | Literal["auto"] = "auto") -> None:
        scorer = _contextual.pair_classifier() if classifier == "auto" else classifier
        if scorer is None:
            # asked for by name, it would test nothing: say so before the run starts
            raise ConfigError(NO_MODEL)
        self.classifier = scorer

    def scorer(self, conversation: Conversation) -> _NliCoherenceScorer:
        return _NliCoherenceScorer(self.classifier)


@dataclass
class _NliCoherenceScorer:
    classifier: PairScorer
    utterances: list[str] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        if turn.user_message:
            self.utterances.append(turn.user_message)
        context = " ".join(self.utterances[-CONTEXT_UTTERANCES:])
        if context.strip():
            self.pairs.append((context, turn.response))
        self.utterances.append(turn.response)

    def result(self) -> Score:
        if not self.pairs:
            return Score.not_applicable("no response follows anything said")
        by_turn = [1.0 - p for p in classify_contradiction(self.classifier, self.pairs)]
        return Score(
            value=percentile(by_turn, 25),
            details={
                "by_turn": by_turn,
                "last_turn": by_turn[-1],
                "mean": mean(by_turn),
                "turns": len(by_turn),
                "aggregation": "p25",
                "backend": "nli",
                "model": self.classifier.model_id,
            },
        )
