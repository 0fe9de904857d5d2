"""`convsim score RESULTS.jsonl`: a stored run scored again, with other metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import convsim
from convsim.cli import main
from convsim.scenarios import BUNDLED_PACKS_DIR

PACK = "multi_session_memory"


def _run(tmp_path: Path, pack: str | Path = PACK, **kw: object) -> Path:
    out = tmp_path / "run.jsonl"
    convsim.run_sync(
        pack,
        "scripted",
        model_args={"memory_turns": 2},
        out=out,
        metrics=["context_retention"],
        **kw,
    )
    return out


def _score(
    path: Path, metrics: str, tmp_path: Path, *extra: str
) -> tuple[str, list[dict[str, object]]]:
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        main,
        ["score", str(path), "--metrics", metrics, "--out", str(out), *extra],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    return result.output, [json.loads(line) for line in out.read_text().splitlines()]


def test_a_run_is_scored_again_with_its_packs_facts(tmp_path: Path) -> None:
    path = _run(tmp_path, limit=5)
    stored = {r.conversation_id: r for r in convsim.read_results(path)}
    output, rows = _score(path, "context_retention,coherence,response_length", tmp_path)
    assert "note:" not in output  # the pack was found, unchanged
    assert [row["conversation_id"] for row in rows] == list(stored)
    for row in rows:
        scores = row["scores"]
        assert isinstance(scores, dict)
        again = scores["context_retention"]
        before = stored[str(row["conversation_id"])].scores["context_retention"]
        # the same metric on the same recorded turns and facts gives the same score
        assert again["value"] == before.value and again["status"] == before.status
        assert scores["coherence"]["status"] == "ok"
    assert any(r.scores["context_retention"].value not in (None, 1.0) for r in stored.values())


def test_a_changed_pack_is_not_used_and_the_output_says_so(tmp_path: Path) -> None:
    pack = tmp_path / "memory"
    shutil.copytree(BUNDLED_PACKS_DIR / PACK, pack)
    path = _run(tmp_path, pack, limit=3)
    with (pack / "scenarios.jsonl").open("a", encoding="utf-8") as fh:
        fh.write("\n")  # any change to the pack's files changes its hash
    output, rows = _score(path, "context_retention", tmp_path)
    assert "has changed since the run" in output
    assert len(rows) == 3
    for row in rows:
        retention = row["scores"]["context_retention"]  # type: ignore[index]
        # no declared facts: only the reference-free fallback can apply
        assert retention["status"] != "ok" or retention["details"]["mode"] == "reference-free"


def test_a_conversation_recorded_twice_counts_by_its_last_line(tmp_path: Path) -> None:
    path = _run(tmp_path, limit=2)
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["turns"] = first["turns"][:1]  # an earlier, shorter record of the same conversation
    path.write_text("\n".join([json.dumps(first), *lines]) + "\n", encoding="utf-8")
    _, rows = _score(path, "response_length", tmp_path)
    assert len(rows) == 2
    again = {row["conversation_id"]: row for row in rows}
    stored = convsim.read_results(path)
    full = next(r for r in reversed(stored) if r.conversation_id == first["conversation_id"])
    assert again[first["conversation_id"]]["scores"]["response_length"]["details"]["n"] == sum(  # type: ignore[index]
        1 for t in full.turns if t.status.value == "completed"
    )


def test_a_damaged_results_file_names_the_line(tmp_path: Path) -> None:
    path = _run(tmp_path, limit=3)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "status": "NOT_A_STATUS"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["score", str(path), "--metrics", "response_length"])
    assert result.exit_code == 2
    assert f"{path}:2: not a convsim result" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_an_empty_file_is_refused_clearly(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    result = CliRunner().invoke(main, ["score", str(path), "--metrics", "response_length"])
    assert result.exit_code == 2 and "holds no conversations" in result.output


def test_a_pack_loaded_with_options_is_loaded_again_the_same_way(tmp_path: Path) -> None:
    out = tmp_path / "fewshot.jsonl"
    result = CliRunner().invoke(
        main,
        ["run", "single_turn_qa", "--num-fewshot", "2", "--limit", "4", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads(out.with_name("fewshot.manifest.json").read_text())
    assert manifest["pack_options"] == {
        "num_fewshot": 2,
        "dataset": {"format": "jsonl", "path": "problems.jsonl"},
    }
    output, rows = _score(out, "exact_match", tmp_path, "--allow-code")  # lm-eval task files
    assert "note:" not in output
    assert [row["scores"]["exact_match"]["value"] for row in rows] == [1.0] * 4  # type: ignore[index]


def test_an_lm_eval_task_run_is_scored_again_with_its_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from convsim.lm_eval import export_lm_eval_tasks

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = tmp_path / "tasks"
    export_lm_eval_tasks(["single_turn_qa"], out=tasks)
    out = tmp_path / "lm.jsonl"
    args = ["run", "lm-eval:single_turn_scenarios_single_turn_qa", "--include-path", str(tasks)]
    args.append("--allow-code")  # lm-eval task files are code
    result = CliRunner().invoke(main, [*args, "--limit", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    output, rows = _score(out, "exact_match", tmp_path, "--allow-code")  # lm-eval task files
    assert "note:" not in output
    assert [row["scores"]["exact_match"]["value"] for row in rows] == [1.0] * 3  # type: ignore[index]


@pytest.mark.parametrize("target", ["itself", "another run"])
def test_scores_never_replace_a_results_file(tmp_path: Path, target: str) -> None:
    path = _run(tmp_path, limit=2)
    kept = path.read_bytes()
    other = path if target == "itself" else tmp_path / "other.jsonl"
    if other != path:
        shutil.copy(path, other)
    result = CliRunner().invoke(
        main, ["score", str(path), "--metrics", "response_length", "--out", str(other)]
    )
    assert result.exit_code == 2, result.output
    assert "results file" in result.output and "Traceback" not in result.output
    assert path.read_bytes() == kept and other.read_bytes() == kept
