"""Reference-free context retention: what the user stated, and which later answer forgot it.

``context_retention`` uses this when a scenario declares no facts and probes (free
conversation, transcripts from elsewhere). The user states three kinds of things:

- statements about themself, read with the patterns of ``consistency`` (name, age, home,
  work, favourites, counts, likes/has/is);
- salient items: numbers, identifiers with digits, capitalised names, quoted phrases;
- answers: the user's reply to a question the assistant asked.

Every answer is checked against what was stated before it (the message it answers
included). An answer *forgets* a stated thing when it

- asks for it again ("how old are you?" after "I'm 30", "do you have any pets" is not
  read, "do you have a dog?" after "I have two dogs" is);
- asks again a question it asked before and the user answered;
- states something else about the user ("you are 31" after "I'm 30");
- does not state an item the user asks back for ("remind me, what was my flight?").

With a contextual pair classifier (``consistency``'s NLI backend) the third check is the
classifier's instead of the patterns': each answer sentence that speaks to the user
("you", "your"; not a question) against each earlier user message that stated something,
a contradiction probability of 0.5 or more forgetting what that message stated (the
things the sentence mentions, or else its first); at most ``PAIR_CAP`` pairs, scored in
``result()``.

The answer just before a user's "I already told you" forgot something too. An answer
*recalls* a stated thing when it states it again though the message it answers did not
(an echo of that message is not memory).

The score is the share of stated things no answer forgot. Details count how many were
recalled, how many forgotten (with the turn and the reason) and how many no answer
touched: ``evidence`` is recalled plus forgotten. Without evidence (no answer recalled or
forgot anything) there is no score: it is not applicable ("no evidence"), with the same
counts in its details, since silence says nothing about memory. Blind spots: once there
is evidence, what no answer touched counts as kept; forgetting is seen only in the forms
the patterns read, and in English.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from convsim._records import Score

from ._consistency import _END, _PHRASE, statements, values_differ
from ._contextual import CONTRADICTS, PairScorer, classify_contradiction, sentences
from ._nli_consistency import PAIR_CAP
from ._words import normal_words

__all__ = ["FreeRetention", "asked_slots", "salient_items"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


_ASK_SLOT = [
    ("name", re.compile(r"\bwhat(?:'s| is) your name\b")),
    ("age", re.compile(r"\bhow old are you\b|\bwhat(?:'s| is) your age\b")),
    (
        "home",
        re.compile(r"\bwhere (?:do|did) you (?:live|grow up|come from)\b|\bwhere are you from\b"),
    ),
    (
        "work",
        re.compile(
            r"\bwhat do you do for (?:a )?(?:living|work)\b|\bwhere do you work\b"
            r"|\bwhat(?:'s| is) your (?:job|occupation|profession)\b|\bwhat do you do\s*\?"
        ),
    ),
]
_ASK_THING = [
    ("favorite", re.compile(r"\bwhat(?:'s| is) your fav(?:ou?rite) ([a-z]+)\b")),
    ("count", re.compile(r"\bhow many ([a-z]+) do you have\b")),
    ("has", re.compile(r"\bdo you (?:have|own) (?:a|an|any) ([a-z]+)\b")),
    ("likes", re.compile(rf"\bdo you (?:like|love|enjoy) {_PHRASE}{_END}")),
    ("is", re.compile(r"\bare you (?:a|an) ([a-z]+)\b")),
]


_NOT_POSSESSIONS = frozenset(
    """question questions idea ideas problem problems issue issues minute moment second sec
    time chance doubt doubts clue point feeling way lot bit look plan plans preference
    suggestion suggestions favorite favourite""".split()
)
"""Things one "has" that are not facts about oneself ("I have a question")."""


def asked_slots(text: str) -> set[str]:
    """The slots the questions in ``text`` ask its addressee about, named as
    ``consistency``'s statements are (``age``, ``likes:jazz``); ``has`` and ``count``
    questions name the thing in the singular."""
    if "?" not in text:
        return set()
    questions = [q for q in _SENTENCE.split(text) if q.rstrip().endswith("?")]
    normal = " ".join(" ".join(questions).lower().replace("\u2019", "'").split())
    if "you" not in normal:
        return set()
    asked = {slot for slot, pattern in _ASK_SLOT if pattern.search(normal)}
    for slot, pattern in _ASK_THING:
        for m in pattern.finditer(normal):
            thing = m.group(1).strip()
            if slot in ("has", "count"):
                thing = _singular(thing)
                if thing in _NOT_POSSESSIONS or f"{thing}s" in _NOT_POSSESSIONS:
                    continue
            asked.add(f"{slot}:{thing}")
    return asked


def _slot_key(slot: str) -> str:
    """A statement's slot as questions name it: ``count:dogs`` and ``has:dog`` are both
    about having a dog."""
    kind, _, thing = slot.partition(":")
    if kind in ("has", "count"):
        return f"has:{_singular(thing)}"
    return slot


_ITEM = re.compile(
    r"\"([^\"]{2,40})\"|"  # a quoted phrase
    r"(?<![\w.])(\d[\d,]*(?:\.\d+)?%?)(?!\w)|"  # a number
    r"\b([A-Za-z]+[-_]?\d[\w-]*)\b|"  # an identifier with digits (A-1042, TRK99)
    r"(?<=[a-z,;:] )([A-Z][a-z]{2,}(?:\s[A-Z][a-z]{2,})*)"  # a capitalised name mid-sentence
)


def salient_items(text: str) -> list[tuple[str, str]]:
    """(item, its context) for each salient thing ``text`` introduces; the context is the
    few words just before the item and right after it ("my flight is" for a flight), so
    a question back about the flight finds it and one about the dog does not."""
    found = []
    for sentence in _SENTENCE.split(text):
        for m in _ITEM.finditer(sentence):
            item = next(g for g in m.groups() if g).strip()
            if len(item.strip(",%")) >= 2:
                before = sentence[: m.start()].split()[-5:]
                after = sentence[m.end() :].split()[:2]
                found.append((item, " ".join([*before, *after])))
    return found


_BACK_REFERENCE = re.compile(
    r"\b(?:remind me|what(?:'s| was| were| is| are) my|what did i (?:say|tell|mention)"
    r"|which \w+ did i|did i (?:say|tell|mention)"
    r"|do you (?:remember|recall) (?:what|which|where|when|who|how|my))\b",
    re.I,
)
_TOLD_ALREADY = re.compile(
    r"\bi (?:already |just )?told you (?:that |this |it )?(?:already|before|earlier)\b"
    r"|\bi (?:already|just) told you\b"
    r"|\bi(?:'ve| have)? already (?:said|answered|mentioned|given you) (?:that|this|it)\b"
    r"(?!\s+to\b)"
    r"|\byou (?:already|just) asked\b|\byou asked (?:me )?(?:that|this|the same)\b"
    r"|\bi said that already\b",
    re.I,
)
_STOP = frozenset(
    """a an and are as at be but by can could did do does for from had has have how i i'm in
    is it its me my of on or our please so that the their them then there these this to was
    we were what when where which who why will with would you your again remind earlier
    before remember said say tell told mentioned going ve ll re s t d m""".split()
)


def _content(text: str) -> set[str]:
    return {w for w in normal_words(text).split() if w not in _STOP and not w.isdigit()}


_TO_USER = re.compile(r"\b(?:you|your|you're|yours)\b", re.I)
_WH = frozenset("what where when which who whose how".split())
_ABOUT_YOU = frozenset("do did are have".split())
_FORMULA = frozenset(
    """help assist else anything today doing going question questions other more need
    needs want wants""".split()
)


def _questions(text: str) -> list[str]:
    """The questions in ``text`` whose answer stays true, so that asking one again means
    the answer was forgotten: wh-questions of four words or more ("what are their
    names?") and questions about the addressee ("do you like fish?"), not offers ("would
    you like another?") nor formulas ("how can I help you today?", "do you need
    anything else?")."""
    if "?" not in text:
        return []
    out = []
    for sentence in _SENTENCE.split(text):
        for q in sentence.split("?")[:-1]:
            words = normal_words(q).split()
            start = next(
                (
                    i
                    for i, w in enumerate(words)
                    if w in _WH or (w in _ABOUT_YOU and words[i + 1 : i + 2] == ["you"])
                ),
                None,
            )
            if start is None:
                continue
            words = words[start:]
            if len(words) >= 4 and not _FORMULA.intersection(words):
                out.append(" ".join(words))
    return out


@dataclass
class _Stated:
    """One thing the user stated, and what the answers after it did with it."""

    kind: str  # "statement", "item", "answer" or "complaint"
    key: str  # the slot as questions name it, the item, or the question answered
    value: str  # what to find in a later answer ("" when nothing is looked for)
    sentence: str
    turn_id: str
    position: int
    slot: str = ""
    """A statement's slot as ``consistency`` names it (``count:dogs``)."""
    told: str = ""
    """A statement's value as ``consistency`` reads it (``2``, ``yes``)."""
    recalled: list[tuple[str, int]] = field(default_factory=list)
    forgotten: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        normal = normal_words(self.value)
        self.wanted = f" {normal} " if normal else ""
        """The value as it is searched for in a normalised answer ("" for nothing)."""
        self.first_word = normal.split()[0] if normal else ""


@dataclass
class FreeRetention:
    """The reference-free retention scorer of one conversation: fed each completed turn
    (the user's message and the answer) in order."""

    stated: list[_Stated] = field(default_factory=list)
    slots: dict[str, _Stated] = field(default_factory=dict)
    """The user's latest statement per slot (``_slot_key``): the user may change their mind."""
    answered: dict[str, list[_Stated]] = field(default_factory=dict)
    """The user's answers by the question they answer."""
    open_questions: list[str] = field(default_factory=list)
    """The last answer's questions, waiting for the user's reply."""
    last_turn: tuple[str, int] | None = None
    forgetting_turns: set[str] = field(default_factory=set)
    """Turns whose answer forgot something."""
    classifier: PairScorer | None = None
    """The NLI pair classifier that reads "stated otherwise" instead of the patterns."""
    said: dict[int, str] = field(default_factory=dict)
    """The user's messages that stated something, by position (for the classifier)."""
    pending: list[tuple[int, str, str, int]] = field(default_factory=list)
    """(premise position, answer sentence, turn id, position) for the classifier."""

    def update(self, user: str, answer: str, turn_id: str, position: int) -> None:
        if self.last_turn is not None and _TOLD_ALREADY.search(user):
            prev_id, prev_position = self.last_turn
            if prev_id not in self.forgetting_turns:  # one lapse is counted once
                self.forgetting_turns.add(prev_id)
                self.stated.append(
                    _Stated("complaint", "", "", user, prev_id, prev_position, forgotten=[
                        {"turn_id": prev_id, "reason": "the user said they had already told it",
                         "distance": 0}
                    ])
                )  # fmt: skip
        if self.open_questions and user.strip():
            answer_to = _Stated("answer", self.open_questions[0], "", user, turn_id, position)
            self.stated.append(answer_to)
            for q in self.open_questions:
                self.answered.setdefault(q, []).append(answer_to)
        self._read_user(user, turn_id, position)
        if self.classifier is not None and any(s.position == position for s in self.stated):
            self.said[position] = user
        questions = _questions(answer)
        self._check(user, answer, questions, turn_id, position)
        self.open_questions = questions
        self.last_turn = (turn_id, position)

    def _read_user(self, user: str, turn_id: str, position: int) -> None:
        values = set()
        for s in statements(user):
            thing = s.slot.partition(":")[2]
            value = s.value if s.value not in ("yes", "no") else thing
            key = _slot_key(s.slot)
            stated = _Stated("statement", key, value, user, turn_id, position, s.slot, s.value)
            self.slots[key] = stated
            self.stated.append(stated)
            values.add(normal_words(value))
        known = {s.value for s in self.stated if s.kind == "item"}
        for item, sentence in salient_items(user):
            if item not in known and normal_words(item) not in values:
                known.add(item)
                self.stated.append(_Stated("item", item, item, sentence, turn_id, position))

    def _check(
        self, user: str, answer: str, questions: list[str], turn_id: str, position: int
    ) -> None:
        said = f" {normal_words(answer)} "
        heard = f" {normal_words(user)} "
        for slot in asked_slots(answer):
            kind, _, thing = slot.partition(":")
            key = f"has:{thing}" if kind == "count" else slot
            earlier = self.slots.get(key)
            if earlier is not None and earlier.position < position:
                # a question about the message just answered asks for more, not again
                self._forget(earlier, turn_id, position, f"asked again: {slot}")
        if self.classifier is not None:
            self._queue(answer, turn_id, position)
        for s in statements(answer, addressee=True, speaker=False) if not self.classifier else ():
            earlier = self.slots.get(_slot_key(s.slot))
            if earlier is None or earlier.slot != s.slot:
                continue
            if values_differ(earlier.told, s.value):
                what = f"stated {s.slot}={s.value!r}, was told {earlier.told!r}"
                self._forget(earlier, turn_id, position, what)
        for question in set(questions):
            for answer_to in self.answered.get(question, ()):
                self._forget(answer_to, turn_id, position, "asked the same question again")
        back_reference = _BACK_REFERENCE.search(user) is not None
        asked = _content(user) if back_reference else set()
        words = set(said.split())
        for stated in self.stated:
            wanted = stated.wanted
            if not wanted or stated.position >= position:
                continue  # nothing to look for, or stated in the message answered
            if not back_reference and stated.first_word not in words:
                continue  # the common case, decided without a substring search
            if wanted in said and wanted not in heard:
                self._recall(stated, turn_id, position)
            elif (
                back_reference
                and stated.kind == "item"
                and wanted not in heard
                and len(asked & _content(stated.sentence)) * 2 > len(asked)
            ):
                self._forget(stated, turn_id, position, "not stated when asked back")

    def _queue(self, answer: str, turn_id: str, position: int) -> None:
        """Queue each answer sentence to the user against each earlier user message that
        stated something."""
        earlier = sorted({s.position for s in self.stated if s.kind != "complaint"})
        for sentence in sentences(answer):
            if sentence.rstrip().endswith("?") or not _TO_USER.search(sentence):
                continue
            for at in earlier:
                if at < position and at in self.said:
                    self.pending.append((at, sentence, turn_id, position))

    def _classify(self) -> None:
        """Score the queued pairs (the latest first when over the cap); a contradiction
        forgets what its user message stated."""
        pending, self.pending = self.pending[-PAIR_CAP:], []
        if self.classifier is None:
            return
        pairs = [(self.said[at], sentence) for at, sentence, _, _ in pending]
        probabilities = classify_contradiction(self.classifier, pairs)
        for (at, sentence, turn_id, position), p in zip(pending, probabilities, strict=True):
            if p < CONTRADICTS:
                continue
            told = [s for s in self.stated if s.position == at and s.kind != "complaint"]
            words = set(normal_words(sentence).split())
            named = [s for s in told if words & set(normal_words(s.value or s.key).split())]
            for stated in named or told[:1]:
                what = f"stated otherwise (nli {p:.2f}): {sentence!r}"
                self._forget(stated, turn_id, position, what)

    def _recall(self, stated: _Stated, turn_id: str, position: int) -> None:
        if not stated.recalled or stated.recalled[-1][0] != turn_id:
            stated.recalled.append((turn_id, position - stated.position))

    def _forget(self, stated: _Stated, turn_id: str, position: int, reason: str) -> None:
        """The first answer that forgot ``stated`` is the one recorded."""
        self.forgetting_turns.add(turn_id)
        if not stated.forgotten:
            stated.forgotten.append(
                {"turn_id": turn_id, "reason": reason, "distance": position - stated.position}
            )

    def result(self) -> Score:
        if self.pending:
            self._classify()
        if not self.stated:
            return Score.not_applicable(
                "the scenario declares no facts and probes, and the user stated nothing "
                "checkable (about themself, numbers, names, IDs, answers to questions)"
            )
        forgotten = [s for s in self.stated if s.forgotten]
        recalled = [s for s in self.stated if s.recalled and not s.forgotten]
        events: dict[int, list[float]] = {}
        for s in self.stated:
            for _, distance in s.recalled:
                events.setdefault(distance, []).append(1.0)
            for f in s.forgotten:
                events.setdefault(f["distance"], []).append(0.0)
        counts = {
            "mode": "reference-free",
            "checks": len(self.stated),
            "recalled": len(recalled),
            "forgotten": len(forgotten),
            "untouched": len(self.stated) - len(recalled) - len(forgotten),
            "evidence": len(recalled) + len(forgotten),
        }
        if not counts["evidence"]:
            return Score.not_applicable(
                f"no evidence: no answer recalled or forgot any of the {len(self.stated)} "
                "things the user stated",
                **counts,
            )
        missed = [
            {"what": s.key or s.sentence, "kind": s.kind, "stated_in": s.turn_id, **f}
            for s in forgotten
            for f in s.forgotten
        ]
        return Score(
            value=1.0 - len(forgotten) / len(self.stated),
            details={
                **counts,
                "curve": {str(d): sum(v) / len(v) for d, v in sorted(events.items())},
                "curve_n": {str(d): len(v) for d, v in sorted(events.items())},
                "contradictions": [m for m in missed if m["reason"].startswith("stated ")],
                "missed": missed,
                "unintroduced": 0,
                **(
                    {"backend": "nli", "model": self.classifier.model_id} if self.classifier else {}
                ),
            },
        )
