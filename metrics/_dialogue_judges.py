"""Conversational judge metrics: a judge model grades the dialogue, not one reply alone.

Four built-in ``judge:`` metrics, each with a fixed prompt whose version and SHA-256
are recorded in every score's details (``prompt_version``, ``prompt_sha256``), so a
figure can be traced to the exact words the judge was asked and a changed prompt never
passes for the old one:

- ``judge:turn_relevancy``: each assistant reply against the message before it, seen
  within a sliding window of the last :data:`WINDOW` messages;
- ``judge:knowledge_retention``: each assistant reply after the first user message:
  does it keep what the user said earlier (no contradiction, no asking again)?
- ``judge:role_adherence``: each assistant reply against the role the system prompt
  (or the persona in the scenario's or transcript's metadata) gives it; not applicable
  where there is neither;
- ``judge:conversation_completeness``: the whole conversation once, at its end: were
  the user's intentions met?

The judge answers JSON ``{"score": 1-5, "reason": "..."}``, mapped to 0-1; the value
is the mean over the graded units (replies, or the one conversation). Sampling, the
spread, the bootstrap interval, re-asking, and the counts of unparsable answers and
failed calls are those of the rubric judges (:mod:`convsim.metrics._judge`): a unit
no sample could grade is listed, never dropped silently, and the score fails when no
unit was graded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from convsim._plural import counted
from convsim._records import Score, TurnRecord, TurnStatus
from convsim._types import Message

from ._consistency import persona_lines
from ._judge import JudgeSettings, _JudgeScorer, _NeedsJudge
from ._protocol import MetricKind, MetricTraits

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = [
    "DIALOGUE_JUDGES",
    "DialogueJudgeMetric",
    "DialoguePrompt",
    "WINDOW",
    "dialogue_judge",
]

WINDOW = 10
"""Messages before a reply that ``judge:turn_relevancy`` shows the judge."""

_ANSWER = (
    'Answer with a JSON object only, for example {{"score": 4, "reason": "one short sentence"}}.'
)


class DialoguePrompt(NamedTuple):
    """A conversational judge's fixed prompt: its version, what it measures, and the
    template (fields: ``role``, ``context``, ``reply``, ``transcript``)."""

    version: str
    description: str
    template: str

    @property
    def sha256(self) -> str:
        """The template's SHA-256: the prompt as it is asked, before the dialogue."""
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()


TURN_RELEVANCY = DialoguePrompt(
    "turn_relevancy/1",
    "Share of assistant replies a judge finds relevant to the message before them, "
    f"read within the last {counted(WINDOW, 'message')}; 1-5 per reply mapped to 0-1.",
    """You are checking whether one reply of an AI assistant is relevant.

The latest messages of the conversation, oldest first:
{context}

The assistant's reply to the last of them:
{reply}

Is the reply relevant to the message right before it, read in the light of the
messages shown? 5: it addresses that message directly; 3: partly, or it drifts;
1: it ignores that message or talks about something else. Grade relevance only, not
correctness or style. """
    + _ANSWER,
)

KNOWLEDGE_RETENTION = DialoguePrompt(
    "knowledge_retention/1",
    "Whether the assistant keeps what the user told it earlier: a judge grades each "
    "reply after the first exchange (no contradiction, no asking again); 1-5 mapped to 0-1.",
    """You are checking whether an AI assistant remembers what the user told it.

The conversation so far, oldest first:
{context}

The assistant's next reply:
{reply}

Look at the facts, preferences and constraints the user stated earlier (names,
numbers, dates, choices, what they want or must avoid). Does the reply keep them?
5: it uses or respects them wherever they matter; 3: it loses one of them or is
vague where one matters; 1: it contradicts them, asks again for something the user
already gave, or acts as if it was never said. A reply that has no need of earlier
facts and does not contradict them gets 5. """
    + _ANSWER,
)

