"""A model server's own figures, from scrapes of its Prometheus ``/metrics``.

vLLM, SGLang, TGI and llama.cpp's server name the same things differently;
:data:`SERVER_FAMILIES` maps each one's names to a common set: KV-cache usage, requests
running and waiting, preemptions, prompt and generation throughput, prefix-cache hit
rate and the server's own time to first token. Gauges are read at each scrape; rates,
the hit rate and the TTFT come from the change of counters and histograms between two
scrapes, so a server restarted in between (a counter that went down) gives none. A
figure the server does not expose is null, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Sample",
    "Scrape",
    "ServerNames",
    "SERVER_FAMILIES",
    "detect_family",
    "GaugeFigures",
    "ServerTtft",
    "ServerFigures",
    "ServerSample",
    "server_figures",
    "server_sample",
    "RAW_LIMIT",
]

RAW_LIMIT = 256
"""The most series a point's ``raw`` keeps."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series' value at a scrape: ``name{labels} value``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def key(self) -> str:
        """``name{label="value",...}``, as the text format writes it."""
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}"


@dataclass(frozen=True)
class Scrape:
    """What one read of ``/metrics`` gave, at ``t_s`` seconds into the run."""

    t_s: float
    point: int
    """The load point (sweep index; 0 without a sweep) it was taken in."""
    samples: tuple[Sample, ...]

    def total(self, names: Sequence[str]) -> float | None:
        """The sum over label sets of the first of ``names`` the server exposes; None
        when it exposes none of them."""
        for name in names:
            values = [s.value for s in self.samples if s.name == name]
            if values:
                return math.fsum(values)
        return None

    def mean(self, names: Sequence[str]) -> float | None:
        """The mean over label sets (a ratio per engine), likewise."""
        for name in names:
            values = [s.value for s in self.samples if s.name == name]
            if values:
                return math.fsum(values) / len(values)
        return None

    def buckets(self, histogram: str) -> dict[float, float]:
        """A histogram's cumulative bucket counts by upper bound, summed over label sets."""
        found: dict[float, float] = {}
        for s in self.samples:
            if s.name != histogram + "_bucket":
                continue
            bound = dict(s.labels).get("le")
            if bound is None:
                continue
            try:
                le = float(bound)
            except ValueError:
                continue
            found[le] = found.get(le, 0.0) + s.value
        return found


@dataclass(frozen=True)
class ServerNames:
    """Where one server family keeps each figure of the common set (the first name
    it exposes wins: newer names first, older spellings after)."""

    family: str
    prefix: str
    """What all of its metric names start with."""
    kv_cache_usage: tuple[str, ...] = ()
    """A gauge from 0 to 1."""
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    """A counter."""
    prompt_tokens: tuple[str, ...] = ()
    """A counter (or a histogram's ``_sum``)."""
    generation_tokens: tuple[str, ...] = ()
    cache_queries: tuple[str, ...] = ()
    """A counter of prompt tokens looked up in the prefix cache."""
    cache_hits: tuple[str, ...] = ()
    """A counter of those found there."""
    cache_hit_rate: tuple[str, ...] = ()
    """A gauge the server computes itself: used only without the two counters."""
    ttft: str | None = None
    """A histogram of time to first token, in seconds."""


SERVER_FAMILIES: tuple[ServerNames, ...] = (
    # vLLM: docs/usage/metrics (v1 engine) and the v0 names it replaced
    ServerNames(
        "vllm",
        "vllm:",
        kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        preemptions=("vllm:num_preemptions_total",),
        prompt_tokens=("vllm:prompt_tokens_total",),
        generation_tokens=("vllm:generation_tokens_total",),
        cache_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        cache_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        cache_hit_rate=("vllm:gpu_prefix_cache_hit_rate",),
        ttft="vllm:time_to_first_token_seconds",
    ),
    # SGLang (--enable-metrics): python/sglang/srt/metrics/collector.py
    ServerNames(
        "sglang",
        "sglang:",
        kv_cache_usage=("sglang:token_usage",),
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        preemptions=("sglang:num_retracted_requests_total",),
        prompt_tokens=("sglang:prompt_tokens_total",),
        generation_tokens=("sglang:generation_tokens_total",),
        cache_queries=("sglang:prompt_tokens_total",),
        cache_hits=("sglang:cached_tokens_total",),
        cache_hit_rate=("sglang:cache_hit_rate",),
        ttft="sglang:time_to_first_token_seconds",
    ),
    # Text Generation Inference: docs/source/reference/metrics.md (no KV usage, no TTFT)
    ServerNames(
        "tgi",
        "tgi_",
        running=("tgi_batch_current_size",),
        waiting=("tgi_queue_size",),
        prompt_tokens=("tgi_request_input_length_sum",),
        generation_tokens=("tgi_request_generated_tokens_sum",),
    ),
    # llama.cpp's llama-server (--metrics): tools/server/README.md
    ServerNames(
        "llamacpp",
        "llamacpp:",
        kv_cache_usage=("llamacpp:kv_cache_usage_ratio",),
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        prompt_tokens=("llamacpp:prompt_tokens_total",),
        generation_tokens=("llamacpp:tokens_predicted_total",),
    ),
)
"""The server families whose names are mapped, in the order they are tried."""


