"""What a job runs: its models, its tasks, and every (model, task) pair of them.

A job is asked for in convsim's form (``pack`` or ``pack_files``, with ``model`` or
``endpoint``), in the developer guide's (``models=[{model_id, model_type, config}]``,
``tasks=[...]``) or in a mix of both (``models`` with ``pack``). It is stored as a list
of models and a list of tasks, and runs their pairs task by task, each model in turn, so
the models of a task finish close together and can be compared early. A job of one pair
is what a job always was: one results file, ``JOB_ID.jsonl``; a job of several writes
``JOB_ID.PAIR.jsonl`` for each pair.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ModelEntry",
    "PlannedModel",
    "PlannedTask",
    "Pair",
    "Plan",
    "plan_of",
    "model_secrets",
    "arg_text",
]


class ModelEntry(BaseModel):
    """One model of an evaluation, in the developer guide's form."""

    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(min_length=1, max_length=300)
    """The model: an operator's endpoint of this name when the server has one; else your
    own model, the name its API serves (``gpt-4o-mini``)."""
    model_type: str | None = Field(default=None, min_length=1, max_length=100)
    """The adapter type (``openai``, ``anthropic``, ``openai-compatible``, ``http``,
    ``scripted``, ...): needed for your own model; checked against an endpoint's type
    when given for one."""
    config: dict[str, str | int | float | bool] = Field(default_factory=dict, max_length=50)
    """The model's arguments, as ``model_args`` (``temperature``, ``base_url``,
    ``api_key``, ...): the same rules hold."""
    endpoint: str | None = Field(default=None, min_length=1, max_length=100)
    """An operator's endpoint by name, when ``model_id`` is not its name."""


def arg_text(value: str | int | float | bool) -> str:
    """A model argument as the adapters read it: JSON's spelling for numbers and
    booleans (``0.0``, ``true``), a string as it is."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class PlannedModel:
    """A model of a job as stored: what is shown, and the names of its sealed arguments."""

    model_id: str
    """How the job names the model (its results and comparisons say this)."""
    model: str
    """The spec, or ``endpoint:NAME`` for an operator's endpoint."""
    endpoint: str | None
    plain: dict[str, str] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)
    """The arguments as the tenant sees them: keys ``***``, URLs redacted."""


@dataclass(frozen=True)
class PlannedTask:
    """A task of a job: its name as asked, and what loads its pack (``pack``,
    ``pack_dir``, ``trials``, ``conversations``; see ``load_job_pack``)."""

    name: str
    source: dict[str, Any]

    @property
    def total(self) -> int | None:
        planned = self.source.get("conversations")
        return None if planned is None else len(planned)


@dataclass(frozen=True)
class Pair:
    """A model on a task: ``index`` in the job's pairs, ``model`` and ``task`` in its
    lists."""

    index: int
    model: int
    task: int


@dataclass(frozen=True)
class Plan:
    """A job's models and tasks; its pairs task by task, each model in turn."""

    models: tuple[PlannedModel, ...]
    tasks: tuple[PlannedTask, ...]
    several: bool = field(init=False)
    """More than one pair: each pair has a results file of its own."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "several", len(self.models) * len(self.tasks) > 1)

    @property
    def pairs(self) -> tuple[Pair, ...]:
        count = len(self.models)
        return tuple(
            Pair(t * count + m, m, t) for t in range(len(self.tasks)) for m in range(count)
        )

    def results_name(self, job_id: str, pair: int) -> str:
        """The file name of a pair's results."""
        return f"{job_id}.{pair}.jsonl" if self.several else f"{job_id}.jsonl"

    def label(self, pair: Pair) -> str:
        """``MODEL_ID on TASK``, as errors and logs name a pair."""
        return f"{self.models[pair.model].model_id} on {self.tasks[pair.task].name}"


def plan_of(request: dict[str, Any]) -> Plan:
    """The plan of a stored job (one stored before jobs had pairs: its one pair)."""
    trials = request.get("trials") or 1
    if "models" not in request:
        model = PlannedModel(
            model_id=request["model"],
            model=request["model"],
            endpoint=request.get("endpoint"),
            plain=dict(request.get("model_args") or {}),
            shown=dict(request.get("shown_args", request.get("model_args") or {})),
        )
        source = {
            "pack": request["pack"],
            "pack_dir": request.get("pack_dir"),
            "trials": trials,
            "conversations": request.get("conversations"),
        }
        return Plan((model,), (PlannedTask(request["pack"], source),))
    models = tuple(
        PlannedModel(
            model_id=m["model_id"],
            model=m["model"],
            endpoint=m.get("endpoint"),
            plain=dict(m.get("model_args") or {}),
            shown=dict(m.get("shown_args") or {}),
        )
        for m in request["models"]
    )
    tasks = tuple(
        PlannedTask(t["name"], {**{k: v for k, v in t.items() if k != "name"}, "trials": trials})
        for t in request["tasks"]
    )
    return Plan(models, tasks)


def model_secrets(request: dict[str, Any], unsealed: dict[str, Any]) -> list[dict[str, str]]:
    """Each model's sealed arguments, in the job's order, from its unsealed blob."""
    if "models" not in request:
        return [dict(unsealed)]
    count = len(request["models"])
    found = unsealed.get("models") or [{}] * count
    return [dict(s) for s in found]
