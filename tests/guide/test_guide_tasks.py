"""The guide's task code blocks, copied with only their import lines changed, on convsim.

- my_conversation_task/: "Multi-Turn Task Implementation" (my_conversation_task.py and
  turn_configs.yml as the guide writes them; the guide gives no scenarios.jsonl, so
  scenarios.jsonl is ours, with the variables its templates name);
- installed/guide_extensions/: "Single-Turn Task Implementation" (my_new_task.py,
  problems.jsonl, config.yml, __init__.py), an installed package whose entry point
  registers the task;
- custom_task_tests.py: "Unit Testing Framework" (the guide's tests/test_custom_task.py),
  run by pytest in a process of its own where the guide's package is importable (this
  process has tests/test_task_api.py's copy of the class under the same task name).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import convsim
from convsim.lm_eval import TASKS

HERE = Path(__file__).parent
CONVERSATION = HERE / "my_conversation_task"
INSTALLED = HERE / "installed"
SINGLE_TURN = INSTALLED / "guide_extensions"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(INSTALLED)}


# -- Multi-Turn Task Implementation ------------------------------------------------------


@pytest.fixture
def conversation_task(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The guide's task, its module imported as ``my_conversation_task`` (as the guide's
    file is named, and as docs/task_api.md's copy of it is: the task registers itself
    under the same name from the same module, which is allowed)."""
    # the guide's load_turn_configurations opens TURN_CONFIG_PATH from the working folder
    monkeypatch.chdir(CONVERSATION)
    path = CONVERSATION / "my_conversation_task.py"
    spec = importlib.util.spec_from_file_location("my_conversation_task", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_conversation_task", module)
    spec.loader.exec_module(module)
    task = module.MyConversationTask()
    assert TASKS.get("multi_turn_scenarios_my_conversation_task") is module.MyConversationTask
    return task


def test_the_guides_multi_turn_task_runs_its_conversations(conversation_task: Any) -> None:
    pack = conversation_task.to_pack()
    assert [c.flow.scenario_type for c in pack.conversations] == [
        "default",
        "specialized_scenario",
    ]
    results = convsim.run_sync(pack, "scripted", metrics=["response_length"])
    assert [r.status.value for r in results] == ["DONE", "DONE"]
    docs = {d["scenario_id"]: d for d in conversation_task.test_docs()}
    for result in results:
        doc = docs[result.conversation_id]
        history: list[dict[str, str]] = []
        for turn in result.turns:
            # the model was sent what the guide's generate_turn_prompt (str.format) makes
            config = conversation_task.turn_config(doc, turn.turn_id)
            context = conversation_task.build_conversation_context(history)
            expected = conversation_task.generate_turn_prompt(doc, config, context, turn.turn_index)
            assert turn.prompt == expected
            # process_turn asks get_model_response the same prompt: no extra call
            assert turn.extra_calls == ()
            history += [
                {"role": "user", "content": turn.prompt},
                {"role": "assistant", "content": turn.response or ""},
            ]
        scores = {k: s.value for k, s in result.scores.items() if s.status == "ok"}
        # the guide's own calculate_* methods (constants) are what the task reports
        assert scores["task:context_retention"] == 0.8
        assert scores["task:goal_achievement"] == 0.7
        assert scores["task:coherence_score"] == 0.9
        # ... beside convsim's own scorers of the same conversation
        assert scores["response_length"] > 0


def test_the_guides_specialized_flow_takes_its_own_turns(conversation_task: Any) -> None:
    pack = conversation_task.to_pack()
    bikes = next(c for c in pack.conversations if c.conversation_id == "bike_fleet")
    assert [t.turn_id for t in bikes.flow.turns] == ["deep_analysis"]


# -- Single-Turn Task Implementation -------------------------------------------------------


def test_the_guides_single_turn_task_runs_from_its_installed_package(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "convsim", "run", "task:single_turn_scenarios_my_new_task",
         "--model", "scripted", "--out", str(out), "--no-progress"],
        env=_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3 and {r["status"] for r in lines} == {"DONE"}
    for line in lines:
        # the scripted model replays the expected answer: the guide's own scoring agrees
        assert line["scores"]["task:exact_match"]["value"] == 1.0
        assert 0.0 < line["scores"]["task:custom_score"]["value"] <= 1.0


def test_the_guides_config_yml_is_a_single_turn_pack(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text((SINGLE_TURN / "config.yml").read_text())
    # as written: its first line, a "# path" comment naming the file, is skipped
    problems = (SINGLE_TURN / "problems.jsonl").read_text()
    assert problems.startswith("# lm_eval/")
    (tmp_path / "problems.jsonl").write_text(problems)
    pack = convsim.load_pack(tmp_path)
    assert len(pack.conversations) == 3
    assert pack.metrics == ("exact_match", "custom_score", "semantic_similarity")
    results = convsim.run_sync(pack, "scripted")
    assert {r.status.value for r in results} == {"DONE"}
    assert all(r.scores["exact_match"].value == 1.0 for r in results)


# -- Unit Testing Framework ----------------------------------------------------------------


def test_the_guides_unit_tests_of_its_task() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "custom_task_tests.py"), "-q", "-n", "0",
         "-p", "no:randomly", "-p", "no:cacheprovider", "--rootdir", str(HERE.parent.parent)],
        env=_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    out = run.stdout
    # the guide's own test_custom_quality_score expects more than 0.5 from its own
    # _calculate_quality_score, which gives 0.2 + 0.3 = 0.5 for that answer
    assert "1 failed, 6 passed" in out, out
    assert "custom_task_tests.py::TestMyNewTask::test_custom_quality_score" in out
    assert "assert 0.5 > 0.5" in out
