"""Repeated trials: each scenario K times, pass@k and pass^k, resumable trial by trial."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import convsim
from convsim import Score, Status
from convsim.cli import main
from convsim.results._report import summarize


def test_pass_at_k_and_pass_hat_k_by_hand() -> None:
    """Scenario a: goal met in 2 of 3 trials; b: in 3 of 3; c: a trial failed."""
    (base,) = convsim.run_sync("customer_support", "scripted", limit=1)
    outcomes = {"a": [1.0, 1.0, 0.0], "b": [1.0, 1.0, 1.0]}
    results = []
    for scenario, values in outcomes.items():
        for k, value in enumerate(values, start=1):
            results.append(
                base.model_copy(
                    update={
                        "conversation_id": f"{scenario}#{k}",
                        "scenario_id": scenario,
                        "trial": k,
                        "scores": {**base.scores, "goal_achievement": Score(value=value)},
                    }
                )
            )
    report = summarize(results)
    assert report.trials == 3
    assert report.pass_hat_k == pytest.approx({1: (2 / 3 + 1) / 2, 2: (1 / 3 + 1) / 2, 3: 0.5})
    assert report.pass_at_k == pytest.approx({1: (2 / 3 + 1) / 2, 2: 1.0, 3: 1.0})
    assert report.trial_spread["goal_achievement"] == pytest.approx(
        ((2 / 9) ** 0.5 + 0.0) / 2  # population std of (1, 1, 0), and of (1, 1, 1)
    )
    failed = base.model_copy(
        update={
            "conversation_id": "b#4",
            "scenario_id": "b",
            "trial": 4,
            "status": Status.FAILED,
            "scores": {"goal_achievement": Score(value=None, reason="not reached")},
        }
    )
    with_failure = summarize([*results, failed])
    assert with_failure.pass_hat_k[4] == 0.0  # b's failed fourth trial counts as a miss


def test_trials_run_each_scenario_k_times_and_resume_by_trial(tmp_path: Path) -> None:
    out = tmp_path / "trials.jsonl"
    runner = CliRunner()
    first = runner.invoke(
        main,
        ["run", "customer_support", "--model", "scripted", "--trials", "3", "--limit", "7",
         "--out", str(out), "--no-progress"],
    )  # fmt: skip
    assert first.exit_code == 0, first.output
    assert len(out.read_text().splitlines()) == 7
    rest = runner.invoke(
        main,
        ["run", "customer_support", "--model", "scripted", "--trials", "3", "--resume",
         "--out", str(out), "--no-progress"],
    )  # fmt: skip
    assert rest.exit_code == 0, rest.output
    results = convsim.read_results(out)
    scenarios = {r.scenario_id for r in results}
    assert len(results) == 3 * len(scenarios)  # every trial once, none twice
    for scenario in scenarios:
        trials = sorted((r for r in results if r.scenario_id == scenario), key=lambda r: r.trial)
        assert [r.trial for r in trials] == [1, 2, 3]
        assert [r.conversation_id for r in trials] == [f"{scenario}#{k}" for k in (1, 2, 3)]
        assert len({r.seed for r in trials}) == 3  # distinct seeds, recorded per trial
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["trials"] == 3
    assert set(summary["pass_at_k"]) == set(summary["pass_hat_k"]) == {"1", "2", "3"}
    assert re.search(r"^\S\s+3\s+\S\s+[01]\.\d{3}\s+\S\s+[01]\.\d{3}\s+\S$", rest.output, re.M)
    assert "pass^k" in rest.output  # the table of k, 1 to 3


def test_one_trial_is_the_pack_itself() -> None:
    pack = convsim.load_pack("customer_support")
    assert pack.with_trials(1) is pack
    tripled = pack.with_trials(3)
    assert len(tripled) == 3 * len(pack) and tripled.pack_hash != pack.pack_hash
