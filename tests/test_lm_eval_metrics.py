"""lm-eval's offline metrics inside convsim: ``lm_eval:<name>``."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import sacrebleu

from convsim import ConfigError
from convsim.metrics import METRICS, score_transcript

PAIRS = [
    ("Translate: le chat", "the cat sat on the mat", "the cat sat on the mat"),
    ("Translate: le chien", "a dog barks", "the dog barks loudly"),
    ("Translate: la maison", "house big", "the big house"),
]


def transcript(pairs: list[tuple[str, str, str]]) -> tuple[list[dict[str, str]], dict[int, str]]:
    messages = []
    for user, answer, _ in pairs:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return messages, {i + 1: gold for i, (_, _, gold) in enumerate(pairs)}


def value(name: str, pairs: list[tuple[str, str, str]] = PAIRS) -> float:
    messages, references = transcript(pairs)
    score = score_transcript(messages, [name], reference_responses=references)[name]
    assert score.value is not None, score.reason
    return score.value


def test_corpus_metrics_equal_sacrebleu_over_the_conversations_turns() -> None:
    answers = [a for _, a, _ in PAIRS]
    golds = [[g for _, _, g in PAIRS]]
    assert value("lm_eval:bleu") == pytest.approx(sacrebleu.corpus_bleu(answers, golds).score)
    assert value("lm_eval:chrf") == pytest.approx(sacrebleu.corpus_chrf(answers, golds).score)
    assert value("lm_eval:ter") == pytest.approx(sacrebleu.corpus_ter(answers, golds).score)


def test_exact_match_and_rouge_per_turn() -> None:
    assert value("lm_eval:exact_match") == pytest.approx(1 / 3)  # the first turn only
    assert value("lm_eval:rouge1", PAIRS[:1]) == pytest.approx(1.0)
    assert 0 < value("lm_eval:rougeL") < 1


@pytest.mark.parametrize("name", ["bleu", "chrf", "chrf++", "ter", "exact_match", "rougeL"])
def test_better_answers_score_better_in_the_metrics_direction(name: str) -> None:
    perfect = [(u, g, g) for u, _, g in PAIRS]
    wrong = [(u, "completely unrelated words here", g) for u, _, g in PAIRS]
    metric = METRICS.get(f"lm_eval:{name}")()
    good, bad = value(f"lm_eval:{name}", perfect), value(f"lm_eval:{name}", wrong)
    assert (good > bad) is metric.higher_is_better
    assert metric.higher_is_better is (name != "ter")


@pytest.mark.parametrize("name", ["acc", "perplexity", "f1", "bertscore", "meteor"])
def test_metrics_lm_eval_cannot_give_offline_are_refused_clearly(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import evaluate

    def no_hub(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the hub was asked for a metric")

    monkeypatch.setattr(evaluate, "load", no_hub)
    with pytest.raises(ConfigError, match=rf"lm_eval:{name} is not available.*lm_eval:bleu"):
        METRICS.get(f"lm_eval:{name}")()


def test_without_references_the_metric_does_not_apply() -> None:
    messages, _ = transcript(PAIRS)
    score = score_transcript(messages, ["lm_eval:bleu"])["lm_eval:bleu"]
    assert score.value is None and score.status == "not_applicable"


def test_a_run_refuses_an_unavailable_lm_eval_metric_before_any_model_call() -> None:
    import convsim

    with pytest.raises(ConfigError, match="lm_eval:acc is not available"):
        convsim.run_sync("customer_support", "scripted", metrics=["lm_eval:acc"], limit=1)


def test_importing_convsim_and_its_metrics_leaves_lm_eval_unloaded() -> None:
    code = (
        "import sys, convsim, convsim.metrics, convsim.adapters, convsim.scenarios; "
        "print(sorted(m for m in ('lm_eval', 'datasets', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
