"""Plugins: discovered by name and entry point, configured, isolated, recorded."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

import convsim
from convsim import ConfigError, ConversationResult, Score, Simulator
from convsim.plugins import PLUGINS, BasePlugin, PluginScores, PythonComplexityAnalyzer

pytestmark = pytest.mark.anyio


def test_code_analysis_measures_the_python_of_each_answer(tmp_path: Path) -> None:
    out = tmp_path / "code.jsonl"
    with capture_logs() as logs:
        results = convsim.run_sync("coding_help", "scripted", out=out, plugins=["code_analysis"])
    failures = [e for e in logs if e["event"] == "plugin_hook_failed"]
    assert failures == []  # names the hook and its error should one ever fail here
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


def test_code_bandit_could_not_analyse_gives_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    from convsim.metrics._builtin import python_blocks
    from convsim.plugins import _analyzer

    results = convsim.run_sync("coding_help", "scripted", limit=3)
    with_code = next(r for r in results if any(python_blocks(t.response or "") for t in r.turns))
    plugin = PLUGINS.get("code_analysis")()
    plugin.initialize(plugin.Config())
    judged = plugin.score(with_code)
    assert judged is not None and judged.scores["code_analysis:summary"].value is not None
    # bandit skips the code: its security is unknown, so no answer reads as sound
    monkeypatch.setattr(_analyzer, "analyse_code", lambda code: None)
    unknown = plugin.score(with_code)
    assert unknown is not None
    summary = unknown.scores["code_analysis:summary"]
    assert summary.value is None and summary.status == "not_applicable"
    assert (summary.reason or "").startswith("not applicable: no evidence:")
    assert summary.details["unchecked"] == summary.details["answers_with_code"] >= 1


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


async def test_two_runs_of_one_simulator_each_have_their_turn_hooks() -> None:
    """Each run has its own queue of turns for the turn hooks: one run ending does not
    close the other's, and every turn of both is seen once."""
    async with Simulator("scripted", plugins=["recorder"], plugin_registry=_registry()) as sim:
        first = sim.run("customer_support", limit=6)
        second = sim.run("customer_support", limit=6)
        with anyio.fail_after(30):  # a hang guard: both runs end at once here
            results = [r async for r in first] + [r async for r in second]
        (recorder,) = sim.plugins.plugins
    seen = [key for kind, key in recorder.events if kind == "turn"]  # type: ignore[attr-defined]
    assert len(seen) == sum(len(r.turns) for r in results) == 2 * len(set(seen))


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


@pytest.mark.slow
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
    result = plugin.process({"code": "def hello(): print('Hello, World!')"}, {"language": "python"})
    assert result["syntax"]["valid"] is True
    assert result["syntax_ok"] and result["functions"] == 1  # convsim's flat figures stay
    assert result["cyclomatic_complexity"] == 1
    with pytest.raises(ValueError, match="no_such_plugin") as unknown:  # as the guide raises
        manager.load_plugin("no_such_plugin")
    assert isinstance(unknown.value, convsim.RegistryError)
    assert "code_analysis" in str(unknown.value)  # the known names are listed


# -- isolation: what a hook raises, how long it takes, what it scores ---------------


class Exits(BasePlugin):
    """Every hook ends the process its own way: SystemExit from the ``async`` hooks,
    KeyboardInterrupt from a sync one (run in a thread of its own)."""

    name: ClassVar[str] = "exits"

    async def on_run_start(self, manifest: Any) -> None:
        raise SystemExit(2)

    async def on_conversation_end(self, result: Any) -> None:
        raise SystemExit(3)

    def on_turn(self, turn: Any) -> None:  # type: ignore[override]
        raise KeyboardInterrupt

    def score(self, result: Any) -> PluginScores:
        sys.exit(4)


