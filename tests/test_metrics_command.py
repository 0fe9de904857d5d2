"""``convsim metrics``: every registered metric (built-in, entry point, prefix, plugin)
with its kind, what it needs and what it measures; and the declarations it reads hold."""

from __future__ import annotations

import json
import re
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import convsim
from convsim import _registry
from convsim._records import Score, TurnRecord
from convsim._registry import Registry
from convsim.cli import main
from convsim.metrics import METRICS, MetricTraits, registered_metrics, score_transcript
from convsim.plugins import CodeAnalysisPlugin, plugin_metrics

WIDTH = 80


def listed(*args: str, width: int = WIDTH) -> str:
    done = CliRunner().invoke(main, ["metrics", *args], env={"COLUMNS": str(width)})
    assert done.exit_code == 0, done.output
    return done.stdout


def test_the_json_lists_every_registered_metric_prefix_and_plugin_score() -> None:
    found = {m["name"]: m for m in json.loads(listed("--json"))}
    for name in METRICS.names():
        assert found[name]["source"] == "built-in", name
    for prefix in METRICS.prefixes():
        assert found[f"{prefix}<...>"]["source"] == "prefix"
    for declared in CodeAnalysisPlugin.metrics:
        assert found[declared.name]["source"] == "plugin"
        assert found[declared.name]["provider"] == "code_analysis"
    exact = found["exact_match"]
    assert (exact["kind"], exact["needs_reference"], exact["needs_judge"]) == ("turn", True, False)
    assert exact["higher_is_better"] is True and exact["unavailable"] is None
    assert found["context_retention"]["needs_facts"] == "optional"
    assert found["goal_achievement"]["needs"] == ["goal"]
    assert found["goal_achievement"]["needs_judge"] == "optional"
    assert found["judge:<...>"]["needs_judge"] is True
    assert found["lm_eval:<...>"]["needs_reference"] is True
    assert found["latency"]["higher_is_better"] is False
    assert found["code_analysis:summary"]["kind"] == "conversation"


def test_every_built_in_metric_declares_its_traits() -> None:
    for info in registered_metrics():
        assert isinstance(info.traits, MetricTraits), info.name
        assert info.description and info.summary.endswith((".", "?", "!")), info.name


def test_what_a_metric_says_it_needs_it_cannot_score_without() -> None:
    """Each built-in metric that needs an input gives "not applicable" without it."""
    messages = [
        {"role": "user", "content": "My name is Ada and I need a refund for order 42."},
        {"role": "assistant", "content": "Hello Ada, the refund for order 42 is on its way."},
        {"role": "user", "content": "Thanks. What was my name again?"},
        {"role": "assistant", "content": "Your name is Ada. Anything else about order 42?"},
    ]
    needing = [
        i for i in registered_metrics() if i.source == "built-in" and i.traits and i.traits.needs
    ]
    assert {"exact_match", "custom_score", "goal_achievement", "accuracy"} <= {
        i.name for i in needing
    }
    scores = score_transcript(messages, [i.name for i in needing])
    for info in needing:
        assert scores[info.name].status == "not_applicable", (info.name, scores[info.name])


class _Answers:
    """A metric an entry point declares: how long each answer is."""

    name = "answer_characters"
    higher_is_better = None
    description = "Characters per answer."
    traits = MetricTraits("turn")

    def scorer(self, conversation: Any) -> Any:
        return self

    def update(self, turn: TurnRecord) -> None:
        return None

    def result(self) -> Score:
        return Score.not_applicable("a test metric")


def test_entry_point_metrics_are_listed_with_their_package_and_broken_ones_say_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = Path(__file__).stem
    points = {
        "convsim.metrics": [
            EntryPoint("answer_characters", f"{here}:_Answers", "convsim.metrics"),
            EntryPoint("broken", "no_such_module_here:Metric", "convsim.metrics"),
        ],
        "convsim.metric_prefixes": [],
    }
    monkeypatch.setattr(_registry, "entry_points", lambda group: points.get(group, []))
    registry: Registry[Any] = Registry(
        "metric", group="convsim.metrics", prefix_group="convsim.metric_prefixes"
    )
    registry.register("latency", "convsim.metrics._builtin:LatencyMetric")
    listing = registered_metrics(registry)
    found = {m.name: m for m in listing}
    assert [m.name for m in listing] == ["latency", "answer_characters", "broken"]
    ours = found["answer_characters"]
    assert (ours.source, ours.provider) == ("entry point", "convsim.metrics")
    assert ours.traits == MetricTraits("turn") and ours.summary == "Characters per answer."
    broken = found["broken"]
    assert broken.source == "entry point" and broken.unavailable is not None
    assert "no_such_module_here" in broken.unavailable


def test_at_80_columns_each_metric_is_a_record_and_nothing_is_cut() -> None:
    text = listed()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH and "\u2026" not in text
    names = [m.name for m in (*registered_metrics(), *plugin_metrics())]
    for name in names:
        assert any(re.fullmatch(rf"{re.escape(name)}( [\u2191\u2193])?", ln) for ln in lines), name
    at = lines.index("exact_match \u2191")
    assert lines[at + 1].strip() == "turn; needs reference"
    retention = lines.index("context_retention \u2191")
    assert lines[retention + 1].strip() == "conversation; needs nothing; reads facts when given"
    assert "plugin code_analysis" in lines and "prefixes" in lines


def test_on_a_wide_console_the_metrics_are_a_table() -> None:
    lines = listed(width=200).splitlines()
    row = next(line for line in lines if line.startswith("goal_achievement"))
    assert re.match(r"goal_achievement \u2191\s+conversation\s+goal \[judge\]\s+Partial", row)
    assert max(len(line) for line in lines) <= 200


def test_the_code_analysis_plugin_declares_every_score_it_gives(tmp_path: Path) -> None:
    out = tmp_path / "code.jsonl"
    convsim.run_sync("coding_help", "scripted", out=out, plugins=["code_analysis"], limit=4)
    given = set()
    for result in convsim.read_results(out):
        given.update(n for n in result.scores if n.startswith("code_analysis:"))
        for scores in result.turn_scores.values():
            given.update(n for n in scores if n.startswith("code_analysis:"))
    declared = {m.name: m.traits.kind for m in CodeAnalysisPlugin.metrics}
    assert given and given <= set(declared)
    assert declared["code_analysis:summary"] == "conversation"
    assert {k for n, k in declared.items() if n != "code_analysis:summary"} == {"turn"}


def test_traits_refuse_what_they_do_not_know() -> None:
    with pytest.raises(ValueError, match="turn or conversation"):
        MetricTraits("answer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown inputs"):
        MetricTraits("turn", needs=frozenset({"oracle"}))  # type: ignore[arg-type]
