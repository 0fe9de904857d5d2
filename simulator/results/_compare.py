"""Two runs of the same scenarios, compared conversation by conversation.

Conversations are paired by ``conversation_id``; those found in one run only are listed,
never silently dropped. For each metric, over the pairs where both runs have a value:
the mean of each run, the mean difference (candidate minus base) with a paired bootstrap
95% interval, a Wilcoxon signed-rank test, wins, ties and losses (a win is the candidate
better, by the metric's direction), and the conversations that changed most. A metric is
*significantly worse* when the whole interval lies on the worse side of zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from convsim._records import ConversationResult, MetricTiers
from convsim.metrics import percentile
from convsim.metrics._bootstrap import integers_draw, resample_means
from convsim.results._report import _higher_is_better
from convsim.results._sinks import read_results

__all__ = ["MetricComparison", "Comparison", "compare", "compare_files"]

_BOOTSTRAP = 10_000
_CHANGED = 5


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Change(_Model):
    conversation_id: str
    base: float
    candidate: float
    difference: float


class MetricComparison(_Model):
    """One metric over the paired conversations."""

    metric: str
    higher_is_better: bool | None
    pairs: int
    tier: str | None = None
    """``primary`` or ``secondary`` as the runs' pack declares it; None when untiered."""
    base_mean: float | None
    candidate_mean: float | None
    mean_difference: float | None
    """Candidate minus base."""
    ci95: list[float] | None
    """Paired bootstrap 95% interval of the mean difference (seeded)."""
    wilcoxon_p: float | None
    """Two-sided Wilcoxon signed-rank p-value; None with fewer than two differing pairs."""
    wins: int
    ties: int
    losses: int
    significantly_worse: bool
    """The candidate is worse and the interval excludes zero (needs a direction)."""
    most_changed: list[Change]


class Comparison(_Model):
    """A candidate run against a base run."""

    base: str
    candidate: str
    paired: int
    only_in_base: list[str]
    only_in_candidate: list[str]
    metrics: list[MetricComparison]
    """The primary metrics first, then the secondary ones, then the rest."""
    metric_tiers: dict[str, list[str]] = Field(default_factory=dict)
    """The tiers the runs' packs declare (``{"primary": [...], "secondary": [...]}``);
    empty when they declare none."""


def _score(result: ConversationResult, metric: str) -> float | None:
    score = result.scores.get(metric)
    return None if score is None else score.value


def _bootstrap(diffs: np.ndarray) -> list[float] | None:
    if diffs.size < 2:
        return None
    means = resample_means(diffs, integers_draw(0), resamples=_BOOTSTRAP)
    return percentile(means, [2.5, 97.5])


def _wilcoxon(diffs: np.ndarray) -> float | None:
    if np.count_nonzero(diffs) < 2:
        return None
    from scipy.stats import wilcoxon

    return float(wilcoxon(diffs, zero_method="wilcox").pvalue)


def _one(
    metric: str,
    higher: bool | None,
    pairs: Sequence[tuple[str, ConversationResult, ConversationResult]],
    tier: str | None = None,
) -> MetricComparison:
    rows = [
        (cid, b, c)
        for cid, base, cand in pairs
        if (b := _score(base, metric)) is not None and (c := _score(cand, metric)) is not None
    ]
    if not rows:
        return MetricComparison(
            metric=metric,
            higher_is_better=higher,
            tier=tier,
            pairs=0,
            base_mean=None,
            candidate_mean=None,
            mean_difference=None,
            ci95=None,
            wilcoxon_p=None,
            wins=0,
            ties=0,
            losses=0,
            significantly_worse=False,
            most_changed=[],
        )
    base = np.array([b for _, b, _ in rows])
    cand = np.array([c for _, _, c in rows])
    diffs = cand - base
    sign = 1.0 if higher is not False else -1.0  # no direction: count "higher" as a win
    better = sign * diffs
    ci = _bootstrap(diffs)
    worse = False
    if ci is not None and higher is not None:
        worse = ci[1] < 0 if higher else ci[0] > 0
    order = np.argsort(-np.abs(diffs), kind="stable")[:_CHANGED]
    return MetricComparison(
        metric=metric,
        higher_is_better=higher,
        tier=tier,
        pairs=len(rows),
        base_mean=float(base.mean()),
        candidate_mean=float(cand.mean()),
        mean_difference=float(diffs.mean()),
        ci95=ci,
        wilcoxon_p=_wilcoxon(diffs),
        wins=int((better > 1e-12).sum()),
        ties=int((np.abs(better) <= 1e-12).sum()),
        losses=int((better < -1e-12).sum()),
        significantly_worse=worse,
        most_changed=[
            Change(
                conversation_id=rows[i][0],
                base=float(base[i]),
                candidate=float(cand[i]),
                difference=float(diffs[i]),
            )
            for i in order
            if diffs[i] != 0
        ],
    )


def compare(
    base: Sequence[ConversationResult],
    candidate: Sequence[ConversationResult],
    *,
    metrics: Sequence[str] | None = None,
    base_name: str = "base",
    candidate_name: str = "candidate",
    with_primary: bool = False,
) -> Comparison:
    """Compare ``candidate`` with ``base``, paired by conversation; ``metrics`` default
    to every conversation metric both runs scored, and ``with_primary`` adds the
    primary metrics to those given (a bare ``--fail-under`` gates them). Metrics are
    listed primary first, then secondary, then the rest."""
    by_base = {r.conversation_id: r for r in base}
    by_cand = {r.conversation_id: r for r in candidate}
    shared = [cid for cid in by_base if cid in by_cand]
    pairs = [(cid, by_base[cid], by_cand[cid]) for cid in shared]
    if metrics is None:
        seen_base = {m for r in base for m in r.scores}
        seen_cand = {m for r in candidate for m in r.scores}
        metrics = sorted(seen_base & seen_cand)
    tiers = _tiers([*candidate, *base])
    if tiers is not None:
        if with_primary:
            metrics = list(dict.fromkeys([*metrics, *tiers.primary]))
        metrics = tiers.ordered(list(metrics))
    direction = _higher_is_better(metrics)
    return Comparison(
        base=base_name,
        candidate=candidate_name,
        paired=len(pairs),
        only_in_base=[cid for cid in by_base if cid not in by_cand],
        only_in_candidate=[cid for cid in by_cand if cid not in by_base],
        metrics=[
            _one(m, direction.get(m), pairs, tiers.tier_of(m) if tiers is not None else None)
            for m in metrics
        ],
        metric_tiers={}
        if tiers is None
        else {"primary": list(tiers.primary), "secondary": list(tiers.secondary)},
    )


def _tiers(results: Sequence[ConversationResult]) -> MetricTiers | None:
    """The metric tiers the results' packs declare, merged; None when none does."""
    found: MetricTiers | None = None
    for result in results:
        tiers = result.metric_tiers
        if tiers is not None and tiers != found:
            found = tiers if found is None else found.merged(tiers)
    return found


def compare_files(
    base: str | Path,
    candidate: str | Path,
    *,
    metrics: Sequence[str] | None = None,
    with_primary: bool = False,
) -> Comparison:
    """:func:`compare` of two results files (the conversations that count in each)."""
    return compare(
        read_results(base),
        read_results(candidate),
        metrics=metrics,
        base_name=str(base),
        candidate_name=str(candidate),
        with_primary=with_primary,
    )


def as_json(comparison: Comparison) -> dict[str, Any]:
    return comparison.model_dump(mode="json")
