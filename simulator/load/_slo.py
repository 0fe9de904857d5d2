"""Service-level objectives and goodput.

``--slo ttft_p99<=500ms,tpot_p99<=50ms,e2e_p99<=10s``: a metric (``ttft``, ``tpot``,
``itl``, ``e2e``), a statistic (``mean``, ``p50``, ``p90``, ``p95``, ``p99``, ``p999``),
``<=`` or ``<``, and a threshold in ``ms`` or ``s``.

``--goodput ttft:500 tpot:50`` is vLLM's form of the same (``vllm bench serve
--goodput``): ``ttft``, ``tpot`` or ``e2el`` and a threshold in ms, each read as that
metric's ``p99 <=`` objective. Goodput counts each request on its own values whatever
the statistic, so the figure is vLLM's; the statistic judges the run (``meets_slo``).

Goodput counts what met every objective, per second of the measured window. A single
request meets an objective when its own value does (as vLLM's serving benchmark counts
goodput): its TTFT, TPOT or end-to-end latency whatever the statistic, and for ITL that
statistic of its own inter-token gaps. A value a request does not have (TPOT of a
one-token answer, ITL without streaming) cannot break an objective; a failed request
meets none. A conversation meets them when every one of its requests does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from convsim._errors import ConfigError
from convsim.metrics import percentile

from ._records import RequestRecord
from ._stats import LatencySummary

__all__ = [
    "SLO",
    "SLOs",
    "SLOMetric",
    "SLOStatistic",
    "Goodput",
    "parse_slos",
    "parse_goodput",
    "merge_objectives",
    "goodput",
]

SLOMetric = Literal["ttft", "ttfot", "tpot", "itl", "e2e"]
SLOStatistic = Literal["mean", "p50", "p90", "p95", "p99", "p999"]
_PERCENTILE = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
_SLO_RE = re.compile(
    r"^(?P<metric>ttft|ttfot|tpot|itl|e2e)_(?P<stat>mean|p50|p90|p95|p99|p999)\s*"
    r"(?P<op><=|<)\s*(?P<value>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ms|s)$"
)
_FORM = (
    "expected METRIC_STAT<=VALUE with METRIC ttft, ttfot, tpot, itl or e2e, STAT mean, "
    "p50, p90, "
    "p95, p99 or p999, < or <=, and a unit ms or s (ttft_p99<=500ms)"
)


class SLO(BaseModel):
    """One objective: ``metric``'s ``statistic`` must stay within ``threshold_ms``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: SLOMetric
    statistic: SLOStatistic
    threshold_ms: float
    inclusive: bool = True
    """True for ``<=``, False for ``<``."""

    def allows(self, value_ms: float) -> bool:
        """True when ``value_ms`` is within the threshold."""
        return value_ms <= self.threshold_ms if self.inclusive else value_ms < self.threshold_ms

    def request_value_ms(self, record: RequestRecord) -> float | None:
        """The value this objective judges for one request, in ms; None if it has none."""
        if self.metric == "ttft":
            value = record.ttft_s
        elif self.metric == "ttfot":
            value = record.ttfot_s
        elif self.metric == "tpot":
            value = record.tpot_s
        elif self.metric == "e2e":
            value = record.e2e_s
        else:
            gaps = record.inter_token_gaps_s
            if not gaps:
                return None
            if self.statistic == "mean":
                value = float(np.mean(gaps))
            else:
                value = percentile(gaps, _PERCENTILE[self.statistic])
        return None if value is None else value * 1000.0

    def met_by(self, record: RequestRecord) -> bool:
        """True when one request meets this objective."""
        if not record.ok:
            return False
        value = self.request_value_ms(record)
        return value is None or self.allows(value)

    def __str__(self) -> str:
        op = "<=" if self.inclusive else "<"
        return f"{self.metric}_{self.statistic}{op}{self.threshold_ms:g}ms"


