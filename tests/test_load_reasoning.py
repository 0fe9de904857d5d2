"""convsim load against a reasoning model: each request records its time to the first
output token apart from its first token, and its reasoning tokens; ``ttfot`` SLOs judge
the former."""

from __future__ import annotations

import pytest

from convsim import ConfigError
from convsim.load import RequestRecord
from convsim.load._slo import parse_slos


def _record(ttft_s: float, ttfot_s: float | None) -> RequestRecord:
    return RequestRecord(
        "a", 0, 1, None, 1.0, ttft_s, ttft_s, (), 2.0, 5, 9, ttfot_s=ttfot_s, reasoning_tokens=4
    )


def test_a_ttfot_slo_judges_the_first_answer_token_not_the_first_thought() -> None:
    (slo,) = parse_slos("ttfot_p99<=100ms").items
    assert slo.request_value_ms(_record(0.02, 0.5)) == pytest.approx(500.0)
    assert slo.request_value_ms(_record(0.02, None)) is None
    (first,) = parse_slos("ttft_p99<=100ms").items
    assert first.request_value_ms(_record(0.02, 0.5)) == pytest.approx(20.0)


def test_an_unknown_slo_metric_names_ttfot_among_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="ttfot"):
        parse_slos("ttfx_p99<=100ms")
