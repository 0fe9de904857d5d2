"""Group summaries: a group holding the whole run shares the run's figures, computed once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import convsim
import convsim.metrics._aggregate as aggregate_module
from convsim import summarize
from convsim.metrics._aggregate import Interval


@pytest.fixture(scope="module")
def results() -> list[convsim.ConversationResult]:
    return convsim.run_sync("single_turn_qa", "scripted", limit=12)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the value lists the summary bootstraps, in order."""
    calls: list[int] = []
    real = aggregate_module.bootstrap_ci

    def counted(values: Sequence[float], **kwargs: int) -> Interval:
        calls.append(len(values))
        return real(values, **kwargs)

    monkeypatch.setattr(aggregate_module, "bootstrap_ci", counted)
    return calls


def test_a_group_of_every_conversation_has_the_runs_figures_bootstrapped_once(
    results: list[convsim.ConversationResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(monkeypatch)
    report = summarize(results)
    for groups in (report.by_model, report.by_scenario_type):  # one model, one type
        (group,) = groups.values()
        assert group.conversations == 12 and group.metrics == report.metrics
    # the pack's difficulties split the run: each part has figures of its own
    parts = report.by_difficulty.values()
    assert sorted(p.metrics["latency"].n for p in parts) == [3, 3, 6]
    summaries = [*report.metrics.values(), *report.turn_metrics.values()]
    summaries += [*report.retention_curve.values(), *(m for p in parts for m in p.metrics.values())]
    assert sorted(calls) == sorted(s.n for s in summaries if s.n)


def test_groups_that_split_the_run_have_their_own_figures(
    results: list[convsim.ConversationResult],
) -> None:
    split = [r.model_copy(update={"model": "other"}) if i < 4 else r for i, r in enumerate(results)]
    report = summarize(split)
    other, scripted = report.by_model["other"], report.by_model[results[0].model]
    assert other.metrics["latency"].n == 4 and scripted.metrics["latency"].n == 8
    assert other.metrics["latency"].mean != report.metrics["latency"].mean
    assert other.metrics["latency"].ci_low is not None