class SLOs(BaseModel):
    """A set of objectives, all of which must be met."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: tuple[SLO, ...]

    def met_by(self, record: RequestRecord) -> bool:
        """True when one request meets every objective."""
        return all(slo.met_by(record) for slo in self.items)

    def met_by_summaries(self, latency_ms: Mapping[str, LatencySummary]) -> bool:
        """True when a run's latency summaries (ms, keyed by metric) meet every objective;
        a statistic with no samples fails its objective."""
        return not self.missed_by(latency_ms)

    def missed_by(self, latency_ms: Mapping[str, LatencySummary]) -> list[str]:
        """Each objective a run's latency summaries miss, in words
        (``ttft_p99 612 ms > 500 ms``); empty when they meet every one."""
        missed = []
        for slo in self.items:
            value = getattr(latency_ms[slo.metric], slo.statistic)
            name = f"{slo.metric}_{slo.statistic}"
            if value is None:
                missed.append(f"{name} has no samples")
            elif not slo.allows(value):
                op = ">" if slo.inclusive else ">="
                missed.append(f"{name} {value:.4g} ms {op} {slo.threshold_ms:g} ms")
        return missed

    def judge(self, latency_ms: Mapping[str, LatencySummary], *, valid: bool) -> bool | None:
        """Whether a point meets every objective: the one answer that the result's
        ``meets_slo``, the sweep's highest rate meeting them, its tables and its gates
        all give.

        None for an invalid point: its figures were set by the client as much as by
        the server (it lagged its schedule, fell behind it, or was throttled), so they
        neither show nor refute that the server meets the objectives.
        """
        if not valid:
            return None
        return self.met_by_summaries(latency_ms)

    def __str__(self) -> str:
        return ",".join(str(s) for s in self.items)


def parse_slos(text: str) -> SLOs:
    """``ttft_p99<=500ms,e2e_p99<=10s`` as :class:`SLOs`.

    Raises:
        ConfigError: naming the part that is not an objective, or a metric given twice
            with the same statistic.
    """
    items: list[SLO] = []
    for part in (p.strip() for p in text.split(",")):
        match = _SLO_RE.match(part.lower())
        if not match:
            raise ConfigError(f"invalid --slo {part!r}: {_FORM}")
        value = float(match["value"]) * (1000.0 if match["unit"] == "s" else 1.0)
        slo = SLO(
            metric=match["metric"],  # type: ignore[arg-type]  # the regex allows only these
            statistic=match["stat"],  # type: ignore[arg-type]
            threshold_ms=value,
            inclusive=match["op"] == "<=",
        )
        if any((s.metric, s.statistic) == (slo.metric, slo.statistic) for s in items):
            raise ConfigError(f"invalid --slo {text!r}: {slo.metric}_{slo.statistic} given twice")
        items.append(slo)
    return SLOs(items=tuple(items))


_GOODPUT_METRICS: dict[str, SLOMetric] = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}
"""vLLM's goodput names and convsim's metric for each."""
_GOODPUT_RE = re.compile(r"^(?P<name>[a-z0-9_]+):(?P<value>\d+(?:\.\d*)?|\.\d+)$")
_GOODPUT_STATISTIC: SLOStatistic = "p99"
_GOODPUT_FORM = (
    "expected KEY:VALUE pairs as vllm bench serve takes them, KEY ttft, tpot or e2el and "
    "VALUE a threshold in ms of 0 or more (ttft:500 tpot:50)"
)


def parse_goodput(text: str) -> SLOs:
    """vLLM's ``ttft:500 tpot:50 e2el:2000`` (ms; apart with spaces or commas) as
    :class:`SLOs`: each a ``p99 <=`` objective on that metric.

    Raises:
        ConfigError: naming the word that is not ``KEY:VALUE``, an unknown key, or a
            key given twice.
    """
    items: list[SLO] = []
    words = text.replace(",", " ").split()
    if not words:
        raise ConfigError(f"invalid --goodput {text!r}: {_GOODPUT_FORM}")
    for word in words:
        match = _GOODPUT_RE.match(word.strip().lower())
        if not match:
            raise ConfigError(f"invalid --goodput {word!r}: {_GOODPUT_FORM}")
        metric = _GOODPUT_METRICS.get(match["name"])
        if metric is None:
            raise ConfigError(
                f"invalid --goodput {word!r}: unknown key {match['name']!r}; {_GOODPUT_FORM}"
            )
        if any(s.metric == metric for s in items):
            raise ConfigError(f"invalid --goodput {text!r}: {match['name']} given twice")
        items.append(
            SLO(metric=metric, statistic=_GOODPUT_STATISTIC, threshold_ms=float(match["value"]))
        )
    return SLOs(items=tuple(items))


def merge_objectives(slo: str | None, goodput: str | None) -> str | None:
    """The objectives of ``--slo`` and ``--goodput`` together, as ``--slo`` text.

    Raises:
        ConfigError: either is invalid, or both name the same metric (a request would
            be judged by two thresholds of it).
    """
    if goodput is None:
        return slo
    extra = parse_goodput(goodput)
    if slo is None:
        return str(extra)
    given = parse_slos(slo)
    for item in extra.items:
        clash = next((s for s in given.items if s.metric == item.metric), None)
        if clash is not None:
            name = next(k for k, v in _GOODPUT_METRICS.items() if v == item.metric)
            raise ConfigError(
                f"--slo {str(clash)!r} and --goodput {name}:{item.threshold_ms:g} both set an "
                f"objective on {item.metric}; give each metric once"
            )
    return f"{given},{extra}"


class Goodput(BaseModel):
    """Requests, and whole conversations, meeting every objective per second."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_s: float
    conversations_per_s: float


def goodput(records: Iterable[RequestRecord], slos: SLOs, duration_s: float) -> Goodput:
    """Goodput of ``records`` (the requests of the measured window) over ``duration_s``.

    A conversation is the set of ``records`` sharing a session id; it counts when every
    one of them meets every objective.
    """
    if duration_s <= 0:
        raise ValueError(f"the measured duration must be positive, got {duration_s}")
    good_requests = 0
    conversations: dict[str, bool] = {}
    for record in records:
        met = slos.met_by(record)
        good_requests += met
        conversations[record.session_id] = conversations.get(record.session_id, True) and met
    return Goodput(
        requests_per_s=good_requests / duration_s,
        conversations_per_s=sum(conversations.values()) / duration_s,
    )
