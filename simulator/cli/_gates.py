"""CI gates: what each gate found, whether it passed, and the exit that follows.

Every gate is judged into a :class:`GateOutcome` with one line saying what it found, pass
or fail, so that the same verdicts are printed, written to ``--junit`` and turned into
the exit code (:data:`~convsim.cli._console.EXIT_GATE_FAILED`, 100). A gate passes only
on evidence: a metric gate whose metric has fewer scored conversations than
``--min-scored`` fails and says how many were scored, instead of passing on a mean of
next to nothing; a metric that applied to no conversation has no value and fails.

``--fail-under VALUE`` (a bare bound) gates each of the pack's primary metrics
(config.yml ``metrics.primary``) in its own direction: a mean at least VALUE for a
metric where higher is better, at most VALUE where lower is better (a metric with no
known direction is taken as higher-is-better, as ``METRIC=VALUE`` takes every metric).
A pack without primary metrics refuses it: that is bad input, not a passed gate.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import click

from ._console import EXIT_GATE_FAILED, print_error

if TYPE_CHECKING:
    from .._records import MetricTiers
    from ..load._result import LoadResult, SweepResult
    from ..load._slo import SLOs
    from ..results._compare import Comparison
    from ..results._junit import JUnitSuite
    from ..results._report import MetricSummary, RunReport

__all__ = [
    "DEFAULT_MIN_SCORED",
    "FailUnder",
    "GateOutcome",
    "LoadChecks",
    "compare_gates",
    "exit_on_failed_gates",
    "fail_under_gates",
    "gate_suite",
    "load_checks",
    "require_primary",
]

DEFAULT_MIN_SCORED = 10
"""Scored conversations a metric gate needs by default; a run of fewer conversations
needs every one of them scored."""


@dataclass(frozen=True)
class GateOutcome:
    """One gate, judged."""

    gate: str
    """The gate's name, as test reports show it: ``fail-under context_retention>=0.9``."""
    passed: bool
    line: str
    """What the gate found, in one line: the figure and the bound, or why it failed."""


@dataclass(frozen=True)
class FailUnder:
    """``--fail-under`` as given: bounds on named metrics (``METRIC=VALUE``), and the
    bare bound (``VALUE``) that each primary metric of the pack must meet. A named
    bound on a primary metric wins over the bare one."""

    named: Mapping[str, float] = field(default_factory=dict)
    primary: float | None = None

    def __bool__(self) -> bool:
        return bool(self.named) or self.primary is not None


def _as_fail_under(gates: FailUnder | Mapping[str, float]) -> FailUnder:
    return gates if isinstance(gates, FailUnder) else FailUnder(dict(gates))


def require_primary(
    gates: FailUnder,
    tiers: MetricTiers | Mapping[str, Sequence[str]] | None,
    source: str,
    *,
    scored: Sequence[str] | None = None,
) -> None:
    """Before any gate is judged: a bare ``--fail-under VALUE`` needs primary metrics
    in ``source`` (a pack, or a results file), and, with ``scored`` (the run's
    ``--metrics``), every one of them scored. Bad input otherwise (exit 2)."""
    if gates.primary is None:
        return
    if tiers is None:
        primary: Sequence[str] = ()
    elif isinstance(tiers, Mapping):
        primary = tiers.get("primary", ())
    else:
        primary = tiers.primary
    if not primary:
        raise click.BadParameter(
            f"a bare bound ({gates.primary:g}) gates the primary metrics, and {source} has "
            "none (config.yml metrics.primary); name the metrics: --fail-under METRIC=VALUE",
            param_hint="--fail-under",
        )
    if scored is not None:
        left_out = [m for m in primary if m not in scored and m not in gates.named]
        if left_out:
            raise click.BadParameter(
                f"a bare bound ({gates.primary:g}) gates the primary metrics "
                f"{', '.join(primary)}, and --metrics leaves out {', '.join(left_out)}",
                param_hint="--fail-under",
            )


class _Bound(NamedTuple):
    """One metric gate: its metric, bound and direction, and whether the bare bound
    on the primary metrics set it."""

    metric: str
    bound: float
    lower_is_better: bool
    primary: bool

    @property
    def gate(self) -> str:
        return f"fail-under {self.metric}{'<=' if self.lower_is_better else '>='}{self.bound:g}"

    @property
    def label(self) -> str:
        """The metric as the verdict names it."""
        if not self.primary:
            return self.metric
        return f"{self.metric} (primary{', lower is better' if self.lower_is_better else ''})"

    def met(self, mean: float) -> bool:
        return mean <= self.bound if self.lower_is_better else mean >= self.bound

    def verdict(self, mean: float, what: str = "mean") -> str:
        """``label what mean OP bound``, the operator saying which side it is on."""
        if self.lower_is_better:
            op = "<=" if self.met(mean) else ">"
        else:
            op = ">=" if self.met(mean) else "<"
        return f"{self.label} {what} {mean:.4g} {op} {self.bound:g}"


