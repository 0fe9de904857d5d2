"""Context retention: does the model still know the facts the user gave it earlier?

A scenario declares facts (value, aliases, the turn that introduces them) and probe
turns that need them. Each probe's response is checked for each fact it needs:

- text facts: the value or an alias as whole words, ignoring case and punctuation;
- numbers: any number in the response within the fact's tolerance (``1,250.50`` and
  ``$89`` are read as numbers);
- dates: the same calendar date in any of the common spellings (ISO, ``March 14,
  2026``, ``14 March 2026``, ``03/14/2026``).

A check counts as recalled when the value is there and the same response does not
also state a different value for the fact (see :func:`stated_values`). The score is the
share of recalled checks; details give a curve by distance (completed turns between
introduction and probe) and every contradiction, including ones outside probe turns.

Without declared facts the reference-free scorer of :mod:`._free_retention` applies:
what the user stated (about themself, numbers, names, IDs, answers to the assistant's
questions) and which later answer forgot it (asked again, stated otherwise, could not
say it when asked back). Details say which mode was used.

Retention needs two completed turns (one to say something, a later one to keep it):
with fewer the score is not applicable. Without facts, a conversation where no answer
recalled or forgot anything the user stated is not applicable either ("no evidence"):
silence is not taken for memory.

Blind spots: a paraphrase that names no value ("your usual order") counts as not
recalled; a value echoed without understanding counts as recalled; without facts, what
no answer touched counts as kept once some answer did recall or forget something.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from convsim._records import Score, TurnRecord, TurnStatus

from . import _contextual
from ._contextual import PairScorer
from ._free_retention import FreeRetention
from ._protocol import MetricTraits
from ._words import normal_words

if TYPE_CHECKING:
    from convsim.scenarios import Conversation
    from convsim.scenarios._schema import Fact

__all__ = ["ContextRetentionMetric", "fact_recalled", "stated_values"]

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?!\w)")
_MONTHS = (
    "january february march april may june july august september october november december"
).split()
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_DATE_PATTERNS = [
    re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"),
    re.compile(rf"\b({_MONTH})\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?", re.I),
    re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH})(?:,?\s+(\d{{4}}))?", re.I),
    re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b"),
]
#: A token that could be a stated value: a number, or an identifier with a digit.
_VALUE_TOKEN = r"[A-Za-z0-9][A-Za-z0-9\-/.]*\d[A-Za-z0-9\-]*|\d+(?:[.,]\d+)*"
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_STATED = re.compile(
    r"\s*(?:(?:is|was|of|now|on)\b|[:=#])?\s*(?:(?:still|now|actually|on)\s+)?"
    rf"((?:[$€£]\s?)?(?:{_MONTH}\s+)?(?:\d+(?:[.,]\d+)+|{_VALUE_TOKEN}))",
    re.I,
)


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().lstrip("$€£").replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def _month(name: str) -> int:
    name = name.casefold().rstrip(".")[:3]
    return next(i for i, m in enumerate(_MONTHS, start=1) if m.startswith(name))


def _dates(text: str) -> list[tuple[int, int, int | None]]:
    """(month, day, year or None) of every date written in ``text``."""
    found: list[tuple[int, int, int | None]] = []
    for i, pattern in enumerate(_DATE_PATTERNS):
        for m in pattern.finditer(text):
            try:
                if i == 0:
                    found.append((int(m[2]), int(m[3]), int(m[1])))
                elif i == 1:
                    found.append((_month(m[1]), int(m[2]), int(m[3]) if m[3] else None))
                elif i == 2:
                    found.append((_month(m[2]), int(m[1]), int(m[3]) if m[3] else None))
                else:
                    found.append((int(m[1]), int(m[2]), int(m[3])))
            except (StopIteration, ValueError):
                continue
    return [(mo, d, y) for mo, d, y in found if 1 <= mo <= 12 and 1 <= d <= 31]


class MonthDay(NamedTuple):
    """A date as people write it: month and day, the year if given."""

    month: int
    day: int
    year: int | None


def _as_date(value: Any) -> MonthDay | None:
    if isinstance(value, (date, datetime)):
        return MonthDay(value.month, value.day, value.year)
    dates = _dates(str(value))
    return MonthDay(*dates[0]) if len(dates) == 1 else None


def fact_recalled(fact: Fact, text: str) -> bool:
    """Whether ``text`` states the fact's value (or an alias)."""
    normal = f" {normal_words(text)} "
    for candidate in (str(fact.value), *fact.aliases):
        wanted = normal_words(candidate)
        if wanted and f" {wanted} " in normal:
            return True
    target = _as_number(fact.value)
    if target is not None and _as_date(fact.value) is None:
        tolerance = fact.tolerance or 1e-9
        for match in _NUMBER.findall(text):
            number = _as_number(match)
            if number is not None and abs(number - target) <= tolerance:
                return True
    wanted_date = _as_date(fact.value)
    if wanted_date is not None:
        for found in _dates(text):
            same_day = found[:2] == wanted_date[:2]
            if same_day and (found[2] == wanted_date[2] or None in (found[2], wanted_date[2])):
                return True
    return False


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@functools.lru_cache(maxsize=4096)
def _label_of(key: str) -> re.Pattern[str]:
    words = [w for w in re.split(r"[_\-\s]+", key) if w]
    return re.compile(r"\b" + r"[\s_\-]*".join(map(re.escape, words)) + r"\b", re.I)


