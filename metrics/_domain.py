"""The guide's domain metrics: domain expertise and financial reasoning.

domain_expertise: of the domain's terms (metrics/domain_terms.json, extendable through a
file named by ``CONVSIM_DOMAIN_TERMS``), how many the responses use in a meaningful
context, i.e. inside a sentence of at least eight words rather than a bare list of
keywords; five such terms earn full marks. The domain comes from the scenario's
``metadata.domain`` (single-turn problems' ``domain``) or a tag naming a known domain.
Blind spot: it rewards vocabulary, not correctness.

financial_reasoning (the guide's signals): 0.3 x coverage of financial concepts (of ten,
five earn full marks) + 0.3 for quantitative analysis (a percentage or amount together
with a computation or comparison) + 0.2 for risk considerations + 0.2 for practical
implementation steps, averaged over the turns that talk finance: the scenario's domain is
finance (every turn then counts, and an answer that ignores finance scores 0), or the
user's message or the answer names an amount of money or a financial term (invest,
portfolio, stocks, interest rate, ...). Where nothing financial was said the metric is
not applicable: chit-chat is not bad financial reasoning. Blind spot: a confident wrong
calculation scores like a right one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from convsim._records import Score, TurnRecord, TurnStatus

from ._once import LoadedOnce
from ._protocol import MetricTraits
from ._stats import mean

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = [
    "DomainExpertiseMetric",
    "FinancialReasoningMetric",
    "domain_terms",
    "financial_signals",
    "talks_finance",
]

TERMS_FILE = Path(__file__).parent / "domain_terms.json"
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
MEANINGFUL_WORDS = 8
FULL_MARKS_TERMS = 5


@LoadedOnce
def _load(extra: str | None) -> dict[str, tuple[str, ...]]:
    data = json.loads(TERMS_FILE.read_text(encoding="utf-8"))
    if extra:
        for domain, terms in json.loads(Path(extra).read_text(encoding="utf-8")).items():
            data[domain] = [*data.get(domain, []), *terms]
    return {
        d: tuple(dict.fromkeys(t.lower() for t in terms))
        for d, terms in data.items()
        if not d.startswith("_")
    }


def domain_terms() -> dict[str, tuple[str, ...]]:
    """Terms by domain, the bundled list plus ``$CONVSIM_DOMAIN_TERMS``."""
    return _load(os.environ.get("CONVSIM_DOMAIN_TERMS"))


def _term_pattern(term: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(term)}(?:s|es)?(?!\w)", re.I)


def meaningful_terms(text: str, terms: tuple[str, ...]) -> set[str]:
    """The terms used inside a sentence of at least MEANINGFUL_WORDS words."""
    used: set[str] = set()
    for sentence in _SENTENCES.split(text):
        if len(sentence.split()) < MEANINGFUL_WORDS:
            continue
        used.update(t for t in terms if _term_pattern(t).search(sentence))
    return used


class DomainExpertiseMetric:
    name = "domain_expertise"
    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"domain"}))
    higher_is_better = True
    description = (
        "Domain terms used in meaningful context (sentences of 8+ words): five "
        "distinct terms earn full marks; the domain comes from the scenario."
    )

    def scorer(self, conversation: Conversation) -> _DomainScorer:
        domain = _scenario_domain(conversation)
        return _DomainScorer(domain, domain_terms().get(domain, ()) if domain else ())


@dataclass
class _DomainScorer:
    domain: str | None
    terms: tuple[str, ...]
    used: set[str] = field(default_factory=set)
    responses: int = 0

    def update(self, turn: TurnRecord) -> None:
        if turn.status is TurnStatus.COMPLETED and turn.response and self.terms:
            self.responses += 1
            self.used |= meaningful_terms(turn.response, self.terms)

    def result(self) -> Score:
        if self.domain is None:
            return Score.not_applicable(
                f"the scenario names no known domain ({', '.join(sorted(domain_terms()))})"
            )
        if not self.responses:
            return Score.not_applicable("no completed turns")
        value = min(1.0, len(self.used) / FULL_MARKS_TERMS)
        return Score(value=value, details={"domain": self.domain, "terms_used": sorted(self.used)})


_CONCEPTS = (
    "risk",
    "return",
    "volatility",
    "correlation",
    "diversification",
    "sharpe ratio",
    "alpha",
    "beta",
    "portfolio",
    "hedge",
)
# each number is tried from its first digit only: linear on long runs of digits
_QUANTITY = re.compile(
    r"(?<![\d.,])[.,]?\d[\d.,]*\s?(?:%|(?:usd|eur|gbp)\b)|[$€£]\s?\d[\d,.]*",
    re.I,
)
_COMPUTATION = re.compile(
    r"[=\u00d7x*/+\-]\s?\d|\b(?:times|divided by|per year|annualis|annualiz|"
    r"compound|ratio of|versus|vs\.?|compared (?:to|with)|increase of|"
    r"decrease of)\b",
    re.I,
)
_RISK = re.compile(
    r"\b(?:risk|downside|drawdown|volatil\w*|loss(?:es)?|uncertain\w*|worst case|"
    r"stress test|exposure)\b",
    re.I,
)
_STEPS = re.compile(
    r"(?m)^\s*(?:\d+[.)]|[-*•])\s+\S|\b(?:allocate|rebalance|set aside|invest|"
    r"buy|sell|hedge with|stop-loss|review (?:it|your)|first,|then,|step \d)\b",
    re.I,
)


# as _QUANTITY, a number is tried from its first digit only
_MONEY = re.compile(r"[$€£]\s?\d|(?<![\d.,])\d[\d.,]*\s?(?:usd|eur|gbp|dollars?|euros?)\b", re.I)
_FINANCE_TOPIC = re.compile(
    r"\b(?:invest\w*|financ\w*|money|budget\w*|income|salary|salaries|expenses|savings|"
    r"funds?|portfolios?|stocks|stock market|etfs?|dividends?|interest rates?|inflation|"
    r"mortgages?|loans?|credit cards?|retirement|pensions?|401\(?k\)?|debts?|"
    r"equit(?:y|ies)|volatility|diversification|hedging|liquidity|drawdowns?|sharpe ratio|"
    r"asset allocation|rebalanc\w*|compound interest|expense ratio|capital gains?|"
    r"brokerage|tax(?:es)?)\b",
    re.I,
)


def talks_finance(text: str) -> bool:
    """Whether ``text`` names an amount of money or a financial term: what makes a turn
    one that financial reasoning applies to ("return" or "risk" alone do not)."""
    return _MONEY.search(text) is not None or _FINANCE_TOPIC.search(text) is not None


def financial_signals(text: str) -> dict[str, float]:
    """The guide's four financial signals of ``text``, each in 0-1: ``concepts``
    (coverage of ten concepts, five for full marks), ``quantitative`` (an amount or a
    percentage beside a computation or comparison), ``risk`` and ``implementation``."""
    lower = text.lower()
    coverage = sum(1 for c in _CONCEPTS if _term_pattern(c).search(lower))
    return {
        "concepts": min(1.0, coverage / 5),
        "quantitative": 1.0 if _QUANTITY.search(text) and _COMPUTATION.search(text) else 0.0,
        "risk": 1.0 if _RISK.search(text) else 0.0,
        "implementation": 1.0 if _STEPS.search(text) else 0.0,
    }


class FinancialReasoningMetric:
    name = "financial_reasoning"
    traits: ClassVar[MetricTraits] = MetricTraits("turn")
    higher_is_better = True
    description = (
        "0.3 x financial concept coverage + 0.3 quantitative analysis + 0.2 risk "
        "considerations + 0.2 implementation steps (the guide's signals), mean "
        "over the responses of turns that talk finance (all of them in a finance "
        "scenario); not applicable where nothing financial was said."
    )

    def scorer(self, conversation: Conversation) -> _FinanceScorer:
        return _FinanceScorer(_scenario_domain(conversation) == "finance")


def _scenario_domain(conversation: Conversation) -> str | None:
    """The scenario's domain: ``metadata.domain``, else a tag naming a known domain."""
    scenario = conversation.scenario
    known = domain_terms()
    domain = scenario.metadata.get("domain") if isinstance(scenario.metadata, dict) else None
    if domain not in known:
        domain = next((t for t in scenario.tags if t in known), None)
    return domain


@dataclass
class _FinanceScorer:
    finance_scenario: bool
    """Every turn asks for financial reasoning (the scenario's domain is finance)."""
    values: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)
    turns: int = 0
    """Completed turns read."""

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        self.turns += 1
        if not (
            self.finance_scenario
            or talks_finance(turn.user_message or "")
            or talks_finance(turn.response)
        ):
            return
        s = financial_signals(turn.response)
        self.parts.append(s)
        self.values.append(
            0.3 * s["concepts"]
            + 0.3 * s["quantitative"]
            + 0.2 * s["risk"]
            + 0.2 * s["implementation"]
        )

    def result(self) -> Score:
        if not self.turns:
            return Score.not_applicable("no completed turns")
        if not self.values:
            return Score.not_applicable(
                "nothing financial was said (no amount of money, no financial term) and "
                "the scenario's domain is not finance",
                turns_read=self.turns,
            )
        return Score(
            value=mean(self.values),
            details={
                **{k: mean([p[k] for p in self.parts]) for k in self.parts[0]},
                "turns": len(self.values),
                "turns_read": self.turns,
            },
        )