def _bounds(
    gates: FailUnder,
    primary: Sequence[str],
    higher_is_better: Mapping[str, bool | None],
) -> list[_Bound]:
    """The metric gates to judge: the primary metrics first (with the bare bound, in
    their own direction), then the named ones as given (at least the bound). A named
    bound on a primary metric, with a bare one given, replaces the bare bound and keeps
    the metric's direction."""
    bounds: list[_Bound] = []
    bare = gates.primary
    tiered: set[str] = set()
    if bare is not None:
        tiered = set(primary)
        for metric in primary:
            lower = higher_is_better.get(metric) is False
            bounds.append(_Bound(metric, gates.named.get(metric, bare), lower, True))
    bounds += [
        _Bound(metric, bound, False, False)
        for metric, bound in gates.named.items()
        if metric not in tiered
    ]
    return bounds


def _standing(n: int, total: int, unit: str, not_applicable: int, failed: int) -> str:
    """On how many ``unit`` a figure stands: scored, and the rest that are not (not
    applicable, failed), so that a mean of a few is never read as one of all."""
    parts = [f"{n} of {total} {unit} scored"]
    if not_applicable:
        parts.append(f"{not_applicable} not applicable")
    if failed:
        parts.append(f"{failed} failed")
    return ", ".join(parts)


def _needed(min_scored: int, total: int) -> int:
    """Scored items a gate needs: ``min_scored``, or all of them when there are fewer."""
    return min(min_scored, total)


def _too_few(metric: str, scored: int, total: int, unit: str, need: int) -> str | None:
    """The line of a gate with fewer than ``need`` scored; None when it has enough."""
    if scored >= need:
        return None
    return f"{metric}: only {scored} of {total} {unit} scored (needs at least {need})"


def fail_under_gates(
    report: RunReport, gates: FailUnder | Mapping[str, float], *, min_scored: int
) -> list[GateOutcome]:
    """``--fail-under`` gates on a run's summary: ``METRIC=VALUE`` ones, and a bare
    bound on each primary metric (check :func:`require_primary` first).

    A gate fails when its metric has no value (not applicable to any conversation is
    not a pass), when fewer than ``min_scored`` of the run's conversations (of the turns
    that asked for it, for a turn metric) were scored, or when the mean is on the wrong
    side of the bound.
    """
    gates = _as_fail_under(gates)
    hib = {name: m.higher_is_better for name, m in report.metrics.items()}
    outcomes = []
    for bound in _bounds(gates, report.metric_tiers.get("primary", []), hib):
        metric, gate = bound.metric, bound.gate
        summary: MetricSummary | None = report.metrics.get(metric)
        total, unit = report.conversations, "conversations"
        if summary is None:
            summary = report.turn_metrics.get(metric)
            if summary is not None:
                total = summary.n + summary.not_applicable + summary.failed
                unit = "turns"
        op = "<=" if bound.lower_is_better else ">="
        if summary is None:
            line = f"{bound.label} has no value in this run (needs {op} {bound.bound:g})"
            outcomes.append(GateOutcome(gate, False, line))
            continue
        scored = _standing(summary.n, total, unit, summary.not_applicable, summary.failed)
        too_few = _too_few(bound.label, summary.n, total, unit, _needed(min_scored, total))
        if too_few is not None:
            outcomes.append(GateOutcome(gate, False, too_few))
        elif summary.mean is None:
            line = f"{bound.label} has no value in this run ({scored}; needs {op} {bound.bound:g})"
            outcomes.append(GateOutcome(gate, False, line))
        else:
            verdict = f"{bound.verdict(summary.mean)} ({scored})"
            outcomes.append(GateOutcome(gate, bound.met(summary.mean), verdict))
    return outcomes


def compare_gates(
    comparison: Comparison,
    *,
    worse: Sequence[str],
    fail_under: FailUnder | Mapping[str, float],
    min_scored: int,
) -> list[GateOutcome]:
    """``--fail-if-worse`` and ``--fail-under`` gates on a comparison, over the
    conversations scored in both runs.

    Either fails when fewer than ``min_scored`` of the paired conversations were scored
    in both runs: with a handful of pairs the interval is too wide to call anything
    worse, and a gate that cannot fail is no gate.
    """
    by_metric = {m.metric: m for m in comparison.metrics}
    need = _needed(min_scored, comparison.paired)
    unit = "paired conversations"
    outcomes = []
    for metric in worse:
        gate = f"fail-if-worse {metric}"
        found = by_metric.get(metric)
        if found is None or found.pairs == 0:
            outcomes.append(GateOutcome(gate, False, f"{metric} has no paired values to compare"))
            continue
        too_few = _too_few(metric, found.pairs, comparison.paired, unit, need)
        low, high = found.ci95 or (0.0, 0.0)
        difference = (
            f"difference {found.mean_difference:+.4g} (95% CI {low:+.4g} to {high:+.4g})"
            if found.ci95 is not None and found.mean_difference is not None
            else "no interval"
        )
        if too_few is not None:
            outcomes.append(GateOutcome(gate, False, too_few))
        elif found.significantly_worse:
            outcomes.append(
                GateOutcome(
                    gate,
                    False,
                    f"{metric} is significantly worse in the candidate: {difference}",
                )
            )
        else:
            outcomes.append(
                GateOutcome(
                    gate,
                    True,
                    f"{metric} is not significantly worse in the candidate: {difference}, "
                    f"{found.pairs} pairs",
                )
            )
    fail_under = _as_fail_under(fail_under)
    directions = {m.metric: m.higher_is_better for m in comparison.metrics}
    primary = comparison.metric_tiers.get("primary", [])
    for bound in _bounds(fail_under, primary, directions):
        metric, gate = bound.metric, bound.gate
        found = by_metric.get(metric)
        mean = found.candidate_mean if found is not None else None
        if found is None or mean is None:
            outcomes.append(
                GateOutcome(gate, False, f"{bound.label} has no value in the candidate")
            )
            continue
        too_few = _too_few(bound.label, found.pairs, comparison.paired, unit, need)
        scored = f"{found.pairs} of {comparison.paired} {unit} scored"
        if too_few is not None:
            outcomes.append(GateOutcome(gate, False, too_few))
        else:
            verdict = f"{bound.verdict(mean, 'candidate mean')} ({scored})"
            outcomes.append(GateOutcome(gate, bound.met(mean), verdict))
    return outcomes


