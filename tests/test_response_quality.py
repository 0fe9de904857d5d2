"""response_quality: structure, relevance to the prompt, completeness against keywords."""

from __future__ import annotations

import pytest

from convsim.metrics import TfidfEmbedder, response_quality, score_transcript
from convsim.metrics._quality import keyword_coverage, structure

PROMPT = "Explain the concept of recursion in programming."
KEYWORDS = ["function", "calls", "itself"]
ON_TOPIC = (
    "Recursion is a programming technique where a function calls itself to solve a smaller "
    "instance of the same problem. Each call works on a smaller input until it reaches a "
    "base case, which returns without calling itself again."
)
OFF_TOPIC = (
    "The best time to plant tomatoes is in late spring, after the last frost, in a sunny "
    "spot with rich soil and"
)


def test_an_on_topic_complete_answer_beats_an_off_topic_incomplete_one() -> None:
    good = response_quality(ON_TOPIC, prompt=PROMPT, required_keywords=KEYWORDS)
    bad = response_quality(OFF_TOPIC, prompt=PROMPT, required_keywords=KEYWORDS)
    assert good.value is not None and bad.value is not None
    assert good.value > 0.8 and bad.value < 0.3
    assert good.relevance.value > 0.5 > 0.1 > bad.relevance.value
    assert (good.completeness.value, bad.completeness.value) == (1.0, 0.0)
    assert bad.completeness.details["missing"] == KEYWORDS
    # the off-topic answer also stops mid-sentence
    assert bad.structure.details["signals"]["ends_cleanly"] == 0.0
    assert good.structure.value == 1.0


def test_each_part_is_in_the_details_and_the_value_is_their_mean() -> None:
    score = response_quality(ON_TOPIC, prompt=PROMPT, required_keywords=KEYWORDS).score()
    parts = [score.details[p] for p in ("structure", "relevance", "completeness")]
    assert score.value == pytest.approx(sum(parts) / 3)
    assert score.details["relevance_details"]["relevant_to"] == "prompt"
    assert "not_applicable" not in score.details


def test_a_part_with_nothing_to_measure_is_left_out_not_scored() -> None:
    quality = response_quality(ON_TOPIC, prompt=PROMPT)  # no keywords
    assert quality.completeness.value is None
    assert quality.details["not_applicable"] == {
        "completeness": "the task gives no required keywords"
    }
    assert quality.value == pytest.approx((quality.structure.value + quality.relevance.value) / 2)


def test_a_short_answer_with_nothing_to_compare_to_is_not_applicable() -> None:
    quality = response_quality("Paris")
    assert quality.value is None
    score = quality.score()
    assert score.status == "not_applicable"
    assert "fewer than 8 words" in str(score.reason) and "no prompt" in str(score.reason)


def test_relevance_falls_back_to_the_reference() -> None:
    quality = response_quality("Paris is the capital of France.", reference="Paris")
    assert quality.relevance.details["relevant_to"] == "reference"
    assert quality.relevance.value is not None and quality.relevance.value > 0.3


def test_an_empty_answer_scores_zero_where_a_part_applies() -> None:
    quality = response_quality("   ", prompt=PROMPT, required_keywords=KEYWORDS)
    assert (quality.structure.value, quality.relevance.value, quality.completeness.value) == (
        0.0,
        0.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("answer", "signal", "value"),
    [
        ("Here is the code:\n```python\nprint('hi')\n", "fences_closed", 0.0),
        ("Here is the code:\n```python\nprint('hi')\n```", "fences_closed", 1.0),
        ("Here is the code:\n```python\nprint('hi')\n```", "ends_cleanly", 1.0),
        ("It works because the function keeps calling until the", "ends_cleanly", 0.0),
        ("Use a loop over the items. " * 4, "distinct_sentences", 0.25),
        ("word " * 130 + ".", "paragraphs", 0.0),
        ("word " * 65 + ".\n\n" + "word " * 65 + ".", "paragraphs", 1.0),
        ("This one sentence goes on " + "and on " * 30 + "forever.", "sentence_length", 0.0),
    ],
)
def test_structure_signals(answer: str, signal: str, value: float) -> None:
    part = structure(answer)
    assert part.details["signals"][signal] == pytest.approx(value)


def test_completeness_is_over_all_the_answers_of_a_conversation() -> None:
    messages = [
        {"role": "user", "content": "Write batch_records with a limit of 500."},
        {"role": "assistant", "content": "Here is batch_records, which caps batches."},
        {"role": "user", "content": "What is its complexity?"},
        {"role": "assistant", "content": "It runs in O(n) time over the records."},
    ]
    keywords = ["batch_records", "O(n)", "500"]
    score = score_transcript(messages, ["response_quality"], required_keywords=keywords)
    quality = score["response_quality"]
    assert quality.details["completeness"] == pytest.approx(2 / 3)
    assert quality.details["completeness_details"]["missing"] == ["500"]
    assert quality.details["turns"] == 2


def test_the_metric_reads_the_user_message_the_reference_and_the_keywords() -> None:
    on = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": ON_TOPIC}]
    off = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": OFF_TOPIC}]
    good = score_transcript(on, ["response_quality"], required_keywords=KEYWORDS)
    bad = score_transcript(off, ["response_quality"], required_keywords=KEYWORDS)
    assert good["response_quality"].value > 0.8 > 0.3 > bad["response_quality"].value


def test_keyword_matching_is_whole_words_and_case_insensitive() -> None:
    part = keyword_coverage(["The FUNCTION calls back"], ["function", "call", "calls"])
    assert part.details == {"found": ["function", "calls"], "missing": ["call"]}


def test_another_embedder_can_measure_relevance() -> None:
    quality = response_quality(ON_TOPIC, prompt=PROMPT, embedder=TfidfEmbedder())
    assert quality.relevance.details["embedder"] == "tfidf"
    assert quality.relevance.value is not None and quality.relevance.value > 0
