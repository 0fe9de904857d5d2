"""An lm-eval generate_until task as a single-turn pack: ``lm-eval:TASK``.

Each of the task's documents becomes one conversation whose single turn sends exactly
the context lm-eval builds for it (few-shot examples and all) with the task's
generation settings (``until`` as stop sequences, ``max_gen_toks``, ``temperature``).
The task's own filters and ``process_results`` score each answer through the
``lm_eval_task:<metric>`` metrics, so the per-document scores are lm-eval's.

A metric aggregated by mean gives each document its own score, and the report's mean
is lm-eval's aggregate. A corpus-level one (``bleu``, ``chrf``, ``ter``: lm-eval's
registered aggregations) gives each document the aggregation of that document alone and
keeps lm-eval's item; the report's ``corpus`` value reduces all items as lm-eval does. A
metric aggregated by a function of the task's own is left out (with a note).

Tasks load offline (the Hugging Face offline flags are set); a task that needs a hub
dataset fails with a clear error. lm_eval is imported here only, on demand.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import sys
import warnings
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any

from convsim._errors import ConfigError, PackError, PackProblem
from convsim._extras import needs_extra
from convsim.scenarios import LoadOptions, Pack, TurnSettings
from convsim.scenarios._criteria import CODE_REFUSED

from ._prompt_pack import PromptPackBuilder

__all__ = ["LM_EVAL_PREFIX", "lm_eval_pack", "load_lm_eval_task", "lm_eval_task"]

LM_EVAL_PREFIX = "lm-eval:"


def _offline() -> None:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextlib.contextmanager
def _global_random_state_kept() -> Iterator[None]:
    """lm-eval seeds the global generators while it loads a task; the caller's own
    random sequences must not change because a task was loaded."""
    state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(state)
        if numpy_state is not None:
            sys.modules["numpy"].random.set_state(numpy_state)


@contextlib.contextmanager
def _templates_compiled_once() -> Iterator[None]:
    """lm-eval compiles a task's Jinja templates again for every document (most of a
    task's load time); while convsim loads a task, each template compiles once. The
    rendering is lm-eval's own: same environment, same filters."""
    from lm_eval import utils

    original = utils.apply_template
    compiled: dict[str, Any] = {}

    def apply_template(template: str, doc: dict[str, Any]) -> str:
        if template not in compiled:
            compiled[template] = utils.env.from_string(template)
        return str(compiled[template].render(**doc))

    utils.apply_template = apply_template
    try:
        yield
    finally:
        utils.apply_template = original


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """lm-eval draws a progress bar on stderr while it builds a task's requests; convsim
    loading a task prints nothing (the command line shows its own progress)."""
    from lm_eval.api import task as task_module

    original = task_module.tqdm

    def quiet(iterable: Any, *args: Any, **kwargs: Any) -> Any:
        return iterable

    task_module.tqdm = quiet
    try:
        yield
    finally:
        task_module.tqdm = original


def lm_eval_task(name: str, include_path: str | Path | None = None) -> Any:
    """lm-eval's task object for ``name``, its requests built (rank 0 of 1).

    Raises:
        MissingExtra: lm-eval is not installed (the ``lm-eval`` extra).
    """
    _offline()
    with needs_extra("lm-eval", f"lm-eval:{name}"):
        import lm_eval.tasks  # noqa: F401
    with _global_random_state_kept(), _templates_compiled_once(), _no_progress_bar():
        return _load_task(name, include_path)


