"""The guide's metrics engine: calculate_metric, custom metrics in convsim's registry,
validate_logic, assess_response_quality and the helpers the guide's engine calls."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import yaml

import convsim
from convsim import ConfigError, RegistryError, _registry
from convsim._registry import Registry
from convsim.lm_eval import (
    CustomMetricsEngine,
    EngineMetric,
    MetricsEngine,
    QualityScore,
)
from convsim.lm_eval import _engine_metrics as engine_metrics
from convsim.metrics import (
    METRICS,
    Metric,
    Score,
    registered_metrics,
    response_quality,
    score_transcript,
)

FINANCE = (
    "A diversified portfolio lowers risk: when the correlation between assets is low, the "
    "volatility of the whole portfolio falls below that of each holding, which lifts its "
    "sharpe ratio. Rebalance once a year to keep the allocation."
)
VAGUE = "Just buy whatever is trending right now and hold on to it."
TURNS = [
    {"prompt": "How do I sort a list in Python?", "response": "Use sorted(items) or items.sort()."},
    {"prompt": "And in reverse order?", "response": "Pass reverse=True to sorted or to sort."},
]


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry[Metric]:
    """A copy of convsim's metric registry for engines to register in."""
    copy = METRICS.copy()
    monkeypatch.setattr(MetricsEngine, "metric_registry", copy)
    return copy


class Engine(MetricsEngine):
    """An engine with one method metric and two custom metrics."""

    def __init__(self) -> None:
        super().__init__()
        self.register_custom_metrics()

    def register_custom_metrics(self) -> None:
        self.custom_metrics = {"shouting": self.shouting, "coherence": self.shouting}

    def calculate_words(self, response: str) -> int:
        return len(response.split())

    def shouting(self, response: str) -> float:
        """Share of the answer's letters in upper case."""
        letters = [c for c in response if c.isalpha()]
        return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


# -- calculate_metric ---------------------------------------------------------------------


def test_calculate_metric_dispatches_as_the_guide_does() -> None:
    engine = Engine()
    assert engine.calculate_metric("words", "one two three") == 3  # calculate_<name>
    assert engine.calculate_metric("shouting", "ABc") == pytest.approx(2 / 3)  # custom
    # a custom metric wins over convsim's metric of the same name
    assert engine.calculate_metric("coherence", "abc") == 0.0
    # then convsim's registry
    assert engine.calculate_metric("lexical_coherence", TURNS) > 0


def test_an_unknown_metric_is_a_value_error_that_names_the_known_ones() -> None:
    engine = Engine()
    with pytest.raises(ValueError, match="unknown metric 'nope'") as caught:
        engine.calculate_metric("nope", "x")
    assert isinstance(caught.value, RegistryError)
    assert {"words", "shouting", "coherence", "validate_logic"} <= set(caught.value.known)
    with pytest.raises(ValueError):
        engine.calculate_metric("metric", "x")  # not calculate_metric itself


def test_convsim_metrics_take_a_prompt_and_the_guides_turns() -> None:
    engine = MetricsEngine()
    quality = engine.calculate_metric("response_quality", FINANCE, prompt="How do I invest?")
    assert 0 < quality <= 1
    flow = engine.calculate_metric("conversation_flow", TURNS)
    assert 0 < flow <= 1
    assert engine.calculate_metric("conversation_flow", TURNS[:1]) is None  # needs two
    with pytest.raises(TypeError, match="expected an answer"):
        engine.calculate_metric("coherence", [1, 2])


# -- custom metrics in convsim's registry ----------------------------------------------


def test_custom_metrics_become_registry_metrics_unless_the_name_is_taken(
    registry: Registry[Metric],
) -> None:
    engine = Engine()
    assert engine.registration.registered == ("shouting",)
    assert engine.registration.kept == ("coherence",)  # convsim's stays convsim's
    assert registry.origin("shouting") == f"{__name__}:Engine"
    assert registry.origin("coherence") is None
    metric = registry.get("shouting")()
    assert isinstance(metric, EngineMetric)
    assert metric.description.startswith("Share of the answer's letters in upper case.")

    Engine()  # built again: it replaces its own names
    assert registry.origin("shouting") == f"{__name__}:Engine"

    class Other(MetricsEngine):
        def register_custom_metrics(self) -> None:
            self.custom_metrics = {"shouting": len}

    other = Other()
    other.register_custom_metrics()
    assert other.registration.kept == ("shouting",)  # another engine's name is kept
    assert registry.origin("shouting") == f"{__name__}:Engine"