async def test_a_hook_raising_system_exit_or_keyboard_interrupt_ends_nothing() -> None:
    registry = _registry()
    registry.register("exits", Exits)
    async with Simulator(
        "scripted", plugins=["exits", "recorder"], plugin_registry=registry
    ) as sim:
        results = [r async for r in sim.run("customer_support", limit=3)]
        _, recorder = sim.plugins.plugins
    assert len(results) == 3 and all(r.status.value == "DONE" for r in results)
    for r in results:
        assert r.scores["exits:failed"].status == "failed"
        assert "SystemExit: 4" in (r.scores["exits:failed"].reason or "")
        assert r.scores["recorder:turns"].value == len(r.turns)  # the other plugin is unharmed
    failures = [(f.hook, f.error) for f in sim.plugins.failures]
    assert ("on_run_start", "SystemExit: 2") in failures
    assert failures.count(("on_conversation_end", "SystemExit: 3")) == 3
    assert failures.count(("on_turn", "KeyboardInterrupt")) == sum(len(r.turns) for r in results)
    assert [kind for kind, _ in recorder.events][-1] == "run_end"  # type: ignore[attr-defined]


async def test_ctrl_c_as_keyboard_interrupt_on_the_loop_thread_goes_through() -> None:
    """Where Python raises a Ctrl-C as KeyboardInterrupt in the thread running an
    ``async`` hook (its default SIGINT handler), it may be the user's: it is not taken
    for the hook's failure. Where the loop turns Ctrl-C into a cancellation (the
    command line, asyncio's runner), a KeyboardInterrupt is the hook's own."""
    from convsim.plugins._calls import RunStop, call_hook, hook_threads

    async def interrupted() -> None:
        raise KeyboardInterrupt

    async def call() -> Any:
        return await call_hook(
            interrupted, (), limit=10, stop=RunStop(), threads=hook_threads(), name="t"
        )

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        await call()
    previous = signal.signal(signal.SIGINT, lambda *_: None)  # as a runner installs its own
    try:
        outcome = await call()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert outcome.error == "KeyboardInterrupt"


async def test_a_cancellation_raised_by_a_hook_is_its_failure_a_real_one_goes_through() -> None:
    from convsim.plugins._calls import RunStop, call_hook, hook_threads

    async def raises_cancelled() -> None:
        raise anyio.get_cancelled_exc_class()()

    outcome = await call_hook(
        raises_cancelled, (), limit=10, stop=RunStop(), threads=hook_threads(), name="t"
    )
    assert outcome.error is not None and "raised by the hook" in outcome.error
    entered = anyio.Event()

    async def waits() -> None:
        entered.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        calls: list[Any] = []

        async def caller() -> None:
            calls.append(
                await call_hook(
                    waits, (), limit=3600, stop=RunStop(), threads=hook_threads(), name="t"
                )
            )

        tg.start_soon(caller)
        await entered.wait()
        tg.cancel_scope.cancel()  # the run's own cancellation
    assert calls == []  # it went through the hook's call, not into an outcome


class HangsAsync(BasePlugin):
    name: ClassVar[str] = "hangs_async"

    async def on_conversation_end(self, result: Any) -> None:
        await anyio.sleep_forever()


class HangsSync(BasePlugin):
    name: ClassVar[str] = "hangs_sync"
    released = threading.Event()

    def score(self, result: Any) -> PluginScores:
        self.released.wait()  # a blocking call that never returns, until the test ends
        return PluginScores()


