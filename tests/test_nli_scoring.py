"""consistency, context_retention and nli_coherence with a contextual pair classifier.

A fake classifier stands in for the ONNX model: a pair contradicts when exactly one of
its texts holds the word "not". Without a classifier the pattern backends score as
they did before (a golden file recorded from the pattern-only code).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from convsim.metrics import METRICS, _contextual, score_transcript
from convsim.metrics._consistency import ConsistencyMetric
from convsim.metrics._nli_consistency import PAIR_CAP

GOLDEN = Path(__file__).parent / "data" / "pattern_scores.json"
PERSONA = "i am 25 years old.\ni live in lisbon."
CORPUS = [
    [("How old are you?", "I'm 25, and I live in Lisbon."),
     ("Nice. Tell me more.", "I am 31 years old and I live in Porto.")],
    [("Hi, my name is Dana and I have two kids.", "Hello Dana!"),
     ("Can you recap?", "Sure: your name is Maria and you have three kids.")],
    [("Do you like jazz?", "I love jazz, especially live."),
     ("What about concerts?", "Honestly I don't like jazz at all.")],
    [("I have two dogs.", "Two dogs, lovely."),
     ("Now I have three dogs.", "You have three dogs now.")],
    [("Hello there.", "Hi! How can I help?"), ("Just chatting.", "Sounds good to me.")],
    [("My flight is BA 249 on March 3.", "Noted: flight BA 249."),
     ("Remind me, what was my flight?", "Your flight is BA 2490."),
     ("And I am a nurse.", "You are a teacher, right? I do not like hospitals.")],
    [("I work as a nurse.", "I work as a chef."), ("Cool.", "I work as a pilot and I'm 40.")],
]  # fmt: skip

_NOT = re.compile(r"\bnot\b", re.I)


class Probabilities(NamedTuple):
    entailment: float
    neutral: float
    contradiction: float


class FakeClassifier:
    """Contradiction (0.9) when exactly one text of a pair says "not"; else 0.1."""

    model_id = "fake/not-flips"

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []
        self.threads: set[str] = set()

    def classify(self, pairs: Sequence[tuple[str, str]]) -> list[Probabilities]:
        self.threads.add(threading.current_thread().name)
        self.pairs += pairs
        out = []
        for premise, hypothesis in pairs:
            flips = bool(_NOT.search(premise)) != bool(_NOT.search(hypothesis))
            p = 0.9 if flips else 0.1
            out.append(Probabilities((1 - p) / 2, (1 - p) / 2, p))
        return out


def _messages(pairs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    messages = []
    for user, assistant in pairs:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages


def _with(classifier: Any) -> Any:
    registry = METRICS.copy()
    registry.register(
        "consistency", partial(ConsistencyMetric, classifier=classifier), replace=True
    )
    return registry


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVSIM_NLI_MODEL", raising=False)
    monkeypatch.setattr(_contextual, "pair_classifier", lambda: None)


def test_without_a_model_the_pattern_backends_score_as_before(no_model: None) -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    for pairs, expected in zip(CORPUS, golden, strict=True):
        scores = score_transcript(
            _messages(pairs), ["consistency", "context_retention"], metadata={"persona": PERSONA}
        )
        got = {
            k: {"value": s.value, "status": s.status, "reason": s.reason, "details": s.details}
            for k, s in scores.items()
        }
        consistency = got["consistency"]
        if consistency["value"] is not None:
            assert consistency["details"].pop("backend") == "pattern"
        got = json.loads(json.dumps(got, sort_keys=True))
        assert got == expected


def test_the_default_metric_uses_the_process_classifier_when_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeClassifier()
    monkeypatch.setattr(_contextual, "pair_classifier", lambda: fake)
    metric = ConsistencyMetric()
    assert metric.classifier is fake and metric.cpu_heavy is True
    monkeypatch.setattr(_contextual, "pair_classifier", lambda: None)
    plain = ConsistencyMetric()
    assert plain.classifier is None and plain.cpu_heavy is False


def test_nli_consistency_reports_the_contradicting_pair() -> None:
    fake = FakeClassifier()
    result = score_transcript(
        _messages(
            [
                ("I have a dog named Rex.", "I love dogs and I walk mine every day."),
                ("Do you?", "Well, I do not walk my dog every day."),
            ]
        ),
        ["consistency"],
        registry=_with(fake),
    )["consistency"]
    assert result.value == pytest.approx(0.1)
    d = result.details
    assert d["backend"] == "nli" and d["model"] == "fake/not-flips"
    pair = d["contradicting_pair"]
    assert pair["statement"] == "Well, I do not walk my dog every day."
    assert pair["turn_id"] == "t2" or pair["turn_id"].endswith("2")
    assert pair["premise_source"] in ("assistant", "user")
    assert d["pairs_scored"] == d["pairs_available"] == len(fake.pairs)


def test_nli_consistency_holds_the_assistant_to_both_personas_and_facts() -> None:
    fake = FakeClassifier()
    result = score_transcript(
        _messages([("Hello.", "Hi there, I am not a doctor at all.")]),
        ["consistency"],
        registry=_with(fake),
        metadata={"persona": "I am a doctor in Lisbon."},
    )["consistency"]
    assert result.value == pytest.approx(0.1)
    assert result.details["contradicting_pair"]["premise_source"] == "persona"
    premises = {p for p, _ in fake.pairs}
    assert "I am a doctor in Lisbon." in premises


def test_nli_consistency_with_nothing_before_any_statement_is_not_applicable() -> None:
    result = score_transcript(
        _messages([("Hi?", "Hello! What can I do for you today?")]),
        ["consistency"],
        registry=_with(FakeClassifier()),
    )["consistency"]
    assert result.value is None and result.status == "not_applicable"
    assert result.details["backend"] == "nli"


def test_nli_consistency_scores_at_most_the_cap_of_pairs() -> None:
    fake = FakeClassifier()
    turns = [
        (f"I like topic {i} a lot.", f"Topic {i} is something I enjoy a lot too.")
        for i in range(12)
    ]
    turns.append(("Really?", "I do not enjoy topic 3 at all."))
    result = score_transcript(_messages(turns), ["consistency"], registry=_with(fake))[
        "consistency"
    ]
    d = result.details
    assert d["pairs_available"] > PAIR_CAP == d["pairs_scored"] == len(fake.pairs) == d["pair_cap"]
    # the pairs that share the most words are kept: the contradiction on topic 3 is among them
    assert result.value == pytest.approx(0.1)
    assert "topic 3" in d["contradicting_pair"]["premise"].lower()


@pytest.mark.anyio
async def test_the_nli_backend_runs_in_a_worker_thread() -> None:
    from convsim.metrics import ascore_transcript

    fake = FakeClassifier()
    result = await ascore_transcript(
        _messages(
            [("I have a cat.", "Cats are great pets to have."), ("Yes.", "I do not like cats.")]
        ),
        ["consistency"],
        registry=_with(fake),
    )
    assert result["consistency"].details["backend"] == "nli"
    assert fake.threads and threading.main_thread().name not in fake.threads


# -- nli_coherence --------------------------------------------------------------------


def _coherence(classifier: Any) -> Any:
    from convsim.metrics._nli_coherence import NliCoherenceMetric

    registry = METRICS.copy()
    registry.register(
        "nli_coherence", partial(NliCoherenceMetric, classifier=classifier), replace=True
    )
    return registry


def test_nli_coherence_scores_each_response_given_its_context() -> None:
    fake = FakeClassifier()
    chat = [
        ("I need a table for two tonight.", "Sure, a table for two tonight is booked."),
        ("Is it by the window?", "It is not by the window, sorry."),
        ("That is fine.", "Great, see you tonight."),
        ("Thanks.", "You are welcome, enjoy the dinner."),
    ]
    result = score_transcript(_messages(chat), ["nli_coherence"], registry=_coherence(fake))
    score = result["nli_coherence"]
    d = score.details
    assert d["backend"] == "nli" and d["model"] == "fake/not-flips"
    assert d["by_turn"] == pytest.approx([0.9, 0.1, 0.1, 0.9])  # "not" in the context flips
    assert score.value == pytest.approx(0.1)  # the 25th percentile
    premise, hypothesis = fake.pairs[1]
    assert hypothesis == "It is not by the window, sorry."
    assert premise.endswith("Is it by the window?")  # the message answered comes last
    assert len(premise.split(". ")) <= 3


def test_coherence_keeps_wordllama_and_says_which_backend_scored(no_model: None) -> None:
    chat = _messages([("Hello, I like tea.", "Tea is lovely."), ("Green?", "Green tea, yes.")])
    details = score_transcript(chat, ["coherence"])["coherence"].details
    assert details["backend"] == details["embedder"] == "wordllama"


def test_nli_coherence_without_a_model_stops_before_testing_nothing(no_model: None) -> None:
    from convsim import ConfigError

    chat = _messages([("Hello, I like tea.", "Tea is lovely.")])
    with pytest.raises(ConfigError, match="CONVSIM_NLI_MODEL"):
        score_transcript(chat, ["coherence", "nli_coherence"])


def test_nli_coherence_asked_for_without_a_model_exits_2_before_the_run(
    no_model: None, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from convsim.cli import main

    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "customer_support",
            "--model",
            "scripted",
            "--metrics",
            "nli_coherence",
            "--limit",
            "1",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "nli_coherence needs an NLI model" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_nli_coherence_with_no_context_is_not_applicable() -> None:
    result = score_transcript(
        [{"role": "assistant", "content": "Welcome!"}],
        ["nli_coherence"],
        registry=_coherence(FakeClassifier()),
    )["nli_coherence"]
    assert result.status == "not_applicable"


# -- context_retention (reference-free) --------------------------------------------------


def _retention(classifier: Any) -> Any:
    from convsim.metrics._retention import ContextRetentionMetric

    registry = METRICS.copy()
    registry.register(
        "context_retention", partial(ContextRetentionMetric, classifier=classifier), replace=True
    )
    return registry


def test_retention_reads_stated_otherwise_with_the_classifier() -> None:
    fake = FakeClassifier()
    chat = _messages(
        [
            ("My flight is BA 249 and I travel with my dog.", "Noted, flight BA 249."),
            ("What else?", "Your dog is not allowed on flight BA 249, I am afraid."),
        ]
    )
    score = score_transcript(chat, ["context_retention"], registry=_retention(fake))
    d = score["context_retention"].details
    assert d["backend"] == "nli" and d["model"] == "fake/not-flips"
    (contradiction,) = d["contradictions"]
    assert contradiction["reason"].startswith("stated otherwise (nli 0.90)")
    assert contradiction["turn_id"] == d["missed"][0]["turn_id"]
    assert fake.pairs == [
        (
            "My flight is BA 249 and I travel with my dog.",
            "Your dog is not allowed on flight BA 249, I am afraid.",
        )
    ]


def test_retention_without_the_classifier_keeps_its_patterns(no_model: None) -> None:
    chat = _messages(
        [
            ("I am 30 years old.", "Thirty, noted."),
            ("And?", "You are 31 years old, so you qualify."),
        ]
    )
    pattern = score_transcript(chat, ["context_retention"])["context_retention"]
    assert "backend" not in pattern.details
    assert pattern.details["contradictions"][0]["reason"].startswith("stated age=")
    nli = score_transcript(chat, ["context_retention"], registry=_retention(FakeClassifier()))
    # the fake sees no "not": the check is the classifier's, which finds nothing here
    assert nli["context_retention"].status == "not_applicable"
    assert "no evidence" in (nli["context_retention"].reason or "")
