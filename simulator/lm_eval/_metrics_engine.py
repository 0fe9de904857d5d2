"""The developer guide's metrics engine, backed by convsim's registered metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from convsim._records import Score
from convsim.metrics import score_transcript

__all__ = ["MetricsEngine"]


def _score(response: str, metric: str, **scenario: Any) -> Score:
    """``metric`` on ``response`` as a one-turn transcript, on this thread (no event loop
    is needed: the metrics the engine offers call no model)."""
    messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": response}]
    return score_transcript(messages, [metric], **scenario)[metric]


def _value(score: Score, metric: str) -> float | None:
    if score.status == "failed":
        raise RuntimeError(f"convsim metric {metric} failed: {score.reason}")
    return float(score.value) if score.value is not None else None


class MetricsEngine:
    """The guide's metrics engine, backed by convsim's registered metrics.

    Each method scores one response as a one-turn transcript with the named metric
    (``convsim.metrics.score_transcript``). Where the metric does not apply (an empty
    response has no words to compare) the value is None, never a made-up 0.0: a
    ``process_results`` that returns it leaves that metric out for the document. A
    failing metric raises.
    """

    def score(
        self, metric: str, response: str, reference: str | None = None, **scenario: Any
    ) -> Score:
        """convsim's ``metric`` on ``response`` (``reference``: the turn's reference)."""
        if reference is not None:
            scenario["reference_responses"] = {"t1": reference}
        return _score(response, metric, **scenario)

    def calculate_semantic_similarity(self, text_a: str, text_b: str) -> float | None:
        """convsim's ``semantic_similarity`` of ``text_a`` to ``text_b``."""
        return _value(self.score("semantic_similarity", text_a, text_b), "semantic_similarity")

    def calculate_exact_match(self, prediction: str, reference: str) -> float | None:
        """convsim's ``exact_match`` (normalized answers)."""
        return _value(self.score("exact_match", prediction, reference), "exact_match")

    def calculate_custom_score(
        self, response: str, reference: str | None = None, required_keywords: Sequence[str] = ()
    ) -> float | None:
        """convsim's ``custom_score`` (the guide's keyword and length score)."""
        score = self.score(
            "custom_score", response, reference, required_keywords=list(required_keywords)
        )
        return _value(score, "custom_score")