async def test_a_hanging_hook_is_abandoned_at_its_time_limit() -> None:
    registry = _registry()
    registry.register("hangs_async", HangsAsync)
    registry.register("hangs_sync", HangsSync)
    try:
        async with Simulator(
            "scripted",
            plugins=["hangs_async", "hangs_sync", "recorder"],
            plugin_config={
                "hangs_async": {"hook_timeout": 0.2},
                "hangs_sync": {"hook_timeout": "0.2"},  # as --plugin-arg gives it
            },
            plugin_registry=registry,
            concurrency=1,
        ) as sim:
            results = [r async for r in sim.run("customer_support", limit=4)]
    finally:
        HangsSync.released.set()
    assert len(results) == 4 and all(r.status.value == "DONE" for r in results)
    reasons = [r.scores["hangs_sync:failed"].reason or "" for r in results]
    assert "timed out after 0.2 s" in reasons[0]
    # stuck once, maybe for good (its thread cannot be killed): called no more
    assert all("not called: its score hook timed out" in reason for reason in reasons[1:])
    assert all(r.scores["recorder:turns"].value == len(r.turns) for r in results)
    timed_out = [f for f in sim.plugins.failures if "timed out" in f.error]
    assert {(f.plugin, f.hook) for f in timed_out} == {
        ("hangs_async", "on_conversation_end"),
        ("hangs_sync", "score"),
    }
    assert set(sim.plugins.stalled) == {"hangs_async", "hangs_sync"}


@pytest.mark.parametrize("timeout", [0, -1, "soon", float("nan")])
def test_a_bad_hook_timeout_is_refused(timeout: object) -> None:
    with pytest.raises(ConfigError, match="hook_timeout"):
        Simulator(
            "scripted",
            plugins=["code_analysis"],
            plugin_config={"code_analysis": {"hook_timeout": timeout}},
        )


def _scores_of(value: Any) -> type[BasePlugin]:
    class Scores(BasePlugin):
        name: ClassVar[str] = "scores"

        def score(self, result: Any) -> Any:
            return value(result) if callable(value) else value

        def score_range(self, name: str) -> Any:
            from convsim.plugins import ScoreRange

            return ScoreRange(0.0, 1.0) if name == "scores:share" else None

    return Scores


BAD_SCORES = {
    "nan": (PluginScores(scores={"scores:x": Score(value=math.nan)}), "not a finite number"),
    "inf": (PluginScores(scores={"scores:x": Score(value=-math.inf)}), "not a finite number"),
    "not a Score": (PluginScores(scores={"scores:x": 0.5}), "is a float, not a Score"),  # type: ignore[dict-item]
    "not PluginScores": ({"scores:x": Score(value=1.0)}, "returned a dict, not PluginScores"),
    "out of range": (PluginScores(scores={"scores:share": Score(value=1.5)}), "outside [0, 1]"),
    "unknown turn": (
        PluginScores(turn_scores={"no-such-turn": {"scores:x": Score(value=1.0)}}),
        "not a turn of",
    ),
    "no name": (PluginScores(scores={"": Score(value=1.0)}), "not a non-empty string"),
    "a value not a number": (
        PluginScores(scores={"scores:x": Score.model_construct(value="high", status="ok")}),
        "is not a number",
    ),
    "details not JSON": (
        PluginScores(scores={"scores:x": Score(value=1.0, details={"seen": object()})}),
        "cannot be written",
    ),
    "status that does not fit": (
        PluginScores(scores={"scores:x": Score.model_construct(value=None, status="ok")}),
        "does not read back",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SCORES))
async def test_scores_that_cannot_be_written_are_refused_and_recorded(case: str) -> None:
    value, why = BAD_SCORES[case]
    registry = PLUGINS.copy()
    registry.register("scores", _scores_of(value))
    async with Simulator("scripted", plugins=["scores"], plugin_registry=registry) as sim:
        results = [r async for r in sim.run("customer_support", limit=2)]
    for r in results:
        failed = r.scores["scores:failed"]
        assert failed.status == "failed" and why in (failed.reason or ""), failed.reason
        assert not {"scores:x", "scores:share"} & set(r.scores)
        assert all(not set(s) & {"scores:x"} for s in r.turn_scores.values())
        ConversationResult.model_validate_json(r.model_dump_json())  # reads back
    assert [(f.plugin, f.hook) for f in sim.plugins.failures] == [("scores", "score")] * 2
    assert all(why in f.error for f in sim.plugins.failures)


