"""Mutated packs of both formats are accepted, or refused with exit 2 and a message
that names the file (and the line and field where there is one): never a traceback, a
hang or a blow-up; and what is accepted runs without failing because of the pack.
A longer run, with counts by outcome: tests/bench/bench_pack_fuzz.py."""

from __future__ import annotations

import pytest
from _pack_fuzz import Case, Outcome, RunOutcome, cases, run, validate
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.slow  # hundreds of packs written, validated and run

FUZZ = settings(
    deadline=None,
    derandomize=True,  # the same cases on every run: CI stays stable
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(FUZZ, max_examples=300)
@given(cases())
def test_a_mutated_pack_is_accepted_or_refused_with_its_place(case: Case) -> None:
    answer = validate(case)
    assert answer.outcome is not Outcome.OTHER, f"{case.change}\n{answer.output[-3000:]}"


@settings(FUZZ, max_examples=40)
@given(cases())
def test_a_mutated_pack_that_validates_also_runs(case: Case) -> None:
    if validate(case).outcome is Outcome.ACCEPTED:
        ran, output = run(case)
        assert ran is RunOutcome.RAN, f"{case.change}\n{output[-3000:]}"