def detect_family(samples: Sequence[Sample]) -> ServerNames | None:
    """The family most of ``samples`` belong to (by name prefix); None for none."""
    counts = {
        f.family: sum(1 for s in samples if s.name.startswith(f.prefix)) for f in SERVER_FAMILIES
    }
    best = max(SERVER_FAMILIES, key=lambda f: counts[f.family])
    return best if counts[best.family] else None


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GaugeFigures(_Model):
    """A gauge over a point's scrapes."""

    mean: float
    max: float
    last: float


class ServerTtft(_Model):
    """The server's own time to first token over a point, from its histogram's change:
    the requests it counted, their mean and (interpolated in the buckets) median."""

    count: int
    mean_ms: float | None
    p50_ms: float | None


class ServerFigures(_Model):
    """What the server's ``/metrics`` said over one point: from the scrape at its start
    to the one at its end (warm-up and cool-down included), as the server counts."""

    url: str
    family: str | None
    """``vllm``, ``sglang``, ``tgi`` or ``llamacpp``; null when the names are none of
    those (``raw`` then holds what was there)."""
    scrapes: int
    failed_scrapes: int
    span_s: float | None
    """Seconds from the first scrape to the last; null with fewer than two."""
    kv_cache_usage: GaugeFigures | None
    """From 0 (empty) to 1 (full)."""
    running: GaugeFigures | None
    waiting: GaugeFigures | None
    preemptions: float | None
    """Preemptions over the span (a counter's change)."""
    prompt_throughput: float | None
    """Prompt tokens per second over the span, as the server counts them."""
    generation_throughput: float | None
    """Generated tokens per second over the span."""
    prefix_cache_hit_rate: float | None
    """Prompt tokens found in the prefix cache over those looked up, over the span;
    the server's own gauge (its mean) where it has no such counters."""
    ttft: ServerTtft | None
    raw: dict[str, float]
    """The last scrape's series of the server's own family (histogram buckets left
    out), at most :data:`RAW_LIMIT`; every series when the family is unknown."""


class ServerSample(_Model):
    """One scrape on the run's time line: gauges as read, rates since the scrape before
    in the same point (null for a point's first)."""

    t_s: float
    """Seconds since the run started."""
    point: int
    kv_cache_usage: float | None
    running: float | None
    waiting: float | None
    prompt_throughput: float | None
    generation_throughput: float | None
    prefix_cache_hit_rate: float | None


def _delta(first: Scrape, last: Scrape, names: Sequence[str]) -> float | None:
    """A counter's change; None when not exposed, or when it went down (a restart)."""
    start, end = first.total(names), last.total(names)
    if start is None or end is None or end < start:
        return None
    return end - start


def _rate(first: Scrape, last: Scrape, names: Sequence[str]) -> float | None:
    seconds = last.t_s - first.t_s
    change = _delta(first, last, names)
    return None if change is None or seconds <= 0 else change / seconds


def _hit_rate(first: Scrape, last: Scrape, names: ServerNames) -> float | None:
    queries = _delta(first, last, names.cache_queries)
    hits = _delta(first, last, names.cache_hits)
    if queries is not None and hits is not None:
        return hits / queries if queries > 0 else None
    return None


def _gauge(
    scrapes: Sequence[Scrape], names: Sequence[str], *, ratio: bool = False
) -> GaugeFigures | None:
    """A gauge over the scrapes: summed over label sets (requests of several engines),
    or averaged for a ``ratio`` (a usage from 0 to 1 per engine)."""
    read = [(s.mean(names) if ratio else s.total(names)) for s in scrapes] if names else []
    values = [v for v in read if v is not None]
    if not values:
        return None
    return GaugeFigures(mean=math.fsum(values) / len(values), max=max(values), last=values[-1])


