"""The pack-source seam (``convsim.pack_sources``), end to end, with the third-party
example in tests/example_source: a package of its own, 'installed' by its dist-info and
entry point, whose quiz format ``convsim run quiz:FILE`` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convsim import PackError
from convsim.scenarios import LoadOptions, problems_pack

EXAMPLE = Path(__file__).parent / "example_source"

QUIZ = """\
# Capitals of Europe
Q: What is the capital of France?
A: Paris
K: Paris

Q: What is the capital of Italy?
A: Rome
D: easy

Q: What is the capital of Spain?
A: Madrid
"""


def convsim(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(EXAMPLE), os.environ.get("PYTHONPATH")) if p),
    }
    return subprocess.run(
        [sys.executable, "-m", "convsim", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
def test_a_third_party_format_runs_through_its_entry_point(tmp_path: Path) -> None:
    quiz = tmp_path / "capitals.quiz"
    quiz.write_text(QUIZ)
    out = tmp_path / "r.jsonl"
    done = convsim("run", f"quiz:{quiz}", "--model", "scripted", "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["conversation_id"] for r in rows] == ["capitals-2", "capitals-6", "capitals-10"]
    assert all("exact_match" in r["scores"] for r in rows)
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["pack"] == f"quiz:{quiz}"
    assert manifest["pack_options"]["dataset"] == {"format": "quiz", "path": "capitals.quiz"}

    quiz.write_text(QUIZ.replace("A: Rome\n", "A: Rome\nX: nothing\n").replace("A: Madrid\n", ""))
    done = convsim("validate", f"quiz:{quiz}")
    assert done.returncode == 2
    assert "capitals.quiz:8: expected Q:, A:, K: or D:, not 'X: nothing'" in done.stderr
    quiz.write_text(QUIZ.replace("A: Madrid\n", ""))
    done = convsim("validate", f"quiz:{quiz}")
    assert done.returncode == 2
    assert "capitals.quiz:10: expected_answer: Field required" in done.stderr
    assert "Traceback" not in done.stderr


def test_problems_pack_validates_and_samples_like_a_folder(tmp_path: Path) -> None:
    config = {
        "task_name": "sums",
        "dataset": {"size": 2},
        "prompt_templates": {"default": "Q: {question}"},
    }
    problems = [(i, {"question": f"{i}+{i}", "expected_answer": str(2 * i)}) for i in range(1, 6)]
    pack = problems_pack("sums:x", config, problems, source="x.sums", options=LoadOptions(seed=3))
    assert pack.name == "sums:x" and len(pack) == 2
    assert pack.notes == ("x.sums: sampled 2 of 5 problems with seed 3",)
    assert pack.dataset["sampled"] == "sampled 2 of 5 problems with seed 3"
    again = problems_pack("sums:x", config, problems, source="x.sums", options=LoadOptions(seed=3))
    assert [c.scenario.scenario_id for c in again.conversations] == [
        c.scenario.scenario_id for c in pack.conversations
    ]
    assert again.pack_hash == pack.pack_hash

    bad = [(4, {"question": "q"}), (9, {"question": "q", "expected_answer": "a", "nope": 1})]
    with pytest.raises(PackError) as exc:
        problems_pack("sums:x", {**config, "dataset": {"format": "csv"}}, bad, source="x.sums",
                      options=LoadOptions())  # fmt: skip
    assert [str(p) for p in exc.value.problems] == [
        "sums:x config: dataset.format: does not apply: the pack source reads the problems",
        "x.sums:4: expected_answer: Field required",
        "x.sums:9: nope: unknown field",
    ]


def test_a_sources_language_note_names_no_line_it_does_not_have() -> None:
    config = {
        "task_name": "sums",
        "evaluation_config": {"languages": ["en"]},
        "prompt_templates": {"default": "Q: {question}"},
    }
    problems = [
        (1, {"question": "1+1", "expected_answer": "2", "language": "en"}),
        (2, {"question": "2+2", "expected_answer": "4", "language": "fr"}),
    ]
    pack = problems_pack("sums:x", config, problems, source="x.sums", options=LoadOptions())
    (note,) = pack.notes
    assert "None" not in note and "evaluation_config.languages (en) keeps 1 of 2" in note, note
