"""The mock server's ``GET /metrics``: what it served, in the Prometheus text format
under vLLM's metric names, so that ``convsim load --server-metrics`` is tested offline.

Gauges: requests running (being answered) and waiting (for a place under
``max_running``; always 0 without it), and a KV-cache usage figure: the tokens of the
requests being answered (prompt and answer) over ``kv_cache_tokens``. Counters: prompt
and generated tokens, the prefix cache's queried and hit tokens
(:mod:`._prefix_cache`), preemptions (always 0). A histogram of the time to first token
the mock took before each answer, its wait for a place included.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

__all__ = ["MockMetrics", "TTFT_BUCKETS_S", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format's media type."""

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
"""Upper bounds of the TTFT histogram's buckets (vLLM's, up to 10 s), in seconds."""


@dataclass
class MockMetrics:
    """Counts the mock server keeps for ``/metrics`` (one event loop: no locks)."""

    model: str
    kv_cache_tokens: int
    running: int = 0
    waiting: int = 0
    """Requests waiting for a place under ``max_running``."""
    kv_tokens: int = 0
    """Tokens held by the requests running."""
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))
    ttft_count: int = 0
    ttft_sum: float = 0.0

    def started(self, prompt_tokens: int, output_tokens: int, cached_tokens: int | None) -> None:
        """A request began to be answered."""
        self.running += 1
        self.kv_tokens += prompt_tokens + output_tokens
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += output_tokens
        if cached_tokens is not None:
            self.prefix_queries += prompt_tokens
            self.prefix_hits += cached_tokens

    def ended(self, prompt_tokens: int, output_tokens: int) -> None:
        """A request stopped being answered (finished, failed or cut off)."""
        self.running -= 1
        self.kv_tokens -= prompt_tokens + output_tokens

    def first_token(self, seconds: float) -> None:
        """A request waited ``seconds`` for its first token."""
        index = bisect.bisect_left(TTFT_BUCKETS_S, seconds)
        if index < len(self.ttft_buckets):
            self.ttft_buckets[index] += 1
        self.ttft_count += 1
        self.ttft_sum += seconds

    def exposition(self) -> str:
        """Everything, in the Prometheus text format (version 0.0.4)."""
        label = "model_name=" + json.dumps(self.model)
        usage = min(1.0, self.kv_tokens / self.kv_cache_tokens) if self.kv_cache_tokens else 0.0
        lines: list[str] = []

        def metric(name: str, kind: str, text: str, value: float) -> None:
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            lines.append(f"{name}{suffix}{{{label}}} {value!r}")

        metric("vllm:num_requests_running", "gauge", "Requests being answered.", self.running)
        metric(
            "vllm:num_requests_waiting", "gauge", "Requests waiting to be answered.", self.waiting
        )
        metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage (1 = full): the running requests' tokens over the cache's.",
            usage,
        )
        metric("vllm:num_preemptions", "counter", "Preemptions.", 0)
        metric("vllm:prompt_tokens", "counter", "Prompt tokens.", self.prompt_tokens)
        metric("vllm:generation_tokens", "counter", "Generated tokens.", self.generation_tokens)
        metric(
            "vllm:prefix_cache_queries",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            self.prefix_queries,
        )
        metric(
            "vllm:prefix_cache_hits",
            "counter",
            "Prompt tokens the prefix cache held.",
            self.prefix_hits,
        )
        name = "vllm:time_to_first_token_seconds"
        lines.append(f"# HELP {name} Time to the first token, in seconds.")
        lines.append(f"# TYPE {name} histogram")
        cumulative = 0
        for bound, count in zip(TTFT_BUCKETS_S, self.ttft_buckets, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{{label},le="{bound!r}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{label},le="+Inf"}} {self.ttft_count}')
        lines.append(f"{name}_count{{{label}}} {self.ttft_count}")
        lines.append(f"{name}_sum{{{label}}} {self.ttft_sum!r}")
        return "\n".join(lines) + "\n"