def test_the_guides_engine_registers_its_five_names() -> None:
    engine = CustomMetricsEngine()
    assert set(engine.custom_metrics) == {
        "domain_expertise_score",
        "technical_accuracy",
        "code_security_score",
        "financial_reasoning",
        "conversation_flow",
    }
    assert engine.registration.registered == ("domain_expertise_score",)


def write_finance_pack(folder: Path) -> Path:
    folder.mkdir()
    config = {"task_name": "finance", "prompt_templates": {"default": "{question}"}}
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    problems = [
        {"id": "expert", "question": "How should I invest?", "expected_answer": FINANCE},
        {"id": "vague", "question": "How should I invest?", "expected_answer": VAGUE},
        {"id": "no_domain", "question": "How should I invest?", "expected_answer": FINANCE},
    ]
    for problem in problems[:2]:
        problem["domain"] = "finance"
    (folder / "problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    return folder


def test_a_metric_registered_the_guides_way_scores_in_a_run(
    tmp_path: Path, registry: Registry[Metric]
) -> None:
    CustomMetricsEngine()
    pack = write_finance_pack(tmp_path / "finance")
    results = convsim.run_sync(
        str(pack), "scripted", metrics=["domain_expertise_score"], metric_registry=registry
    )
    scores = {r.scenario_id: r.scores["domain_expertise_score"] for r in results}
    assert scores["expert"].value is not None and scores["vague"].value is not None
    assert scores["expert"].value > 0.5 > scores["vague"].value
    assert scores["no_domain"].status == "not_applicable"
    assert "metadata.domain" in str(scores["no_domain"].reason)


def test_without_the_engine_a_run_says_the_name_is_unknown(
    tmp_path: Path, registry: Registry[Metric]
) -> None:
    pack = write_finance_pack(tmp_path / "finance")
    with pytest.raises(RegistryError, match="unknown metric 'domain_expertise_score'"):
        convsim.run_sync(
            str(pack), "scripted", metrics=["domain_expertise_score"], metric_registry=registry
        )


# -- how an engine's function is called ---------------------------------------------------


def _score(function: Any, messages: list[dict[str, str]], **scenario: Any) -> Score:
    metric = EngineMetric("custom", function, "tests")
    registry: Registry[Metric] = Registry("metric")
    registry.register("custom", lambda: metric)
    return score_transcript(messages, ["custom"], registry=registry, **scenario)["custom"]


CHAT = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "How are you?"},
    {"role": "assistant", "content": "Very well, thank you."},
]


def test_a_turn_function_is_called_per_answer_and_averaged() -> None:
    seen: list[tuple[str, str]] = []

    def length(response: str, prompt: str) -> int:
        seen.append((prompt, response))
        return len(response)

    score = _score(length, CHAT)
    assert seen == [("Hello there", "Hi!"), ("How are you?", "Very well, thank you.")]
    assert score.value == pytest.approx((3 + 21) / 2)
    assert score.details == {"n": 2, "turns_read": 2}


def test_a_conversation_function_is_called_once_with_the_turns() -> None:
    calls: list[list[dict[str, Any]]] = []

    def turns(conversation_turns: list[dict[str, Any]]) -> float:
        calls.append(conversation_turns)
        return 0.5

    assert _score(turns, CHAT).value == 0.5
    [only] = calls
    assert [t["response"] for t in only] == ["Hi!", "Very well, thank you."]
    assert EngineMetric("c", turns, "tests").traits.kind == "conversation"


def test_context_and_doc_carry_the_scenario() -> None:
    got: dict[str, Any] = {}

    def look(response: str, context: dict[str, Any], doc: dict[str, Any]) -> bool:
        got.update(context=context, doc=doc)
        return True

    _score(look, CHAT[:2], metadata={"language": "go", "tests": ["x"]}, required_keywords=["a"])
    assert got["context"]["language"] == "go" and got["context"]["required_keywords"] == ["a"]
    assert got["doc"]["metadata"]["tests"] == ["x"]


