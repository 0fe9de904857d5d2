"""The developer guide's task API on convsim: ``AdvancedTask`` and ``register_task``.

A task class written the guide's way (``doc_to_text``, ``doc_to_target``,
``construct_requests``, ``process_results``, ``aggregation``, ``higher_is_better``,
``has_*_docs``, ``test_docs``) subclasses :class:`AdvancedTask` and runs

- under convsim: ``convsim.run_sync(task.to_pack(), "scripted")``. Each document is one
  single-turn conversation; the task's ``process_results`` scores the answer through the
  ``task:<key>`` metrics (one per numeric key), and ``task.aggregate(results)`` reduces
  them as the task's ``aggregation()`` says (``mean``, ``std``);
- under lm-eval: ``task.to_lm_eval_task()`` is an ``lm_eval.api.task.Task`` that
  ``lm_eval.simple_evaluate(tasks=[...])`` accepts as it is.

lm_eval is imported by ``to_lm_eval_task`` only, never by ``import convsim``.
"""

from __future__ import annotations

import inspect
import json
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._records import ConversationResult
from convsim._registry import Registry
from convsim.scenarios import LoadOptions, Pack, TurnSettings

from ._prompt_pack import PromptPackBuilder
from ._task_metric import TASK_METRIC_PREFIX, TaskDocument, numeric

__all__ = ["AdvancedTask", "TASKS", "register_task", "task_pack"]
AGGREGATIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": statistics.fmean,
    "std": lambda xs: statistics.pstdev(xs) if len(xs) > 1 else 0.0,
    "median": statistics.median,
    "min": min,
    "max": max,
}
"""The reductions ``aggregation()`` may name; ``std`` is the population standard deviation."""

TASKS: Registry[Any] = Registry("task", group="convsim.tasks")
"""Task name -> task class, filled by :func:`register_task` and by the entry-point group
``convsim.tasks`` (so ``convsim run task:NAME`` finds a package's task classes)."""

T = TypeVar("T", bound=type)


def _names_class(reference: str, cls: type) -> bool:
    """Whether a ``"module:attr"`` reference names ``cls`` without importing it: its
    module, or a package above it, and its name. A class registered by an entry point
    and decorated too is imported through that reference: importing it again to compare
    would go round in a circle."""
    module, _, attr = reference.partition(":")
    inside = cls.__module__ == module or cls.__module__.startswith(module + ".")
    return inside and attr == cls.__qualname__


def register_task(name: str, *, registry: Registry[Any] = TASKS) -> Callable[[T], T]:
    """Class decorator: ``@register_task("single_turn_scenarios_x")`` registers a task
    class in convsim's task registry (the same class defined again, e.g. a module
    reloaded, or the class an entry point of ``convsim.tasks`` names, replaces itself;
    another class under a taken name is refused)."""

    def decorate(cls: T) -> T:
        replace = False
        if name in registry:
            reference = registry.reference(name)
            if reference is not None:
                replace = _names_class(reference, cls)
            else:
                old = registry.get(name)
                replace = (
                    getattr(old, "__module__", None),
                    getattr(old, "__qualname__", None),
                ) == (cls.__module__, cls.__qualname__)
        registry.register(name, cls, replace=replace)
        if "TASK_NAME" not in cls.__dict__:
            cls.TASK_NAME = name  # type: ignore[attr-defined]
        return cls

    return decorate


# -- the base class -----------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the task's dataset {path}: {exc.strerror}") from None
    docs = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path.name}:{lineno}: invalid JSON: {exc.msg}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{path.name}:{lineno}: a document must be a JSON object")
        docs.append(doc)
    return docs


