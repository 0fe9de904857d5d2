"""The report's plots, as inline SVG drawn by matplotlib (no script, no network)."""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from convsim._extras import needs_extra
from convsim._records import ConversationResult, TurnStatus
from convsim.metrics import percentile

__all__ = ["Plot", "cdf_plot", "run_plots", "trials_plot"]

_SIZE = (6.4, 3.0)


class Plot:
    """A titled SVG figure."""

    def __init__(self, key: str, title: str, svg: str, note: str = "") -> None:
        self.key, self.title, self.svg, self.note = key, title, svg, note


def _pyplot() -> Any:
    with needs_extra("html", "the HTML report's plots"):
        import matplotlib

        matplotlib.use("svg", force=True)
        import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",  # text as text: small and searchable
            "font.size": 8,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "svg.hashsalt": "convsim",  # the same run, the same file
            # ticks say the values themselves: "5000.002", never "0.002" and "+5e3"
            "axes.formatter.useoffset": False,
        }
    )
    return plt


def _svg(fig: Any) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # the XML prologue and DOCTYPE do not belong inline


def _metric_values(results: Sequence[ConversationResult]) -> dict[str, list[float]]:
    values: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for name, score in r.scores.items():
            if score.value is not None:
                values[name].append(score.value)
    return dict(sorted(values.items()))


def _distributions(plt: Any, values: dict[str, list[float]]) -> Plot | None:
    if not values:
        return None
    n = len(values)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4, 1.9 * rows), squeeze=False)
    for ax, (name, vals) in zip(axes.flat, values.items(), strict=False):
        ax.hist(vals, bins=20, color="#4c72b0")
        ax.set_title(f"{name} (n={len(vals)})", fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    return Plot("metrics", "Each metric's distribution over conversations", _svg(fig))


def cdf_plot(
    plt: Any,
    series: dict[str, list[float]],
    *,
    key: str,
    title: str,
    unit: str,
    value_unit: str = "ms",
    log: bool = False,
) -> Plot | None:
    """Empirical CDFs of ``series`` (values in ``value_unit``) on one axis, the share of
    ``unit`` (turns, requests) up the side; None when all are empty."""
    import numpy as np

    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=_SIZE)
    for name, values in series.items():
        xs = np.sort(np.asarray(values, dtype=float))
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=name)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(f"{value_unit} (log scale)" if log else value_unit)
    ax.set_ylabel(f"share of {unit}")
    ax.legend(frameon=False)
    return Plot(key, title, _svg(fig))


def _latency(plt: Any, results: Sequence[ConversationResult]) -> Plot | None:
    series: dict[str, list[float]] = {"end to end": [], "time to first token": []}
    first_output: list[float] = []
    reasoned = False
    for r in results:
        for t in r.turns:
            if t.status is TurnStatus.COMPLETED and t.timings is not None:
                if t.timings.latency_s is not None:
                    series["end to end"].append(t.timings.latency_s)
                if t.timings.ttft_s is not None:
                    series["time to first token"].append(t.timings.ttft_s)
                if t.timings.ttfot_s is not None:
                    first_output.append(t.timings.ttfot_s)
                    reasoned = reasoned or t.timings.ttfot_s != t.timings.ttft_s
    if reasoned:  # else the same line as the first token's
        series["time to first output token"] = first_output
    return cdf_plot(
        plt,
        series,
        key="latency",
        title="Model-call latency per turn (CDF)",
        unit="turns",
        value_unit="s",
    )


def _by_turn(plt: Any, results: Sequence[ConversationResult]) -> Plot | None:
    by_index: dict[int, list[float]] = defaultdict(list)
    for r in results:
        for t in r.turns:
            if t.status is TurnStatus.COMPLETED and t.timings and t.timings.latency_s is not None:
                by_index[t.turn_index].append(t.timings.latency_s)
    if len(by_index) < 2:
        return None
    idx = sorted(by_index)
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot(idx, [percentile(by_index[i], 50) for i in idx], marker="o", label="median")
    ax.plot(idx, [percentile(by_index[i], 95) for i in idx], marker=".", label="p95")
    ax.set_xlabel("turn index")
    ax.set_ylabel("s")
    ax.legend(frameon=False)
    return Plot("by_turn", "Latency by turn index", _svg(fig))