def test_inputs_that_are_missing_leave_the_metric_not_applicable() -> None:
    def needs(response: str, reference: str, domain: str) -> float:
        raise AssertionError("never called without a reference and a domain")

    score = _score(needs, CHAT)
    assert score.status == "not_applicable"
    assert str(score.reason) == (
        "not applicable: no completed turn has a reference response; "
        "the scenario names no domain (metadata.domain)"
    )
    assert EngineMetric("n", needs, "t").traits.needs == {"reference", "domain"}
    assert _score(lambda response: None, CHAT).status == "not_applicable"
    assert _score(lambda response: Score.not_applicable("no"), CHAT).status == "not_applicable"


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (lambda response: 1 / 0, "ZeroDivisionError"),
        (lambda response: "great", "not a number"),
        (lambda response: float("nan"), "not a number"),
    ],
)
def test_a_broken_function_fails_the_score(function: Any, message: str) -> None:
    score = _score(function, CHAT)
    assert score.status == "failed" and message in str(score.reason)


def test_a_function_a_run_cannot_call_says_so_when_a_run_names_it(
    registry: Registry[Metric],
) -> None:
    class Odd(MetricsEngine):
        def register_custom_metrics(self) -> None:
            self.custom_metrics = {"odd": self.odd}

        def odd(self, response: str, colour: str) -> float:
            return 1.0

    engine = Odd()
    engine.register_custom_metrics()
    assert engine.registration.registered == ("odd",)
    with pytest.raises(ConfigError, match="cannot fill its parameter 'colour'"):
        registry.get("odd")()
    [info] = [i for i in registered_metrics(registry) if i.name == "odd"]
    assert info.unavailable is not None and "colour" in info.unavailable


def test_custom_metrics_must_be_functions() -> None:
    engine = MetricsEngine()
    with pytest.raises(TypeError, match="'broken'"):
        engine.custom_metrics = {"broken": 3}  # type: ignore[dict-item]


# -- entry points: engines other packages declare -----------------------------------------


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[EntryPoint]]]:
    points: dict[str, list[EntryPoint]] = {
        "convsim.metric_sources": [
            EntryPoint(
                "engines",
                "convsim.lm_eval._engine_metrics:register_engines",
                "convsim.metric_sources",
            )
        ],
        "convsim.metric_engines": [
            EntryPoint("mine", f"{__name__}:Engine", "convsim.metric_engines")
        ],
    }

    def found(group: str) -> list[EntryPoint]:
        return points.get(group, [])

    monkeypatch.setattr(_registry, "entry_points", found)
    monkeypatch.setattr(engine_metrics, "entry_points", found)
    yield points


def test_engines_a_package_declares_are_found_on_the_first_miss(
    declared: dict[str, list[EntryPoint]],
) -> None:
    fresh: Registry[Metric] = Registry(
        "metric", group="convsim.metrics", source_group="convsim.metric_sources"
    )
    assert "shouting" in fresh
    assert fresh.origin("shouting") == f"{__name__}:Engine"
    assert isinstance(fresh.get("shouting")(), EngineMetric)
    [info] = [i for i in registered_metrics(fresh) if i.name == "shouting"]
    assert (info.source, info.provider) == ("entry point", f"{__name__}:Engine")


def test_an_engine_that_cannot_be_built_is_named(
    declared: dict[str, list[EntryPoint]],
) -> None:
    declared["convsim.metric_engines"] = [
        EntryPoint("broken", "no_such_module_here:Engine", "convsim.metric_engines")
    ]
    fresh: Registry[Metric] = Registry("metric", source_group="convsim.metric_sources")
    with pytest.raises(ConfigError, match=r"metric engine 'broken'.*no_such_module_here"):
        fresh.get("anything")


def test_a_registry_copy_keeps_its_sources_and_origins(
    declared: dict[str, list[EntryPoint]],
) -> None:
    fresh: Registry[Metric] = Registry("metric", source_group="convsim.metric_sources")
    fresh.register("mine", "convsim.metrics._builtin:LatencyMetric", origin="a package")
    copy = fresh.copy()
    assert copy.origin("mine") == "a package" and "shouting" in copy
    copy.unregister("mine")
    copy.register("mine", "convsim.metrics._builtin:LatencyMetric")
    assert copy.origin("mine") is None and fresh.origin("mine") == "a package"


# -- validate_logic and assess_response_quality -------------------------------------------