class AdvancedTask:
    """Base class of tasks written with the guide's API.

    ``__init__(config)`` reads ``self.dataset = {"test": [doc, ...]}`` from the JSONL file
    ``config["dataset_path"]``, else ``DATASET_PATH`` (absolute, or relative to the
    subclass's module file).
    """

    VERSION: float | int | str | None = 0
    DATASET_PATH: str | None = None
    DATASET_NAME: str | None = None
    TASK_NAME: str | None = None
    OUTPUT_TYPE = "generate_until"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config: dict[str, Any] = dict(config or {})
        self.dataset: dict[str, list[dict[str, Any]]] = {"test": self._load_docs()}

    # the dataset
    def dataset_file(self) -> Path:
        return self._task_file(self.config.get("dataset_path") or self.DATASET_PATH, "DATASET_PATH")

    def _task_file(self, raw: str | None, attribute: str) -> Path:
        """``raw`` as a path: absolute, or relative to the subclass's module file."""
        if raw is None:
            raise ConfigError(f"{type(self).__name__} sets no {attribute} (or {attribute.lower()})")
        path = Path(raw)
        if not path.is_absolute():
            path = Path(inspect.getfile(type(self))).resolve().parent / path
        return path

    def _load_docs(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.dataset_file())

    def has_training_docs(self) -> bool:
        return False

    def has_validation_docs(self) -> bool:
        return False

    def has_test_docs(self) -> bool:
        return True

    def training_docs(self) -> Iterable[Any]:
        return self.dataset.get("train", [])

    def validation_docs(self) -> Iterable[Any]:
        return self.dataset.get("validation", [])

    def test_docs(self) -> Iterable[Any]:
        return self.dataset["test"]

    def eval_docs(self) -> list[Any]:
        """The documents evaluated: test docs, else validation docs."""
        if self.has_test_docs():
            return list(self.test_docs())
        if self.has_validation_docs():
            return list(self.validation_docs())
        raise ConfigError(f"{self.name}: the task has neither test nor validation docs")

    @property
    def name(self) -> str:
        return self.TASK_NAME or self.DATASET_NAME or type(self).__name__

    # the task's hooks, to override
    def doc_to_text(self, doc: Any) -> str:
        raise NotImplementedError

    def doc_to_target(self, doc: Any) -> Any:
        raise NotImplementedError

    def construct_requests(self, doc: Any, ctx: str, **kwargs: Any) -> Any:
        """One generate_until request for ``ctx`` (override to set until, max_tokens,
        temperature, in the guide's shape)."""
        return [
            {
                "request_type": "generate_until",
                "arguments": {"prompt": ctx, "until": [], "max_tokens": None, "temperature": 0.0},
            }
        ]

    def process_results(self, doc: Any, results: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def aggregation(self) -> dict[str, Any]:
        return {}

    def higher_is_better(self) -> dict[str, bool]:
        return {}

    # running under convsim
    def request_arguments(self, doc: Any) -> dict[str, Any]:
        """The generate_until arguments of ``doc``'s request (prompt, until, max_tokens,
        temperature), from ``construct_requests``."""
        ctx = self.doc_to_text(doc)
        requests = self.construct_requests(doc, ctx)
        if isinstance(requests, (dict, tuple)) or not isinstance(requests, list):
            requests = [requests]
        if len(requests) != 1:
            raise ConfigError(f"{self.name}: convsim runs one request per document")
        request = requests[0]
        if isinstance(request, Mapping):
            kind = request.get("request_type", "generate_until")
            arguments = dict(request.get("arguments") or {})
        else:  # an lm-eval Instance
            kind = getattr(request, "request_type", None)
            context, gen_kwargs = request.arguments
            arguments = {
                "prompt": context,
                "until": gen_kwargs.get("until"),
                "max_tokens": gen_kwargs.get("max_gen_toks"),
                "temperature": gen_kwargs.get("temperature"),
            }
        if kind != "generate_until":
            raise ConfigError(f"{self.name}: convsim runs generate_until requests, not {kind}")
        arguments.setdefault("prompt", ctx)
        return arguments

    def metric_names(self) -> list[str]:
        """The metrics the task reports: aggregation() and higher_is_better() keys."""
        return list(dict.fromkeys([*self.aggregation(), *self.higher_is_better()]))

    def to_pack(self) -> Pack:
        """A single-turn pack: one conversation per document, scored by the task's own
        ``process_results`` through the ``task:<key>`` metrics."""
        builder = PromptPackBuilder("task", f"task\0{self.name}\0{self.VERSION}")
        for index, doc in enumerate(self.eval_docs()):
            arguments = self.request_arguments(doc)
            until = arguments.get("until")
            target = self.doc_to_target(doc)
            builder.add(
                doc_id=index,
                name=self.name,
                description=f"task {self.name}, document {index}",
                prompt=str(arguments["prompt"]),
                settings=TurnSettings(
                    temperature=arguments.get("temperature"),
                    max_tokens=arguments.get("max_tokens"),
                    stop=[until] if isinstance(until, str) else (list(until) if until else None),
                ),
                reference=str(target[0] if isinstance(target, list) and target else target),
                metadata={"task": self.name, "doc_id": index},
                origin=TaskDocument(self, doc),
                difficulty=doc.get("difficulty") if isinstance(doc, Mapping) else None,
            )
        return builder.pack(
            name=f"task:{self.name}",
            path=self.dataset_file().parent,
            metrics=tuple(TASK_METRIC_PREFIX + m for m in self.metric_names()),
        )

    def aggregate(
        self, results: Iterable[ConversationResult | Mapping[str, Any]]
    ) -> dict[str, dict[str, float]]:
        """``{metric: {"mean": ..., "std": ...}}`` as ``aggregation()`` asks, over convsim
        results (their ``task:<metric>`` scores) or over ``process_results`` dicts. A
        metric with no values is left out."""
        values: dict[str, list[float]] = {m: [] for m in self.aggregation()}
        for result in results:
            if isinstance(result, Mapping):
                found = {k: v for k, v in result.items() if numeric(v)}
            else:
                found = {
                    k[len(TASK_METRIC_PREFIX) :]: s.value
                    for k, s in result.scores.items()
                    if k.startswith(TASK_METRIC_PREFIX) and s.value is not None
                }
            for metric in values:
                if metric in found:
                    values[metric].append(float(found[metric]))
        out: dict[str, dict[str, float]] = {}
        for metric, how in self.aggregation().items():
            if not values[metric]:
                continue
            names = [how] if isinstance(how, str) else list(how)
            out[metric] = {}
            for agg in names:
                if agg not in AGGREGATIONS:
                    raise ConfigError(f"{self.name}: unknown aggregation {agg!r} for {metric}")
                out[metric][agg] = float(AGGREGATIONS[agg](values[metric]))
        return out

    # running under lm-eval
    def lm_eval_context(self, doc: Any) -> str:
        """What lm-eval's model is asked for ``doc``."""
        return self.doc_to_text(doc)

    def lm_eval_results(self, doc: Any, results: list[str]) -> dict[str, Any]:
        """``doc``'s results from lm-eval's model's answers."""
        return dict(self.process_results(doc, results))

    def to_lm_eval_task(self) -> Any:
        """This task as an ``lm_eval.api.task.Task`` for ``lm_eval.simple_evaluate``."""
        return _lm_eval_task_for(self)


def task_pack(spec: str, options: LoadOptions) -> Pack:
    """The pack source ``task:NAME`` (entry point ``convsim.pack_sources``): the pack of
    a task class registered with ``@register_task``."""
    name = spec.removeprefix(TASK_METRIC_PREFIX)
    if options.num_fewshot or options.context_mode is not None:
        raise ConfigError(
            "--num-fewshot and --context-mode do not apply to task:NAME packs: the task "
            "class builds its own prompts"
        )
    if options.include_path is not None:
        raise ConfigError("include_path applies to lm-eval:TASK packs only")
    if name not in TASKS:
        raise ConfigError(
            f"no task {name!r} is registered: import the module whose class has "
            f"@register_task({name!r}) first"
        )
    pack: Pack = TASKS.get(name)().to_pack()
    return pack


def _lm_eval_task_for(task: AdvancedTask) -> Any:
    """An ``lm_eval.api.task.Task`` delegating to ``task``: numeric process_results keys
    are its metrics; a key aggregated with ``std`` also reports ``<key>_std``."""
    with needs_extra("lm-eval", "AdvancedTask.to_lm_eval_task()"):
        from lm_eval.api.instance import Instance
        from lm_eval.api.metrics import mean
        from lm_eval.api.task import Task, TaskConfig

    def std(items: list[float]) -> float:
        return AGGREGATIONS["std"](items)

    def wants_std(how: Any) -> bool:
        return "std" in ([how] if isinstance(how, str) else list(how))

    class ConvsimTask(Task):
        VERSION = task.VERSION
        DATASET_PATH = str(task.dataset_file())
        DATASET_NAME = task.DATASET_NAME
        OUTPUT_TYPE = "generate_until"

        def download(self, *args: Any, **kwargs: Any) -> None:
            self.dataset = task.dataset

        def has_training_docs(self) -> bool:
            return task.has_training_docs()

        def has_validation_docs(self) -> bool:
            return task.has_validation_docs()

        def has_test_docs(self) -> bool:
            return task.has_test_docs()

        def training_docs(self) -> Any:
            return list(task.training_docs())

        def validation_docs(self) -> Any:
            return list(task.validation_docs())

        def test_docs(self) -> Any:
            return list(task.test_docs())

        def doc_to_text(self, doc: Any) -> str:
            return task.lm_eval_context(doc)

        def doc_to_target(self, doc: Any) -> Any:
            return task.doc_to_target(doc)

        def construct_requests(self, doc: Any, ctx: str, **kwargs: Any) -> Any:
            arguments = task.request_arguments(doc)
            gen_kwargs: dict[str, Any] = {"until": arguments.get("until") or []}
            if arguments.get("max_tokens") is not None:
                gen_kwargs["max_gen_toks"] = arguments["max_tokens"]
            if arguments.get("temperature") is not None:
                gen_kwargs["temperature"] = arguments["temperature"]
            return Instance(
                request_type="generate_until",
                doc=doc,
                arguments=(ctx, gen_kwargs),
                idx=0,
                metadata=kwargs.get("metadata", (task.name, None, 1)),
            )

        def process_results(self, doc: Any, results: list[str]) -> dict[str, float]:
            out = {k: float(v) for k, v in task.lm_eval_results(doc, results).items() if numeric(v)}
            for key, how in task.aggregation().items():
                if key in out and wants_std(how):
                    out[f"{key}_std"] = out[key]
            return out

        def aggregation(self) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, how in task.aggregation().items():
                out[key] = mean
                if wants_std(how):
                    out[f"{key}_std"] = std
            return out

        def higher_is_better(self) -> dict[str, bool]:
            out = dict(task.higher_is_better())
            for key, how in task.aggregation().items():
                if wants_std(how):
                    out[f"{key}_std"] = False
            return out

    lm_task = ConvsimTask()
    # Task(config=...) would put the whole mapping in TaskConfig's first field
    lm_task._config = TaskConfig(task=task.name, output_type="generate_until")
    return lm_task
