"""One self-contained HTML page for a load test (``convsim load --html``): its figures,
and plots of latency CDFs, throughput and in-flight requests over time, latency by turn
depth, schedule delay, and for a sweep the throughput-latency curve with the SLO lines.

Offline like the run report: inline SVG, no script, a Content-Security-Policy that
forbids any request; rendered by a sandboxed, autoescaping Jinja2 environment.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convsim._errors import ConfigError
from convsim._version import __version__

from ._html import _environment
from ._plots import Plot, _pyplot, _svg, cdf_plot

__all__ = ["render_load_html", "write_load_html"]

_SIZE = (6.4, 3.0)


def _timeline(plt: Any, point: Any) -> Plot | None:
    timeline = point.timeline
    if len(timeline) < 3:
        return None
    t = [e.t_s for e in timeline]
    done = [e.completed for e in timeline]
    steps = zip(done, done[1:], t, t[1:], strict=False)
    rate = [0.0] + [(b - a) / max(tb - ta, 1e-9) for a, b, ta, tb in steps]
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot(t, rate, label="completed requests/s")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("requests/s")
    right = ax.twinx()
    right.plot(t, [e.in_flight for e in timeline], color="#dd8452", label="in flight")
    right.set_ylabel("in flight")
    lines = ax.get_lines() + right.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], frameon=False, loc="upper left")
    return Plot("timeline", "Throughput and requests in flight over time", _svg(fig))


def _by_turn(plt: Any, point: Any) -> Plot | None:
    turns = point.by_turn
    if len(turns) < 2:
        return None
    idx = [t.turn_index for t in turns]
    fig, ax = plt.subplots(figsize=_SIZE)
    for label, values in (
        ("TTFT p50", [t.ttft_ms.p50 for t in turns]),
        ("TTFT p99", [t.ttft_ms.p99 for t in turns]),
        *(
            [("TTFOT p50", [t.ttfot_ms.p50 for t in turns])]
            if any(t.ttfot_ms.p50 != t.ttft_ms.p50 for t in turns)
            else []
        ),
        ("E2E p50", [t.e2e_ms.p50 for t in turns]),
    ):
        if any(v is not None for v in values):
            ax.plot(
                idx, [float("nan") if v is None else v for v in values], marker="o", label=label
            )
    ax.set_xlabel("turn index (the context grows with it)")
    ax.set_ylabel("ms")
    ax.legend(frameon=False)
    return Plot("by_turn", "Latency by turn depth", _svg(fig))


def _hit_rate_by_turn(plt: Any, point: Any) -> Plot | None:
    cache = getattr(point, "prefix_cache", None)
    turns = [t for t in cache.hit_rate_by_turn if t.hit_rate is not None] if cache else []
    if not turns:
        return None
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot([t.turn_index for t in turns], [t.hit_rate for t in turns], marker="o")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("turn index")
    ax.set_ylabel("cached / prompt tokens")
    return Plot("prefix_cache", "Prefix-cache hit rate by turn depth (as reported)", _svg(fig))


def _server_timeline(plt: Any, result: Any) -> Plot | None:
    samples = getattr(result, "server_metrics_timeline", None) or []
    if len(samples) < 2:
        return None
    t = [s.t_s for s in samples]
    fig, ax = plt.subplots(figsize=_SIZE)
    for label, values in (
        ("running", [s.running for s in samples]),
        ("waiting", [s.waiting for s in samples]),
    ):
        if any(v is not None for v in values):
            ax.plot(t, [float("nan") if v is None else v for v in values], label=label)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("requests")
    right = ax.twinx()
    for label, values, color in (
        ("KV-cache usage", [s.kv_cache_usage for s in samples], "#c44e52"),
        ("prefix-cache hit rate", [s.prefix_cache_hit_rate for s in samples], "#8172b3"),
    ):
        if any(v is not None for v in values):
            right.plot(
                t,
                [float("nan") if v is None else v for v in values],
                color=color,
                linestyle="--",
                label=label,
            )
    right.set_ylim(0, 1.05)
    right.set_ylabel("share (0 to 1)")
    lines = ax.get_lines() + right.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], frameon=False, loc="upper left")
    return Plot("server", "The server's own metrics over time (/metrics)", _svg(fig))


def _sweep(plt: Any, result: Any, slos: Any) -> Plot | None:
    points = [p for p in result.points if p.latency_ms.e2e.p99 is not None]
    if len(points) < 2:
        return None
    fig, ax = plt.subplots(figsize=_SIZE)
    rates = [p.throughput.requests_per_s for p in points]
    for name, stat in (("ttft", "p99"), ("e2e", "p99"), ("e2e", "p50")):
        values = [getattr(getattr(p.latency_ms, name), stat) for p in points]
        if any(v is not None for v in values):
            ax.plot(rates, values, marker="o", label=f"{name.upper()} {stat}")
    for slo in getattr(slos, "items", ()):
        ax.axhline(slo.threshold_ms, linestyle="--", linewidth=0.8, color="#999")
        ax.annotate(
            f"SLO {slo.metric} {slo.statistic} {slo.threshold_ms:g} ms",
            (rates[0], slo.threshold_ms),
            fontsize=7,
            color="#666",
            va="bottom",
        )
    best = result.max_rate_meeting_slo
    if best is not None:
        ax.set_title(f"highest rate meeting every SLO: {best:.3g} sessions/s", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("achieved requests/s")
    ax.set_ylabel("ms (log scale)")
    ax.legend(frameon=False)
    return Plot("sweep", "Throughput against latency across the sweep", _svg(fig))


def _label(point: Any) -> str:
    """The point as its column head says it: c=8, 4/s or trace."""
    if point.concurrency is not None:
        return f"c={point.concurrency}"
    if point.target_rate is not None:
        return f"{point.target_rate:.3g}/s"
    return "trace"


def render_load_html(
    result: Any, requests: Sequence[tuple[int, Any]], *, title: str, slos: Any = None
) -> str:
    """The page for a load ``result`` (a run or a sweep) and its per-request records:
    its figures, why it is invalid (each point's reasons, named by point in a sweep),
    its notes, whether it is partial, and its plots."""
    points = list(result.points) if hasattr(result, "points") else [result]
    main = max(range(len(points)), key=lambda i: points[i].throughput.requests_per_s)
    chosen = [r for i, r in requests if i == main and r.ok]
    plt = _pyplot()
    latency = {
        "TTFT": [r.ttft_s * 1000 for r in chosen if r.ttft_s is not None],
        # only where the first answer token came after a first thought: else TTFT's line
        **(
            {"TTFOT": [r.ttfot_s * 1000 for r in chosen if r.ttfot_s is not None]}
            if any(r.ttfot_s != r.ttft_s for r in chosen)
            else {}
        ),
        "TPOT": [r.tpot_s * 1000 for r in chosen if r.tpot_s is not None],
        "ITL": [g * 1000 for r in chosen for g in r.inter_token_gaps_s],
        "E2E": [r.e2e_s * 1000 for r in chosen],
    }
    # on a log axis: a send exactly on time (0 ms) is drawn at 1 microsecond
    delays = {
        "send delay": [
            max(r.schedule_delay_s * 1000, 1e-3) for r in chosen if r.schedule_delay_s is not None
        ]
    }
    made = [
        _sweep(plt, result, slos) if len(points) > 1 else None,
        cdf_plot(
            plt,
            latency,
            key="latency",
            title="Latency CDFs (the busiest point)",
            unit="requests",
            log=True,
        ),
        _timeline(plt, points[main]),
        _by_turn(plt, points[main]),
        _hit_rate_by_turn(plt, points[main]),
        _server_timeline(plt, result),
        cdf_plot(
            plt,
            delays,
            key="delay",
            title="Schedule delay: actual minus scheduled send",
            unit="requests",
            log=True,
        ),
    ]
    template = _environment().get_template("load.html.j2")
    return str(
        template.render(
            title=title,
            points=points,
            labels=[_label(p) for p in points],
            invalid_reasons=list(result.invalid_reasons),
            notes=list(dict.fromkeys(note for p in points for note in p.notes)),
            partial=result.partial,
            partial_reason=result.partial_reason,
            sweep=result if len(points) > 1 else None,
            judged=any(p.goodput is not None for p in points),  # goodput: SLOs were given
            server=any(getattr(p, "server_metrics", None) is not None for p in points),
            cached=any(
                getattr(p, "prefix_cache", None) is not None and p.prefix_cache.requests
                for p in points
            ),
            plots=[p for p in made if p is not None],
            version=__version__,
            generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
    )


def write_load_html(
    out: str | Path, result: Any, requests: Sequence[tuple[int, Any]], *, slos: Any = None
) -> Path:
    target = Path(out)
    if not target.parent.exists():
        raise ConfigError(f"{target}: its folder does not exist")
    page = render_load_html(result, requests, title=target.stem, slos=slos)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target
