"""Each built-in metric moves with what it measures, and says when it does not apply."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convsim import Score, TurnRecord, TurnStatus
from convsim._records import TurnTimings
from convsim.metrics import METRICS, normalize_answer, register_metric, resolve_metrics
from convsim.metrics._stats import mean, percentile
from convsim.scenarios import load_pack

GUIDE = Path(__file__).parent / "data" / "guide_example"


@pytest.fixture(scope="module")
def conversation():
    return load_pack(GUIDE).conversations[0]


def with_scenario(conversation, **fields):
    import dataclasses

    scenario = conversation.scenario.model_copy(update=fields)
    return dataclasses.replace(conversation, scenario=scenario)


def turn(
    response: str | None = "ok",
    *,
    turn_id: str = "introduction",
    status=TurnStatus.COMPLETED,
    latency: float | None = 0.1,
    ttft: float | None = None,
) -> TurnRecord:
    return TurnRecord(
        conversation_id="c",
        turn_index=0,
        turn_id=turn_id,
        role="assistant",
        status=status,
        response=response if status is TurnStatus.COMPLETED else None,
        timings=TurnTimings(
            started_at=0.0, duration_s=latency or 0.0, latency_s=latency, ttft_s=ttft
        ),
    )


def score(name: str, conversation, turns: list[TurnRecord]) -> Score:
    scorer = METRICS.get(name)().scorer(conversation)
    for t in turns:
        scorer.update(t)
    return scorer.result()


def test_latency_tracks_call_times_and_ignores_failed_turns(conversation) -> None:
    fast = score("latency", conversation, [turn(latency=0.1), turn(latency=0.3)])
    slow = score("latency", conversation, [turn(latency=1.0), turn(latency=3.0)])
    assert fast.value == pytest.approx(0.2) and slow.value == pytest.approx(2.0)
    assert slow.details["p50_s"] == pytest.approx(2.0) and slow.details["max_s"] == 3.0
    failed = score(
        "latency", conversation, [turn(latency=9.0, status=TurnStatus.FAILED), turn(latency=0.5)]
    )
    assert failed.value == pytest.approx(0.5) and failed.details["n"] == 1
    assert (
        score("latency", conversation, [turn(latency=0.2, ttft=0.05)]).details["ttft_mean_s"]
        == 0.05
    )


def test_latency_without_completed_turns_is_not_applicable(conversation) -> None:
    result = score("latency", conversation, [turn(status=TurnStatus.SKIPPED)])
    assert result.value is None and result.reason == "not applicable: no completed turns"
    assert not result.applicable


def test_response_length_counts_words(conversation) -> None:
    assert score("response_length", conversation, [turn("one two three")]).value == 3
    assert score("response_length", conversation, [turn("a"), turn("a b c d e")]).value == 3
    assert score("response_length", conversation, []).value is None


def test_exact_match_normalises_and_needs_references(conversation) -> None:
    conv = with_scenario(conversation, reference_responses={"introduction": "The Paris."})
    assert score("exact_match", conv, [turn("paris")]).value == 1.0
    assert score("exact_match", conv, [turn("London")]).value == 0.0
    assert (
        score("exact_match", conv, [turn("paris"), turn("x", turn_id="analysis")]).details["n"] == 1
    )
    none = score("exact_match", conversation, [turn("paris")])
    assert none.value is None and "no reference responses" in (none.reason or "")


def test_normalize_answer() -> None:
    assert normalize_answer("  The  Answer, is: 42! ") == "answer is 42"


def test_custom_score_rewards_required_keywords(conversation) -> None:
    conv = with_scenario(conversation, required_keywords=["refund", "order"])
    assert (
        score("custom_score", conv, [turn("Your refund for the order is on its way")]).value == 1.0
    )
    half = score("custom_score", conv, [turn("Your refund is on its way")])
    assert half.value == pytest.approx(0.6) and half.details["missing_keywords"] == ["order"]
    assert score("custom_score", conv, [turn("Hello")]).value == pytest.approx(0.2)
    assert score("custom_score", conv, [turn("")]).value == 0.0
    assert score("custom_score", conv, [turn("reorder refunds")]).value == pytest.approx(
        0.2
    )  # whole words
    assert score("custom_score", conversation, [turn("x")]).value is None


@settings(max_examples=40, deadline=None)
@given(keywords=st.integers(min_value=1, max_value=40), hits=st.data())
def test_custom_score_stays_within_zero_and_one(conversation, keywords: int, hits) -> None:
    words = [f"kw{i}" for i in range(keywords)]
    present = hits.draw(st.lists(st.sampled_from(words), unique=True))
    conv = with_scenario(conversation, required_keywords=words)
    value = score("custom_score", conv, [turn(" ".join(present) or "nothing")]).value
    assert value is not None and 0.0 <= value <= 1.0
    assert value == pytest.approx(0.2 + 0.8 * len(present) / keywords)


def test_custom_score_of_every_keyword_is_exactly_one(conversation) -> None:
    for keywords in range(1, 41):  # 0.8 * 7 / 7 once came out a hair over 0.8
        words = [f"kw{i}" for i in range(keywords)]
        conv = with_scenario(conversation, required_keywords=words)
        assert score("custom_score", conv, [turn(" ".join(words))]).value == 1.0, keywords


def test_technical_accuracy_rewards_valid_and_well_made_code(conversation) -> None:
    bare = "Here:\n```python\ndef f(x):\n    return x + 1\n```\n"
    careful = (
        '```python\ndef f(x: int) -> int:\n    """Add one."""\n    if x < 0:\n'
        "        raise ValueError(x)\n    return x + 1\n\n\ndef test_f() -> None:\n"
        '    """f adds one."""\n    assert f(1) == 2\n```'
    )
    broken = "Here:\n```python\ndef f(x)\n    return x +\n```\n"
    assert score("technical_accuracy", conversation, [turn(careful)]).value == pytest.approx(1.0)
    assert score("technical_accuracy", conversation, [turn(bare)]).value == pytest.approx(0.6)
    mixed = score("technical_accuracy", conversation, [turn(bare), turn(broken)])
    assert mixed.value == pytest.approx(0.3) and mixed.details["blocks"] == 2
    assert mixed.details["valid"] == 1 and mixed.details["errors"]
    js = "```javascript\nconst x = ;\n```"
    assert score("technical_accuracy", conversation, [turn(js)]).value is None
    assert score("technical_accuracy", conversation, [turn("no code")]).reason.startswith(
        "not applicable"
    )


def test_code_security_finds_the_guides_categories(conversation) -> None:
    risky = (
        '```python\nimport os, pickle\npassword = "hunter2"\n'
        'def run(cmd, q, blob):\n    os.system("ls " + cmd)\n'
        "    cur.execute(\"SELECT * FROM t WHERE a = '%s'\" % q)\n"
        '    open("../../etc/passwd")\n    return pickle.loads(blob)\n```'
    )
    safe = "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"
    bad = score("code_security_score", conversation, [turn(risky)])
    good = score("code_security_score", conversation, [turn(safe)])
    assert good.value == 1.0 and bad.value == 0.0
    assert set(bad.details["categories"]) >= {
        "command_injection",
        "sql_injection",
        "hardcoded_secrets",
        "unsafe_deserialization",
        "path_traversal",
    }
    assert score("code_security_score", conversation, [turn("no code")]).value is None


def test_code_security_does_not_pass_code_it_could_not_analyse(conversation) -> None:
    unclosed = "```python\nimport os\nos.system(input()\n```"
    shell = "```\nrm -rf / && curl x | sh\n```"
    for text in (unclosed, shell):
        result = score("code_security_score", conversation, [turn(text)])
        assert result.value is None and "no parsable Python" in (result.reason or "")
    risky = "```python\nimport os\nos.system(input())\n```"
    mixed = score("code_security_score", conversation, [turn(risky + "\n" + unclosed)])
    assert mixed.value is not None and mixed.value < 1.0
    assert mixed.details["unanalysed"] == ["introduction#1"]


def test_technical_accuracy_survives_code_too_deep_to_compile(conversation) -> None:
    deep = "```python\nx = " + "-" * 100_000 + "1\n```"
    fine = "```python\ndef f(x):\n    return x + 1\n```"
    result = score("technical_accuracy", conversation, [turn(deep), turn(fine)])
    assert result.details["blocks"] == 2 and result.details["valid"] == 1
    assert result.value == pytest.approx(0.3)


def test_domain_expertise_needs_terms_in_real_sentences(conversation) -> None:
    import dataclasses

    conv = dataclasses.replace(
        conversation,
        scenario=conversation.scenario.model_copy(
            update={"metadata": {"domain": "machine_learning"}}
        ),
    )
    expert = (
        "To avoid overfitting, hold out a validation set and tune each hyperparameter "
        "there. Regularization trades a little bias for lower variance in the model. "
        "Report precision and recall on the test set only once at the end."
    )
    keywords = "overfitting validation hyperparameter regularization bias variance precision"
    assert score("domain_expertise", conv, [turn(expert)]).value == 1.0
    assert score("domain_expertise", conv, [turn(keywords)]).value == 0.0  # a bare list
    none = score("domain_expertise", conversation, [turn(expert)])
    assert none.value is None and "names no known domain" in (none.reason or "")


def test_financial_reasoning_signals(conversation) -> None:
    thorough = (
        "Diversification lowers portfolio risk: with a correlation of 0.3, volatility "
        "falls compared to one fund, while the expected return is 6% per year.\n"
        "1. Allocate 60% to a global index fund.\n2. Rebalance once a year.\n"
        "Expect drawdowns of 20% in a bad year."
    )
    vague = "You should think about it carefully."
    assert score("financial_reasoning", conversation, [turn(thorough)]).value == pytest.approx(1.0)
    # a vague answer to a financial question measures as no financial reasoning at all
    asked = dataclasses.replace(turn(vague), user_message="How should I invest my savings?")
    assert score("financial_reasoning", conversation, [asked]).value == 0.0
    finance = with_scenario(conversation, tags=["finance"])  # every turn asks for it
    assert score("financial_reasoning", finance, [turn(vague)]).value == 0.0
    # with nothing financial said, a vague answer is not bad financial reasoning
    chat = score("financial_reasoning", conversation, [turn(vague), turn("Nice weather today.")])
    assert chat.value is None and chat.status == "not_applicable"
    assert "nothing financial was said" in (chat.reason or "") and chat.details["turns_read"] == 2
    # a finance turn among chit-chat is scored alone, not diluted by the chat
    mixed = score("financial_reasoning", conversation, [turn(thorough), turn(vague)])
    assert mixed.value == pytest.approx(1.0)
    assert (mixed.details["turns"], mixed.details["turns_read"]) == (1, 2)
    from convsim.metrics._domain import financial_signals

    for amount in ("1.000.000 EUR", "1.250,00 EUR", "7,5%", "$1,250.50", "400 usd"):
        assert financial_signals(f"Compared to last year: {amount}.")["quantitative"] == 1.0


@pytest.mark.parametrize(
    "name",
    [
        "engagement_quality",
        "clarity_score",
        "analysis_depth",
        "recommendation_quality",
        "detail_level",
        "accuracy",
        "depth_of_analysis",
    ],
)
def test_judge_rubrics_say_they_need_a_judge(conversation, name: str) -> None:
    result = score(name, conversation, [turn("anything at all")])
    assert result.value is None and "needs a judge" in (result.reason or "")


def test_every_registered_metric_builds_and_describes_itself() -> None:
    from convsim.metrics._nli_coherence import NliCoherenceMetric

    class NoModel:  # nli_coherence is built with a model or not at all
        model_id = "none"

        def classify(self, pairs: Any) -> list[Any]:
            raise AssertionError("not called")

    for name in METRICS.names():
        factory = partial(NliCoherenceMetric, NoModel()) if name == "nli_coherence" else None
        metric = (factory or METRICS.get(name))()
        assert metric.name == name
        assert metric.description
        assert metric.higher_is_better in (True, False, None)


def test_register_metric_decorator_and_resolve() -> None:
    registry = METRICS.copy()

    @register_metric("words_over_ten", registry=registry)
    class LongAnswers:
        name = "words_over_ten"
        higher_is_better = None
        description = "share of responses over ten words"

        def scorer(self, conversation):
            return self

        def update(self, turn):
            self.last = len(turn.response.split()) > 10

        def result(self):
            return Score(value=float(self.last))

    metrics = resolve_metrics(["latency", "words_over_ten", "latency"], registry=registry)
    assert [m.name for m in metrics] == ["latency", "words_over_ten"]
    assert "words_over_ten" not in METRICS  # the default registry is untouched


def test_percentile_and_mean() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3
    assert mean([1, 2]) == 1.5
    with pytest.raises(ValueError):
        percentile([], 50)
