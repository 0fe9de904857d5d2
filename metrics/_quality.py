"""response_quality: the structure of an answer, its relevance to the prompt, and its
completeness against the task's required keywords.

Three parts, each measured only where it has something to measure, and the value is the
mean of those that were:

- **structure** (answers of eight words or more, and any empty answer, which has
  none): the mean of the signals that apply: code fences closed; the answer ends at the
  end of a sentence, list item or code block rather than mid-sentence; sentences not
  repeated (distinct / all, two or more sentences); paragraphs, a list or headings in
  answers of 120 words or more; sentences of at most 40 words (share);
- **relevance**: cosine similarity of the answer to the prompt (the user's message),
  else to the reference answer, in WordLlama embeddings (convsim's offline embedder,
  loaded once per process; TF-IDF where it is not installed); an empty answer is 0;
- **completeness**: the share of the required keywords the answers contain
  (case-insensitive, whole words), over all the answers of a conversation.

Blind spots: structure is form, not correctness; relevance is topical closeness, so a
fluent wrong answer on the topic scores high; keywords say nothing of how they are used.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from convsim._plural import counted
from convsim._records import Score, TurnRecord, TurnStatus

from ._embedding import Embedder, cosine, default_embedder
from ._protocol import MetricTraits
from ._stats import mean

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = [
    "QualityPart",
    "ResponseQuality",
    "ResponseQualityMetric",
    "keyword_coverage",
    "relevance",
    "response_quality",
    "structure",
]

STRUCTURED_WORDS = 8
"""Answers shorter than this (a number, a name, a yes) have no structure to judge."""
PARAGRAPH_WORDS = 120
"""Answers this long should be broken into paragraphs, a list or sections."""
LONG_SENTENCE_WORDS = 40

_FENCE = re.compile(r"^\s*(```|~~~)", re.M)
_FENCED_BLOCK = re.compile(r"(```|~~~).*?(\1|\Z)", re.S)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_LIST_OR_HEADING = re.compile(r"(?m)^\s*(?:[-*•]|\d+[.)]|#{1,6})\s+\S")
_CLEAN_END = re.compile(r"""[.!?:;)\]}"'`»*_]\s*$""")


@dataclass(frozen=True)
class QualityPart:
    """One part of the assessment: its value, or why it has none."""

    value: float | None
    details: dict[str, Any]
    reason: str | None = None
    """Why it is not applicable (when ``value`` is None)."""


def _sentences(prose: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(prose) if s.strip()]


def structure(response: str) -> QualityPart:
    """The structure signals of ``response`` and their mean."""
    if not response.strip():
        return QualityPart(0.0, {"empty": True})
    words = len(response.split())
    fences = len(_FENCE.findall(response))
    if words < STRUCTURED_WORDS and not fences:
        reason = f"fewer than {counted(STRUCTURED_WORDS, 'word')}"
        return QualityPart(None, {"words": words}, reason)
    prose = _FENCED_BLOCK.sub("\n", response)
    sentences = _sentences(prose)
    signals: dict[str, float] = {}
    if fences:
        signals["fences_closed"] = 1.0 if fences % 2 == 0 else 0.0
    last = response.rstrip()
    ends_in_code = fences % 2 == 0 and bool(re.search(r"(```|~~~)\s*$", last))
    ends_in_list = bool(_LIST_OR_HEADING.search(last.splitlines()[-1])) if last else False
    signals["ends_cleanly"] = (
        1.0 if ends_in_code or ends_in_list or _CLEAN_END.search(last) else 0.0
    )
    if len(sentences) >= 2:
        distinct = {" ".join(s.lower().split()) for s in sentences}
        signals["distinct_sentences"] = len(distinct) / len(sentences)
    if len(prose.split()) >= PARAGRAPH_WORDS:
        broken = "\n\n" in prose.strip() or bool(_LIST_OR_HEADING.search(prose))
        signals["paragraphs"] = 1.0 if broken else 0.0
    if sentences:
        short = sum(len(s.split()) <= LONG_SENTENCE_WORDS for s in sentences)
        signals["sentence_length"] = short / len(sentences)
    return QualityPart(mean(list(signals.values())), {"signals": signals, "words": words})


def relevance(
    response: str, prompt: str | None, reference: str | None, embedder: Embedder
) -> QualityPart:
    """Cosine similarity of ``response`` to ``prompt``, else to ``reference``."""
    target, against = (prompt, "prompt") if prompt and prompt.strip() else (reference, "reference")
    if not target or not target.strip():
        return QualityPart(None, {}, "no prompt or reference answer to be relevant to")
    if not response.strip():
        return QualityPart(0.0, {"relevant_to": against, "empty": True})
    sims = cosine(embedder, [target, response], [(0, 1)])
    if sims is None:
        return QualityPart(None, {"relevant_to": against}, "no comparable words")
    return QualityPart(sims[0], {"relevant_to": against, "embedder": _embedder_name(embedder)})