def _by_type(plt: Any, results: Sequence[ConversationResult], scores_0_1: set[str]) -> Plot | None:
    import numpy as np

    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for name, score in r.scores.items():
            if name in scores_0_1 and score.value is not None and 0.0 <= score.value <= 1.0:
                table[name][r.scenario_type].append(score.value)
    table = {k: v for k, v in sorted(table.items()) if v}
    types = sorted({t for per in table.values() for t in per})
    if not table or len(types) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(table) * len(types) + 1.0))
    height = 0.8 / len(types)
    for k, scenario_type in enumerate(types):
        means = [float(np.mean(table[m][scenario_type])) if table[m][scenario_type] else 0.0
                 for m in table]  # fmt: skip
        ax.barh(np.arange(len(table)) + k * height, means, height=height, label=scenario_type)
    ax.set_yticks(np.arange(len(table)) + 0.4 - height / 2, list(table))
    ax.set_xlim(0, 1)
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    return Plot("by_type", "Scores (0-1 metrics) by scenario type", _svg(fig))


def _retention(plt: Any, curve: dict[int, Any]) -> Plot | None:
    points = [(d, s.mean) for d, s in sorted(curve.items()) if s.mean is not None]
    if len(points) < 2:
        return None
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot([d for d, _ in points], [m for _, m in points], marker="o")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("turns between a fact and its probe")
    ax.set_ylabel("recalled")
    return Plot("retention", "Retention by distance", _svg(fig))


def _errors(plt: Any, results: Sequence[ConversationResult]) -> Plot | None:
    failed = [r for r in results if r.error is not None]
    if not failed:
        return None
    start = min(r.timings.started_at for r in results)
    by_type: dict[str, list[float]] = defaultdict(list)
    for r in failed:
        assert r.error is not None
        by_type[r.error.type].append(r.timings.finished_at - start)
    fig, ax = plt.subplots(figsize=_SIZE)
    from matplotlib.ticker import MaxNLocator

    ax.hist(list(by_type.values()), bins=30, stacked=True, label=list(by_type))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # conversations are whole
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("failed conversations")
    ax.legend(frameon=False, fontsize=7)
    return Plot("errors", "Failures over time", _svg(fig))


def run_plots(
    results: Sequence[ConversationResult],
    retention_curve: dict[int, Any],
    higher_is_better: dict[str, bool | None],
) -> list[Plot]:
    """Every plot the run has data for; the by-type bars show the scores where higher
    is better (a latency is not a 0-1 score)."""
    plt = _pyplot()
    scores = {name for name, higher in higher_is_better.items() if higher}
    made = [
        _distributions(plt, _metric_values(results)),
        _by_type(plt, results, scores),
        _retention(plt, retention_curve),
        _latency(plt, results),
        _by_turn(plt, results),
        _errors(plt, results),
    ]
    return [p for p in made if p is not None]


def trials_plot(pass_at_k: dict[int, float], pass_hat_k: dict[int, float]) -> Plot | None:
    """pass@k and pass^k against k, every k (the table beside it shows some); None
    without trials."""
    if not pass_hat_k:
        return None
    plt = _pyplot()
    ks = sorted(pass_hat_k)
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot(ks, [pass_at_k[k] for k in ks], marker="." if len(ks) < 30 else None, label="pass@k")
    ax.plot(ks, [pass_hat_k[k] for k in ks], marker="." if len(ks) < 30 else None, label="pass^k")
    if ks[-1] >= 16:
        ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("k (trials)")
    ax.set_ylabel("goal achieved")
    ax.legend(frameon=False)
    return Plot("trials", "Goal achieved in at least one (pass@k) and in all (pass^k) of k trials",
                _svg(fig))  # fmt: skip
