"""lm-eval generate_until tasks run as convsim packs: ``convsim run lm-eval:TASK``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_lm_eval_model import QUESTIONS, _evaluate, _write_task

import convsim
from convsim import ConfigError
from convsim.cli import main
from convsim.scenarios import load_pack

pytestmark = pytest.mark.usefixtures("offline")


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def half_right(tmp_path: Path) -> Path:
    """A task whose filter keeps what follows "You wrote: " in the answer: `scripted`
    echoes the prompt there (its opening words vary with the seed), and half the targets
    are the prompt."""
    docs = [
        {"question": q, "answer": q if i % 2 == 0 else "something else"}
        for i, q in enumerate(QUESTIONS)
    ]
    root = _write_task(tmp_path, "half_right", docs)
    config = root / "half_right.yaml"
    config.write_text(
        config.read_text(encoding="utf-8")
        + "filter_list:\n"
        + "  - name: echo\n"
        + "    filter:\n"
        + "      - function: regex\n"
        + '        regex_pattern: "You wrote: (.*)"\n'
        + "      - function: take_first\n",
        encoding="utf-8",
    )
    return root


def test_a_task_becomes_one_single_turn_conversation_per_document(tmp_path: Path) -> None:
    pack = load_pack("lm-eval:half_right", include_path=half_right(tmp_path), allow_code=True)
    assert pack.name == "lm-eval:half_right" and len(pack) == len(QUESTIONS)
    assert pack.metrics == ("lm_eval_task:exact_match",)
    first = pack.conversations[0]
    assert first.scenario.variables["prompt"] == QUESTIONS[0]  # lm-eval's own context
    settings = first.flow.turns[0].config.config
    assert settings.stop == ["\n"] and settings.max_tokens == 64 and settings.temperature == 0


def test_scores_equal_lm_evals_own_on_the_same_outputs(tmp_path: Path) -> None:
    include = half_right(tmp_path)
    theirs = _evaluate(
        "convsim", include, "half_right", model_args="model=scripted", log_samples=True
    )
    pack = load_pack("lm-eval:half_right", include_path=include, allow_code=True)
    ours = convsim.run_sync(pack, "scripted", model_args={"use_references": "false"}, metrics=[])
    by_doc = {int(r.conversation_id.rsplit("-", 1)[1]): r for r in ours}
    for sample in theirs["samples"]["half_right"]:  # the filter saw the same text
        details = by_doc[sample["doc_id"]].scores["lm_eval_task:exact_match"].details
        assert details["lm_eval"]["exact_match,echo"] == sample["exact_match"]
    values = [r.scores["lm_eval_task:exact_match"].value for r in ours]
    expected = theirs["results"]["half_right"]["exact_match,echo"]
    assert sum(values) / len(values) == pytest.approx(expected) == pytest.approx(0.5)


def test_corpus_metrics_reduce_the_whole_run_as_lm_eval_does(tmp_path: Path) -> None:
    include = half_right(tmp_path)
    config = include / "half_right.yaml"
    config.write_text(
        config.read_text(encoding="utf-8").replace(
            "  - metric: exact_match\n    aggregation: mean\n",
            "  - metric: bleu\n    aggregation: bleu\n"
            "  - metric: chrf\n    aggregation: chrf\n"
            "  - metric: ter\n    aggregation: ter\n"
            "  - metric: exact_match\n    aggregation: mean\n",
        ),
        encoding="utf-8",
    )
    theirs = _evaluate("convsim", include, "half_right", model_args="model=scripted")
    pack = load_pack("lm-eval:half_right", include_path=include, allow_code=True)
    names = ("bleu", "chrf", "ter", "exact_match")
    assert set(pack.metrics) == {f"lm_eval_task:{m}" for m in names}
    ours = convsim.run_sync(pack, "scripted", model_args={"use_references": "false"}, metrics=[])
    report = convsim.summarize(ours)
    expected = theirs["results"]["half_right"]
    for metric in ("bleu", "chrf", "ter"):
        summary = report.metrics[f"lm_eval_task:{metric}"]
        assert summary.corpus == pytest.approx(expected[f"{metric},echo"]), metric
    # half the answers are right: neither nothing nor everything (BLEU of three-word
    # answers is 0 at the corpus level: they have no 4-grams)
    assert 0 < report.metrics["lm_eval_task:chrf"].corpus < 100
    assert 0 < report.metrics["lm_eval_task:ter"].corpus < 100
    assert report.metrics["lm_eval_task:ter"].higher_is_better is False
    assert report.metrics["lm_eval_task:exact_match"].corpus is None  # a mean is just that
    first = ours[0].scores["lm_eval_task:bleu"]
    assert first.details["corpus_aggregation"] == "lm_eval:bleu"
    assert "lm_eval_task:bleu" in report.to_markdown().split("Over the whole run")[1]


def test_cli_runs_a_task_and_reports_its_metric(tmp_path: Path) -> None:
    include = half_right(tmp_path)
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "lm-eval:half_right",
            "--include-path",
            str(include),
            "--allow-code",
            "--model-arg",
            "use_references=false",
            "--metrics",
            "response_length",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(QUESTIONS)
    values = sorted(r["scores"]["lm_eval_task:exact_match"]["value"] for r in rows)
    assert values == [0.0, 0.0, 1.0, 1.0]


def test_tasks_convsim_cannot_run_are_refused_clearly(tmp_path: Path) -> None:
    include = half_right(tmp_path)
    with pytest.raises(ConfigError, match="not found in"):
        load_pack("lm-eval:no_such_task", include_path=include, allow_code=True)
    text = (include / "half_right.yaml").read_text(encoding="utf-8")
    (include / "half_right.yaml").write_text(
        text.replace("output_type: generate_until", "output_type: loglikelihood"), encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="generate_until"):
        load_pack("lm-eval:half_right", include_path=include, allow_code=True)
    with pytest.raises(ConfigError, match="do not apply to lm-eval"):
        load_pack("lm-eval:half_right", include_path=include, num_fewshot=2, allow_code=True)


def test_loading_a_task_leaves_the_callers_random_state_and_logging_alone(
    tmp_path: Path,
) -> None:
    import logging
    import random

    include = half_right(tmp_path)
    random.seed(42)
    expected = [random.random() for _ in range(3)]
    random.seed(42)
    levels = {n: logging.getLogger(n).level for n in ("", "convsim")}
    load_pack("lm-eval:half_right", include_path=include, allow_code=True)
    assert [random.random() for _ in range(3)] == expected
    assert {n: logging.getLogger(n).level for n in ("", "convsim")} == levels
    site_packages = Path(convsim.__file__).parents[1]
    assert not any(site_packages.glob("**/half_right*"))  # no caches beside the package
