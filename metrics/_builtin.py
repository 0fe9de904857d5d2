"""Built-in metrics: latency, response length, exact match, the guide's custom score and
Python code validity."""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from convsim._python_ast import parse
from convsim._records import Score, TurnRecord, TurnStatus

from ._protocol import MetricTraits
from ._stats import mean, percentile

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = [
    "LatencyMetric",
    "ResponseLengthMetric",
    "ExactMatchMetric",
    "CustomScoreMetric",
    "TechnicalAccuracyMetric",
    "normalize_answer",
]


def _completed(turn: TurnRecord) -> bool:
    return turn.status is TurnStatus.COMPLETED and turn.response is not None


# -- latency ------------------------------------------------------------------------


class LatencyMetric:
    """Mean model-call latency in seconds over completed turns (p50/p95/max, TTFT)."""

    name = "latency"
    traits: ClassVar[MetricTraits] = MetricTraits("turn")
    higher_is_better = False
    description = "Seconds per model call: mean, with p50, p95, max and mean TTFT in details."

    def scorer(self, conversation: Conversation) -> _LatencyScorer:
        return _LatencyScorer()


@dataclass
class _LatencyScorer:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if _completed(turn) and turn.timings is not None and turn.timings.latency_s is not None:
            self.latencies.append(turn.timings.latency_s)
            if turn.timings.ttft_s is not None:
                self.ttfts.append(turn.timings.ttft_s)

    def result(self) -> Score:
        if not self.latencies:
            return Score.not_applicable("no completed turns")
        details: dict[str, float | int] = {
            "n": len(self.latencies),
            "p50_s": percentile(self.latencies, 50),
            "p95_s": percentile(self.latencies, 95),
            "max_s": max(self.latencies),
        }
        if self.ttfts:
            details["ttft_mean_s"] = mean(self.ttfts)
        return Score(value=mean(self.latencies), details=details)


# -- response length ----------------------------------------------------------------


class ResponseLengthMetric:
    """Mean words per response over completed turns."""

    name = "response_length"
    traits: ClassVar[MetricTraits] = MetricTraits("turn")
    higher_is_better = None
    description = "Mean words per response (whitespace-separated), with min, max and total."

    def scorer(self, conversation: Conversation) -> _LengthScorer:
        return _LengthScorer()


@dataclass
class _LengthScorer:
    lengths: list[int] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if _completed(turn):
            self.lengths.append(len(turn.response.split()))  # type: ignore[union-attr]

    def result(self) -> Score:
        if not self.lengths:
            return Score.not_applicable("no completed turns")
        return Score(
            value=mean(self.lengths),
            details={
                "n": len(self.lengths),
                "min": min(self.lengths),
                "max": max(self.lengths),
                "total": sum(self.lengths),
            },
        )


# -- exact match --------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD-style)."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


class ExactMatchMetric:
    """1 when the normalised response equals the turn's reference response."""

    name = "exact_match"
    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"reference"}))
    higher_is_better = True
    description = (
        "Share of turns whose response equals the reference after SQuAD-style "
        "normalisation (case, punctuation, articles, whitespace)."
    )

    def scorer(self, conversation: Conversation) -> _ExactMatchScorer:
        return _ExactMatchScorer(conversation.scenario.reference_responses)


@dataclass
class _ExactMatchScorer:
    references: dict[str, str]
    matches: list[float] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        reference = self.references.get(turn.turn_id)
        if reference is not None and _completed(turn):
            hit = normalize_answer(turn.response or "") == normalize_answer(reference)
            self.matches.append(1.0 if hit else 0.0)

    def result(self) -> Score:
        if not self.references:
            return Score.not_applicable("the scenario gives no reference responses")
        if not self.matches:
            return Score.not_applicable("no completed turn has a reference response")
        return Score(value=mean(self.matches), details={"n": len(self.matches)})


# -- the guide's custom quality score -----------------------------------------------


class CustomScoreMetric:
    """The guide's quality score: 0.2 for a non-empty response plus 0.8 times the share
    of the scenario's required_keywords it contains (the guide gave 0.3 for any one)."""

    name = "custom_score"
    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"keywords"}))
    higher_is_better = True
    description = (
        "0.2 for a non-empty response + 0.8 x share of required_keywords present "
        "(case-insensitive, whole words); mean over completed turns."
    )

    def scorer(self, conversation: Conversation) -> _CustomScorer:
        keywords = conversation.scenario.required_keywords
        patterns = [re.compile(rf"(?<!\w){re.escape(k.lower())}(?!\w)") for k in keywords]
        return _CustomScorer(keywords, patterns)


