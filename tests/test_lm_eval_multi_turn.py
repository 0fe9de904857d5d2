"""Multi-turn packs as lm-eval tasks (``multi_turn_scenarios_<pack>``), run by ``--model
convsim`` through convsim's runtime."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from _lm_eval_cli import invoke_lm_eval

from convsim import PackError, run_sync
from convsim.lm_eval._export import CONVERSATION_MARKER, export_lm_eval_tasks
from convsim.scenarios import load_pack

pytest.importorskip("lm_eval")

PACK = "customer_support"
TASK = f"multi_turn_scenarios_{PACK}"
LIMIT = 3


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _evaluate(model: Any, include: Path, **kwargs: Any) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from convsim.lm_eval import register_lm_eval_model

    register_lm_eval_model()
    results = simple_evaluate(
        model=model,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        limit=LIMIT,
        **kwargs,
    )
    assert results is not None
    return results


def test_the_task_has_one_document_per_conversation(tmp_path: Path) -> None:
    (task,) = [t for t in export_lm_eval_tasks(out=tmp_path) if t.task == TASK]
    docs = [json.loads(line) for line in task.data_path.read_text().splitlines()]
    pack = load_pack(PACK)
    assert docs == [
        {"pack": PACK, "conversation_id": c.conversation_id} for c in pack.conversations
    ]
    assert "latency" not in task.metrics and "coherence" in task.metrics


def test_a_pack_folder_is_exported_by_its_path(tmp_path: Path) -> None:
    folder = load_pack(PACK).path
    (task,) = [t for t in export_lm_eval_tasks([folder], tmp_path) if t.task == TASK]
    doc = json.loads(task.data_path.read_text().splitlines()[0])
    assert doc["pack"] == PACK  # a bundled folder keeps its name


@pytest.mark.slow
def test_convsim_model_runs_the_conversations_as_convsim_does(
    tmp_path: Path, offline: None
) -> None:
    (task,) = [t for t in export_lm_eval_tasks(out=tmp_path) if t.task == TASK]
    results = _evaluate("convsim", tmp_path, model_args="model=scripted,seed=7,concurrency=4")
    got = results["results"][TASK]
    expected = run_sync(PACK, "scripted", limit=LIMIT, seed=7)
    assert len(expected) == LIMIT
    for name in task.metrics:
        values = [r.scores[name].value for r in expected if name in r.scores]
        values = [v for v in values if v is not None]
        if not values:
            continue
        assert f"{name},none" in got, name
        assert got[f"{name},none"] == pytest.approx(sum(values) / len(values)), name
        assert not math.isnan(got[f"{name},none"])
    assert {"coherence,none", "conversation_flow,none", "goal_achievement,none"} <= set(got)
    samples = results.get("samples", {}).get(TASK)
    if samples:
        assert samples[0]["arguments"][0][0].startswith(CONVERSATION_MARKER)


def test_another_model_fails_at_once_with_a_clear_message(
    tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lm_eval.models.dummy import DummyLM

    asked: list[Any] = []
    monkeypatch.setattr(DummyLM, "generate_until", lambda self, requests: asked.append(requests))
    export_lm_eval_tasks(out=tmp_path)
    with pytest.raises(ValueError, match=r"needs `--model convsim`.*got DummyLM"):
        _evaluate("dummy", tmp_path)
    assert asked == []  # refused before lm-eval sent the model anything


@pytest.mark.slow
def test_the_cli_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    export_lm_eval_tasks(out=tmp_path)
    args = ["--model", "dummy", "--tasks", TASK, "--include_path", str(tmp_path)]
    result = invoke_lm_eval(monkeypatch, *args)
    assert result.exit_code == 2
    assert "error:" in result.output and "needs `--model convsim`" in result.output
    assert "Traceback" not in result.output


def test_the_late_check_still_names_the_model_it_needs() -> None:
    from convsim.lm_eval._export import conversation_scores

    with pytest.raises(ValueError, match="--model convsim"):
        conversation_scores(TASK, "lol", ["coherence"])
    assert conversation_scores(TASK, '{"coherence": 0.5, "x": 1}', ["coherence"]) == {
        "coherence": 0.5
    }


@pytest.mark.slow
def test_a_pack_with_code_is_exported_and_run_only_when_allowed(
    tmp_path: Path, offline: None
) -> None:
    from click.testing import CliRunner

    from convsim.cli import main

    folder = tmp_path / "coded"
    folder.mkdir()
    (folder / "turn_configs.yml").write_text(
        "default:\n  turns:\n    - turn_id: a\n      prompt_template: 'Hello, I am {name}'\n"
    )
    goal = {"description": "any answer", "all_of": [{"kind": "python", "value": "operator:is_not"}]}
    row = {"scenario_id": "s1", "scenario_description": "d", "variables": {"name": "Ada"}}
    (folder / "scenarios.jsonl").write_text(json.dumps({**row, "goal": goal}) + "\n")
    out = tmp_path / "tasks"
    refused = CliRunner().invoke(main, ["lm-eval-tasks", str(folder), "--out", str(out)])
    assert refused.exit_code == 2 and "goal.all_of.0.value" in refused.output
    allowed = CliRunner().invoke(
        main, ["lm-eval-tasks", str(folder), "--out", str(out), "--allow-code"]
    )
    assert allowed.exit_code == 0, allowed.output

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from convsim.lm_eval import register_lm_eval_model

    register_lm_eval_model()

    def evaluate(model_args: str) -> Any:
        manager = TaskManager(include_path=str(out), include_defaults=False)
        tasks = ["multi_turn_scenarios_coded"]
        return simple_evaluate(model="convsim", model_args=model_args, tasks=tasks,
                               task_manager=manager)  # fmt: skip

    with pytest.raises(
        PackError, match=r"goal\.all_of\.0\.value: .operator:is_not. runs Python code"
    ):
        evaluate("model=scripted")
    got = evaluate("model=scripted,allow_code=true")["results"]["multi_turn_scenarios_coded"]
    assert got["goal_achievement,none"] == 1.0  # the checker ran
