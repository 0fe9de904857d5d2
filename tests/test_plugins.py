"""Plugins: discovered by name and entry point, configured, isolated, recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel

import convsim
from convsim import ConfigError, Score, Simulator
from convsim.plugins import PLUGINS, BasePlugin, PluginScores, PythonComplexityAnalyzer

pytestmark = pytest.mark.anyio


def test_code_analysis_measures_the_python_of_each_answer(tmp_path: Path) -> None:
    out = tmp_path / "code.jsonl"
    results = convsim.run_sync("coding_help", "scripted", out=out, plugins=["code_analysis"])
    with_code = [
        (r, turn_id, scores)
        for r in results
        for turn_id, scores in r.turn_scores.items()
        if "code_analysis:cyclomatic_complexity" in scores
    ]
    assert with_code
    for _, _, scores in with_code:
        assert scores["code_analysis:cyclomatic_complexity"].value >= 1
        assert 0 <= scores["code_analysis:maintainability_index"].value <= 100
        assert scores["code_analysis:security_findings"].value >= 0
    summarised = [r for r in results if r.scores["code_analysis:summary"].value is not None]
    assert summarised and all(0 <= r.scores["code_analysis:summary"].value <= 1 for r in summarised)
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["plugins"] == [{"name": "code_analysis", "version": "1.0"}]


def test_the_analyzer_finds_complexity_and_insecure_code() -> None:
    analyzer = PythonComplexityAnalyzer()
    branchy = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(12))
    assert analyzer.analyse(branchy).cyclomatic_complexity == 13
    risky = analyzer.analyse("import pickle\n\ndef load(b):\n    return pickle.loads(b)\n")
    assert risky.security_findings is not None and risky.security_findings >= 1
    broken = analyzer.analyse("def f(:\n  pass")
    assert not broken.syntax_ok and broken.cyclomatic_complexity is None


class Recorder(BasePlugin):
    name: ClassVar[str] = "recorder"
    version: ClassVar[str] = "2.1"

    class Config(BaseModel):
        label: str = "x"

    def initialize(self, config: Any) -> None:
        super().initialize(config)
        self.events: list[tuple[str, str]] = []

    async def on_run_start(self, manifest: Any) -> None:
        self.events.append(("run_start", manifest.pack))

    async def on_turn(self, turn: Any) -> None:
        self.events.append(("turn", f"{turn.conversation_id}/{turn.turn_id}"))

    async def on_run_end(self, statistics: Any) -> None:
        self.events.append(("run_end", str(statistics.done)))

    def score(self, result: Any) -> PluginScores:
        return PluginScores(scores={"recorder:turns": Score(value=float(len(result.turns)))})


class Broken(BasePlugin):
    name: ClassVar[str] = "broken"

    async def on_turn(self, turn: Any) -> None:
        raise RuntimeError("hook exploded")

    def score(self, result: Any) -> PluginScores:
        raise ValueError("scoring exploded")


def _registry() -> Any:
    registry = PLUGINS.copy()
    registry.register("recorder", Recorder)
    registry.register("broken", Broken)
    return registry


async def test_hooks_run_in_order_and_a_failing_plugin_harms_nobody() -> None:
    async with Simulator(
        "scripted",
        plugins=["recorder", "broken"],
        plugin_config={"recorder": {"label": "y"}},
        plugin_registry=_registry(),
    ) as sim:
        handle = sim.run("customer_support", limit=3)
        results = [r async for r in handle]
        recorder, _ = sim.plugins.plugins
    assert len(results) == 3 and all(r.status.value == "DONE" for r in results)
    assert recorder.config.label == "y"  # type: ignore[attr-defined]
    kinds = [kind for kind, _ in recorder.events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    turns = sum(len(r.turns) for r in results)
    assert kinds.count("turn") == turns
    for r in results:
        assert r.scores["recorder:turns"].value == len(r.turns)
        assert r.scores["broken:failed"].status == "failed"
    failures = {(f.plugin, f.hook) for f in sim.plugins.failures}
    assert failures == {("broken", "on_turn"), ("broken", "score")}


async def test_a_slow_turn_hook_never_holds_a_conversation_up() -> None:
    gate = anyio.Event()
    seen: list[int] = []

    class Slow(BasePlugin):
        name: ClassVar[str] = "slow"

        async def on_turn(self, turn: Any) -> None:
            await gate.wait()  # the first turn's hook waits until every result is in

    registry = PLUGINS.copy()
    registry.register("slow", Slow)
    async with Simulator("scripted", plugins=["slow"], plugin_registry=registry) as sim:
        handle = sim.run("customer_support", limit=4)
        async for _ in handle:
            seen.append(1)
            if len(seen) == 4:
                gate.set()  # conversations all finished while the hook was stuck
    assert len(seen) == 4


def test_bad_plugin_names_and_settings_are_refused_before_running() -> None:
    with pytest.raises(convsim.RegistryError, match="no_such_plugin"):
        Simulator("scripted", plugins=["no_such_plugin"])
    with pytest.raises(ConfigError, match="max_complexity"):
        Simulator(
            "scripted",
            plugins=["code_analysis"],
            plugin_config={"code_analysis": {"max_complexity": 0}},
        )
    with pytest.raises(ConfigError, match="not asked for"):
        Simulator("scripted", plugin_config={"code_analysis": {}})


def test_a_third_party_plugin_is_found_through_its_entry_point(tmp_path: Path) -> None:
    """A package of its own, 'installed' on a path with its dist-info and entry point,
    is discovered by name and run by the command line."""
    site = tmp_path / "site"
    (site / "wordcount_plugin").mkdir(parents=True)
    (site / "wordcount_plugin" / "__init__.py").write_text(
        "from typing import ClassVar\n"
        "from convsim import Score\n"
        "from convsim.plugins import BasePlugin, PluginScores\n\n"
        "class WordCount(BasePlugin):\n"
        "    name: ClassVar[str] = 'wordcount'\n"
        "    version: ClassVar[str] = '0.3'\n\n"
        "    def score(self, result):\n"
        "        words = sum(len((t.response or '').split()) for t in result.turns)\n"
        "        return PluginScores(scores={'wordcount:words': Score(value=float(words))})\n"
    )
    info = site / "wordcount_plugin-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wordcount-plugin\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[convsim.plugins]\nwordcount = wordcount_plugin:WordCount\n"
    )
    out = tmp_path / "run.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "convsim", "run", "customer_support", "--model", "scripted",
         "--plugin", "wordcount", "--limit", "2", "--out", str(out), "--no-progress"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = convsim.read_results(out)
    assert all(r.scores["wordcount:words"].value > 0 for r in results)
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["plugins"] == [{"name": "wordcount", "version": "0.3"}]


def test_the_guides_plugin_calls() -> None:
    """The developer guide's integration test, with convsim's names."""
    from convsim.plugins import PluginManager

    manager = PluginManager()
    assert manager.load_plugin("code_analysis") is True
    plugin = manager.get_plugin("code_analysis")
    assert plugin is not None
    result = plugin.process(  # type: ignore[attr-defined]
        {"code": "def hello(): print('Hello, World!')"}, {"language": "python"}
    )
    assert result["syntax_ok"] and result["functions"] == 1
    assert result["cyclomatic_complexity"] == 1
    assert manager.load_plugin("no_such_plugin") is False
    assert manager.failures[-1].plugin == "no_such_plugin"
