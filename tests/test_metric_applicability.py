"""No metric gives a verdict where it had nothing to measure.

Every registered metric (built-in, entry point, one sample per prefix) is fed
conversations with nothing in them to measure: no completed turn, a single turn, and
chit-chat with no facts, goal, reference, code, numbers or money, where the user says
things of themself that no answer ever touches (so memory and consistency have no
evidence either way). Each score must then be ``not_applicable`` or ``failed``. The few
metrics that measure any answer at all are listed in :data:`MEASURES_ANY_ANSWER`, each
with why; a metric that gives a value and is not listed fails the test.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convsim import Score, TurnRecord, TurnStatus
from convsim._records import TurnTimings
from convsim.metrics import METRICS, AsyncConversationScorer, Metric
from convsim.metrics._transcripts import build_transcript
from convsim.scenarios import Conversation


class MeasuresAnyAnswer(NamedTuple):
    """A metric that legitimately scores any answered conversation, and why."""

    why: str
    min_turns: int = 1
    """Completed turns it needs before it measures anything."""


MEASURES_ANY_ANSWER = {
    "latency": MeasuresAnyAnswer("every completed model call has a measured duration"),
    "response_length": MeasuresAnyAnswer("every completed answer has a length in words"),
    "coherence": MeasuresAnyAnswer(
        "it measures each answer's semantic fit to the message it answers, which any "
        "answer to a user message has"
    ),
    "nli_coherence": MeasuresAnyAnswer(
        "it measures whether each answer contradicts the messages before it, which any "
        "answer to a user message has"
    ),
    "lexical_coherence": MeasuresAnyAnswer(
        "it measures each answer's word overlap with the message it answers and the "
        "conversation so far, which any answer has"
    ),
    "response_quality": MeasuresAnyAnswer(
        "its relevance part measures each answer's semantic fit to the message it "
        "answers, which any answer to a user message has (structure and completeness "
        "apply only where there is structure or keywords to measure)"
    ),
    "conversation_flow": MeasuresAnyAnswer(
        "it measures topic consistency, relevance and progression between answers",
        min_turns=2,
    ),
}

PREFIX_SAMPLES = {
    "judge:": "judge:Is the reply helpful?",
    "lm_eval:": "lm_eval:exact_match",
    "lm_eval_task:": "lm_eval_task:exact_match",
    "task:": "task:accuracy",
}
"""One name per registered prefix: a prefix builds a metric for any name after it."""


def metric_names() -> list[str]:
    return [*METRICS.names(), *(PREFIX_SAMPLES[p] for p in METRICS.prefixes())]


def test_every_prefix_and_listed_metric_is_known() -> None:
    assert set(METRICS.prefixes()) <= set(PREFIX_SAMPLES), "add a sample name for the prefix"
    assert set(MEASURES_ANY_ANSWER) <= set(METRICS.names())


class _NeutralClassifier:
    """An NLI model that calls every pair neutral: nli_coherence needs one to be built."""

    model_id = "test/neutral"

    def classify(self, pairs: Any) -> list[Any]:
        from convsim.metrics._nli import NliScores

        return [NliScores(entailment=0.0, neutral=1.0, contradiction=0.0) for _ in pairs]


@pytest.fixture(scope="module")
def metrics() -> dict[str, Metric]:
    from convsim.metrics._nli_coherence import NliCoherenceMetric

    def build(name: str) -> Metric:
        if name == "nli_coherence":
            return NliCoherenceMetric(classifier=_NeutralClassifier())
        return METRICS.get(name)()

    return {name: build(name) for name in metric_names()}


# -- conversations with nothing to measure ---------------------------------------------

# The user and the assistant speak with disjoint words, so no answer can echo, recall or
# contradict what the user said; the assistant never says I/you nor asks anything.
USER_WORDS = (
    "hello hi there today lovely weather walk park garden flowers tea music quiet "
    "evening sunny nice really so calm rainy windy the was felt long slow"
).split()
USER_THINGS = "jazz gardening hiking painting dog cat bicycle nurse teacher poetry".split()
ASSISTANT_WORDS = (
    "sounds wonderful indeed pleasant afternoon breeze outdoors relaxing certainly "
    "great glad such moments matter enjoy rest well deserved peaceful cheerful simple "
    "pleasures brighten any ordinary"
).split()
STATEMENTS = ("I like {}.", "I love {}.", "I have a {}.", "I am a {}.", "I work as a {}.")


def _sentence(words: list[str], end: str) -> str:
    text = " ".join(words)
    return text[:1].upper() + text[1:] + end


user_sentence = st.one_of(
    st.builds(
        _sentence,
        st.lists(st.sampled_from(USER_WORDS), min_size=1, max_size=12),
        st.sampled_from([".", "!", "?"]),
    ),
    st.builds(str.format, st.sampled_from(STATEMENTS), st.sampled_from(USER_THINGS)),
)
answer_sentence = st.builds(
    _sentence,
    st.lists(st.sampled_from(ASSISTANT_WORDS), min_size=1, max_size=15),
    st.sampled_from([".", "!"]),
)
user_message = st.lists(user_sentence, min_size=1, max_size=3).map(" ".join)
answer = st.lists(answer_sentence, min_size=1, max_size=3).map(" ".join)


class Chat(NamedTuple):
    """A conversation to score and its turn records; ``completed`` of them answered."""

    conversation: Conversation
    records: list[TurnRecord]
    completed: int


@st.composite
def chats(draw: st.DrawFn, *, min_turns: int = 1, max_turns: int = 5) -> Chat:
    pairs = draw(st.lists(st.tuples(user_message, answer), min_size=min_turns, max_size=max_turns))
    messages = [
        {"role": role, "content": text}
        for user, reply in pairs
        for role, text in (("user", user), ("assistant", reply))
    ]
    transcript = build_transcript("chat", messages)
    failed = draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
    records = []
    for record, fails in zip(transcript.turns, failed, strict=True):
        if fails:  # the model call failed, or the turn was skipped: no answer
            status = draw(st.sampled_from([TurnStatus.FAILED, TurnStatus.SKIPPED]))
            records.append(dataclasses.replace(record, status=status, response=None))
        else:
            latency = draw(st.floats(0.01, 5.0))
            timings = TurnTimings(started_at=0.0, duration_s=latency, latency_s=latency)
            records.append(dataclasses.replace(record, timings=timings))
    return Chat(transcript.conversation, records, len(failed) - sum(failed))


def _score(metric: Metric, conversation: Conversation, records: list[TurnRecord]) -> Score:
    scorer = metric.scorer(conversation)
    if isinstance(scorer, AsyncConversationScorer):

        async def fold() -> Score:
            for record in records:
                await scorer.update(record)
            return await scorer.result()

        return anyio.run(fold)
    for record in records:
        scorer.update(record)
    return scorer.result()


def _check(metrics: dict[str, Metric], chat: Chat) -> None:
    for name, metric in metrics.items():
        score = _score(metric, chat.conversation, chat.records)
        if score.status == "ok":
            allowed = MEASURES_ANY_ANSWER.get(name)
            assert allowed is not None and chat.completed >= allowed.min_turns, (
                f"{name} gave {score.value} with nothing to measure "
                f"({chat.completed} completed turns): {score.details}"
            )
        else:
            assert score.value is None and score.reason, (name, score)


def test_the_vocabularies_hold_nothing_to_measure() -> None:
    from convsim.metrics._domain import talks_finance

    said = " ".join([*USER_WORDS, *USER_THINGS, *ASSISTANT_WORDS])
    assert not talks_finance(said) and not any(c.isdigit() for c in said)
    assert not set(USER_WORDS + USER_THINGS) & set(ASSISTANT_WORDS)
    assert not {"i", "my", "you", "your", "what", "how"} & set(ASSISTANT_WORDS)


_EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_EXAMPLES
@given(chat=chats(max_turns=4).filter(lambda c: c.completed == 0))
def test_no_completed_turn_gives_no_value(metrics: dict[str, Metric], chat: Chat) -> None:
    for name, metric in metrics.items():
        score = _score(metric, chat.conversation, chat.records)
        assert score.value is None and score.status != "ok", (name, score)


@_EXAMPLES
@given(chat=chats(min_turns=1, max_turns=1))
def test_a_single_turn_gives_no_verdict(metrics: dict[str, Metric], chat: Chat) -> None:
    _check(metrics, chat)


@_EXAMPLES
@given(chat=chats(min_turns=2, max_turns=5))
def test_chit_chat_gives_no_verdict(metrics: dict[str, Metric], chat: Chat) -> None:
    _check(metrics, chat)


def test_the_cases_of_the_issue_give_no_value(metrics: dict[str, Metric]) -> None:
    """Single-turn retention and free chit-chat were 1.0, chit-chat's finance 0.0."""
    stated = [
        {"role": "user", "content": "Hi, I'm Maria and I love hiking. My order is NW-48213."},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
    ]
    single = build_transcript("single", stated)
    chat = build_transcript(
        "chat",
        [
            *stated,
            {"role": "user", "content": "Nothing really, just chatting. Nice weather, no?"},
            {"role": "assistant", "content": "It is lovely out. Enjoy the sunshine!"},
        ],
    )
    for transcript in (single, chat):
        for name in ("context_retention", "financial_reasoning", "consistency"):
            score: Any = _score(metrics[name], transcript.conversation, list(transcript.turns))
            assert score.value is None and score.status == "not_applicable", (name, score)