ROLE_ADHERENCE = DialoguePrompt(
    "role_adherence/1",
    "Whether the assistant stays in the role its system prompt or persona gives it: a "
    "judge grades each reply; not applicable without a role; 1-5 mapped to 0-1.",
    """You are checking whether an AI assistant stays in the role it was given.

The assistant's role:
{role}

The conversation so far, oldest first:
{context}

The assistant's next reply:
{reply}

Does the reply stay in that role: its identity, its purpose, its tone and the limits
the role sets? 5: fully in role; 3: partly out of role (a lapse of tone or scope);
1: it abandons the role or does what the role forbids. """
    + _ANSWER,
)

CONVERSATION_COMPLETENESS = DialoguePrompt(
    "conversation_completeness/1",
    "Whether the user's intentions were met by the end of the conversation: a judge "
    "grades the whole conversation once; 1-5 mapped to 0-1.",
    """You are checking whether a conversation with an AI assistant met the user's needs.

The whole conversation, oldest first:
{transcript}

First work out what the user wanted: each request, question or goal they expressed,
including ones added along the way. Then check whether, by the end, the assistant met
each of them. 5: every intention was met; 3: about half were met, or all only in
part; 1: none was met. Name any unmet intention in the reason. """
    + _ANSWER,
)


def _line(judge: JudgeSettings, message: Message) -> str:
    text = (
        judge.answer(message.content, message.reasoning)
        if message.role == "assistant"
        else (message.content)
    )
    return f"{message.role}: {text}"


def _dialogue(judge: JudgeSettings, messages: Sequence[Message]) -> str:
    """The messages as the judge reads them, the system prompt left out (a role is
    given apart, where the prompt asks for it)."""
    return "\n".join(_line(judge, m) for m in messages if m.role != "system") or "(none)"


def _history(turn: TurnRecord) -> list[Message]:
    """The messages before ``turn``'s reply, the user's message last."""
    messages = list(turn.messages)
    user = turn.user_message
    if user and not (messages and messages[-1].role == "user"):
        messages.append(Message(role="user", content=user))
    return messages


def _role(conversation: Conversation | None, turn: TurnRecord) -> str | None:
    """The assistant's role: the system prompt it was sent, else its persona."""
    system = [m.content for m in turn.messages if m.role == "system" and m.content.strip()]
    if system:
        return "\n".join(system)
    if conversation is not None:
        persona = persona_lines(conversation.scenario.metadata or {})
        if persona:
            return "\n".join(persona)
    return None


@dataclass
class _DialogueScorer(_JudgeScorer):
    """Grades units of a conversation: each reply (``per_turn``) or, at the end, the
    whole conversation. ``prompt_for`` builds a unit's prompt from the turn, or says
    why there is none (a str starting with ``"skip:"``)."""

    prompt: DialoguePrompt = TURN_RELEVANCY
    build: Callable[[_DialogueScorer, TurnRecord], str | None] = field(
        default=lambda scorer, turn: None
    )
    per_turn: bool = True
    conversation: Any = None
    last: TurnRecord | None = None
    skipped: list[str] = field(default_factory=list)
    """Replies with nothing to grade (the first, for knowledge retention)."""
    missing: str = "no completed turns to judge"

    def __post_init__(self) -> None:
        self.extra = {"prompt_version": self.prompt.version, "prompt_sha256": self.prompt.sha256}

    async def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        self.last = turn
        if not self.per_turn:
            return
        prompt = self.build(self, turn)
        if prompt is None:
            self.skipped.append(turn.turn_id)
            return
        await self.grade(prompt, turn.turn_id)

    async def result(self) -> Score:
        if not self.per_turn and self.last is not None:
            prompt = self.build(self, self.last)
            if prompt is not None:
                await self.grade(prompt, "conversation")
        if not self.asked:
            reason = self.missing if self.last is not None else "no completed turns to judge"
            return Score.not_applicable(reason, **self.extra, skipped_turns=self.skipped)
        score = await super().result()
        return score.model_copy(
            update={"details": {**score.details, "skipped_turns": self.skipped}}
        )


def _framed(scorer: _DialogueScorer, **fields: str) -> str:
    values = {"role": "", "context": "", "reply": "", "transcript": "", **fields}
    return scorer.judge.framed(scorer.prompt.template.format(**values))


