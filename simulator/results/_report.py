"""Summaries of a results file: counts, metric means, latency; as tables, JSON, Markdown."""

from __future__ import annotations

import copy
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, Field, computed_field, model_serializer

from convsim.metrics import CORPUS_AGGREGATION, CORPUS_ITEM, METRICS, corpus_value, mean, percentile
from convsim.metrics._aggregate import aggregate

from .._plural import counted
from .._records import (
    HIGHER_IS_BETTER_DETAIL,
    ConversationResult,
    MetricTiers,
    Score,
    Status,
    TurnStatus,
)
from .._types import USAGE_SOURCES
from ._prefix_cache import PrefixCacheFigures, PrefixCacheFold
from ._sinks import iter_results, scan_lines, validate_line

__all__ = [
    "RunReport",
    "MetricSummary",
    "GroupSummary",
    "Summarizer",
    "shown_ks",
    "summarize",
    "summarize_file",
]


UNSPECIFIED = "unspecified"
"""The group of conversations whose scenario gives no difficulty (or language)."""

PASS_METRICS = ("goal_achievement", "final_state")
"""What tells whether a trial passed (pass@k, pass^k): the first of these it has a value
for, at 1. A scenario graded by its tools' final state alone (tau2-bench's way) passes
on ``final_state``."""


def shown_ks(most: int) -> list[int]:
    """The k of pass@k and pass^k a person reads: 1, 2, 4, 8, ... up to ``most``, and
    ``most`` itself (300 trials: ten figures, not 300; the JSON keeps every k)."""
    ks = [1 << i for i in range(most.bit_length()) if 1 << i <= most]
    return ks if not ks or ks[-1] == most else [*ks, most]