def test_a_nan_score_leaves_a_file_report_and_resume_read(tmp_path: Path) -> None:
    """The reviewer's case: a NaN plugin score made the results file unreadable."""
    from click.testing import CliRunner

    from convsim import JsonlSink
    from convsim.cli import main

    registry = PLUGINS.copy()
    registry.register(
        "scores",
        _scores_of(lambda result: PluginScores(scores={"scores:x": Score(value=math.nan)})),
    )
    out = tmp_path / "run.jsonl"

    async def run() -> None:
        async with Simulator("scripted", plugins=["scores"], plugin_registry=registry) as sim:
            await sim.run("customer_support", sink=JsonlSink(out), limit=3).wait()

    anyio.run(run)
    assert len(convsim.read_results(out)) == 3
    for args in (
        ("report", str(out)),
        ("run", "customer_support", "--out", str(out), "--resume", "--limit", "5"),
    ):
        done = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert done.exit_code == 0, done.stderr
    assert len(convsim.read_results(out)) == 3 + 5  # kept, and five more


def test_code_analysis_scores_lie_in_their_ranges() -> None:
    from convsim.plugins import ScoreRange

    plugin = PLUGINS.get("code_analysis")()
    assert plugin.score_range("code_analysis:summary") == ScoreRange(0.0, 1.0)
    assert plugin.score_range("code_analysis:maintainability_index") == ScoreRange(0.0, 100.0)
    assert plugin.score_range("code_analysis:halstead_effort") == ScoreRange(0.0)
    assert plugin.score_range("something_else") is None


HANGING_PLUGINS = """
import os, threading
from pathlib import Path
from typing import ClassVar
import anyio
from convsim.plugins import BasePlugin

MARK = Path(os.environ["CONVSIM_TEST_MARK"])

class HangsInScore(BasePlugin):
    name: ClassVar[str] = "hangs_in_score"

    def score(self, result):
        MARK.touch()
        threading.Event().wait()  # a blocking call that never returns

class HangsAtEnd(BasePlugin):
    name: ClassVar[str] = "hangs_at_end"

    async def on_conversation_end(self, result):
        MARK.touch()
        await anyio.sleep_forever()
"""


def install_plugins(site: Path, module: str, source: str, entry_points: dict[str, str]) -> None:
    """A package ``module`` 'installed' in ``site`` with its dist-info and entry points."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[convsim.plugins]\n"
        + "".join(f"{name} = {module}:{cls}\n" for name, cls in entry_points.items())
    )


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("plugin", ["hangs_in_score", "hangs_at_end"])
def test_two_ctrl_c_end_a_run_whose_hook_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin: str
) -> None:
    """A hook stuck for good (its time limit an hour away): the first Ctrl-C stops
    gracefully (an hour of grace), the second at once, and the process exits."""
    from test_cli import Convsim

    site = tmp_path / "site"
    install_plugins(
        site,
        "hanging_plugins",
        HANGING_PLUGINS,
        {"hangs_in_score": "HangsInScore", "hangs_at_end": "HangsAtEnd"},
    )
    mark = tmp_path / "hook-entered"
    monkeypatch.setenv("CONVSIM_TEST_MARK", str(mark))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run.jsonl"
    with Convsim(
        "run", "customer_support", "--model", "scripted", "--plugin", plugin,
        "--plugin-arg", f"{plugin}.hook_timeout=3600", "--grace-period", "3600",
        "--out", str(out), "--no-progress",
    ) as run:  # fmt: skip
        run.wait_for(mark.exists, "a hook entered")
        run.interrupt()
        run.wait_for_line("stopping: in-flight conversations get the grace period")
        run.interrupt()
        assert run.finish(timeout=30) == 130, run.stderr
    assert "stopping at once" in run.stderr and "Traceback" not in run.stderr
    results = convsim.read_results(out)  # the file reads
    assert results
    if plugin == "hangs_in_score":
        assert all(r.scores[f"{plugin}:failed"].status == "failed" for r in results)
        assert any("the run was stopped" in (r.scores[f"{plugin}:failed"].reason or "")
                   for r in results)  # fmt: skip
