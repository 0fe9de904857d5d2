"""Token-count and think-time distributions, the --synthetic workload, raw-sample stats."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from convsim import ConfigError
from convsim.load import (
    Distribution,
    Exponential,
    Fixed,
    LogNormal,
    Normal,
    Samples,
    SyntheticWorkload,
    Uniform,
    parse_distribution,
    parse_synthetic,
    summarize,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64", Fixed(64.0)),
        ("uniform:1,3", Uniform(1.0, 3.0)),
        ("normal:100,20", Normal(100.0, 20.0)),
        ("normal:100,20,50,150", Normal(100.0, 20.0, 50.0, 150.0)),
        ("lognormal:200,50,10,400", LogNormal(200.0, 50.0, 10.0, 400.0)),
        ("exp:2", Exponential(2.0)),
    ],
)
def test_parse_round_trips(text: str, expected: object) -> None:
    parsed = parse_distribution(text)
    assert parsed == expected and str(parsed) == text
    assert isinstance(parsed, Distribution)


def test_samples_respect_bounds_and_integers() -> None:
    rng = np.random.default_rng(0)
    normal = parse_distribution("normal:100,50,80,120", integer=True).sample(rng, 5000)
    assert normal.dtype == np.int64 and normal.min() == 80 and normal.max() == 120
    uniform = parse_distribution("uniform:1,3", integer=True).sample(rng, 3000)
    assert set(uniform.tolist()) == {1, 2, 3}
    assert parse_distribution("64", integer=True).sample(rng, 3).tolist() == [64, 64, 64]
    think = parse_distribution("normal:0.5,2").sample(rng, 1000)
    assert think.min() == 0.0  # durations are never negative


def test_lognormal_and_exp_have_the_means_asked_for() -> None:
    rng = np.random.default_rng(1)
    lognormal = parse_distribution("lognormal:200,50").sample(rng, 50000)
    assert abs(lognormal.mean() - 200) < 2 and abs(lognormal.std() - 50) < 2
    assert abs(parse_distribution("exp:2").sample(rng, 50000).mean() - 2) < 0.05


@pytest.mark.parametrize(
    ("text", "integer", "reason"),
    [
        ("fast", False, "not a number"),
        ("gauss:1,2", False, "unknown distribution 'gauss'"),
        ("uniform:3,1", False, "MIN <= MAX"),
        ("uniform:1", False, "MIN <= MAX"),
        ("normal:1,2,3", False, "MEAN,STD or MEAN,STD,MIN,MAX"),
        ("normal:10,2,30,20", False, "MIN is above MAX"),
        ("lognormal:0,1", False, "MEAN above 0"),
        ("exp:0", False, "one MEAN above 0"),
        ("-3", False, "0 or more"),
        ("inf", False, "finite"),
        ("64.5", True, "whole numbers"),
    ],
)
def test_parse_errors_name_the_text_and_the_forms(text: str, integer: bool, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_distribution(text, integer=integer, what="--think-time")
    message = str(info.value)
    assert f"invalid --think-time {text!r}" in message and reason in message
    assert "uniform:MIN,MAX" in message and "exp:MEAN" in message


def test_synthetic_workload_reads_distributions_with_commas() -> None:
    workload = parse_synthetic("turns=3,input_tokens=uniform:100,200,output_tokens=64")
    assert workload == SyntheticWorkload(
        turns=Fixed(3, integer=True),
        input_tokens=Uniform(100, 200, integer=True),
        output_tokens=Fixed(64, integer=True),
    )
    assert workload.prefix_tokens == Fixed(0, integer=True)
    full = parse_synthetic("input_tokens=256,output_tokens=normal:64,8,1,128,prefix_tokens=1000")
    assert full.turns == Fixed(1, integer=True) and full.output_tokens.integer
    assert SyntheticWorkload.model_validate(full.model_dump()) == full
    with pytest.raises(Exception, match="frozen"):
        full.turns = Fixed(2)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("turns=3,input=256,output_tokens=64", "unknown key 'input'"),
        ("turns=3,output_tokens=64", "missing input_tokens"),
        ("turns=3,turns=4,input_tokens=1,output_tokens=1", "turns given twice"),
        ("3,input_tokens=1,output_tokens=1", "expected KEY=VALUE"),
        ("turns=0,input_tokens=1,output_tokens=1", "at least 1"),
        ("turns=normal:3,1,input_tokens=1,output_tokens=1", "at least 1"),
        ("input_tokens=2.5,output_tokens=1", "--synthetic input_tokens"),
    ],
)
def test_synthetic_errors(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_synthetic(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "prompt_tokens=256,output_tokens=64",
            {"input_tokens": Fixed(256, integer=True), "output_tokens": Fixed(64, integer=True)},
        ),
        (
            # a deviation: normal, 5 deviations either side (at least 1) unless bounded
            "prompt_tokens=256,prompt_tokens_stdev=64,output_tokens=64,output_tokens_stdev=8,"
            "output_tokens_max=80",
            {
                "input_tokens": Normal(256, 64, 1, 576, integer=True),
                "output_tokens": Normal(64, 8, 24, 80, integer=True),
            },
        ),
        (
            # bounds alone: uniform over them, each by default the count itself
            "prompt_tokens=100,prompt_tokens_min=50,output_tokens=10,output_tokens_max=20",
            {
                "input_tokens": Uniform(50, 100, integer=True),
                "output_tokens": Uniform(10, 20, integer=True),
            },
        ),
        (
            '{"prompt_tokens": 128, "output_tokens": 16, "turns": 2}',
            {
                "input_tokens": Fixed(128, integer=True),
                "output_tokens": Fixed(16, integer=True),
                "turns": Fixed(2, integer=True),
            },
        ),
        (
            # guidellm's spread on convsim's own input_tokens is read too
            "input_tokens=32,prompt_tokens_min=32,prompt_tokens_max=32,output_tokens=4",
            {"input_tokens": Fixed(32, integer=True), "output_tokens": Fixed(4, integer=True)},
        ),
    ],
)
def test_synthetic_reads_guidellms_spelling(text: str, expected: dict[str, object]) -> None:
    workload = parse_synthetic(text)
    for key, value in expected.items():
        assert getattr(workload, key) == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("input_tokens=1,prompt_tokens=1,output_tokens=1", "input_tokens and prompt_tokens"),
        ("prompt_tokens_stdev=4,output_tokens=1", "prompt_tokens_stdev without prompt_tokens=N"),
        (
            "prompt_tokens=uniform:1,9,prompt_tokens_max=9,output_tokens=1",
            "is the distribution 'uniform:1,9'",
        ),
        ("prompt_tokens=10,prompt_tokens_min=20,output_tokens=1", "prompt_tokens_min 20 is above"),
        ("prompt_tokens=10,output_tokens=5,output_tokens_stdev=1.5", "whole number"),
        ("prompt_tokens=10,output_tokens=5,output_tokens_stdev=-1", "whole number"),
        ('{"prompt_tokens": 10, "output_tokens": 5, "samples": 9}', "unknown key 'samples'"),
        ('{"prompt_tokens": 10, "output_tokens": [5]}', "output_tokens: expected a number"),
        ('{"prompt_tokens": 10', "not a JSON object"),
        ("[1, 2]", "expected KEY=VALUE"),
    ],
)
def test_guidellm_spelling_errors(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(reason)):
        parse_synthetic(text)


def test_summary_figures() -> None:
    summary = summarize([0.004, 0.001, 0.003, 0.002], scale=1000.0)
    assert summary.count == 4
    assert summary.mean == pytest.approx(2.5) and summary.std == pytest.approx(math.sqrt(1.25))
    assert summary.p50 == pytest.approx(2.5) and summary.p90 == pytest.approx(3.7)
    assert summary.p999 == pytest.approx(3.997)
    empty = summarize([])
    assert empty.count == 0 and empty.mean is None and empty.p99 is None


def test_merged_worker_samples_summarise_exactly_as_the_pooled_samples() -> None:
    rng = np.random.default_rng(5)
    parts = [Samples(rng.lognormal(0, 1, size)) for size in (1000, 1, 2500, 0)]
    pooled = np.concatenate([p.values for p in parts])
    rng.shuffle(pooled)
    merged = Samples.merge(parts)
    assert len(merged) == 3501
    assert merged.summary(1000.0) == summarize(pooled, 1000.0)  # exact, not approximate
    assert Samples.merge([]).summary().count == 0
    assert Samples.of(iter([1.0, 2.0])).summary().mean == 1.5
