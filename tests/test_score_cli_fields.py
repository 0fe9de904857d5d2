"""Failed vs not-applicable scores, and the scenario fields and judge options of
``convsim score``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import convsim
from convsim import Score, summarize
from convsim.cli import main
from convsim.metrics import METRICS, read_transcripts, score_transcript

MESSAGES = [
    {"role": "user", "content": "What is compound interest?"},
    {"role": "assistant", "content": "Interest on interest."},
    {"role": "user", "content": "And diversification?"},
    {"role": "assistant", "content": "Spreading a portfolio to reduce risk."},
]


class Boom:
    """A metric whose scorer always crashes."""

    name = "boom"
    higher_is_better = True
    description = "always fails"

    def scorer(self, conversation: Any) -> Boom:
        return self

    def update(self, turn: Any) -> None:
        pass

    def result(self) -> Score:
        raise RuntimeError("kaput")


@pytest.fixture
def boom(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(METRICS._factories, "boom", Boom)


def write(tmp_path: Path, *records: dict[str, Any]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# -- 1. failed is not "not applicable" ------------------------------------------------


def test_score_status_and_constructors() -> None:
    assert Score(value=0.5).status == "ok"
    assert Score.not_applicable("nothing to check").status == "not_applicable"
    failed = Score.failed("RuntimeError: kaput")
    assert failed.status == "failed" and failed.reason == "metric failed: RuntimeError: kaput"
    # records written before the status field: inferred from the reason
    old = Score.model_validate({"value": None, "reason": "metric failed: judge down"})
    assert old.status == "failed"
    assert Score.model_validate({"value": None, "reason": "not applicable: x"}).status == (
        "not_applicable"
    )
    assert Score.model_validate({"value": 1.0, "reason": None}).status == "ok"
    assert Score.model_validate(failed.model_dump()) == failed
    with pytest.raises(ValueError):
        Score(value=1.0, status="failed")


def test_report_counts_failed_metrics_apart(boom: None) -> None:
    results = convsim.run_sync("single_turn_qa", "scripted", limit=3, metrics=["boom", "latency"])
    report = summarize(results)
    summary = report.metrics["boom"]
    assert summary.failed == 3 and summary.not_applicable == 0 and summary.n == 0
    assert report.metrics["latency"].failed == 0
    md = report.to_markdown()
    assert "| not applicable | failed |" in md
    # no tier (the pack tiers others); applicable, scored, n/a, failed
    assert "| boom |  | n/a |  | n/a | 3 | 0 | 0 | 3 |" in md
    # results written before Score.status existed: still counted as failed
    old = []
    for r in results:
        data = r.model_dump(mode="json")
        for score in data["scores"].values():
            score.pop("status", None)
        old.append(type(r).model_validate(data))
    assert summarize(old).metrics["boom"].failed == 3


def test_report_command_shows_failed(boom: None, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    convsim.run_sync("single_turn_qa", "scripted", limit=2, metrics=["boom"], out=out)
    result = CliRunner().invoke(main, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert "failed" in result.stdout


def test_score_command_counts_failed_apart(boom: None, tmp_path: Path) -> None:
    path = write(tmp_path, {"conversation_id": "a", "messages": MESSAGES})
    result = CliRunner().invoke(
        main, ["score", str(path), "--metrics", "boom,exact_match"], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "failed" in rows["a"]
    cells = [c.strip() for c in rows["boom"].split("│")]
    assert cells[1:-1] == ["boom", "n/a", "", "0", "0", "1"]
    cells = [c.strip() for c in rows["exact_match"].split("│")]
    assert cells[1:-1] == ["exact_match", "n/a", "", "0", "1", "0"]


# -- 2. scenario fields in transcript records -----------------------------------------


def test_score_reads_references_keywords_metadata_and_groups(tmp_path: Path) -> None:
    common = {
        "messages": MESSAGES,
        "reference_responses": {"1": "Interest on interest.", "t2": "Something else."},
        "required_keywords": ["risk"],
        "metadata": {"domain": "finance"},
        "tags": ["finance"],
    }
    path = write(
        tmp_path,
        {"conversation_id": "a", **common, "scenario_type": "advice", "difficulty": "easy"},
        {"conversation_id": "b", **common, "scenario_type": "faq", "difficulty": "hard"},
    )
    out = tmp_path / "s.jsonl"
    metrics = "exact_match,custom_score,domain_expertise,semantic_similarity"
    result = CliRunner().invoke(
        main, ["score", str(path), "--metrics", metrics, "--out", str(out)], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["scenario_type"], r["difficulty"]) for r in rows] == [
        ("advice", "easy"),
        ("faq", "hard"),
    ]
    scores = rows[0]["scores"]
    assert scores["exact_match"]["value"] == 0.5
    assert scores["custom_score"]["value"] == pytest.approx((0.2 + 1.0) / 2)
    assert scores["domain_expertise"]["status"] == "ok"
    assert scores["semantic_similarity"]["status"] == "ok"
    assert "by scenario_type" in result.stdout and "by difficulty" in result.stdout
    assert "advice" in result.stdout and "hard" in result.stdout
    transcript, _ = read_transcripts(path)
    assert transcript.conversation.scenario.tags == ["finance"]
    assert transcript.conversation.flow.scenario_type == "advice"


def test_score_transcript_from_python_takes_scenario_fields() -> None:
    scores = score_transcript(
        MESSAGES, ["exact_match"], reference_responses={2: "Spreading a portfolio to reduce risk."}
    )
    assert scores["exact_match"].value == 1.0
    with pytest.raises(TypeError, match="colour"):
        score_transcript(MESSAGES, ["exact_match"], colour="red")


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"reference_responses": {"9": "x"}}, "t.jsonl:1: reference_responses.t9: unknown turn"),
        ({"reference_responses": ["x"]}, "t.jsonl:1: reference_responses:"),
        ({"reference_responses": {"1": 5}}, "t.jsonl:1: reference_responses.t1:"),
        ({"required_keywords": "risk"}, "t.jsonl:1: required_keywords:"),
        ({"required_keywords": [1]}, "t.jsonl:1: required_keywords.0:"),
        ({"metadata": [1]}, "t.jsonl:1: metadata:"),
        ({"tags": "finance"}, "t.jsonl:1: tags:"),
        ({"scenario_type": 3}, "t.jsonl:1: scenario_type:"),
        ({"difficulty": ["hard"]}, "t.jsonl:1: difficulty:"),
    ],
)
def test_bad_scenario_fields_name_file_line_and_field(
    tmp_path: Path, fields: dict[str, Any], where: str
) -> None:
    path = write(tmp_path, {"conversation_id": "a", "messages": MESSAGES, **fields})
    result = CliRunner().invoke(main, ["score", str(path), "--metrics", "exact_match"])
    assert result.exit_code == 2, result.output
    assert where in result.stderr and "Traceback" not in result.stderr
    assert "unknown field" not in result.stderr  # the field is read, its value is bad


# -- 2b. judge options and budgets on convsim score ---------------------------------


def test_score_judge_samples_combine_and_budgets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import FakeAdapter

    from convsim.adapters import ADAPTERS
    from convsim.adapters._budget import Budgets

    bound: list[Any] = []

    class BudgetedJudge(FakeAdapter):
        def share_budgets(self, budgets: Budgets) -> None:
            bound.append(budgets)

    answers = iter(['{"score": 5, "reason": "a"}', '{"score": 1, "reason": "b"}'] * 10)
    monkeypatch.setitem(
        ADAPTERS._factories, "fakejudge", lambda config: BudgetedJudge(lambda m, p: next(answers))
    )
    path = write(tmp_path, {"conversation_id": "a", "messages": MESSAGES})
    out = tmp_path / "s.jsonl"
    args = ["score", str(path), "--metrics", "judge:Is it polite?", "--out", str(out)]
    result = CliRunner().invoke(
        main, [*args, "--judge", "fakejudge", "--judge-samples", "3", "--judge-combine", "majority"]
    )
    assert result.exit_code == 0, result.output
    score = json.loads(out.read_text())["scores"]["judge:Is it polite?"]
    assert score["details"]["judge_calls"] == 6  # 3 samples x 2 turns
    assert len(bound) == 1 and isinstance(bound[0], Budgets)
    bad = CliRunner().invoke(main, [*args, "--judge", "fakejudge", "--judge-combine", "median"])
    assert bad.exit_code == 2
