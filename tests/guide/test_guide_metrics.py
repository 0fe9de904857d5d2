"""The guide's "Adding Custom Metrics" code, copied with only its imports changed
(custom_metrics.py: ``from convsim.lm_eval import MetricsEngine``; metrics_engine.py:
``from custom_metrics import CustomMetricsEngine``), on good and bad answers, and its
custom metric named in a run: in this process, and by ``convsim run --metrics`` in
another one, where a package declares the engine in ``convsim.metric_engines``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from custom_metrics import CustomMetricsEngine
from metrics_engine import MetricsEngine as GuideMetricsEngine

import convsim
from convsim import read_results
from convsim._registry import Registry
from convsim.lm_eval import MetricsEngine
from convsim.metrics import METRICS, Metric

HERE = Path(__file__).parent
REFERENCE = "Diversification across assets with low correlation reduces portfolio volatility."
EXPERT = (
    "A diversified portfolio lowers risk: when the correlation between assets is low, the "
    "volatility of the whole portfolio falls below that of each holding, and its sharpe "
    "ratio improves. Hedge currency exposure and rebalance the portfolio yearly."
)
VAGUE = "Just buy whatever is trending right now and hold on to it."
PLAN = (
    "Put 60% in equities and 40% in bonds: with 8% and 3% expected returns that is "
    "0.6 x 8 + 0.4 x 3 = 6% a year. The main risk is a drawdown in equities, so keep a "
    "cash buffer.\n1. Allocate now.\n2. Rebalance every year."
)
TURNS = [
    {"prompt": "How do I sort a list in Python?", "response": "Use sorted(items) or items.sort()."},
    {"prompt": "And in reverse order?", "response": "Pass reverse=True to sorted or to sort."},
]


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry[Metric]:
    copy = METRICS.copy()
    monkeypatch.setattr(MetricsEngine, "metric_registry", copy)
    return copy


@pytest.fixture
def engine() -> GuideMetricsEngine:
    return GuideMetricsEngine()


def test_the_guides_engine_registers_its_metrics_in_convsims_registry(
    registry: Registry[Metric],
) -> None:
    custom = CustomMetricsEngine()
    # the four names convsim has already keep convsim's metric in runs
    assert custom.registration.registered == ("domain_expertise_score",)
    assert registry.origin("domain_expertise_score") == "custom_metrics:CustomMetricsEngine"


def test_domain_expertise_tells_an_expert_answer_from_a_vague_one(
    engine: GuideMetricsEngine,
) -> None:
    expert = engine.calculate_metric("domain_expertise_score", EXPERT, REFERENCE, "finance")
    vague = engine.calculate_metric("domain_expertise_score", VAGUE, REFERENCE, "finance")
    assert expert > 0.3 and vague == 0.0


def test_the_quality_multiplier_is_convsims_measure(engine: GuideMetricsEngine) -> None:
    on_topic = engine.custom_engine.assess_response_quality(EXPERT, REFERENCE)
    off_topic = engine.custom_engine.assess_response_quality("I like turtles a lot.", REFERENCE)
    assert on_topic > off_topic
    assert on_topic.details["relevance_details"]["relevant_to"] == "reference"


def test_financial_reasoning_uses_convsims_signals(engine: GuideMetricsEngine) -> None:
    plan = engine.calculate_metric("financial_reasoning", PLAN, {})
    vague = engine.calculate_metric("financial_reasoning", VAGUE, {})
    # the vague answer names one step ("buy"): the guide's 0.2 for implementation
    assert plan > 0.7 and vague == pytest.approx(0.2)


def test_conversation_flow_uses_convsims_parts(engine: GuideMetricsEngine) -> None:
    on_topic = engine.calculate_metric("conversation_flow", TURNS)
    wandering = [TURNS[0], {"prompt": "And in reverse order?", "response": "Bananas are yellow."}]
    assert on_topic > engine.calculate_metric("conversation_flow", wandering)
    assert engine.calculate_metric("conversation_flow", TURNS[:1]) == 0.0  # the guide's rule


def test_code_security_and_technical_accuracy_run_the_guides_checks(
    engine: GuideMetricsEngine,
) -> None:
    risky = "password = 'hunter2'\nos.system('rm -rf ' + path)"
    assert engine.calculate_metric("code_security_score", risky) < (
        engine.calculate_metric("code_security_score", "def add(a, b):\n    return a + b")
    )
    documented = (
        "def add(a, b):\n    '''Add, with error handling and validation.'''\n    return a + b"
    )
    context = {"language": "python"}
    assert engine.calculate_metric("technical_accuracy", documented, "", context) > (
        engine.calculate_metric("technical_accuracy", "def add(a, b) return a +", "", context)
    )


def test_an_unknown_metric_raises_value_error(engine: GuideMetricsEngine) -> None:
    with pytest.raises(ValueError, match="Unknown metric: nope"):
        engine.calculate_metric("nope")


# -- the guide's metric named in runs --------------------------------------------------------


def finance_pack(folder: Path) -> Path:
    folder.mkdir()
    config = {"task_name": "finance", "prompt_templates": {"default": "{question}"}}
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    problems = [
        {"id": "expert", "question": "How should I invest?", "expected_answer": EXPERT},
        {"id": "vague", "question": "How should I invest?", "expected_answer": VAGUE},
    ]
    lines = [json.dumps({**p, "domain": "finance"}) for p in problems]
    (folder / "problems.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_a_run_in_this_process_scores_the_guides_metric(
    tmp_path: Path, registry: Registry[Metric]
) -> None:
    CustomMetricsEngine()
    results = convsim.run_sync(
        str(finance_pack(tmp_path / "finance")),
        "scripted",
        metrics=["domain_expertise_score"],
        metric_registry=registry,
    )
    scores = {r.scenario_id: r.scores["domain_expertise_score"].value for r in results}
    assert scores["expert"] is not None and scores["expert"] > 0.3 and scores["vague"] == 0.0


def declare_engine(folder: Path) -> Path:
    """A distribution on ``folder`` that declares the guide's engine as an entry point."""
    info = folder / "guide_metrics-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: guide-metrics\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[convsim.metric_engines]\nguide = custom_metrics:CustomMetricsEngine\n"
    )
    return folder


def test_convsim_run_names_the_guides_metric_from_a_declared_engine(tmp_path: Path) -> None:
    site = declare_engine(tmp_path / "site")
    pack = finance_pack(tmp_path / "finance")
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(HERE)])}
    run = [sys.executable, "-m", "convsim", "run", str(pack), "--model", "scripted"]
    done = subprocess.run(
        [*run, "--metrics", "domain_expertise_score", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    scores = {r.scenario_id: r.scores["domain_expertise_score"].value for r in read_results(out)}
    assert scores["expert"] is not None and scores["expert"] > 0.3 and scores["vague"] == 0.0

    listing = subprocess.run(
        [sys.executable, "-m", "convsim", "metrics", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    found = {m["name"]: m for m in json.loads(listing.stdout)}
    ours = found["domain_expertise_score"]
    assert (ours["source"], ours["provider"]) == (
        "entry point",
        "custom_metrics:CustomMetricsEngine",
    )
    assert ours["needs_reference"] is True