def _load_task(name: str, include_path: str | Path | None) -> Any:
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(
        include_path=str(include_path) if include_path is not None else None,
        include_defaults=include_path is None,
    )
    if name not in manager.all_tasks:
        where = f"in {include_path}" if include_path is not None else "among lm-eval's tasks"
        raise ConfigError(f"lm-eval task {name!r} not found {where}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            tasks = get_task_dict([name], manager)
    except Exception as exc:  # lm-eval raises whatever its dataset loading raised
        raise ConfigError(
            f"lm-eval task {name!r} could not be loaded offline ({type(exc).__name__}: "
            f"{exc}); convsim runs tasks whose data are local files (dataset_path: json)"
        ) from exc
    if len(tasks) != 1 or not hasattr(next(iter(tasks.values())), "build_all_requests"):
        raise ConfigError(f"lm-eval:{name} is a group; name one task")
    task = next(iter(tasks.values()))
    if task.OUTPUT_TYPE != "generate_until":
        raise ConfigError(
            f"lm-eval task {name!r} is {task.OUTPUT_TYPE}: convsim runs generate_until tasks "
            "(answers a model writes), not loglikelihood ones"
        )
    if not runnable_metrics(task):
        raise ConfigError(
            f"lm-eval task {name!r} aggregates every metric with a function of its own; "
            "convsim reduces a run with lm-eval's registered aggregations only (mean, bleu, "
            "chrf, ter, ...)"
        )
    task.build_all_requests(limit=None, rank=0, world_size=1)
    return task


def lm_eval_pack(spec: str, options: LoadOptions) -> Pack:
    """The pack source ``lm-eval:TASK`` (entry point ``convsim.pack_sources``)."""
    if options.num_fewshot or options.context_mode is not None:
        raise ConfigError(
            "--num-fewshot and --context-mode do not apply to lm-eval:TASK: the task's "
            "own configuration sets them"
        )
    if options.include_path is not None and not options.allow_code:
        # lm-eval task files are code: `!function` imports Python, `class:` names a task
        # class, and their Jinja templates are not sandboxed
        raise PackError(
            [
                PackProblem(
                    str(options.include_path),
                    None,
                    "include_path",
                    "lm-eval task files can run Python code (!function tags, class:, "
                    f"Jinja templates): {CODE_REFUSED}",
                )
            ]
        )
    return load_lm_eval_task(
        spec, include_path=options.include_path, metric_names=options.metric_names
    )


def load_lm_eval_task(
    spec: str,
    *,
    include_path: str | Path | None = None,
    metric_names: Container[str] | None = None,
) -> Pack:
    """The pack for ``lm-eval:TASK``: one single-turn conversation per document."""
    name = spec[len(LM_EVAL_PREFIX) :]
    task = lm_eval_task(name, include_path)
    targets = _remember_targets(task)
    runnable = runnable_metrics(task)
    metrics = tuple(f"lm_eval_task:{m}" for m in runnable)
    notes = tuple(
        f"lm_eval_task:{m} is left out: the task aggregates it with a function of its own"
        for m in task.aggregation()
        if m not in runnable
    )
    missing = [m for m in metrics if metric_names is not None and m not in metric_names]
    if missing:
        raise ConfigError(f"unknown metrics {', '.join(missing)}")
    builder = PromptPackBuilder("lm_eval", f"lm-eval\0{name}")
    for instance in sorted(task.instances, key=lambda i: i.doc_id):
        context, gen_kwargs = instance.arguments
        builder.add(
            doc_id=instance.doc_id,
            name=name,
            description=f"lm-eval task {name}, document {instance.doc_id}",
            prompt=context,
            settings=_settings(gen_kwargs),
            reference=_target_text(targets[instance.doc_id]),
            metadata={
                "lm_eval_task": name,
                "lm_eval_include_path": str(include_path) if include_path is not None else None,
                "doc_id": instance.doc_id,
            },
            origin=task,
        )
    return builder.pack(
        name=f"lm-eval:{name}", path=Path(str(include_path or ".")), metrics=metrics, notes=notes
    )


def _remember_targets(task: Any) -> dict[int, Any]:
    """Each document's target, worked out once; ``process_results`` asks for it again
    while scoring and lm-eval would compile the task's template anew every time."""
    with _templates_compiled_once():
        by_doc = {id(i.doc): (i.doc_id, task.doc_to_target(i.doc)) for i in task.instances}
    worked_out = task.doc_to_target

    def doc_to_target(doc: Any) -> Any:
        known = by_doc.get(id(doc))
        return known[1] if known is not None else worked_out(doc)

    task.doc_to_target = doc_to_target
    return {doc_id: target for doc_id, target in by_doc.values()}


def _settings(gen_kwargs: dict[str, Any]) -> TurnSettings:
    until = gen_kwargs.get("until")
    if isinstance(until, str):
        until = [until]
    temperature = gen_kwargs.get("temperature")
    if gen_kwargs.get("do_sample") is False:
        temperature = 0.0
    return TurnSettings(
        temperature=float(temperature) if temperature is not None else 0.0,
        max_tokens=gen_kwargs.get("max_gen_toks"),
        stop=list(until) if until else None,
    )


def _target_text(target: Any) -> str:
    """The reference text for convsim's own metrics (lm-eval scores with the doc)."""
    if isinstance(target, list):
        return str(target[0]) if target else ""
    return str(target)


def runnable_metrics(task: Any) -> list[str]:
    """The task's metrics whose aggregation lm-eval registers (``mean``, ``bleu``, ...);
    one aggregated by a function of the task's own cannot be reduced from results."""
    return [m for m, agg in task.aggregation().items() if aggregation_name(agg) is not None]


def aggregation_name(aggregation: Any) -> str | None:
    """The name lm-eval registers ``aggregation`` under (``mean``, ``bleu``, ...)."""
    from lm_eval.api.registry import AGGREGATION_REGISTRY

    for name, function in AGGREGATION_REGISTRY.items():
        if function is aggregation:
            return str(name)
    return None


def score_document(task: Any, doc_id: int, response: str) -> dict[str, Any]:
    """lm-eval's results for one document's answer: every filter, then process_results.
    Keys are ``metric,filter`` as in lm-eval's results."""
    by_doc = getattr(task, "_convsim_instances", None)
    if by_doc is None:  # built once per task: a run scores every document
        by_doc = task._convsim_instances = {i.doc_id: i for i in task.instances}
    instance = by_doc[doc_id]
    results: dict[str, Any] = {}
    for ensemble in task._filters:
        answered = copy.copy(instance)
        answered.resps = [response]
        answered.filtered_resps = {}
        ensemble.apply([answered])
        filtered = answered.filtered_resps[ensemble.name]
        for metric, value in task.process_results(instance.doc, [filtered]).items():
            results[f"{metric},{ensemble.name}"] = value
    return results
