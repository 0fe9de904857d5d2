"""Packs as lm-eval tasks: ``convsim lm-eval-tasks [PACK...] [--out DIR]``.

Each single-turn pack becomes a task ``single_turn_scenarios_<pack>`` in DIR: a JSONL of
the prompts exactly as convsim renders them (one line per problem), a task YAML that
loads it offline (``dataset_path: json`` with a local ``data_files``), and a small utils
module whose ``process_results`` scores each answer with convsim's own metric registry.

Each multi-turn pack becomes a task ``multi_turn_scenarios_<pack>``: one document per
conversation (``{"pack": ..., "conversation_id": ...}``) whose prompt is a marker
(:data:`CONVERSATION_MARKER` + JSON) that only the ``convsim`` lm-eval model understands:
it runs the whole conversation through convsim's runtime and answers with the JSON of its
scores, which ``process_results`` returns. Any other model fails with a clear error.

Nothing here imports lm_eval: the files are plain text, read by lm-eval later.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import yaml

from convsim._errors import ConfigError
from convsim.metrics import DEFAULT_METRICS, METRICS, score_transcript
from convsim.scenarios import SINGLE_TURN_ID, Pack, list_packs, load_pack

__all__ = [
    "CONVERSATION_MARKER",
    "ExportedTask",
    "MULTI_TURN_TASK_PREFIX",
    "TASK_PREFIX",
    "export_lm_eval_tasks",
]

TASK_PREFIX = "single_turn_scenarios_"
MULTI_TURN_TASK_PREFIX = "multi_turn_scenarios_"
CONVERSATION_MARKER = "convsim-conversation:"
"""Prompt prefix of a multi-turn task's documents; the JSON of {pack, conversation_id}
follows it. The ``convsim`` lm-eval model runs such a request as a whole conversation."""
_UNSCORED = frozenset({"latency"})
"""Wall-clock timings: not a score of the conversation, and never reproducible."""

_MULTI_TURN_UTILS = '''"""Written by `convsim lm-eval-tasks`: {task} runs convsim conversations."""

from __future__ import annotations

from typing import Any

from convsim.lm_eval.task_support import (
    conversation_request,
    conversation_scores,
    require_convsim_model,
    std,
    with_std,
)

TASK = {task!r}
METRICS = {metrics!r}


def doc_to_text(doc: dict[str, Any]) -> str:
    """A request only the convsim lm-eval model understands (checked before lm-eval
    generates anything)."""
    require_convsim_model(TASK)
    return conversation_request(doc["pack"], doc["conversation_id"])


def doc_to_target(doc: dict[str, Any]) -> str:
    return ""


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """The conversation's scores, as the convsim model returned them."""
    return with_std(conversation_scores(TASK, results[0] if results else "", METRICS))
'''

_UTILS = '''"""Written by `convsim lm-eval-tasks`: scores {task} with convsim's metric registry."""

from __future__ import annotations

from typing import Any

from convsim.metrics import score_transcript
from convsim.lm_eval.task_support import std, with_std

METRICS = {metrics!r}


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """One answer, scored as a one-turn convsim transcript; a score that does not apply
    to this answer is NaN (it shows in lm-eval's mean rather than being dropped)."""
    messages = []
    if doc.get("system"):
        messages.append({{"role": "system", "content": doc["system"]}})
    messages.append({{"role": "user", "content": doc["prompt"]}})
    messages.append({{"role": "assistant", "content": results[0]}})
    scores = score_transcript(
        messages,
        METRICS,
        reference_responses={{1: doc["target"]}},
        required_keywords=doc.get("required_keywords") or [],
        scenario_type="single_turn",
    )
    return with_std({{
        name: float("nan") if scores[name].value is None else float(scores[name].value)
        for name in METRICS
    }})