class MetricSummary(BaseModel):
    """One metric over a run's conversations (or turns): the mean and its interval over
    the scored ones only, beside how many were scored, not applicable and failed."""

    mean: float | None
    n: int
    """Conversations scored: with a value, the only ones the mean and CI are over."""
    not_applicable: int
    """Conversations where the metric measured nothing (nothing to check, or no
    evidence either way)."""
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
    judge_samples: dict[str, int] | None = None
    """For a judge metric: its judge's samples over the run (``asked``, ``graded``,
    ``unparsable``, ``failed``), failed and not-applicable scores included, so that
    answers the judge gave in prose or calls that failed show beside the mean; None
    for a metric no judge graded."""

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use
    @property
    def applicable(self) -> int:
        """Conversations the metric applied to: scored, or failed while scoring."""
        return self.n + self.failed

    @model_serializer(mode="wrap")
    def _without_judge_samples(self, handler: Any) -> Any:
        """A metric no judge graded says nothing about judge samples (and reads as
        before)."""
        data = handler(self)
        if self.judge_samples is None and isinstance(data, dict):
            data.pop("judge_samples", None)
        return data


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
    """By metric, the primary ones first, then the secondary ones (``metric_tiers``)."""
    metric_tiers: dict[str, list[str]] = Field(default_factory=dict)
    """The tiers the pack declares (config.yml ``metrics.primary`` and
    ``metrics.secondary``): ``{"primary": [...], "secondary": [...]}``; empty (and left
    out of the JSON) for packs without tiers. Metrics in neither are untiered."""
    turn_metrics: dict[str, MetricSummary] = Field(default_factory=dict)
    """Turn-level ``evaluation_metrics``, over the turns that asked for them."""
    by_scenario_type: dict[str, GroupSummary]
    by_difficulty: dict[str, GroupSummary] = Field(default_factory=dict)
    by_model: dict[str, GroupSummary] = Field(default_factory=dict)
    by_language: dict[str, GroupSummary] = Field(default_factory=dict)
    """By the scenarios' language (a problem's ``language``), those without one as
    ``unspecified``; empty (and left out of the JSON) when no scenario has one."""
    retention_curve: dict[int, MetricSummary] = Field(default_factory=dict)
    """context_retention by distance in turns between a fact and its probe."""
    latency_s: dict[str, float] = Field(default_factory=dict)
    """Model-call latency over all completed turns: mean, p50, p95, p99, max (answers
    from the response cache have none)."""
    ttft_s: dict[str, float] = Field(default_factory=dict)
    """Time to the first token of any kind (reasoning counts) over the completed turns
    that streamed: mean, p50, p95, p99, max; empty (and left out of the JSON) when no
    turn streamed."""
    ttfot_s: dict[str, float] = Field(default_factory=dict)
    """Time to the first answer token, the same way: what a user of a reasoning model
    waits for (equal to ``ttft_s`` for a model that does not reason aloud)."""
    cache: dict[str, int] = Field(default_factory=dict)
    """Answers of the model under test and the simulated user taken from the response
    cache (``hits``) and asked of the model (``misses``); empty when none was cached."""
    usage: dict[str, int]
    token_sources: dict[str, int] = Field(default_factory=dict)
    """Turns of the model under test by where their token counts came from: ``server``
    (its usage), ``tokenizer`` (counted with its tokenizer, as it sent none) and
    ``estimate`` (neither: four characters a token); empty when no turn reported any."""
    cost_usd: float | None = None
    """Summed over conversations with a price (the model under test)."""
    user_cost_usd: float | None = None
    """The simulated user's calls, summed where priced; None without any."""
    judge_cost_usd: float | None = None
    """The judge's calls, summed where priced; None without any."""
    unpriced: list[str] = Field(default_factory=list)
    """The models whose calls had no price (``NAME (role)``): their cost is unknown and
    not in the sums, never counted as 0."""
    errors: dict[str, int]
    """Failure causes by error type."""
    duration_s: float | None = None
    """Wall time from the first conversation's start to the last one's end."""
    trials: int | None = None
    """The most trials any scenario ran (``--trials``); None when each ran once."""
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    """By k: the chance that at least one of k trials of a scenario achieves its goal
    (goal_achievement 1, or where a trial has no goal score, final_state 1: see
    :data:`PASS_METRICS`), estimated without bias from each scenario's n trials
    (1 - C(n-c, k) / C(n, k)) and averaged over scenarios."""
    pass_hat_k: dict[int, float] = Field(default_factory=dict)
    """By k: the chance that all k trials achieve the goal (tau-bench's pass^k:
    C(c, k) / C(n, k)), averaged over scenarios."""
    trial_spread: dict[str, float] = Field(default_factory=dict)
    """By metric: the standard deviation across a scenario's trials, averaged over the
    scenarios: how much the same scenario's score moves from one trial to the next."""
    clipped_turns: int = 0
    """Turns whose pack max_tokens the user's cap (``--max-tokens``, a ``max_tokens``
    model argument) clipped: their answers may be cut short where the pack's were not."""
    prefix_cache: PrefixCacheFigures | None = None
    """The server's prefix-cache hit rate over the model under test's answered turns
    that reported cached prompt tokens, overall and by turn index; None (and left out
    of the JSON) when no turn reported them."""

    @model_serializer(mode="wrap")
    def _without_unused_trials(self, handler: Any) -> Any:
        """A run without --trials says nothing about trials, one whose cap clipped no
        turn nothing about clipping (and each reads as before)."""
        data = handler(self)
        if self.trials is None and isinstance(data, dict):
            for key in ("trials", "pass_at_k", "pass_hat_k", "trial_spread"):
                data.pop(key, None)
        if not self.clipped_turns and isinstance(data, dict):  # no cap clipped anything
            data.pop("clipped_turns", None)
        if self.prefix_cache is None and isinstance(data, dict):  # no server said
            data.pop("prefix_cache", None)
        if not self.cache and isinstance(data, dict):  # a run without cache hits, as before
            data.pop("cache", None)
        if not self.metric_tiers and isinstance(data, dict):  # a pack without tiers
            data.pop("metric_tiers", None)
        if not self.by_language and isinstance(data, dict):  # no scenario has a language
            data.pop("by_language", None)
        if isinstance(data, dict):  # no turn streamed: nothing measured, no empty table
            for key in ("ttft_s", "ttfot_s"):
                if not data.get(key):
                    data.pop(key, None)
        if isinstance(data, dict):  # no simulated user, no judge, every model priced
            for key in ("user_cost_usd", "judge_cost_usd", "unpriced"):
                if not data.get(key):
                    data.pop(key, None)
        return data

    def tier_of(self, metric: str) -> str | None:
        """``primary`` or ``secondary``; None for a metric in neither tier."""
        for tier, names in self.metric_tiers.items():
            if metric in names:
                return tier
        return None

    def token_sources_line(self) -> str | None:
        """Where the token counts came from, in words (``token counts of 12 turns: 10
        from the server, 2 estimated (...)``); None when no turn reported tokens."""
        sources = self.token_sources
        total = sum(sources.values())
        if not total:
            return None
        words = {
            "server": "from the server",
            "tokenizer": "counted with the server's tokenizer",
            "estimate": "estimated (no usage, no tokenizer)",
        }
        parts = [f"{sources[s]} {words[s]}" for s in USAGE_SOURCES if sources.get(s)]
        return f"token counts of {counted(total, 'turn')}: " + ", ".join(parts)

    def cost_text(self) -> str:
        """What the run cost, by role where more than the model was priced, and which
        models had no price (their cost unknown, not 0)."""
        parts = [
            f"{role} ${value:.4f}"
            for role, value in (
                ("model", self.cost_usd),
                ("user", self.user_cost_usd),
                ("judge", self.judge_cost_usd),
            )
            if value is not None
        ]
        total = sum(v for v in (self.cost_usd, self.user_cost_usd, self.judge_cost_usd) if v)
        known = f"${total:.4f}" + (f" ({', '.join(parts)})" if len(parts) > 1 else "")
        if not self.unpriced:
            return known if parts else "-"
        unknown = f"unknown for {', '.join(self.unpriced)} (no price)"
        return f"{known} + {unknown}" if parts else unknown

    def to_markdown(self) -> str:
        lines = ["# convsim run summary", ""]
        lines.append(f"- packs: {', '.join(self.packs)}; models: {', '.join(self.models)}")
        lines.append(f"- conversations: {self.conversations}")
        if self.duration_s is not None:
            lines.append(f"- wall time: {self.duration_s:.2f} s")
        if self.clipped_turns:
            lines.append(f"- turns clipped to the max_tokens cap: {self.clipped_turns}")
        if self.cache:
            lines.append(
                f"- response cache: {counted(self.cache['hits'], 'answer')} from the cache "
                f"(no call, no latency), {self.cache['misses']} asked of the models"
            )
        said = self.token_sources_line()
        if said:
            lines.append(f"- {said}")
        cache = self.prefix_cache
        if cache is not None and cache.hit_rate is not None:
            by_turn = ", ".join(
                f"turn {t.turn_index} {t.hit_rate:.0%}"
                for t in cache.hit_rate_by_turn
                if t.hit_rate is not None
            )
            lines.append(
                f"- prefix cache: {cache.hit_rate:.1%} of prompt tokens cached, as "
                f"{counted(cache.requests, 'turn')} reported ({by_turn})"
            )

        lines.append(f"- cost: {self.cost_text()}")
        if self.trials is not None:
            lines.append(f"- trials per scenario: {self.trials}")
        if self.pass_hat_k:
            lines += ["", "## Trials: goal achieved", ""]
            lines += ["| k | pass@k | pass^k |", "|---:|---:|---:|"]
            for k in shown_ks(max(self.pass_hat_k)):
                lines.append(f"| {k} | {self.pass_at_k[k]:.3f} | {self.pass_hat_k[k]:.3f} |")
        lines += ["", "## Status", "", "| status | conversations |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in self.statuses.items()]
        lines += [
            "",
            "## Metrics",
            "",
            "Means and intervals are over the scored conversations only; applicable is "
            "scored plus failed.",
            "",
        ]
        tiered = bool(self.metric_tiers)
        if tiered:
            lines += [
                "Primary metrics first, then secondary ones (the pack's config.yml); "
                "a metric in neither has no tier.",
                "",
            ]
        lines += [
            "| metric |"
            + (" tier |" if tiered else "")
            + " mean | 95% CI | std | applicable | scored | not applicable | failed |",
            "|---|" + ("---|" if tiered else "") + "---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, m in self.metrics.items():
            ci = "" if m.ci_low is None else f"{_fmt(m.ci_low)} - {_fmt(m.ci_high)}"
            tier = f" {self.tier_of(name) or ''} |" if tiered else ""
            lines.append(
                f"| {name} |{tier} {_fmt(m.mean)} | {ci} | {_fmt(m.std)} | {m.applicable} "
                f"| {m.n} | {m.not_applicable} | {m.failed} |"
            )
        judged = {n: m.judge_samples for n, m in self.metrics.items() if m.judge_samples}
        if judged:
            lines += [
                "",
                "Judge samples (answers that could not be parsed and calls that failed are "
                "counted, never scored):",
                "",
                "| metric | asked | graded | unparsable | failed |",
                "|---|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {name} | {c['asked']} | {c['graded']} | {c['unparsable']} | {c['failed']} |"
                for name, c in judged.items()
            ]
        corpus = {n: m.corpus for n, m in self.metrics.items() if m.corpus is not None}
        if corpus:
            lines += ["", "Over the whole run (corpus-level metrics, as lm-eval reduces them):"]
            lines += [f"- {name}: {_fmt(value)}" for name, value in corpus.items()]
        if self.turn_metrics:
            lines += [
                "",
                "## Turn metrics",
                "",
                "Over the turns that ask for them: counts are of turns.",
                "",
                "| metric | mean | applicable | scored | not applicable | failed |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for name, m in self.turn_metrics.items():
                lines.append(
                    f"| {name} | {_fmt(m.mean)} | {m.applicable} | {m.n} | {m.not_applicable} "
                    f"| {m.failed} |"
                )
        names = list(self.metrics)
        lines += _group_table("By scenario type", "scenario_type", self.by_scenario_type, names)
        if self.by_language:
            lines += _group_table("By language", "language", self.by_language, names)
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
            rows = [("end to end", self.latency_s), ("TTFT", self.ttft_s), ("TTFOT", self.ttfot_s)]
            lines += [
                "",
                "## Latency (s)",
                "",
                "| | " + " | ".join(self.latency_s) + " |",
                "|---|" + "---:|" * len(self.latency_s),
            ]
            lines += [
                f"| {name} | " + " | ".join(f"{v:.4f}" for v in figures.values()) + " |"
                for name, figures in rows
                if figures
            ]
        if self.errors:
            lines += ["", "## Errors", "", "| error | conversations |", "|---|---:|"]
            lines += [f"| {k} | {v} |" for k, v in self.errors.items()]
        return "\n".join(lines) + "\n"


def _group_table(
    title: str, column: str, groups: Mapping[str, GroupSummary], names: list[str]
) -> list[str]:
    """A summary.md section: one row per group, its statuses and each metric's mean."""
    lines = ["", f"## {title}", ""]
    lines.append(
        f"| {column} | conversations | "
        + " | ".join(["DONE", "FAILED", "TIMED_OUT", "CANCELLED", *names])
        + " |"
    )
    lines.append("|---|" + "---:|" * (5 + len(names)))
    for group, g in groups.items():
        cells = [str(g.statuses.get(s.value, 0)) for s in Status]
        cells += [_fmt(g.metrics[n].mean) if n in g.metrics else "" for n in names]
        lines.append(f"| {group} | {g.conversations} | " + " | ".join(cells) + " |")
    return lines


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


class _ScoreFold:
    """Mean and counts per metric, folded one name -> Score map at a time."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)
        self.missing: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.corpus: dict[str, _CorpusFold] = {}
        self.judged: dict[str, Counter[str]] = {}

    def add(self, scores: dict[str, Score]) -> None:
        for name, score in scores.items():
            if "samples_asked" in score.details:
                counts = self.judged.setdefault(name, Counter())
                for key in _JUDGE_SAMPLES:
                    value = score.details.get(f"samples_{key}")
                    counts[key] += value if isinstance(value, int) else 0
            if score.value is not None:
                self.values[name].append(score.value)
                fold = self.corpus.get(name)
                if fold is None:
                    fold = self.corpus[name] = _CorpusFold()
                fold.add(score)
            elif score.status == "failed":
                self.failed[name] += 1
            else:
                self.missing[name] += 1

    def summaries(self, hib: dict[str, bool | None]) -> dict[str, MetricSummary]:
        names = list(dict.fromkeys([*self.values, *self.missing, *self.failed]))
        summaries = {
            n: _summary(self.values[n], self.missing[n], hib.get(n), self.failed[n]) for n in names
        }
        for name, fold in self.corpus.items():
            summaries[name].corpus = fold.value()
        for name, counts in self.judged.items():
            summaries[name].judge_samples = {key: counts[key] for key in _JUDGE_SAMPLES}
        return summaries


_JUDGE_SAMPLES = ("asked", "graded", "unparsable", "failed")
"""The judge's sample counts a judge metric's details carry (``samples_<key>``)."""


class _CorpusFold:
    """The run-level value of a corpus-level metric: its scores carry their items, and
    all of them must name the same reduction."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.items: list[Any] | None = []
        """None once a score without the reduction (or with another one) was seen."""

    def add(self, score: Score) -> None:
        if self.items is None:
            return
        kind = score.details.get(CORPUS_AGGREGATION)
        if kind is None or (self.kind is not None and kind != self.kind):
            self.items = None
            return
        self.kind = kind
        self.items.append(score.details.get(CORPUS_ITEM))

    def value(self) -> float | None:
        if self.items is None or self.kind is None:
            return None
        return corpus_value(str(self.kind), self.items)


def _summarise(
    score_maps: Iterable[dict[str, Score]], hib: dict[str, bool | None]
) -> dict[str, MetricSummary]:
    """Mean and counts per metric over ``score_maps`` (one name -> Score map each)."""
    fold = _ScoreFold()
    for scores in score_maps:
        fold.add(scores)
    return fold.summaries(hib)


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


def _higher_is_better(names: Iterable[str]) -> dict[str, bool | None]:
    found: dict[str, bool | None] = {}
    for name in names:
        if name in METRICS:
            try:
                found[name] = METRICS.get(name)().higher_is_better
            except Exception:  # a third-party metric that cannot be built here
                found[name] = None
    return found


class _GroupFold:
    def __init__(self) -> None:
        self.conversations = 0
        self.statuses: Counter[str] = Counter()
        self.scores = _ScoreFold()

    def add(self, result: ConversationResult) -> None:
        self.conversations += 1
        self.statuses[result.status.value] += 1
        self.scores.add(result.scores)

    def summary(self, hib: dict[str, bool | None], whole: _WholeRun) -> GroupSummary:
        if self.conversations == whole.conversations:  # the run's scores, in its order
            metrics = {name: m.model_copy() for name, m in whole.metrics.items()}
        else:
            metrics = self.scores.summaries(hib)
        return GroupSummary(
            conversations=self.conversations, statuses=dict(self.statuses), metrics=metrics
        )


class _WholeRun(NamedTuple):
    """The run's metric summaries and how many conversations they cover: a group that
    holds every conversation (one model, say) has these figures, not a second bootstrap
    of the same values."""

    conversations: int
    metrics: dict[str, MetricSummary]


def _groups(
    folds: dict[str, _GroupFold], hib: dict[str, bool | None], whole: _WholeRun
) -> dict[str, GroupSummary]:
    return {name: fold.summary(hib, whole) for name, fold in sorted(folds.items())}


class Summarizer:
    """Builds a :class:`RunReport` from results fed one at a time, keeping only what
    the report needs (counts and metric values), never the results: a summary of any
    number of conversations fits in memory. ``summarize(results)`` is this fed with
    every result; :func:`summarize_file` feeds it a results file line by line."""

    def __init__(self) -> None:
        self._count = 0
        self._names: set[str] = set()
        self._given_hib: dict[str, bool] = {}
        self._statuses: Counter[str] = Counter()
        self._reasons: Counter[str] = Counter()
        self._turns: Counter[str] = Counter()
        self._clipped = 0
        self._latencies: list[float] = []
        self._ttfts: list[float] = []
        self._ttfots: list[float] = []
        self._cache: Counter[str] = Counter()
        self._prefix_cache = PrefixCacheFold()
        self._usage: Counter[str] = Counter()
        self._sources: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._costs: list[float] = []
        self._user_costs: list[float] = []
        self._judge_costs: list[float] = []
        self._unpriced: set[str] = set()
        self._runs: set[str] = set()
        self._packs: set[str] = set()
        self._models: set[str] = set()
        self._started: float | None = None
        self._finished: float | None = None
        self._tiers: MetricTiers | None = None
        self._metrics = _ScoreFold()
        self._turn_metrics = _ScoreFold()
        self._by_type: dict[str, _GroupFold] = defaultdict(_GroupFold)
        self._by_difficulty: dict[str, _GroupFold] = defaultdict(_GroupFold)
        self._by_model: dict[str, _GroupFold] = defaultdict(_GroupFold)
        self._by_language: dict[str, _GroupFold] = defaultdict(_GroupFold)
        self._languages = False
        """Whether any conversation so far had a language."""
        self._retention: dict[int, list[float]] = defaultdict(list)
        self._trials: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        """By scenario, by metric: the values of its trials (with --trials only)."""
        self._trial_counts: Counter[str] = Counter()
        self._goals: dict[str, list[bool]] = defaultdict(list)
        """By scenario: whether each trial achieved the goal."""

    def add(self, r: ConversationResult) -> None:
        """Fold in one conversation."""
        if r.language is not None and not self._languages:
            self._start_languages()
        self._count += 1
        self._names.update(r.scores)
        for scores in r.turn_scores.values():
            self._names.update(scores)
        for name, score in r.scores.items():  # a task's own direction, where it gives one
            given = score.details.get(HIGHER_IS_BETTER_DETAIL)
            if isinstance(given, bool):
                self._given_hib[name] = given
        self._statuses[r.status.value] += 1
        self._reasons[r.termination_reason.value] += 1
        self._usage.update(
            prompt_tokens=r.usage.prompt_tokens,
            completion_tokens=r.usage.completion_tokens,
            total_tokens=r.usage.total_tokens,
        )
        if r.error is not None:
            self._errors[r.error.type] += 1
        for t in r.turns:
            self._turns[t.status.value] += 1
            self._clipped += t.max_tokens_clipped_from is not None
            if t.status is TurnStatus.COMPLETED:
                self._cache["hits" if t.cached else "misses"] += 1
            if t.user_message is not None and t.user_usage is not None:
                self._cache["hits" if t.user_cached else "misses"] += 1
            if t.usage is not None:
                self._sources[t.usage.source] += 1
                if t.status is TurnStatus.COMPLETED and not t.cached:
                    self._prefix_cache.add(
                        t.turn_index, t.usage.prompt_tokens, t.usage.cached_tokens
                    )
            if (
                t.status is TurnStatus.COMPLETED
                and t.timings is not None
                and t.timings.latency_s is not None
            ):
                self._latencies.append(t.timings.latency_s)
                if t.timings.ttft_s is not None:
                    self._ttfts.append(t.timings.ttft_s)
                if t.timings.ttfot_s is not None:
                    self._ttfots.append(t.timings.ttfot_s)
        if r.cost_usd is not None:
            self._costs.append(r.cost_usd)
        elif r.usage.total_tokens:
            self._unpriced.add(f"{r.model} (model)")
        if r.user_cost_usd is not None:
            self._user_costs.append(r.user_cost_usd)
        elif r.user_usage is not None and r.user_usage.total_tokens:
            self._unpriced.add("the simulated user (user)")
        self._add_judge_costs(r)
        tiers = r.metric_tiers
        if tiers is not None and tiers != self._tiers:
            self._tiers = tiers if self._tiers is None else self._tiers.merged(tiers)
        self._runs.add(r.run_id)
        self._packs.add(r.pack)
        self._models.add(r.model)
        started, finished = r.timings.started_at, r.timings.finished_at
        self._started = started if self._started is None else min(self._started, started)
        self._finished = finished if self._finished is None else max(self._finished, finished)
        self._metrics.add(r.scores)
        for scores in r.turn_scores.values():
            self._turn_metrics.add(scores)
        self._by_type[r.scenario_type].add(r)
        self._by_difficulty[r.difficulty or UNSPECIFIED].add(r)
        self._by_model[r.model].add(r)
        if self._languages:
            self._by_language[r.language or UNSPECIFIED].add(r)
        self._add_retention(r)
        if r.trial is not None:
            self._trial_counts[r.scenario_id] += 1
            for name, score in r.scores.items():
                if score.value is not None:
                    self._trials[r.scenario_id][name].append(score.value)
            passed = next(
                (
                    value
                    for name in PASS_METRICS
                    if (value := getattr(r.scores.get(name), "value", None)) is not None
                ),
                None,
            )
            if passed is not None:
                self._goals[r.scenario_id].append(passed >= 1.0 - 1e-9)
            elif r.status is not Status.DONE:  # a trial that failed did not reach the goal
                self._goals[r.scenario_id].append(False)

    def _start_languages(self) -> None:
        """At the first conversation with a language: the ones before it had none, so
        the run so far is the ``unspecified`` group (a run without languages never
        pays for a breakdown it does not show)."""
        self._languages = True
        if self._count:
            so_far = _GroupFold()
            so_far.conversations = self._count
            so_far.statuses = Counter(self._statuses)
            so_far.scores = copy.deepcopy(self._metrics)
            self._by_language[UNSPECIFIED] = so_far

    def _add_judge_costs(self, r: ConversationResult) -> None:
        """Each judged score's cost, or its judge as one without a price."""
        scores = [*r.scores.values(), *(s for t in r.turn_scores.values() for s in t.values())]
        for score in scores:
            details = score.details
            if not details.get("judge_calls"):
                continue
            cost = details.get("judge_cost_usd")
            if isinstance(cost, (int, float)) and not isinstance(cost, bool):
                self._judge_costs.append(float(cost))
            else:
                self._unpriced.add(f"{details.get('judge', 'the judge')} (judge)")

    def _add_retention(self, r: ConversationResult) -> None:
        """Pooled over conversations: per distance, the share of checks recalled."""
        score = r.scores.get("context_retention")
        if score is None or score.value is None:
            return
        curve, counts = score.details.get("curve", {}), score.details.get("curve_n", {})
        if not isinstance(curve, dict) or not isinstance(counts, dict):
            return
        for distance, share in curve.items():
            try:
                n = int(counts.get(distance, 1))
                recalled, at = round(share * n), int(distance)
            except (TypeError, ValueError, OverflowError):  # not a curve convsim wrote
                continue
            self._retention[at] += [1.0] * recalled + [0.0] * (n - recalled)

    def report(self) -> RunReport:
        """The summary of everything fed so far."""
        hib = _higher_is_better(self._names)
        hib.update(self._given_hib)
        latency = _distribution(self._latencies)
        duration = None
        if self._started is not None and self._finished is not None:
            duration = self._finished - self._started
        whole = _WholeRun(self._count, self._tiered(self._metrics.summaries(hib)))
        return RunReport(
            runs=sorted(self._runs),
            packs=sorted(self._packs),
            models=sorted(self._models),
            conversations=self._count,
            statuses={s.value: self._statuses.get(s.value, 0) for s in Status},
            termination_reasons=dict(self._reasons.most_common()),
            turns={s.value: self._turns.get(s.value, 0) for s in TurnStatus},
            metrics=whole.metrics,
            metric_tiers=self._tier_lists(),
            turn_metrics=self._turn_metrics.summaries(hib),
            by_scenario_type=_groups(self._by_type, hib, whole),
            by_difficulty=_groups(self._by_difficulty, hib, whole),
            by_model=_groups(self._by_model, hib, whole),
            by_language=_groups(self._by_language, hib, whole) if self._languages else {},
            retention_curve={d: _summary(v, 0, True) for d, v in sorted(self._retention.items())},
            latency_s=latency,
            ttft_s=_distribution(self._ttfts),
            ttfot_s=_distribution(self._ttfots),
            cache={k: self._cache[k] for k in ("hits", "misses")} if self._cache["hits"] else {},
            usage=dict(self._usage),
            token_sources={s: self._sources[s] for s in USAGE_SOURCES} if self._sources else {},
            cost_usd=sum(self._costs) if self._costs else None,
            user_cost_usd=sum(self._user_costs) if self._user_costs else None,
            judge_cost_usd=sum(self._judge_costs) if self._judge_costs else None,
            unpriced=sorted(self._unpriced),
            errors=dict(self._errors.most_common()),
            duration_s=duration,
            clipped_turns=self._clipped,
            prefix_cache=self._prefix_cache.figures() if self._prefix_cache.reported else None,
            **self._trial_figures(),
        )

    def _tiered(self, summaries: dict[str, MetricSummary]) -> dict[str, MetricSummary]:
        """``summaries`` with the primary metrics first, then the secondary ones."""
        if self._tiers is None:
            return summaries
        return {name: summaries[name] for name in self._tiers.ordered(list(summaries))}

    def _tier_lists(self) -> dict[str, list[str]]:
        if self._tiers is None:
            return {}
        return {"primary": list(self._tiers.primary), "secondary": list(self._tiers.secondary)}

    def _trial_figures(self) -> dict[str, Any]:
        if not self._trial_counts:
            return {}
        most = max(self._trial_counts.values())
        at: dict[int, list[float]] = defaultdict(list)
        hat: dict[int, list[float]] = defaultdict(list)
        for scenario, n in self._trial_counts.items():
            goals = self._goals.get(scenario, [])
            if len(goals) < n:
                continue  # a finished trial without a goal score: pass^k cannot be told
            c = sum(goals)
            for k in range(1, n + 1):
                at[k].append(1.0 - math.comb(n - c, k) / math.comb(n, k))
                hat[k].append(math.comb(c, k) / math.comb(n, k))
        spread: dict[str, list[float]] = defaultdict(list)
        for per_metric in self._trials.values():
            for name, values in per_metric.items():
                if len(values) > 1:
                    spread[name].append(statistics.pstdev(values))
        return {
            "trials": most,
            "pass_at_k": {k: mean(v) for k, v in sorted(at.items())},
            "pass_hat_k": {k: mean(v) for k, v in sorted(hat.items())},
            "trial_spread": {name: mean(v) for name, v in sorted(spread.items())},
        }


def summarize(results: Iterable[ConversationResult]) -> RunReport:
    """Summarise results (e.g. from :func:`convsim.read_results`)."""
    summary = Summarizer()
    for result in results:
        summary.add(result)
    return summary.report()


def summarize_file(path: str | Path) -> RunReport:
    """Summarise the results of a results file that count (a conversation's last line),
    reading it line by line: memory holds the summary's figures, not the results.

    Raises:
        ResultsError: the file is missing, or a line is damaged or not a result.
    """
    path = Path(path)
    summary, seen = Summarizer(), set()
    for result in iter_results(path):
        if result.conversation_id in seen:
            break  # a conversation recorded twice: only its last line counts
        seen.add(result.conversation_id)
        summary.add(result)
    else:
        return summary.report()
    # Rare (lines of retried conversations not yet compacted): which line counts for
    # each conversation, then only those, in file order as read_results has them.
    last: dict[str, int] = {}
    for line in scan_lines(path):
        if line.data is not None:
            last[str(line.data.get("conversation_id"))] = line.number
    counted = set(last.values())
    summary = Summarizer()
    for line in scan_lines(path):
        if line.number in counted:
            summary.add(validate_line(path, line))
    return summary.report()


def _distribution(values: list[float]) -> dict[str, float]:
    """Mean, p50, p95, p99 and max of ``values``; empty when there are none."""
    if not values:
        return {}
    return {
        "mean": mean(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values),
    }