def _label(fact: Fact) -> re.Pattern[str]:
    return _label_of(fact.key)


def stated_values(fact: Fact, text: str) -> list[str]:
    """Values the text states for the fact: a value-like token directly after its label
    (the fact's key, e.g. ``order id`` for ``order_id``), optionally joined by "is",
    "was", "of", ``:``, ``=`` or ``#``, in a sentence that does not also state the fact's
    own value ("86 guests", "your order id, which you gave me 3 turns ago, is A-1042").
    A heuristic: it misses rewordings of the label and values placed further away."""
    label = _label(fact)
    if label.search(text) is None:
        return []  # the common case: the label is not mentioned at all
    stated = []
    for sentence in _SENTENCE_END.split(text):
        matches = list(label.finditer(sentence))
        if not matches or fact_recalled(fact, sentence):
            continue
        for m in matches:
            token = _STATED.match(sentence, m.end())
            if token is not None:
                stated.append(token.group(1).rstrip(".,"))
    return stated


class ContextRetentionMetric:
    """Share of probe checks whose response still states the fact introduced earlier."""

    name = "context_retention"
    traits: ClassVar[MetricTraits] = MetricTraits("conversation", uses=frozenset({"facts"}))
    higher_is_better = True
    description = (
        "Share of (probe turn, fact) checks whose response states the fact's value "
        "(text, aliases, numbers within tolerance, dates) without contradicting it; "
        "with a curve by turn distance. Without scenario facts and probes: the share of "
        "what the user stated (about themself, numbers, names, IDs, answers) that no "
        "later answer forgot (asked again, stated otherwise, could not say when asked), "
        "not applicable where no answer recalled or forgot any of it; not applicable "
        "with fewer than two completed turns."
    )

    def __init__(
        self,
        embedder: Any = None,
        semantic_threshold: float = 0.6,
        classifier: PairScorer | Literal["auto"] | None = "auto",
    ) -> None:
        self.embedder = embedder
        self.classifier = _contextual.pair_classifier() if classifier == "auto" else classifier
        """The NLI pair classifier of the reference-free "stated otherwise" check (the
        process's, when present); None: the patterns."""
        self.cpu_heavy = embedder is not None or self.classifier is not None
        """With an embedder or a classifier the checks run in result(), off the event loop."""
        """Optional semantic match: a probe that names no value still counts as recalled
        when a sentence of it is this similar to the fact (value and aliases)."""
        self.semantic_threshold = semantic_threshold

    def scorer(self, conversation: Conversation) -> _RetentionScorer:
        scenario = conversation.scenario
        return _RetentionScorer(
            facts={f.key: f for f in scenario.facts},
            probes={p.turn_id: list(p.facts) for p in scenario.probes},
            semantic=self._semantic if self.embedder is not None else None,
            free=FreeRetention(classifier=self.classifier),
        )

    def _semantic(self, fact: Fact, text: str) -> bool:
        from ._embedding import cosine

        sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
        if not sentences:
            return False
        statement = " ".join([str(fact.value), *fact.aliases])
        sims = cosine(
            self.embedder, [statement, *sentences], [(0, i) for i in range(1, len(sentences) + 1)]
        )
        return sims is not None and max(sims) >= self.semantic_threshold


