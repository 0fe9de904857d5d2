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

Blind spots: a paraphrase that names no value ("your usual order") counts as not
recalled; a value echoed without understanding counts as recalled.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from convsim._records import Score, TurnRecord, TurnStatus

if TYPE_CHECKING:
    from convsim.scenarios import Conversation
    from convsim.scenarios._schema import Fact

__all__ = ["ContextRetentionMetric", "fact_recalled", "stated_values"]

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?!\w)")
_WORDS = re.compile(r"[^\w]+")
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
_VALUE_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-/.]*\d[A-Za-z0-9\-]*|\d+(?:[.,]\d+)*")


def _normal(text: str) -> str:
    return " ".join(_WORDS.sub(" ", text.casefold()).split())


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


def _as_date(value: Any) -> tuple[int, int, int | None] | None:
    if isinstance(value, (date, datetime)):
        return (value.month, value.day, value.year)
    dates = _dates(str(value))
    return dates[0] if len(dates) == 1 else None


def fact_recalled(fact: Fact, text: str) -> bool:
    """Whether ``text`` states the fact's value (or an alias)."""
    normal = f" {_normal(text)} "
    for candidate in (str(fact.value), *fact.aliases):
        wanted = _normal(candidate)
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


def _label(fact: Fact) -> re.Pattern[str]:
    words = [w for w in re.split(r"[_\-\s]+", fact.key) if w]
    return re.compile(r"\b" + r"[\s_\-]*".join(map(re.escape, words)) + r"\b", re.I)


def stated_values(fact: Fact, text: str) -> list[str]:
    """Values the text states for the fact: a value-like token right after its label
    (the fact's key, e.g. ``order id`` for ``order_id``) when the fact's own value is
    not beside the label. A heuristic: it misses rewordings of the label, and a number
    that merely follows the label ("budget for 2 people") is taken for a value."""
    stated = []
    for m in _label(fact).finditer(text):
        if fact_recalled(fact, text[max(0, m.start() - 30) : m.end() + 30]):
            continue  # the fact's own value is right beside its label ("86 guests")
        token = _VALUE_TOKEN.search(text[m.end() : m.end() + 30])
        if token is not None:
            stated.append(token.group(0).rstrip(".,"))
    return stated


class ContextRetentionMetric:
    """Share of probe checks whose response still states the fact introduced earlier."""

    name = "context_retention"
    higher_is_better = True
    description = (
        "Share of (probe turn, fact) checks whose response states the fact's value "
        "(text, aliases, numbers within tolerance, dates) without contradicting it; "
        "with a curve by turn distance. Needs scenario facts and probes."
    )

    def scorer(self, conversation: Conversation) -> _RetentionScorer:
        scenario = conversation.scenario
        return _RetentionScorer(
            facts={f.key: f for f in scenario.facts},
            probes={p.turn_id: list(p.facts) for p in scenario.probes},
        )


@dataclass
class _RetentionScorer:
    facts: dict[str, Fact]
    probes: dict[str, list[str]]
    completed: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    contradictions: list[dict[str, Any]] = field(default_factory=list)
    unintroduced: int = 0

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        self.completed.append(turn.turn_id)
        position = len(self.completed) - 1
        text = turn.response
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
            self.checks.append(
                {
                    "fact": key,
                    "turn_id": turn.turn_id,
                    "distance": position - introduced[key],
                    "recalled": fact_recalled(fact, text) and not contradicted,
                    "contradicted": contradicted,
                }
            )

    def result(self) -> Score:
        if not self.facts or not self.probes:
            return Score.not_applicable("the scenario declares no facts and probes")
        if not self.checks:
            return Score.not_applicable("no probe turn completed after its facts were given")
        by_distance: dict[int, list[float]] = defaultdict(list)
        for check in self.checks:
            by_distance[check["distance"]].append(1.0 if check["recalled"] else 0.0)
        recalled = sum(c["recalled"] for c in self.checks)
        return Score(
            value=recalled / len(self.checks),
            details={
                "checks": len(self.checks),
                "recalled": recalled,
                "curve": {d: sum(v) / len(v) for d, v in sorted(by_distance.items())},
                "curve_n": {d: len(v) for d, v in sorted(by_distance.items())},
                "contradictions": self.contradictions,
                "missed": [c for c in self.checks if not c["recalled"]],
                "unintroduced": self.unintroduced,
            },
        )