class LoadChecks(NamedTuple):
    """What a load run is judged on, as k6 thresholds judge a test: its validity
    (``--fail-on-invalid``) and its SLOs (``--fail-on-slo``)."""

    valid: GateOutcome
    slo: GateOutcome | None
    """None without ``--slo``."""

    def made(self) -> list[GateOutcome]:
        """Every check made, gate or not: what ``--junit`` reports."""
        return [self.valid] if self.slo is None else [self.valid, self.slo]

    def gates(self, *, fail_on_invalid: bool, fail_on_slo: bool) -> list[GateOutcome]:
        """The checks asked to decide the exit code."""
        asked = [self.valid] if fail_on_invalid else []
        if fail_on_slo and self.slo is not None:
            asked.append(self.slo)
        return asked


def load_checks(result: LoadResult | SweepResult, slos: SLOs | None) -> LoadChecks:
    """Judge a load run or sweep: valid (every point, for a sweep), and meeting the SLOs.

    A run meets the SLOs when its ``meets_slo`` is true; a sweep when one of its points
    does (``max_rate_meeting_slo``). An invalid point is not judged
    (:meth:`~convsim.load.SLOs.judge`), so it never passes the SLO gate.
    """
    from ..load._result import SweepResult

    if result.valid:
        valid = GateOutcome("valid", True, "the run is valid")
    else:
        reasons = "; ".join(result.invalid_reasons)
        valid = GateOutcome("valid", False, f"the run is invalid: {reasons}")
    if slos is None:
        return LoadChecks(valid, None)
    gate = f"meets SLO {slos}"
    if isinstance(result, SweepResult):
        best = result.max_rate_meeting_slo
        if best is not None:
            return LoadChecks(
                valid,
                GateOutcome(
                    gate, True, f"{best:.3g} sessions/s is the highest rate meeting every SLO"
                ),
            )
        unjudged = sum(p.meets_slo is None for p in result.points)
        return LoadChecks(
            valid,
            GateOutcome(
                gate,
                False,
                f"none of the points meets every SLO ({slos})"
                + (f"; {unjudged} invalid, not judged" if unjudged else ""),
            ),
        )
    if result.meets_slo is None:
        line = f"the SLO ({slos}) is not judged: the run is invalid"
        return LoadChecks(valid, GateOutcome(gate, False, line))
    if result.meets_slo:
        return LoadChecks(valid, GateOutcome(gate, True, f"the run meets every SLO ({slos})"))
    missed = ", ".join(slos.missed_by(dict(result.latency_ms)))
    return LoadChecks(valid, GateOutcome(gate, False, f"the run misses the SLO: {missed}"))


def exit_on_failed_gates(outcomes: Sequence[GateOutcome], *, code: int = EXIT_GATE_FAILED) -> None:
    """One ``gate failed:`` line per failed gate on stderr, then exit ``code`` (100 for
    quality gates, 99 for a load test's); nothing when every gate passed."""
    failed = [o for o in outcomes if not o.passed]
    for outcome in failed:
        print_error(f"gate failed: {outcome.line}")
    if failed:
        sys.exit(code)


def gate_suite(
    outcomes: Sequence[GateOutcome],
    *,
    name: str = "gates",
    properties: Mapping[str, str] | None = None,
) -> JUnitSuite:
    """The gates as a JUnit suite: one test case each, failed with its line; every
    line, passed ones too, in the suite's output."""
    from ..results._junit import JUnitCase, JUnitFailure, JUnitSuite

    cases = [
        JUnitCase(
            o.gate,
            "convsim.gates",
            failure=None if o.passed else JUnitFailure("gate failed", o.line, o.line),
        )
        for o in outcomes
    ]
    output = "\n".join(
        f"{'passed' if o.passed else 'FAILED'}: {o.gate}: {o.line}" for o in outcomes
    )
    return JUnitSuite(name, cases, properties=dict(properties or {}), output=output)