'''


STD_SUFFIX = "_std"
_STD_FUNCTION_TAG = "convsim-std-aggregation"  # replaced by a !function tag once dumped


def std(items: Sequence[float]) -> float:
    """The population standard deviation of a metric's values: the guide's ``std``
    aggregation, reported beside the mean as ``<metric>_std``."""
    values = [float(v) for v in items if not math.isnan(float(v))]
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def with_std(scores: dict[str, float]) -> dict[str, float]:
    """``scores`` with each value again under ``<metric>_std`` (aggregated by :func:`std`)."""
    return {**scores, **{name + STD_SUFFIX: value for name, value in scores.items()}}


def conversation_request(pack: str, conversation_id: str) -> str:
    """The request text of a conversation document: the marker and its reference."""
    ref = {"pack": pack, "conversation_id": conversation_id}
    return CONVERSATION_MARKER + json.dumps(ref, sort_keys=True, ensure_ascii=False)


class NeedsConvsimModel(ConfigError, ValueError):
    """A conversation task evaluated by another lm-eval model than ``convsim``."""


def _needs_convsim(task: str) -> str:
    return (
        f"{task}: the task needs `--model convsim` (e.g. `convsim lm-eval --model convsim "
        "--model_args model=SPEC ...`): each document is a whole multi-turn conversation "
        "that only convsim's runtime can run"
    )


def require_convsim_model(task: str) -> None:
    """Fail before any generation when lm-eval evaluates this task with another model.

    lm-eval hands a task no handle on the model, so this looks for the ``lm`` of the
    ``lm_eval.evaluator.evaluate`` call that is building the requests; when there is none
    (the task used some other way) the check is left to :func:`conversation_scores`.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if (
            frame.f_code.co_name == "evaluate"
            and frame.f_globals.get("__name__") == "lm_eval.evaluator"
        ):
            lm = frame.f_locals.get("lm")
            lm = getattr(lm, "lm", lm)  # lm-eval's CachingLM wraps the model
            if lm is not None and not getattr(lm, "runs_convsim_conversations", False):
                raise NeedsConvsimModel(f"{_needs_convsim(task)}; got {type(lm).__name__}")
            return
        frame = frame.f_back


def conversation_scores(task: str, text: str, metrics: Sequence[str]) -> dict[str, float]:
    """``metrics`` from the convsim model's answer to a conversation request (the JSON
    of the conversation's scores); a metric that did not apply is left out."""
    try:
        scores = json.loads(text)
    except (TypeError, ValueError):
        scores = None
    if not isinstance(scores, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in scores.values()
    ):
        raise NeedsConvsimModel(
            f"{_needs_convsim(task)}; the model answered {str(text)[:80]!r} instead of the "
            "conversation's scores"
        )
    return {
        name: float(scores[name])
        for name in metrics
        if name in scores and not math.isnan(float(scores[name]))
    }


@dataclass(frozen=True)
class ExportedTask:
    """One written task: its name, YAML, the metrics kept and those left out (and why)."""

    task: str
    yaml_path: Path
    data_path: Path
    metrics: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]


def _task_name(pack: Pack) -> str:
    prefix = TASK_PREFIX if pack.kind == "single_turn" else MULTI_TURN_TASK_PREFIX
    return prefix + re.sub(r"[^0-9A-Za-z_]+", "_", pack.name)


def _docs(pack: Pack) -> list[dict[str, Any]]:
    docs = []
    for conv in pack.conversations:
        turn = conv.flow.turns[0]
        scenario = conv.scenario
        docs.append(
            {
                "prompt": conv.render(turn, []),
                "target": (scenario.reference_responses or {}).get(SINGLE_TURN_ID, ""),
                "conversation_id": conv.conversation_id,
                "system": scenario.system_prompt or "",
                "required_keywords": list(scenario.required_keywords or []),
            }
        )
    return docs


class MetricChoice(NamedTuple):
    """The metrics a task reports, and those left out with the reason."""

    kept: list[str]
    skipped: list[tuple[str, str]]


def _applicable(pack: Pack, docs: list[dict[str, Any]]) -> MetricChoice:
    """The pack's metrics that give a value for every problem when it is answered with
    its own expected answer; the others are left out (lm-eval's mean cannot skip None)."""
    kept: list[str] = []
    skipped: list[tuple[str, str]] = []
    for name in dict.fromkeys(pack.metrics):
        reason = None
        for doc in docs:
            try:
                score = score_transcript(
                    [
                        {"role": "user", "content": doc["prompt"]},
                        {"role": "assistant", "content": doc["target"]},
                    ],
                    [name],
                    reference_responses={1: doc["target"]},
                    required_keywords=doc["required_keywords"],
                    scenario_type="single_turn",
                )[name]
            except Exception as exc:  # e.g. a judge metric with no judge model
                reason = f"cannot be scored offline: {exc}"
                break
            if score.value is None:
                reason = f"does not apply to {doc['conversation_id']}: {score.reason or 'n/a'}"
                break
        if reason is None and name in METRICS:
            kept.append(name)
        else:
            skipped.append((name, reason or "not in the metric registry"))
    return MetricChoice(kept, skipped)


def _higher_is_better(name: str) -> bool | None:
    return METRICS.get(name)().higher_is_better


def _pack_ref(pack: Pack) -> str:
    """How the convsim model finds the pack again: a bundled name, else its folder."""
    folder = pack.path.resolve()
    bundled = {info.path.resolve() for info in list_packs()}
    return pack.name if folder in bundled else str(folder)


def _conversation_metrics(pack: Pack) -> MetricChoice:
    """What ``convsim run`` scores on this pack (the default metrics, the pack's and
    its flows'), less timings and metrics that need a judge model."""
    names = [*DEFAULT_METRICS, *pack.metrics]
    for conv in pack.conversations:
        names.extend(conv.flow.flow.metrics)
    kept: list[str] = []
    skipped: list[tuple[str, str]] = []
    for name in dict.fromkeys(names):
        if name in _UNSCORED:
            skipped.append((name, "a wall-clock timing, not a score of the conversation"))
        elif name.startswith("judge"):
            skipped.append((name, "needs a judge model"))
        elif name not in METRICS:
            skipped.append((name, "not in the metric registry"))
        else:
            kept.append(name)
    return MetricChoice(kept, skipped)


def _write_task(
    pack: Pack,
    out: Path,
    docs: list[dict[str, Any]],
    metrics: list[str],
    skipped: list[tuple[str, str]],
    utils_source: str,
    fields: dict[str, Any],
    functions: Sequence[str],
) -> ExportedTask:
    """Write a task's documents, its utils module and its YAML into ``out``: the YAML
    holds ``fields`` beside what every exported task has, and ``functions`` refer to
    the utils module."""
    task = _task_name(pack)
    data = out / f"{task}.jsonl"
    data.write_text(
        "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
    )
    utils = f"{task}_utils"
    (out / f"{utils}.py").write_text(utils_source, encoding="utf-8")
    config = {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        **fields,
        "metric_list": [
            entry
            for m in metrics
            for entry in (
                {"metric": m, "aggregation": "mean", "higher_is_better": _higher_is_better(m)},
                # a spread has no better direction; saying so keeps lm-eval from warning
                {
                    "metric": m + STD_SUFFIX,
                    "aggregation": _STD_FUNCTION_TAG,
                    "higher_is_better": None,
                },
            )
        ],
        "metadata": {"version": 1.0, "convsim_pack": str(pack.path)},
    }
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    text = text.replace(_STD_FUNCTION_TAG, f"!function {utils}.std")
    # lm-eval resolves `!function module.name` next to the YAML; safe_dump cannot tag it.
    for key in functions:
        text += f"{key}: !function {utils}.{key}\n"
    path = out / f"{task}.yaml"
    path.write_text(text, encoding="utf-8")
    return ExportedTask(task, path, data, tuple(metrics), tuple(skipped))


def export_multi_turn_pack(pack: Pack, out: Path) -> ExportedTask:
    """Write one multi-turn pack as an lm-eval task into ``out`` (``--model convsim``)."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    task = _task_name(pack)
    ref = _pack_ref(pack)
    docs = [{"pack": ref, "conversation_id": c.conversation_id} for c in pack.conversations]
    metrics, skipped = _conversation_metrics(pack)
    if not metrics:
        raise ConfigError(f"{pack.name}: none of the pack's metrics can be scored")
    return _write_task(
        pack,
        out,
        docs,
        metrics,
        skipped,
        _MULTI_TURN_UTILS.format(task=task, metrics=metrics),
        {"generation_kwargs": {"until": []}},
        ("doc_to_text", "doc_to_target", "process_results"),
    )


def export_pack(pack: Pack, out: Path) -> ExportedTask:
    """Write one pack as an lm-eval task into ``out``."""
    if pack.kind != "single_turn":
        return export_multi_turn_pack(pack, out)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    task = _task_name(pack)
    docs = _docs(pack)
    metrics, skipped = _applicable(pack, docs)
    if not metrics:
        raise ConfigError(f"{pack.name}: none of the pack's metrics applies to every problem")
    settings = pack.conversations[0].flow.turns[0].config.config
    generation: dict[str, Any] = {"until": []}
    if settings.max_tokens is not None:
        generation["max_gen_toks"] = settings.max_tokens
    if settings.temperature is not None:
        generation["temperature"] = settings.temperature
        generation["do_sample"] = settings.temperature > 0
    return _write_task(
        pack,
        out,
        docs,
        metrics,
        skipped,
        _UTILS.format(task=task, metrics=metrics),
        {
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{target}}",
            "generation_kwargs": generation,
        },
        ("process_results",),
    )


def export_lm_eval_tasks(
    packs: Sequence[str | Path] = (),
    out: str | Path = "lm_eval_tasks",
    *,
    allow_code: bool = False,
) -> list[ExportedTask]:
    """Every bundled pack (single- and multi-turn) plus each pack named in ``packs``,
    written into ``out``; pass ``out`` as lm-eval's ``--include_path``. A pack that
    names code is exported only with ``allow_code`` (and its conversations run only
    with the convsim model's ``allow_code=true``)."""
    loaded: dict[Path, Pack] = {}
    for info in list_packs():
        pack = load_pack(info.path, metric_names=METRICS)
        loaded[pack.path.resolve()] = pack
    for name in packs:
        pack = load_pack(name, metric_names=METRICS, allow_code=allow_code)
        loaded[pack.path.resolve()] = pack
    return [export_pack(pack, Path(out)) for pack in loaded.values()]
