"""A pack written as an lm-eval task by convsim, run back in convsim as lm-eval:TASK.

The task's process_results scores each answer with convsim's own metrics, from sync code
called inside convsim's running event loop: it must score without a loop of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import convsim
from convsim.cli import main
from convsim.lm_eval import export_lm_eval_tasks

pytestmark = pytest.mark.slow  # lm-eval runs its tasks end to end

PACK = "single_turn_qa"
TASK = f"single_turn_scenarios_{PACK}"


@pytest.fixture()
def tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "tasks"
    export_lm_eval_tasks([PACK], out=out)
    return out


def _check(results: list[convsim.ConversationResult], metrics: tuple[str, ...]) -> None:
    assert results and metrics
    for result in results:
        for name in metrics:
            score = result.scores[name]
            assert score.status == "ok", (result.conversation_id, name, score.reason)
        # scripted answers with the reference: lm-eval's exact_match, through convsim's
        assert result.scores["lm_eval_task:exact_match"].value == 1.0


@pytest.mark.anyio
async def test_lm_eval_task_scores_its_documents_inside_a_running_loop(tasks: Path) -> None:
    pack = convsim.load_pack(f"lm-eval:{TASK}", include_path=tasks, allow_code=True)
    assert "lm_eval_task:custom_score" in pack.metrics
    async with convsim.Simulator("scripted") as sim:
        results = [r async for r in sim.run(pack, limit=6)]
    _check(results, pack.metrics)


def test_lm_eval_task_scores_its_documents_from_the_command_line(
    tasks: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run.jsonl"
    args = ["run", f"lm-eval:{TASK}", "--include-path", str(tasks), "--allow-code", "--limit", "6"]
    result = CliRunner().invoke(main, [*args, "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    results = convsim.read_results(out)
    assert len(results) == 6
    metrics = tuple(n for n in results[0].scores if n.startswith("lm_eval_task:"))
    _check(results, metrics)
