"""Summaries of a results file: counts, metric means, latency; as tables, JSON, Markdown."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from pydantic import BaseModel, Field

from convsim.metrics import CORPUS_AGGREGATION, CORPUS_ITEM, METRICS, corpus_value, mean, percentile
from convsim.metrics._aggregate import aggregate

from ._records import HIGHER_IS_BETTER_DETAIL, ConversationResult, Score, Status, TurnStatus

__all__ = ["RunReport", "MetricSummary", "GroupSummary", "summarize"]


class MetricSummary(BaseModel):
    mean: float | None
    n: int
    """Conversations with a value."""
    not_applicable: int
    """Conversations where the metric did not apply (nothing to check)."""
    failed: int = 0
    """Conversations where the metric failed: a crashing scorer, a judge outage."""
    higher_is_better: bool | None = None
    std: float | None = None
    stderr: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    """The 95% confidence interval of the mean (bootstrap)."""
    corpus: float | None = None
    """The metric's own reduction of the whole run, for corpus-level metrics (an lm-eval
    task's bleu, chrf or ter): what lm-eval reports for the same answers."""


class GroupSummary(BaseModel):
    conversations: int
    statuses: dict[str, int]
    metrics: dict[str, MetricSummary]


class RunReport(BaseModel):
    """What ``convsim report`` prints and writes."""

    runs: list[str]
    packs: list[str]
    models: list[str]
    conversations: int
    statuses: dict[str, int]
    termination_reasons: dict[str, int]
    turns: dict[str, int]
    metrics: dict[str, MetricSummary]
    turn_metrics: dict[str, MetricSummary] = Field(default_factory=dict)
    """Turn-level ``evaluation_metrics``, over the turns that asked for them."""
    by_scenario_type: dict[str, GroupSummary]
    by_difficulty: dict[str, GroupSummary] = Field(default_factory=dict)
    by_model: dict[str, GroupSummary] = Field(default_factory=dict)
    retention_curve: dict[int, MetricSummary] = Field(default_factory=dict)
    """context_retention by distance in turns between a fact and its probe."""
    latency_s: dict[str, float] = Field(default_factory=dict)
    """Model-call latency over all completed turns: mean, p50, p95, p99, max."""
    usage: dict[str, int]
    cost_usd: float | None = None
    """Summed over conversations with a price (the model under test)."""
    errors: dict[str, int]
    """Failure causes by error type."""
    duration_s: float | None = None
    """Wall time from the first conversation's start to the last one's end."""

    def to_markdown(self) -> str:
        lines = ["# convsim run summary", ""]
        lines.append(f"- packs: {', '.join(self.packs)}; models: {', '.join(self.models)}")
        lines.append(f"- conversations: {self.conversations}")
        if self.duration_s is not None:
            lines.append(f"- wall time: {self.duration_s:.2f} s")
        lines += ["", "## Status", "", "| status | conversations |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in self.statuses.items()]
        lines += [
            "",
            "## Metrics",
            "",
            "| metric | mean | 95% CI | std | n | not applicable | failed |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, m in self.metrics.items():
            ci = "" if m.ci_low is None else f"{_fmt(m.ci_low)} - {_fmt(m.ci_high)}"
            lines.append(
                f"| {name} | {_fmt(m.mean)} | {ci} | {_fmt(m.std)} | {m.n} | {m.not_applicable} "
                f"| {m.failed} |"
            )
        corpus = {n: m.corpus for n, m in self.metrics.items() if m.corpus is not None}
        if corpus:
            lines += ["", "Over the whole run (corpus-level metrics, as lm-eval reduces them):"]
            lines += [f"- {name}: {_fmt(value)}" for name, value in corpus.items()]
        if self.turn_metrics:
            lines += [
                "",
                "## Turn metrics",
                "",
                "| metric | mean | turns | not applicable | failed |",
                "|---|---:|---:|---:|---:|",
            ]
            for name, m in self.turn_metrics.items():
                lines.append(
                    f"| {name} | {_fmt(m.mean)} | {m.n} | {m.not_applicable} | {m.failed} |"
                )
        lines += ["", "## By scenario type", ""]
        names = list(self.metrics)
        lines.append(
            "| scenario_type | conversations | "
            + " | ".join(["DONE", "FAILED", "TIMED_OUT", "CANCELLED", *names])
            + " |"
        )
        lines.append("|---|" + "---:|" * (5 + len(names)))
        for group, g in self.by_scenario_type.items():
            cells = [str(g.statuses.get(s.value, 0)) for s in Status]
            cells += [_fmt(g.metrics[n].mean) if n in g.metrics else "" for n in names]
            lines.append(f"| {group} | {g.conversations} | " + " | ".join(cells) + " |")
        if self.retention_curve:
            lines += [
                "",
                "## Retention by distance (turns between fact and probe)",
                "",
                "| distance | recalled | 95% CI | checks |",
                "|---:|---:|---:|---:|",
            ]
            for d, m in self.retention_curve.items():
                lines.append(
                    f"| {d} | {_fmt(m.mean)} | {_fmt(m.ci_low)} - {_fmt(m.ci_high)} | {m.n} |"
                )
        if self.latency_s:
            lines += [
                "",
                "## Latency (s)",
                "",
                "| " + " | ".join(self.latency_s) + " |",
                "|" + "---:|" * len(self.latency_s),
                "| " + " | ".join(f"{v:.4f}" for v in self.latency_s.values()) + " |",
            ]
        if self.errors:
            lines += ["", "## Errors", "", "| error | conversations |", "|---|---:|"]
            lines += [f"| {k} | {v} |" for k, v in self.errors.items()]
        return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _summarise(
    score_maps: Iterable[dict[str, Score]], hib: dict[str, bool | None]
) -> dict[str, MetricSummary]:
    """Mean and counts per metric over ``score_maps`` (one name -> Score map each)."""
    values: dict[str, list[float]] = defaultdict(list)
    items: dict[str, list[Score]] = defaultdict(list)
    missing: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for scores in score_maps:
        for name, score in scores.items():
            if score.value is not None:
                values[name].append(score.value)
                items[name].append(score)
            elif score.status == "failed":
                failed[name] += 1
            else:
                missing[name] += 1
    names = list(dict.fromkeys([*values, *missing, *failed]))
    summaries = {n: _summary(values[n], missing[n], hib.get(n), failed[n]) for n in names}
    for name, scored in items.items():
        summaries[name].corpus = _corpus(scored)
    return summaries


def _corpus(scores: list[Score]) -> float | None:
    """The run-level value of a corpus-level metric (its scores carry their items)."""
    kinds = {s.details.get(CORPUS_AGGREGATION) for s in scores}
    if len(kinds) != 1 or None in kinds:
        return None
    return corpus_value(str(kinds.pop()), [s.details[CORPUS_ITEM] for s in scores])


def _summary(values: list[float], missing: int, hib: bool | None, failed: int = 0) -> MetricSummary:
    if not values:
        return MetricSummary(
            mean=None, n=0, not_applicable=missing, failed=failed, higher_is_better=hib
        )
    agg = aggregate(values)
    return MetricSummary(
        mean=agg.mean,
        n=agg.n,
        not_applicable=missing,
        failed=failed,
        higher_is_better=hib,
        std=agg.std,
        stderr=agg.stderr,
        ci_low=agg.ci_low,
        ci_high=agg.ci_high,
    )


def _metric_summaries(
    results: list[ConversationResult], hib: dict[str, bool | None]
) -> dict[str, MetricSummary]:
    return _summarise((r.scores for r in results), hib)


def _turn_metric_summaries(
    results: list[ConversationResult], hib: dict[str, bool | None]
) -> dict[str, MetricSummary]:
    return _summarise((scores for r in results for scores in r.turn_scores.values()), hib)


def _higher_is_better(names: Iterable[str]) -> dict[str, bool | None]:
    found: dict[str, bool | None] = {}
    for name in names:
        if name in METRICS:
            try:
                found[name] = METRICS.get(name)().higher_is_better
            except Exception:  # a third-party metric that cannot be built here
                found[name] = None
    return found


def _groups(
    results: list[ConversationResult],
    key: Callable[[ConversationResult], str],
    hib: dict[str, bool | None],
) -> dict[str, GroupSummary]:
    groups: dict[str, list[ConversationResult]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    return {
        name: GroupSummary(
            conversations=len(group),
            statuses=dict(Counter(r.status.value for r in group)),
            metrics=_metric_summaries(group, hib),
        )
        for name, group in sorted(groups.items())
    }


def _retention_curve(results: list[ConversationResult]) -> dict[int, MetricSummary]:
    """Pooled over conversations: per distance, the share of checks recalled."""
    checks: dict[int, list[float]] = defaultdict(list)
    for r in results:
        score = r.scores.get("context_retention")
        if score is None or score.value is None:
            continue
        curve, counts = score.details.get("curve", {}), score.details.get("curve_n", {})
        for distance, share in curve.items():
            n = int(counts.get(distance, 1))
            recalled = round(share * n)
            checks[int(distance)] += [1.0] * recalled + [0.0] * (n - recalled)
    return {d: _summary(v, 0, True) for d, v in sorted(checks.items())}


def summarize(results: Iterable[ConversationResult]) -> RunReport:
    """Summarise results (e.g. from :func:`convsim.read_results`)."""
    results = list(results)
    hib = _higher_is_better(
        {n for r in results for n in r.scores}
        | {n for r in results for scores in r.turn_scores.values() for n in scores}
    )
    for r in results:  # a task's own direction, where its scores carry one
        for name, score in r.scores.items():
            given = score.details.get(HIGHER_IS_BETTER_DETAIL)
            if isinstance(given, bool):
                hib[name] = given
    statuses = Counter(r.status.value for r in results)
    turns: Counter[str] = Counter()
    latencies: list[float] = []
    usage: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for r in results:
        usage.update(
            prompt_tokens=r.usage.prompt_tokens,
            completion_tokens=r.usage.completion_tokens,
            total_tokens=r.usage.total_tokens,
        )
        if r.error is not None:
            errors[r.error.type] += 1
        for t in r.turns:
            turns[t.status.value] += 1
            if (
                t.status is TurnStatus.COMPLETED
                and t.timings is not None
                and t.timings.latency_s is not None
            ):
                latencies.append(t.timings.latency_s)
    latency: dict[str, float] = {}
    if latencies:
        latency = {
            "mean": mean(latencies),
            "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95),
            "p99": percentile(latencies, 99),
            "max": max(latencies),
        }
    duration = None
    if results:
        duration = max(r.timings.finished_at for r in results) - min(
            r.timings.started_at for r in results
        )
    return RunReport(
        runs=sorted({r.run_id for r in results}),
        packs=sorted({r.pack for r in results}),
        models=sorted({r.model for r in results}),
        conversations=len(results),
        statuses={s.value: statuses.get(s.value, 0) for s in Status},
        termination_reasons=dict(
            Counter(r.termination_reason.value for r in results).most_common()
        ),
        turns={s.value: turns.get(s.value, 0) for s in TurnStatus},
        metrics=_metric_summaries(results, hib),
        turn_metrics=_turn_metric_summaries(results, hib),
        by_scenario_type=_groups(results, lambda r: r.scenario_type, hib),
        by_difficulty=_groups(results, lambda r: r.difficulty or "unspecified", hib),
        by_model=_groups(results, lambda r: r.model, hib),
        retention_curve=_retention_curve(results),
        latency_s=latency,
        usage=dict(usage),
        cost_usd=(
            sum(r.cost_usd for r in results if r.cost_usd is not None)
            if any(r.cost_usd is not None for r in results)
            else None
        ),
        errors=dict(errors.most_common()),
        duration_s=duration,
    )
