"""What an evaluation of several (model, task) pairs reports: a summary per pair, and
its models compared task by task.

Each model after the first is compared with the first (the base) on every task, paired
by conversation (:func:`convsim.results.compare`): the same task gives the same
conversations to every model. A pair with no results yet has no summary, and a
comparison that lacks one side says so; neither is shown as a figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from convsim._errors import ResultsError
from convsim.results._compare import compare
from convsim.results._report import summarize_file
from convsim.results._sinks import read_results

from ._plan import Plan

__all__ = [
    "PairSummary",
    "ModelComparison",
    "EvaluationSummary",
    "summarize_pairs",
    "compare_models",
]


class PairSummary(BaseModel):
    """One model on one task."""

    pair: int
    model_id: str
    task: str
    summary: dict[str, Any] | None
    """The pair's summary, as ``GET /v1/evaluations/{id}/summary`` gives for a job of one
    pair; null before its first result."""
    note: str | None = None
    """Why there is no summary."""


class ModelComparison(BaseModel):
    """A model against the job's first model, on one task, paired by conversation."""

    task: str
    base: str
    """The base's model_id (the job's first model)."""
    candidate: str
    comparison: dict[str, Any] | None
    """As ``convsim compare --json`` gives it (per metric: both means, the mean
    difference with its paired bootstrap interval, Wilcoxon p, wins, ties, losses); null
    while a side has no results."""
    note: str | None = None


class EvaluationSummary(BaseModel):
    """The summary of a job of several pairs."""

    pairs: list[PairSummary]
    comparisons: list[ModelComparison]


def _results(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def summarize_pairs(results_dir: Path, job_id: str, plan: Plan) -> list[PairSummary]:
    """Each pair's summary of the results it has (blocking: reads the files)."""
    found = []
    for pair in plan.pairs:
        path = results_dir / plan.results_name(job_id, pair.index)
        summary: dict[str, Any] | None = None
        note: str | None = "no results yet"
        if _results(path):
            try:
                summary = json.loads(summarize_file(path).model_dump_json())
                note = None
            except ResultsError:
                note = "its results could not be read"
        found.append(
            PairSummary(
                pair=pair.index,
                model_id=plan.models[pair.model].model_id,
                task=plan.tasks[pair.task].name,
                summary=summary,
                note=note,
            )
        )
    return found


def compare_models(results_dir: Path, job_id: str, plan: Plan) -> list[ModelComparison]:
    """Every model after the first against the first, task by task (blocking)."""
    found = []
    count = len(plan.models)
    for t, task in enumerate(plan.tasks):
        base = plan.models[0].model_id
        base_path = results_dir / plan.results_name(job_id, t * count)
        for m in range(1, count):
            candidate = plan.models[m].model_id
            path = results_dir / plan.results_name(job_id, t * count + m)
            comparison: dict[str, Any] | None = None
            note: str | None = None
            missing = [
                name for name, p in ((base, base_path), (candidate, path)) if not _results(p)
            ]
            if missing:
                note = f"no results yet for {' and '.join(missing)}"
            else:
                try:
                    compared = compare(
                        read_results(base_path),
                        read_results(path),
                        base_name=base,
                        candidate_name=candidate,
                    )
                    comparison = compared.model_dump(mode="json")
                except ResultsError:
                    note = "the results could not be read"
            found.append(
                ModelComparison(
                    task=task.name,
                    base=base,
                    candidate=candidate,
                    comparison=comparison,
                    note=note,
                )
            )
    return found
