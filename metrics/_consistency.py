"""Consistency: does the assistant contradict itself, or what the user said about themself?

Statements are read from each turn with patterns for the things people state about
themselves and bots about "themselves": a name, an age, where one lives or comes from,
one's work, a favourite, how many of something one has, and what one likes, has or is
(with its polarity: "I like jazz" against "I don't like jazz"). A statement's subject is
its speaker ("I ...") or, in an assistant turn, the user ("you ...", "your name is").

A check is an assistant statement on something already stated: by the assistant about
itself (or by its persona, given as ``persona`` in the scenario's or transcript's
metadata, as PersonaChat gives it), or by the user about themself when the assistant
speaks about the user. It is a contradiction when the value differs (another name,
another number, the opposite polarity; a description such as "a big city" is not another
value). The score is the share of checks that do not contradict. With no check there is
no score, never a "consistent" 1.0: not applicable, with nothing to check when no
statement was read at all, and "no evidence" (details counting the statements read) when
statements were read but the assistant never restated one. The user contradicting
themself is not the assistant's doing and is not counted (the user's later statement
simply replaces the earlier one).

Blind spots: only what the patterns read is seen ("I'm 30" is, "I turned thirty last
spring" is not); a paraphrased value ("NYC" against "New York") reads as different; and
contradictions of meaning without a stated value are not seen at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from convsim._records import Score, TurnRecord, TurnStatus

from . import _contextual
from ._contextual import PairScorer
from ._protocol import MetricTraits
from ._words import normal_words

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

    from ._nli_consistency import NliConsistencyScorer

__all__ = ["ConsistencyMetric", "Statement", "statements"]

_NEG = r"(?:do not|don't|dont|never|am not|'m not|no longer)"
_END = (
    r"(?=[.,!?;]|$| and\b| but\b| too\b| so\b| because\b| though\b| at all\b| very much\b"
    r"| a lot\b| much\b| either\b| anymore\b| especially\b| now\b)"
)
_PHRASE = r"([a-z][a-z' -]{0,30}?)"
_NUMBER_WORDS = {
    "no": "0",
    "zero": "0",
    "one": "1",
    "a": "1",
    "an": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_COUNT = r"(\d+|no|zero|one|two|three|four|five|six|seven|eight|nine|ten)"


def _patterns(me: str, be: str, have: str, my: str) -> list[tuple[str, re.Pattern[str]]]:
    """The value patterns for one grammatical person (``i``/``am``/``my`` or the
    ``you`` forms); each captures (slot detail?, value)."""
    return [
        ("name", re.compile(rf"\b{my} name is ([a-z]+)\b")),
        ("age", re.compile(rf"\b{me}{be} (\d{{1,3}}) years? old\b")),
        ("age", re.compile(rf"\b{me}{be} (\d{{1,3}})(?= ?[.,!?]|$)")),
        ("home", re.compile(rf"\b{me} (?:live|lives|grew up) in {_PHRASE}{_END}")),
        ("home", re.compile(rf"\b{me}{be} from {_PHRASE}{_END}")),
        ("work", re.compile(rf"\b{me} work(?:s)? as (?:a |an )?{_PHRASE}{_END}")),
        ("favorite", re.compile(rf"\b{my} fav(?:ou?rite) ([a-z]+) is {_PHRASE}{_END}")),
        ("count", re.compile(rf"\b{me} {have} {_COUNT} ([a-z]+?)s?\b")),
    ]


def _polar(me: str, be: str, have: str) -> list[tuple[str, bool, re.Pattern[str]]]:
    """Polarity patterns (slot, positive?, pattern capturing the object)."""
    likes = r"(?:really )?(?:like|love|enjoy)"
    fond = r"(?:really )?(?:like|love|enjoy|adore)s?"
    return [
        ("likes", False, re.compile(rf"\b{me} {_NEG} {likes} {_PHRASE}{_END}")),
        ("likes", False, re.compile(rf"\b{me} (?:hate|dislike|can't stand) {_PHRASE}{_END}")),
        ("likes", True, re.compile(rf"\b{me} {fond} {_PHRASE}{_END}")),
        ("has", False, re.compile(rf"\b{me} {_NEG} (?:have|own) (?:a|an|any) ([a-z]+)")),
        ("has", True, re.compile(rf"\b{me} (?:{have}|own|owns) (?:a|an) ([a-z]+)")),
        ("is", False, re.compile(rf"\b{me}{be} not (?:a|an) ([a-z]+)")),
        ("is", True, re.compile(rf"\b{me}{be} (?:a|an) ([a-z]+)")),
    ]  # fmt: skip


_FIRST_PERSON = re.compile(r"\b(?:i|my)\b")
_SECOND_PERSON = re.compile(r"\b(?:you|your)\b")
_I_AM, _YOU_ARE = r"(?: am|'m)", r"(?: are|'re)"
_SELF = (_patterns("i", _I_AM, "have", "my"), _polar("i", _I_AM, "have"))
_ADDRESSEE = (_patterns("you", _YOU_ARE, "have", "your"), _polar("you", _YOU_ARE, "have"))


class Statement(NamedTuple):
    """What one turn states: about whom (``speaker`` or ``addressee``), which slot
    (``age``, ``likes:jazz``), and the value (text, or ``yes``/``no`` for a polarity)."""

    about: str
    slot: str
    value: str


_CONTRACTED = re.compile(r"\b(i|you|we|they)'ve\b")


def _normal(text: str) -> str:
    text = " ".join(text.lower().replace("\u2019", "'").split())
    return _CONTRACTED.sub(r"\1 have", text) if "'ve" in text else text


def values_differ(earlier: str, stated: str) -> bool:
    """Whether ``stated`` is another value than ``earlier`` for the same slot: not a
    description ("a big city" for Lisbon), nor the same with more words ("a nurse on
    night shifts" for "nurse")."""
    if earlier == stated:
        return False
    if stated.split()[0] in ("a", "an", "the", "some", "such", "that", "this"):
        return False
    a, b = f" {normal_words(earlier)} ", f" {normal_words(stated)} "
    return a not in b and b not in a


def persona_lines(metadata: Mapping[str, Any]) -> list[str]:
    """The assistant's persona from a scenario's or transcript's ``metadata``
    (``persona``: lines in one string, or a list), without "your persona:" prefixes."""
    persona = metadata.get("persona")
    if isinstance(persona, str):
        lines = persona.splitlines()
    elif isinstance(persona, (list, tuple)):
        lines = [str(line) for line in persona]
    else:
        return []
    return [_PERSONA_PREFIX.sub("", line) for line in lines if line.strip()]


_PERSONA_PREFIX = re.compile(r"^\s*(?:your|my)\s+persona\s*:\s*", re.I)


def _at(pattern: re.Pattern[str], text: str, anchors: list[int]) -> Iterator[re.Match[str]]:
    """The pattern's matches that start at one of the anchors (where its person is
    named): a few anchored tries instead of a scan of the whole text per pattern."""
    for pos in anchors:
        m = pattern.match(text, pos)
        if m is not None:
            yield m


def _read(text: str, about: str, patterns: Any) -> list[Statement]:
    values, polar = patterns
    anchor = _FIRST_PERSON if about == "speaker" else _SECOND_PERSON
    anchors = [m.start() for m in anchor.finditer(text)]
    found: list[Statement] = []
    if not anchors:
        return found
    claimed: set[str] = set()
    for slot, pattern in values:
        for m in _at(pattern, text, anchors):
            groups = [g.strip() for g in m.groups()]
            if slot == "favorite":
                found.append(Statement(about, f"favorite:{groups[0]}", groups[1]))
            elif slot == "count":
                number = _NUMBER_WORDS.get(groups[0], groups[0])
                found.append(Statement(about, f"count:{groups[1]}", number))
            elif slot not in claimed:  # the first pattern of a slot that reads wins
                claimed.add(slot)
                found.append(Statement(about, slot, groups[0]))
    seen: set[tuple[str, str]] = set()
    for slot, positive, pattern in polar:  # negative patterns first: they are longer
        for m in _at(pattern, text, anchors):
            thing = m.group(1).strip()
            if (slot, thing) in seen:
                continue
            seen.add((slot, thing))
            found.append(Statement(about, f"{slot}:{thing}", "yes" if positive else "no"))
    return found


def statements(text: str, *, addressee: bool = False, speaker: bool = True) -> list[Statement]:
    """What ``text`` states about its speaker; with ``addressee``, also what it states
    about the one it speaks to ("you are 30", "your name is Ana"); without ``speaker``,
    only that."""
    normal = _normal(text)
    found = _read(normal, "speaker", _SELF) if speaker else []
    if addressee:
        found += _read(normal, "addressee", _ADDRESSEE)
    return found


class ConsistencyMetric:
    """Share of the assistant's statements on things already stated that do not
    contradict them (itself, or what the user said about themself)."""

    name = "consistency"
    traits: ClassVar[MetricTraits] = MetricTraits("conversation")
    higher_is_better = True
    description = (
        "Share of the assistant's statements (name, age, home, work, favourites, counts, "
        "likes/has/is with polarity) on something already stated, by itself or by the "
        "user about themself, or by its persona (metadata ``persona``), that do not "
        "contradict it; not applicable when nothing is stated twice. Sees only what its "
        "patterns read. With an NLI model (the nli extra, CONVSIM_NLI_MODEL): 1 - the "
        "highest contradiction probability of each assistant sentence against earlier "
        "ones, the personas and the user's statements (details: backend, pair)."
    )

    def __init__(self, classifier: PairScorer | Literal["auto"] | None = "auto") -> None:
        self.classifier = _contextual.pair_classifier() if classifier == "auto" else classifier
        """The NLI pair classifier (the process's, when present); None: the patterns."""
        self.cpu_heavy = self.classifier is not None
        """With a classifier the pairs are scored in result(), off the event loop."""

    def scorer(self, conversation: Conversation) -> _ConsistencyScorer | NliConsistencyScorer:
        scenario = conversation.scenario
        if self.classifier is not None:
            from ._nli_consistency import NliConsistencyScorer

            return NliConsistencyScorer.for_conversation(
                self.classifier,
                persona_lines(scenario.metadata or {}),
                scenario.user.persona if scenario.user is not None else "",
                list(scenario.facts),
            )
        scorer = _ConsistencyScorer()
        for line in persona_lines(scenario.metadata or {}):
            for s in statements(line):
                scorer.assistant.setdefault(s.slot, (s.value, "persona"))
        return scorer


@dataclass
class _ConsistencyScorer:
    assistant: dict[str, tuple[str, str]] = field(default_factory=dict)
    """What the assistant said about itself: slot -> (value, turn_id)."""
    user: dict[str, tuple[str, str]] = field(default_factory=dict)
    """What the user said about themself: slot -> (value, turn_id)."""
    checks: int = 0
    contradictions: list[dict[str, Any]] = field(default_factory=list)
    statements: int = 0
    """Statements read in the assistant's turns (about itself or the user)."""

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        for s in statements(turn.user_message or ""):
            self.user[s.slot] = (s.value, turn.turn_id)  # the user may change their mind
        for s in statements(turn.response, addressee=True):
            self.statements += 1
            known = self.assistant if s.about == "speaker" else self.user
            earlier = known.get(s.slot)
            if earlier is not None:
                self.checks += 1
                if values_differ(earlier[0], s.value):
                    about = "the user" if s.about == "addressee" else "itself"
                    self.contradictions.append(
                        {
                            "about": "its persona" if earlier[1] == "persona" else about,
                            "slot": s.slot,
                            "earlier": earlier[0],
                            "earlier_turn": earlier[1],
                            "stated": s.value,
                            "turn_id": turn.turn_id,
                        }
                    )
            if s.about == "speaker":
                self.assistant.setdefault(s.slot, (s.value, turn.turn_id))

    def result(self) -> Score:
        read = {
            "checks": self.checks,
            "statements": self.statements,
            "user_statements": len(self.user),
            "persona_statements": sum(1 for _, t in self.assistant.values() if t == "persona"),
        }
        if not self.checks:
            if not (self.statements or read["user_statements"] or read["persona_statements"]):
                return Score.not_applicable(
                    "nothing to check: no statement about the assistant or the user (name, "
                    "age, home, work, favourites, counts, likes) was read",
                    **read,
                )
            return Score.not_applicable(
                "no evidence: the assistant never restated something already stated (name, "
                "age, home, work, favourites, counts, likes)",
                **read,
            )
        return Score(
            value=1.0 - len(self.contradictions) / self.checks,
            details={**read, "contradictions": self.contradictions, "backend": "pattern"},
        )