@dataclass
class _CustomScorer:
    keywords: list[str]
    patterns: list[re.Pattern[str]]
    scores: list[float] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)

    def update(self, turn: TurnRecord) -> None:
        if not _completed(turn) or not self.patterns:
            return
        text = (turn.response or "").lower()
        found = [bool(p.search(text)) for p in self.patterns]
        self.missing.update(k for k, hit in zip(self.keywords, found, strict=True) if not hit)
        share = sum(found) / len(found)
        # within 0-1 also in floating point (0.8 * 7 / 7 is a hair over 0.8)
        self.scores.append(min(1.0, (0.2 if text.strip() else 0.0) + 0.8 * share))

    def result(self) -> Score:
        if not self.keywords:
            return Score.not_applicable("the scenario declares no required_keywords")
        if not self.scores:
            return Score.not_applicable("no completed turns")
        return Score(
            value=mean(self.scores),
            details={"n": len(self.scores), "missing_keywords": sorted(self.missing)},
        )


# -- technical accuracy (Python code validity) --------------------------------------

_FENCE = re.compile(r"```[ \t]*(?P<lang>[A-Za-z0-9_+\-]*)[^\n]*\n(?P<code>.*?)```", re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """Fenced code blocks labelled python/py, or unlabelled."""
    return [
        m["code"]
        for m in _FENCE.finditer(text)
        if m["lang"].lower() in ("python", "py", "python3", "")
    ]


def practice_signals(code: str) -> dict[str, bool]:
    """Best-practice signals of code that parses: docstrings and type hints on every
    function (when there are functions), error handling, and tests."""
    tree = parse(code)
    functions = [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    signals: dict[str, bool] = {
        "error_handling": any(isinstance(n, (ast.Try, ast.Raise)) for n in ast.walk(tree)),
        "tests": any(isinstance(n, ast.Assert) for n in ast.walk(tree))
        or any(f.name.startswith("test") for f in functions),
    }
    if functions:
        signals["docstrings"] = all(ast.get_docstring(f) for f in functions)
        signals["type_hints"] = all(
            f.returns is not None
            and all(a.annotation is not None for a in f.args.args if a.arg not in ("self", "cls"))
            for f in functions
        )
    return signals


class TechnicalAccuracyMetric:
    """Python code in the responses: does it compile, and does it follow good practice?"""

    name = "technical_accuracy"
    traits: ClassVar[MetricTraits] = MetricTraits("turn")
    higher_is_better = True
    cpu_heavy = True
    description = (
        "Per fenced Python block: 0.6 if it compiles, plus 0.4 x the share of best-practice "
        "signals present (docstrings and type hints on functions, error handling, tests); "
        "0 if it does not compile. Blind to whether the code is correct."
    )

    def scorer(self, conversation: Conversation) -> _TechnicalScorer:
        return _TechnicalScorer()


@dataclass
class _TechnicalScorer:
    pending: list[tuple[str, str]] = field(default_factory=list)
    """(turn_id, code) gathered by update(); compiled in result(), off the event loop."""
    blocks: int = 0
    valid: int = 0
    scores: list[float] = field(default_factory=list)
    signals: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if _completed(turn):
            self.pending.extend((turn.turn_id, code) for code in python_blocks(turn.response or ""))

    def _check(self, turn_id: str, code: str) -> None:
        self.blocks += 1
        try:
            compile(code, f"<{turn_id}>", "exec")
            signals = practice_signals(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            if len(self.errors) < 5:
                self.errors.append(f"{turn_id}: {type(exc).__name__}: {exc}"[:300])
            self.scores.append(0.0)
            return
        self.valid += 1
        for name, present in signals.items():
            self.signals[name] = self.signals.get(name, 0) + present
        self.scores.append(0.6 + 0.4 * sum(signals.values()) / len(signals))

    def result(self) -> Score:
        for turn_id, code in self.pending:
            self._check(turn_id, code)
        self.pending.clear()
        if not self.blocks:
            return Score.not_applicable("no Python code blocks in the responses")
        return Score(
            value=mean(self.scores),
            details={
                "blocks": self.blocks,
                "valid": self.valid,
                "signals": self.signals,
                "errors": self.errors,
            },
        )
