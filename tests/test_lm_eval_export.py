"""Single-turn packs as lm-eval tasks: `convsim lm-eval-tasks`."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from convsim.cli import main
from convsim.lm_eval._export import export_lm_eval_tasks
from convsim.metrics import score_transcript
from convsim.scenarios import BUNDLED_PACKS_DIR, load_pack

PACK = "single_turn_qa"
TASK = f"single_turn_scenarios_{PACK}"


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def _config(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    assert isinstance(data, dict)
    return data


def test_the_task_files_render_prompts_as_convsim_does(tmp_path: Path) -> None:
    (task,) = [t for t in export_lm_eval_tasks(out=tmp_path) if t.task == TASK]
    config = _config(task.yaml_path)
    assert config["dataset_path"] == "json" and config["output_type"] == "generate_until"
    data = Path(config["dataset_kwargs"]["data_files"]["test"])
    assert data.is_absolute() and data.parent == tmp_path.resolve()
    assert config["process_results"] == f"{TASK}_utils.process_results"
    assert (tmp_path / f"{TASK}_utils.py").exists()
    pack = load_pack(PACK)
    assert config["generation_kwargs"]["max_gen_toks"] == 64
    means = [m for m in config["metric_list"] if m["aggregation"] == "mean"]
    assert [m["metric"] for m in means] == list(pack.metrics)
    hib = {m["metric"]: m["higher_is_better"] for m in means}
    assert hib == {"exact_match": True, "custom_score": True, "response_length": None}
    # the guide's aggregation is mean and std: each metric again as <metric>_std
    stds = [m for m in config["metric_list"] if m not in means]
    assert [m["metric"] for m in stds] == [f"{m}_std" for m in pack.metrics]
    assert {m["aggregation"] for m in stds} == {f"{TASK}_utils.std"}
    docs = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    assert len(docs) == len(pack)
    for doc, conv in zip(docs, pack.conversations, strict=True):
        assert doc["prompt"] == conv.render(conv.flow.turns[0], [])
        assert doc["conversation_id"] == conv.conversation_id
        assert doc["target"] == conv.scenario.reference_responses["answer"]


def test_a_metric_that_cannot_apply_is_left_out(tmp_path: Path) -> None:
    pack = tmp_path / "no_keywords"
    shutil.copytree(BUNDLED_PACKS_DIR / PACK, pack)
    lines = (pack / "problems.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    del first["required_keywords"]
    lines[0] = json.dumps(first)
    (pack / "problems.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tasks = {t.task: t for t in export_lm_eval_tasks([pack], out=tmp_path / "out")}
    mine = tasks["single_turn_scenarios_no_keywords"]
    assert mine.metrics == ("exact_match", "response_length")
    assert [name for name, _ in mine.skipped] == ["custom_score"]
    assert "custom_score" in tasks[TASK].metrics


def test_lm_eval_scores_equal_convsims_own(tmp_path: Path, offline: None) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from convsim.lm_eval import register_lm_eval_model

    export_lm_eval_tasks(out=tmp_path)
    register_lm_eval_model()
    results = simple_evaluate(
        model="convsim",
        model_args="model=scripted",
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        limit=5,
        log_samples=True,
    )
    assert results is not None
    scores = results["results"][TASK]
    samples = results["samples"][TASK]
    assert len(samples) == 5
    pack = load_pack(PACK)
    by_id = {c.conversation_id: c for c in pack.conversations}
    ours: dict[str, list[float]] = {m: [] for m in pack.metrics}
    for sample in samples:
        conv = by_id[sample["doc"]["conversation_id"]]
        messages = [
            {"role": "system", "content": conv.scenario.system_prompt},
            {"role": "user", "content": conv.render(conv.flow.turns[0], [])},
            {"role": "assistant", "content": sample["resps"][0][0]},
        ]
        own = score_transcript(
            messages,
            list(pack.metrics),
            reference_responses={1: conv.scenario.reference_responses["answer"]},
            required_keywords=conv.scenario.required_keywords,
        )
        for name in pack.metrics:
            value = own[name].value
            assert value is not None
            assert sample[name] == pytest.approx(value)
            ours[name].append(value)
    for name, values in ours.items():
        reported = scores[f"{name},none"]
        assert isinstance(reported, float) and not math.isnan(reported)
        assert reported == pytest.approx(sum(values) / len(values))
        assert scores[f"{name}_std,none"] == pytest.approx(statistics.pstdev(values))


def test_cli_writes_the_tasks_and_prints_the_include_path(tmp_path: Path) -> None:
    out = tmp_path / "tasks"
    result = CliRunner().invoke(main, ["lm-eval-tasks", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / f"{TASK}.yaml").exists() and (out / f"{TASK}.jsonl").exists()
    assert f"--include_path {out.resolve()}" in result.output
    assert TASK in result.output


def test_cli_exports_a_multi_turn_pack_as_a_conversation_task(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["lm-eval-tasks", "customer_support", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    config = (tmp_path / "multi_turn_scenarios_customer_support.yaml").read_text(encoding="utf-8")
    assert "task: multi_turn_scenarios_customer_support" in config


@pytest.mark.slow
def test_an_exported_task_runs_back_in_convsim(tmp_path: Path, offline: None) -> None:
    export_lm_eval_tasks(out=tmp_path)
    pack = load_pack(f"lm-eval:{TASK}", include_path=tmp_path, allow_code=True)
    own = load_pack(PACK)
    assert pack.metrics == tuple(f"lm_eval_task:{m}" for m in own.metrics)
    # <metric>_std is reduced by the task's own function: left out, and said so
    assert [n.split(" ")[0] for n in pack.notes] == [f"lm_eval_task:{m}_std" for m in own.metrics]
    assert [c.scenario.variables["prompt"] for c in pack.conversations] == [
        c.render(c.flow.turns[0], []) for c in own.conversations
    ]