def _reply(scorer: _DialogueScorer, turn: TurnRecord) -> str:
    return scorer.judge.answer(turn.response or "", turn.reasoning)


def _relevancy(scorer: _DialogueScorer, turn: TurnRecord) -> str | None:
    window = [m for m in _history(turn) if m.role != "system"][-WINDOW:]
    if not window:
        return None
    return _framed(scorer, context=_dialogue(scorer.judge, window), reply=_reply(scorer, turn))


def _retention(scorer: _DialogueScorer, turn: TurnRecord) -> str | None:
    history = _history(turn)
    # something the user said before the message this reply answers
    if sum(1 for m in history if m.role == "user") < 2:
        return None
    return _framed(scorer, context=_dialogue(scorer.judge, history), reply=_reply(scorer, turn))


def _adherence(scorer: _DialogueScorer, turn: TurnRecord) -> str | None:
    role = _role(scorer.conversation, turn)
    if role is None:
        return None
    return _framed(
        scorer,
        role=role,
        context=_dialogue(scorer.judge, _history(turn)),
        reply=_reply(scorer, turn),
    )


def _completeness(scorer: _DialogueScorer, turn: TurnRecord) -> str | None:
    reply = Message(role="assistant", content=turn.response or "", reasoning=turn.reasoning)
    transcript = [*_history(turn), reply]
    return _framed(scorer, transcript=_dialogue(scorer.judge, transcript))


class _Spec(NamedTuple):
    prompt: DialoguePrompt
    build: Callable[[_DialogueScorer, TurnRecord], str | None]
    kind: MetricKind
    per_turn: bool
    missing: str


_SPECS: dict[str, _Spec] = {
    "judge:turn_relevancy": _Spec(
        TURN_RELEVANCY, _relevancy, "turn", True, "no reply had a message before it"
    ),
    "judge:knowledge_retention": _Spec(
        KNOWLEDGE_RETENTION,
        _retention,
        "conversation",
        True,
        "nothing to retain: no reply came after a second user message",
    ),
    "judge:role_adherence": _Spec(
        ROLE_ADHERENCE,
        _adherence,
        "conversation",
        True,
        "no role to adhere to: no system prompt and no persona in the metadata",
    ),
    "judge:conversation_completeness": _Spec(
        CONVERSATION_COMPLETENESS, _completeness, "conversation", False, "nothing to judge"
    ),
}

DIALOGUE_JUDGES: tuple[str, ...] = tuple(_SPECS)
"""The built-in conversational judge metrics' names."""


@dataclass(frozen=True)
class DialogueJudgeMetric:
    """A conversational judge metric (see the module's docstring); without a judge it
    reports "not applicable: needs a judge"."""

    name: str
    judge: JudgeSettings | None = None
    higher_is_better: bool = True

    @property
    def traits(self) -> MetricTraits:
        return MetricTraits(_SPECS[self.name].kind, needs=frozenset({"judge"}))

    @property
    def description(self) -> str:
        spec = _SPECS[self.name]
        return f"{spec.prompt.description} Prompt {spec.prompt.version}."

    @property
    def prompt(self) -> DialoguePrompt:
        return _SPECS[self.name].prompt

    def with_judge(self, judge: JudgeSettings) -> DialogueJudgeMetric:
        return replace(self, judge=judge)

    def scorer(self, conversation: Conversation) -> Any:
        if self.judge is None:
            return _NeedsJudge(self.name)
        spec = _SPECS[self.name]
        return _DialogueScorer(
            rubric=spec.prompt.version,
            judge=self.judge,
            prompt=spec.prompt,
            build=spec.build,
            per_turn=spec.per_turn,
            conversation=conversation,
            missing=spec.missing,
        )


def dialogue_judge(name: str) -> DialogueJudgeMetric:
    """The built-in conversational judge metric called ``name`` (``judge:...``).

    Raises:
        KeyError: ``name`` is not one of :data:`DIALOGUE_JUDGES`.
    """
    if name not in _SPECS:
        raise KeyError(name)
    return DialogueJudgeMetric(name)
