"""Coherence, conversation flow and semantic similarity respond to what they measure."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

import convsim
from convsim.metrics import METRICS, score_transcript
from convsim.metrics._coherence import CoherenceMetric
from convsim.metrics._embedding import Embedder, TfidfEmbedder

SUPPORT = [
    (
        "My package with the blue kettle never arrived.",
        "I'm sorry the kettle package has not arrived; I will track the parcel.",
    ),
    (
        "The tracking number is TRK-99812.",
        "Tracking TRK-99812 shows the parcel stuck at the depot since Monday.",
    ),
    (
        "Can you send a replacement kettle instead?",
        "Yes, I have ordered a replacement kettle to ship today.",
    ),
    (
        "When will the replacement arrive?",
        "The replacement kettle should arrive within three working days.",
    ),
]
COOKING = [
    ("How long should I roast a chicken?", "Roast a whole chicken at 200C for about 80 minutes."),
    ("Should I baste it?", "Baste the chicken every 20 minutes to keep it moist."),
    (
        "What sides go well with roast chicken?",
        "Roast potatoes and green beans go well with chicken.",
    ),
    ("How do I make gravy?", "Make gravy from the roasting juices with flour and stock."),
]


def messages(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    out = []
    for user, assistant in pairs:
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return out


def coherence(pairs: list[tuple[str, str]]) -> float:
    value = score_transcript(messages(pairs), ["coherence"])["coherence"].value
    assert value is not None
    return value


def test_off_topic_responses_lower_coherence() -> None:
    on_topic = coherence(SUPPORT)
    off_topic = coherence([(u, a) for (u, _), (_, a) in zip(SUPPORT, COOKING, strict=True)])
    assert on_topic > off_topic + 0.2


def test_shuffled_responses_lower_coherence() -> None:
    rng = random.Random(3)
    users = [u for u, _ in SUPPORT]
    answers = [a for _, a in SUPPORT]
    worse = 0
    for _ in range(5):
        shuffled = answers[:]
        while shuffled == answers:
            rng.shuffle(shuffled)
        worse += coherence(list(zip(users, shuffled, strict=True))) < coherence(SUPPORT)
    assert worse == 5


def test_lexical_coherence_components_and_facts() -> None:
    score = score_transcript(
        messages(SUPPORT),
        ["lexical_coherence"],
        facts=[{"key": "tracking_number", "value": "TRK-99812", "introduced_in": 2}],
    )["lexical_coherence"]
    assert set(score.details) >= {
        "relevance",
        "context",
        "continuity",
        "consistency",
        "topic_drift",
    }
    assert score.details["consistency"] == 1.0 and score.details["consistency_checks"] == 1
    contradicted = [
        *SUPPORT[:3],
        ("When will it arrive?", "Tracking number TRK-11111 says Friday."),
    ]
    bad = score_transcript(
        messages(contradicted),
        ["lexical_coherence"],
        facts=[{"key": "tracking_number", "value": "TRK-99812", "introduced_in": 2}],
    )["lexical_coherence"]
    # of the two responses that state the tracking number, one contradicts it; the two
    # that say nothing of it check nothing
    assert bad.details["consistency"] == 0.5 and bad.details["consistency_checks"] == 2
    silent = score_transcript(
        messages([SUPPORT[0], SUPPORT[2], SUPPORT[3]]),
        ["lexical_coherence"],
        facts=[{"key": "tracking_number", "value": "TRK-99812", "introduced_in": 1}],
    )["lexical_coherence"]
    assert "consistency" not in silent.details and silent.details["consistency_checks"] == 0


def test_conversation_flow_rewards_progress_and_punishes_repetition() -> None:
    flowing = score_transcript(messages(SUPPORT), ["conversation_flow"])["conversation_flow"]
    repeated = score_transcript(
        messages([(u, SUPPORT[0][1]) for u, _ in SUPPORT]), ["conversation_flow"]
    )["conversation_flow"]
    assert flowing.value is not None and repeated.value is not None
    assert flowing.details["progression"] > repeated.details["progression"] + 0.5
    one_turn = score_transcript(messages(SUPPORT[:1]), ["conversation_flow"])["conversation_flow"]
    assert one_turn.value is None and "two or more" in (one_turn.reason or "")


def test_semantic_similarity_to_references() -> None:
    results = convsim.run_sync(
        "single_turn_qa", "scripted", metrics=["semantic_similarity"], limit=5
    )
    assert {r.scores["semantic_similarity"].value for r in results} == {1.0}
    results = convsim.run_sync(
        "single_turn_qa",
        "scripted",
        model_args={"use_references": "false"},
        metrics=["semantic_similarity"],
        limit=5,
    )
    assert all((r.scores["semantic_similarity"].value or 0) < 1.0 for r in results)


def test_a_plugged_in_embedder_is_used() -> None:
    class Constant:
        def embed(self, texts: Any) -> Any:
            return [[1.0, 0.0] for _ in texts]

    assert isinstance(Constant(), Embedder) and isinstance(TfidfEmbedder(), Embedder)
    metric = CoherenceMetric(embedder=Constant())
    conv = convsim.load_pack("customer_support").conversations[0]
    scorer = metric.scorer(conv)
    from convsim import TurnRecord, TurnStatus

    for i in range(3):
        scorer.update(
            TurnRecord(
                conversation_id="c",
                turn_index=i,
                turn_id=f"t{i}",
                role="assistant",
                status=TurnStatus.COMPLETED,
                user_message=f"question{i}",
                response=f"answer{i}",
            )
        )
    assert scorer.result().value == pytest.approx(1.0)  # identical vectors everywhere


def test_heavy_scorers_run_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []
    registry = METRICS.copy()

    class Spy(CoherenceMetric):
        name = "coherence"

        def scorer(self, conversation: Any) -> Any:
            inner = super().scorer(conversation)

            class Wrapped:
                def update(self, turn: Any) -> None:
                    inner.update(turn)  # cheap: gathers texts

                def result(self) -> Any:
                    seen.append(threading.get_ident())  # the TF-IDF work happens here
                    return inner.result()

            return Wrapped()

    registry.register("coherence", Spy, replace=True)
    results = convsim.run_sync(
        "customer_support", "scripted", metrics=["coherence"], metric_registry=registry, limit=2
    )
    assert seen and loop_thread not in seen
    assert all(r.scores["coherence"].value is not None for r in results)


def test_an_assistant_opening_is_not_scored_for_relevance() -> None:
    opening = [{"role": "assistant", "content": "Hello! How can I help today?"}]
    score = score_transcript([*opening, *messages(SUPPORT)], ["coherence"])["coherence"]
    alone = score_transcript(messages(SUPPORT), ["coherence"])["coherence"]
    assert len(score.details["by_turn"]) == len(SUPPORT)  # the opening answers no one
    assert min(score.details["by_turn"]) > 0.2  # no zero for the opening
    assert score.value == pytest.approx(alone.value, abs=0.05)


@pytest.mark.parametrize("name", ["coherence", "conversation_flow"])
@pytest.mark.parametrize("blank", ["", "   ", "\U0001f44d\U0001f389"])
def test_texts_with_no_words_are_not_scored(name: str, blank: str) -> None:
    pairs = [("\U0001f600", blank), ("\U0001f642", blank)]
    score = score_transcript(messages(pairs), [name])[name]
    assert score.value is None and "no comparable words" in (score.reason or "")


def test_conversation_flow_skips_an_assistant_opening_and_blank_responses() -> None:
    opening = [{"role": "assistant", "content": "Hello! How can I help today?"}]
    with_opening = score_transcript([*opening, *messages(SUPPORT)], ["conversation_flow"])
    alone = score_transcript(messages(SUPPORT), ["conversation_flow"])
    assert with_opening["conversation_flow"].details["relevance"] == pytest.approx(
        alone["conversation_flow"].details["relevance"], abs=0.05
    )
    blank_reply = [*SUPPORT[:2], (SUPPORT[2][0], "   ")]
    flow = score_transcript(messages(blank_reply), ["conversation_flow"])["conversation_flow"]
    full = score_transcript(messages(SUPPORT[:3]), ["conversation_flow"])["conversation_flow"]
    assert flow.details["progression"] < full.details["progression"]


def test_a_paraphrase_scores_above_an_echo() -> None:
    """Answering in other words fits; repeating the user's words back adds nothing.
    TF-IDF coherence gets this backwards."""
    user = "My flight to Boston was cancelled and I need to get there by Friday morning."
    paraphrase = (
        "Sorry about that. I can rebook you on Thursday's evening departure, "
        "arriving before Friday."
    )
    echo = "Your flight to Boston was cancelled and you need to get there by Friday morning."
    semantic = {
        name: coherence([(user, answer)]) for name, answer in (("para", paraphrase), ("echo", echo))
    }
    assert semantic["para"] > semantic["echo"] + 0.2
    lexical = {
        name: score_transcript(messages([(user, answer)]), ["lexical_coherence"])[
            "lexical_coherence"
        ].value
        for name, answer in (("para", paraphrase), ("echo", echo))
    }
    assert lexical["echo"] > lexical["para"]  # the blind spot the new scorer removes


def test_coherence_scores_each_turn_and_takes_the_lower_quartile() -> None:
    """One off-topic answer among fitting ones pulls the conversation down more than a
    mean would, and the turn scores show which one it was."""
    mixed = [*SUPPORT[:3], (SUPPORT[3][0], COOKING[0][1])]
    score = score_transcript(messages(mixed), ["coherence"])["coherence"]
    by_turn = score.details["by_turn"]
    assert len(by_turn) == 4 and min(by_turn) == by_turn[3]
    assert score.value is not None and score.value < score.details["mean"]
    assert score.details["last_turn"] == by_turn[3]
    assert score.details["embedder"] == "wordllama"


def test_wordllama_loads_from_the_package_without_touching_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from convsim.metrics import _wordllama

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _wordllama._model.cache_clear()
    vectors = _wordllama.WordLlamaEmbedder().embed(["a red car", "a crimson automobile", "tax law"])
    assert vectors.shape == (3, 256)
    near, far = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert near > far


def _wordllama_inference() -> Any:
    """WordLlama's own ``WordLlamaInference`` class, imported without letting its
    ``logging.basicConfig()`` configure the root logger."""
    import logging

    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        from wordllama.inference import WordLlamaInference
    finally:
        root.removeHandler(guard)
    return WordLlamaInference


def _varied_texts() -> list[str]:
    """Texts short and long, blank, emoji, accents, and long histories."""
    rng = random.Random(7)
    pieces = [text for pair in SUPPORT + COOKING for text in pair]
    pieces += ["", "   ", "🙂", "naïve café — déjà vu", "x" * 3000, "Thanks!\n\nBye."]
    histories = [" ".join(rng.choices(pieces, k=rng.randint(2, 40))) for _ in range(80)]
    return pieces + histories


def test_wordllama_vectors_are_those_of_wordllamas_own_embed() -> None:
    """Pooled one text at a time, the vectors are WordLlama's own, bit for bit, so scores
    stay what they were."""
    import numpy as np

    from convsim.metrics import _wordllama

    texts = _varied_texts()
    model = _wordllama._read_model()
    theirs = _wordllama_inference()(model.table, _wordllama._read_model().tokenizer).embed(texts)
    ours = _wordllama.WordLlamaEmbedder().embed(texts)
    norms = np.linalg.norm(theirs, axis=1, keepdims=True)
    expected = np.where(norms > 0, theirs / np.maximum(norms, 1e-12), 0.0)
    expected[[not t.strip() for t in texts]] = 0.0
    assert ours.dtype == np.float32 and np.array_equal(ours, expected)


def test_embedding_a_long_history_beside_short_texts_pads_nothing() -> None:
    """Coherence embeds each response beside the whole conversation before it: the
    short texts are not padded to the long one's length (WordLlama's own embed takes
    hundreds of MB for these texts)."""
    import tracemalloc

    from convsim.metrics import _wordllama

    history = " ".join(f"The parcel number {i} went to depot {i % 97}." for i in range(200))
    texts = [history] + [f"Short answer number {i}." for i in range(63)]
    embedder = _wordllama.WordLlamaEmbedder()
    embedder.embed(["warm up: the model is loaded once"])
    tracemalloc.start()
    try:
        vectors = embedder.embed(texts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert vectors.shape == (64, 256)
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MB"
