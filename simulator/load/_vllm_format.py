"""A load result in ``vllm bench serve``'s JSON keys, for dashboards built on them.

vLLM writes one object per run: ``duration`` (s), ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput``,
``request_goodput`` (null without goodput objectives), ``output_throughput``,
``total_token_throughput`` (per second), and for each of ``ttft``, ``tpot``, ``itl``
and ``e2el`` its ``mean_*_ms``, ``median_*_ms``, ``std_*_ms`` and ``p{N}_*_ms``
(vLLM writes the percentiles asked with ``--metric-percentiles``; here 90, 95, 99 and
99.9, all convsim measures), with the run's settings ``date``, ``model_id``,
``request_rate`` (requests per second; ``"inf"`` in closed loop), ``burstiness`` and
``max_concurrency``.

Only what convsim measured is written: a latency without samples leaves its keys out,
and token totals and throughputs are left out when any count was estimated rather
than the server's or its tokenizer's. A sweep is one object per point, one per line,
as ``vllm bench serve --append-result`` writes runs.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from convsim._errors import ConfigError
from convsim.adapters import parse_model_spec

from ._plan import LoadPlan
from ._result import LoadResult, PointResult, SweepResult
from ._stats import LatencySummary

__all__ = ["vllm_result", "write_vllm_result"]

_LATENCIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
"""convsim's latency names and vLLM's."""
_PERCENTILES = {"p90": "90", "p95": "95", "p99": "99", "p999": "99.9"}
"""convsim's percentile fields and how vLLM names each in its keys."""


def _latency(name: str, summary: LatencySummary) -> dict[str, float]:
    if not summary.count:
        return {}
    keys = {
        f"mean_{name}_ms": summary.mean,
        f"median_{name}_ms": summary.p50,
        f"std_{name}_ms": summary.std,
        **{f"p{word}_{name}_ms": getattr(summary, field) for field, word in _PERCENTILES.items()},
    }
    return {key: value for key, value in keys.items() if value is not None}


def _request_rate(point: PointResult) -> float | str | None:
    if point.concurrency is not None:
        return "inf"  # closed loop: no arrival rate, as vLLM writes an unlimited one
    return point.target_request_rate


def _burstiness(plan: LoadPlan, point: PointResult) -> float | None:
    """vLLM's gamma shape of the arrival gaps (1: Poisson); None where the arrivals
    were not drawn so (closed loop, a trace, constant gaps)."""
    if point.concurrency is not None or (plan.trace is not None and plan.rate is None):
        return None
    return {"poisson": 1.0, "gamma": plan.burstiness}.get(plan.arrival)


def vllm_result(point: PointResult, plan: LoadPlan, *, date: str) -> dict[str, Any]:
    """One point's figures in ``vllm bench serve``'s keys and units (ms, per second)."""
    model = parse_model_spec(plan.model)
    out: dict[str, Any] = {"date": date, "model_id": model.model or model.type}
    rate = _request_rate(point)
    if rate is not None:
        out["request_rate"] = rate
    burstiness = _burstiness(plan, point)
    if burstiness is not None:
        out["burstiness"] = burstiness
    out["max_concurrency"] = (
        point.concurrency if point.concurrency is not None else plan.max_concurrency
    )
    seconds = point.duration_s
    out["duration"] = seconds
    out["completed"] = point.requests.completed
    out["failed"] = point.requests.failed
    counted = "estimate" not in point.token_sources
    if counted:
        output_tokens = round(point.throughput.output_tokens_per_s * seconds)
        out["total_input_tokens"] = round(point.throughput.total_tokens_per_s * seconds) - (
            output_tokens
        )
        out["total_output_tokens"] = output_tokens
    out["request_throughput"] = point.throughput.requests_per_s
    out["request_goodput"] = None if point.goodput is None else point.goodput.requests_per_s
    if counted:
        out["output_throughput"] = point.throughput.output_tokens_per_s
        out["total_token_throughput"] = point.throughput.total_tokens_per_s
    for ours, theirs in _LATENCIES.items():
        out.update(_latency(theirs, getattr(point.latency_ms, ours)))
    return out


def write_vllm_result(
    path: Path, result: LoadResult | SweepResult, plan: LoadPlan, *, now: datetime | None = None
) -> None:
    """Write ``result`` to ``path`` in vLLM's keys: one JSON object, or for a sweep one
    per point, one per line.

    Raises:
        ConfigError: the file cannot be written.
    """
    date = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    points = result.points if isinstance(result, SweepResult) else [result]
    lines = [json.dumps(vllm_result(p, plan, date=date)) for p in points]
    try:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the result: {exc}") from exc
