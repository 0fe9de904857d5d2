"""Results as data: results files as flat DataFrames, and the report's CSV."""

from __future__ import annotations

import builtins
import csv
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import convsim
from convsim.cli import main
from convsim.results import load


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("runs")
    paths = []
    for name, model_args in (("full", {}), ("forgetful", {"memory_turns": "1"})):
        path = folder / f"{name}.jsonl"
        convsim.run_sync("customer_support", "scripted", out=path, limit=3, model_args=model_args)
        paths.append(path)
    return paths


def test_one_row_per_conversation_turn_and_score_across_files(two_runs: list[Path]) -> None:
    results = load(two_runs)
    conversations, turns, scores = results.conversations, results.turns, results.scores
    assert len(conversations) == 6
    assert set(conversations["file"]) == {str(p) for p in two_runs}
    assert {"score.context_retention", "score.coherence"} <= set(conversations.columns)
    assert (conversations["status"] == "DONE").all()
    # every turn of every conversation, with its conversation's id and the text said
    counted = turns.groupby(["file", "conversation_id"]).size().rename("counted").reset_index()
    joined = conversations.merge(counted, on=["file", "conversation_id"])
    assert len(joined) == 6 and (joined["counted"] == joined["turns"]).all()
    completed = turns[turns["status"] == "completed"]
    assert len(completed) > 0 and completed["response"].notna().all()
    # conversation scores and the metric columns agree
    retention = scores[(scores["metric"] == "context_retention") & scores["turn_id"].isna()]
    merged = retention.merge(conversations, on=["file", "conversation_id"])
    assert (merged["value"].fillna(-1) == merged["score.context_retention"].fillna(-1)).all()


def test_a_retried_conversation_counts_once(tmp_path: Path, two_runs: list[Path]) -> None:
    lines = two_runs[0].read_text().splitlines()
    first = json.loads(lines[0])
    first["status"] = "FAILED"
    copy = tmp_path / "retried.jsonl"
    copy.write_text("\n".join([json.dumps(first), *lines]) + "\n")  # failed, then done
    conversations = load(copy).conversations
    row = conversations[conversations["conversation_id"] == first["conversation_id"]]
    assert len(row) == 1 and row["status"].item() == "DONE"


def test_without_pandas_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, two_runs: list[Path]
) -> None:
    real_import = builtins.__import__

    def no_pandas(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pandas":
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(convsim.ConfigError, match=r"convsim\[pandas\]"):
        load(two_runs[0])


def test_report_writes_one_csv_row_per_conversation(two_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "runs.csv"
    result = CliRunner().invoke(main, ["report", str(two_runs[1]), "--csv", str(out)])
    assert result.exit_code == 0, result.output
    with out.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3
    assert rows[0]["model"] == "scripted" and "score.context_retention" in rows[0]
    frame = load(two_runs[1]).conversations
    assert [r["conversation_id"] for r in rows] == list(frame["conversation_id"])


def test_report_csv_where_no_folder_can_be_made_exits_2(
    two_runs: list[Path], tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "runs.csv"
    result = CliRunner().invoke(main, ["report", str(two_runs[1]), "--csv", str(out)])
    assert result.exit_code == 2 and f"{out}: cannot create its folder" in result.stderr
    assert "Traceback" not in result.output


def test_the_trial_of_each_conversation_is_a_column(tmp_path: Path, two_runs: list[Path]) -> None:
    path = tmp_path / "trials.jsonl"
    convsim.run_sync(convsim.load_pack("customer_support").with_trials(3), "scripted",
                     out=path, limit=6)  # fmt: skip
    conversations = load(path).conversations
    assert sorted(conversations["trial"]) == [1, 1, 2, 2, 3, 3]
    suffix = "#" + conversations["trial"].astype(str)
    ids = conversations["conversation_id"]
    assert all(c.endswith(s) for c, s in zip(ids, suffix, strict=True))
    assert load(two_runs[0]).conversations["trial"].isna().all()  # one trial: none said


def test_the_csv_of_report_has_the_trial_and_its_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    convsim.run_sync(convsim.load_pack("customer_support").with_trials(2), "scripted",
                     out=path, limit=2)  # fmt: skip
    out = tmp_path / "new" / "folder" / "rows.csv"
    done = CliRunner().invoke(main, ["report", str(path), "--csv", str(out)])
    assert done.exit_code == 0, done.output
    with out.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["trial"] for r in rows) == ["1", "2"]
    assert all(r["conversation_id"].endswith("#" + r["trial"]) for r in rows)