@dataclass
class _RetentionScorer:
    facts: dict[str, Fact]
    probes: dict[str, list[str]]
    completed: list[str] = field(default_factory=list)
    free: FreeRetention = field(default_factory=FreeRetention)
    """The reference-free scorer, used when the scenario declares no facts and probes."""
    semantic: Any = None
    """fact, text -> bool: the optional semantic match."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    contradictions: list[dict[str, Any]] = field(default_factory=list)
    unintroduced: int = 0
    semantic_pending: list[tuple[dict[str, Any], Fact, str]] = field(default_factory=list)
    """Checks the lexical match missed, left for the semantic match in result()."""
    first_free: tuple[str, str, str, int] | None = None
    """The first completed turn, held for the reference-free scorer until a second one
    comes: a conversation of one completed turn has no retention to read, so its turn is
    never read (the scorer is fed the same turns, in the same order, all the same)."""

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        self.completed.append(turn.turn_id)
        position = len(self.completed) - 1
        text = turn.response
        if not (self.facts and self.probes):
            said = (turn.user_message or "", text, turn.turn_id, position)
            if position == 0:
                self.first_free = said
                return
            if self.first_free is not None:
                self.free.update(*self.first_free)
                self.first_free = None
            self.free.update(*said)
            return
        introduced = {
            key: self.completed.index(f.introduced_in)
            for key, f in self.facts.items()
            if f.introduced_in in self.completed
        }
        for key in introduced:
            for value in stated_values(self.facts[key], text):
                self.contradictions.append({"fact": key, "turn_id": turn.turn_id, "stated": value})
        for key in self.probes.get(turn.turn_id, []):
            fact = self.facts[key]
            if key not in introduced or introduced[key] >= position:
                self.unintroduced += 1  # never said (its turn failed or was skipped)
                continue
            contradicted = bool(stated_values(fact, text))
            recalled = not contradicted and fact_recalled(fact, text)
            check = {
                "fact": key,
                "turn_id": turn.turn_id,
                "distance": position - introduced[key],
                "recalled": recalled,
                "contradicted": contradicted,
            }
            self.checks.append(check)
            if not recalled and not contradicted and self.semantic is not None:
                self.semantic_pending.append((check, fact, text))

    def result(self) -> Score:
        for check, fact, text in self.semantic_pending:
            check["recalled"] = check["semantic"] = self.semantic(fact, text)
        self.semantic_pending.clear()
        turns = len(self.completed)
        if turns < 2:
            return Score.not_applicable(
                f"{'one completed turn' if turns else 'no completed turns'}: retention needs "
                "a later turn to keep what an earlier one said",
                completed_turns=turns,
            )
        if not (self.facts and self.probes):
            return self.free.result()
        if not self.checks:
            return Score.not_applicable("no probe turn completed after its facts were given")
        by_distance: dict[int, list[float]] = defaultdict(list)
        for check in self.checks:
            by_distance[check["distance"]].append(1.0 if check["recalled"] else 0.0)
        recalled = sum(c["recalled"] for c in self.checks)
        return Score(
            value=recalled / len(self.checks),
            details={
                "mode": "facts",
                "checks": len(self.checks),
                "recalled": recalled,
                "curve": {str(d): sum(v) / len(v) for d, v in sorted(by_distance.items())},
                "curve_n": {str(d): len(v) for d, v in sorted(by_distance.items())},
                "contradictions": self.contradictions,
                "missed": [c for c in self.checks if not c["recalled"]],
                "unintroduced": self.unintroduced,
            },
        )