CODE = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.mark.skipif(os.name != "posix", reason="the sandbox needs POSIX limits")
def test_validate_logic_runs_only_when_the_engine_allows_code() -> None:
    refused = MetricsEngine().validate_logic(CODE, ["assert add(1, 2) == 3"])
    assert not refused and refused.score.status == "not_applicable"
    allowed = MetricsEngine(allow_code=True)
    assert allowed.validate_logic(CODE, ["assert add(1, 2) == 3"])  # tests as the reference
    wrong = allowed.validate_logic(CODE, tests={"cases": ["assert add(1, 2) == 4"]})
    assert not wrong and (wrong.passed, wrong.total) == (0, 1)
    assert not allowed.validate_logic(CODE, "a reference answer in words")  # nothing to run
    assert MetricsEngine().validate_logic(CODE, ["assert add(1, 2) == 3"], allow_code=True)
    metadata = {"tests": ["assert add(1, 2) == 3"]}
    assert allowed.calculate_metric("validate_logic", CODE, metadata=metadata) == 1.0
    assert MetricsEngine().calculate_metric("validate_logic", CODE, metadata=metadata) is None
    with pytest.raises(ValueError, match="not Python"):
        allowed.validate_logic(CODE, ["assert ("])


def test_assess_response_quality_is_a_number_that_carries_its_parts() -> None:
    engine = MetricsEngine()
    reference = "Diversification across assets with low correlation reduces risk."
    good = engine.assess_response_quality(FINANCE, reference)
    bad = engine.assess_response_quality("I like turtles and", reference)
    assert isinstance(good, QualityScore) and isinstance(bad, QualityScore)
    assert good > bad
    assert min(0.5 * good, 1.0) == pytest.approx(0.5 * float(good))  # the guide's use
    assert good.relevance is not None and good.details["relevance_details"]["relevant_to"] == (
        "reference"
    )
    assert good.completeness is None  # no keywords given
    assert pickle.loads(pickle.dumps(good)) == good
    assert "structure=" in repr(good)
    assert engine.assess_response_quality("Paris") is None  # nothing to measure
    with pytest.raises(ValueError, match="no part"):
        QualityScore(response_quality("Paris"))


# -- the helpers the guide's engine calls ---------------------------------------------------


def test_the_financial_helpers_read_convsims_signals() -> None:
    engine = MetricsEngine()
    plan = "Put 60% in stocks: 0.6 x 8% = 4.8% a year. The risk is a drawdown. 1. Rebalance."
    assert engine.contains_quantitative_analysis(plan)
    assert engine.mentions_risk_factors(plan)
    assert engine.includes_implementation_details(plan)
    for helper in (
        engine.contains_quantitative_analysis,
        engine.mentions_risk_factors,
        engine.includes_implementation_details,
    ):
        assert not helper("What a lovely afternoon for a walk in the park.")


def test_the_flow_helpers_are_conversation_flows_parts() -> None:
    engine = MetricsEngine()
    flow = engine.score("conversation_flow", TURNS)
    assert engine.calculate_topic_consistency(TURNS) == flow.details["topic_consistency"]
    assert engine.calculate_response_relevance(TURNS) == flow.details["relevance"]
    assert engine.calculate_progression_quality(TURNS) == flow.details["progression"]
    assert engine.calculate_topic_consistency(TURNS[:1]) is None


def test_code_security_is_bandits_and_python_only() -> None:
    engine = CustomMetricsEngine()
    risky = engine.calculate_code_security("import os\nos.system('ls ' + user_input)\n")
    safe = engine.calculate_code_security("def add(a, b):\n    return a + b\n")
    assert risky is not None and safe == 1.0 and risky < safe
    assert engine.calculate_code_security_score("x = 1", "javascript") is None


def test_the_guides_five_metrics_tell_good_answers_from_bad() -> None:
    engine = CustomMetricsEngine()
    reference = "Diversification across assets with low correlation reduces risk."
    expert = engine.calculate_metric("domain_expertise_score", FINANCE, reference, "finance")
    vague = engine.calculate_metric("domain_expertise_score", VAGUE, reference, "finance")
    assert expert > 0.5 > vague
    assert engine.calculate_domain_expertise(FINANCE, reference, "astrology") is None
    good_code = '```python\ndef add(a: int, b: int) -> int:\n    """Add."""\n    return a + b\n```'
    assert engine.calculate_metric("technical_accuracy", good_code, None, {}) > (
        engine.calculate_metric("technical_accuracy", "```python\ndef add(a, b)\n```", None, {})
    )
    assert engine.calculate_metric("financial_reasoning", FINANCE, {}) > (
        engine.calculate_metric("financial_reasoning", VAGUE, {"domain": "finance"})
    )
    assert engine.calculate_metric("financial_reasoning", "Nice weather today.", {}) is None
    on_topic = engine.calculate_metric("conversation_flow", TURNS)
    off_topic = engine.calculate_metric(
        "conversation_flow",
        [TURNS[0], {"prompt": "And in reverse?", "response": "Bananas grow in the tropics."}],
    )
    assert on_topic > off_topic