def _quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile``: linear within the bucket that holds it."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # beyond the last finite bound: that bound is all we know
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, count
    return lower


def _ttft(first: Scrape, last: Scrape, histogram: str | None) -> ServerTtft | None:
    if histogram is None:
        return None
    count = _delta(first, last, (histogram + "_count",))
    total = _delta(first, last, (histogram + "_sum",))
    if count is None:
        return None
    start, end = first.buckets(histogram), last.buckets(histogram)
    change = {le: end[le] - start.get(le, 0.0) for le in end}
    p50 = _quantile(0.5, change) if change and all(v >= 0 for v in change.values()) else None
    mean = total / count if total is not None and count > 0 else None
    return ServerTtft(
        count=round(count),
        mean_ms=None if mean is None else mean * 1000.0,
        p50_ms=None if p50 is None else p50 * 1000.0,
    )


def _raw(last: Scrape, names: ServerNames | None) -> dict[str, float]:
    kept: dict[str, float] = {}
    for s in last.samples:
        if s.name.endswith("_bucket") or s.name.endswith("_created"):
            continue
        if names is not None and not s.name.startswith(names.prefix):
            continue
        if len(kept) >= RAW_LIMIT:
            break
        kept[s.key] = s.value
    return kept


def server_figures(url: str, scrapes: Sequence[Scrape], failed: int = 0) -> ServerFigures | None:
    """The figures of one point from its scrapes (in time order); None without any."""
    if not scrapes:
        return None
    first, last = scrapes[0], scrapes[-1]
    names = detect_family(last.samples)
    two = len(scrapes) > 1
    if names is None:
        return ServerFigures(
            url=url,
            family=None,
            scrapes=len(scrapes),
            failed_scrapes=failed,
            span_s=last.t_s - first.t_s if two else None,
            kv_cache_usage=None,
            running=None,
            waiting=None,
            preemptions=None,
            prompt_throughput=None,
            generation_throughput=None,
            prefix_cache_hit_rate=None,
            ttft=None,
            raw=_raw(last, None),
        )
    hit_rate = _hit_rate(first, last, names) if two else None
    if hit_rate is None and not (names.cache_queries and two):
        gauge = _gauge(scrapes, names.cache_hit_rate, ratio=True)
        hit_rate = None if gauge is None else gauge.mean
    return ServerFigures(
        url=url,
        family=names.family,
        scrapes=len(scrapes),
        failed_scrapes=failed,
        span_s=last.t_s - first.t_s if two else None,
        kv_cache_usage=_gauge(scrapes, names.kv_cache_usage, ratio=True),
        running=_gauge(scrapes, names.running),
        waiting=_gauge(scrapes, names.waiting),
        preemptions=_delta(first, last, names.preemptions) if two and names.preemptions else None,
        prompt_throughput=_rate(first, last, names.prompt_tokens) if two else None,
        generation_throughput=_rate(first, last, names.generation_tokens) if two else None,
        prefix_cache_hit_rate=hit_rate,
        ttft=_ttft(first, last, names.ttft) if two else None,
        raw=_raw(last, names),
    )


def server_sample(scrape: Scrape, before: Scrape | None) -> ServerSample:
    """``scrape`` on the time line; rates since ``before`` (the same point's previous)."""
    names = detect_family(scrape.samples)
    if names is None:
        return ServerSample(
            t_s=scrape.t_s,
            point=scrape.point,
            kv_cache_usage=None,
            running=None,
            waiting=None,
            prompt_throughput=None,
            generation_throughput=None,
            prefix_cache_hit_rate=None,
        )
    usage = scrape.mean(names.kv_cache_usage) if names.kv_cache_usage else None
    rates = before is not None and before.point == scrape.point
    hit_rate = _hit_rate(before, scrape, names) if rates and before is not None else None
    return ServerSample(
        t_s=scrape.t_s,
        point=scrape.point,
        kv_cache_usage=usage,
        running=scrape.total(names.running) if names.running else None,
        waiting=scrape.total(names.waiting) if names.waiting else None,
        prompt_throughput=_rate(before, scrape, names.prompt_tokens)
        if rates and before is not None
        else None,
        generation_throughput=_rate(before, scrape, names.generation_tokens)
        if rates and before is not None
        else None,
        prefix_cache_hit_rate=hit_rate,
    )