def _embedder_name(embedder: Embedder) -> str:
    return str(getattr(embedder, "name", type(embedder).__name__))


def _keyword(keyword: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(keyword.lower())}(?!\w)")


def keyword_coverage(responses: Sequence[str], keywords: Sequence[str]) -> QualityPart:
    """The share of ``keywords`` found in ``responses`` (any of them)."""
    wanted = list(dict.fromkeys(k for k in keywords if k.strip()))
    if not wanted:
        return QualityPart(None, {}, "the task gives no required keywords")
    text = "\n".join(responses).lower()
    found = [k for k in wanted if _keyword(k).search(text)]
    missing = [k for k in wanted if k not in found]
    return QualityPart(len(found) / len(wanted), {"found": found, "missing": missing})


@dataclass(frozen=True)
class ResponseQuality:
    """The three parts of an answer's quality and their mean (None: none applied)."""

    structure: QualityPart
    relevance: QualityPart
    completeness: QualityPart

    @property
    def parts(self) -> dict[str, QualityPart]:
        return {
            "structure": self.structure,
            "relevance": self.relevance,
            "completeness": self.completeness,
        }

    @property
    def value(self) -> float | None:
        """The mean of the parts that were measured; None when none was."""
        values = [p.value for p in self.parts.values() if p.value is not None]
        return mean(values) if values else None

    @property
    def details(self) -> dict[str, Any]:
        """Each part's value and what it rests on; the reasons of those not measured."""
        details: dict[str, Any] = {}
        for name, part in self.parts.items():
            details[name] = part.value
            if part.details:
                details[f"{name}_details"] = part.details
        skipped = {n: p.reason for n, p in self.parts.items() if p.value is None}
        if skipped:
            details["not_applicable"] = skipped
        return details

    def score(self) -> Score:
        """As a convsim score."""
        value = self.value
        if value is None:
            reasons = "; ".join(f"{n}: {p.reason}" for n, p in self.parts.items())
            return Score.not_applicable(reasons)
        return Score(value=value, details=self.details)


def response_quality(
    response: str,
    *,
    prompt: str | None = None,
    reference: str | None = None,
    required_keywords: Sequence[str] = (),
    embedder: Embedder | None = None,
) -> ResponseQuality:
    """The structure of ``response``, its relevance to ``prompt`` (else to
    ``reference``) and its completeness against ``required_keywords``."""
    return ResponseQuality(
        structure(response),
        relevance(response, prompt, reference, embedder or default_embedder()),
        keyword_coverage([response], required_keywords),
    )


class ResponseQualityMetric:
    """Structure, relevance to the prompt and keyword completeness of the answers."""

    name = "response_quality"
    higher_is_better = True
    cpu_heavy = True
    traits = MetricTraits("turn", uses=frozenset({"reference", "keywords"}))
    description = (
        "Mean of three parts, each where it applies: structure (closed fences, a clean "
        "ending, no repeated sentences, paragraphs in long answers, no run-on "
        "sentences), relevance (WordLlama cosine similarity to the user's message, else "
        "to the reference), completeness (share of required keywords in the answers). "
        "Blind to correctness."
    )

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or default_embedder()

    def scorer(self, conversation: Conversation) -> _QualityScorer:
        scenario = conversation.scenario
        return _QualityScorer(
            self.embedder, dict(scenario.reference_responses), list(scenario.required_keywords)
        )


@dataclass
class _QualityScorer:
    embedder: Embedder
    references: dict[str, str]
    keywords: list[str]
    turns: list[TurnRecord] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if turn.status is TurnStatus.COMPLETED and turn.response is not None:
            self.turns.append(turn)

    def result(self) -> Score:
        if not self.turns:
            return Score.not_applicable("no completed turns")
        structures = [structure(t.response or "") for t in self.turns]
        relevances = [
            relevance(
                t.response or "",
                t.user_message or t.prompt,
                self.references.get(t.turn_id),
                self.embedder,
            )
            for t in self.turns
        ]
        quality = ResponseQuality(
            _averaged(structures),
            _averaged(relevances),
            keyword_coverage([t.response or "" for t in self.turns], self.keywords),
        )
        score = quality.score()
        if score.value is None:
            return score
        return Score(value=score.value, details={**score.details, "turns": len(self.turns)})


def _averaged(parts: list[QualityPart]) -> QualityPart:
    """The mean of the turns' parts that were measured, with how many were."""
    measured = [p for p in parts if p.value is not None]
    if not measured:
        return QualityPart(None, {}, parts[0].reason if parts else "no completed turns")
    if len(parts) == 1:
        return measured[0]
    return QualityPart(
        mean([p.value for p in measured if p.value is not None]),
        {"turns_measured": len(measured)},
    )
