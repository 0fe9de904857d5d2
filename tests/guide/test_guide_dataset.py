"""The guide's single-turn task files (Creating Custom Tasks, steps 3 and 4), copied from
the guide: problems.jsonl as written (its first line, a ``#`` comment naming the file, is
skipped) and config.yml as written (the spaces on its blank lines left out). Its
``dataset.size: 100`` with three problems runs all three and says so."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from convsim import load_pack
from convsim.cli import main

PROBLEMS_JSONL = """\
# lm_eval/tasks/single_turn_scenarios/my_new_task/problems.jsonl
{"question": "What is the capital of France?", "expected_answer": "Paris", "context": "", "required_keywords": ["paris", "france"], "difficulty": "easy"}
{"question": "Explain the concept of recursion in programming.", "expected_answer": "Recursion is a programming technique where a function calls itself to solve smaller instances of the same problem.", "context": "Programming concepts", "required_keywords": ["function", "calls", "itself"], "difficulty": "medium"}
{"question": "Calculate the derivative of x^2 + 3x + 2", "expected_answer": "2x + 3", "context": "Calculus", "required_keywords": ["derivative", "2x", "3"], "difficulty": "medium"}
"""  # noqa: E501

CONFIG_YML = """\
# lm_eval/tasks/single_turn_scenarios/my_new_task/config.yml
task_name: "my_new_task"
task_type: "single_turn"
description: "Evaluate model's ability to [describe capability]"
version: 1.0

dataset:
  path: "problems.jsonl"
  format: "jsonl"
  size: 100

metrics:
  primary:
    - "exact_match"
    - "custom_score"
  secondary:
    - "semantic_similarity"

evaluation_config:
  context_modes: ["no_context", "minimal_context", "full_context"]
  languages: ["en"]
  difficulty_levels: ["easy", "medium", "hard"]

prompt_templates:
  default: |
    {context}

    Question: {question}

    Answer:

  with_examples: |
    Here are some examples:
    {examples}

    {context}

    Question: {question}

    Answer:
"""


def guide_pack(folder: Path) -> Path:
    folder.mkdir()
    (folder / "problems.jsonl").write_text(PROBLEMS_JSONL)
    (folder / "config.yml").write_text(CONFIG_YML)
    return folder


def test_the_guides_task_files_load_with_size_over_the_data(tmp_path: Path) -> None:
    pack = load_pack(guide_pack(tmp_path / "my_new_task"))
    assert len(pack) == 3
    assert pack.notes == (
        "problems.jsonl: dataset.size is 100, but the dataset holds 3 problems: all 3 are used",
    )
    assert pack.dataset == {"format": "jsonl", "path": "problems.jsonl"}


def test_the_guides_task_runs_and_records_its_dataset(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main, ["run", str(guide_pack(tmp_path / "my_new_task")), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 3
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["pack_options"]["dataset"] == {"format": "jsonl", "path": "problems.jsonl"}
