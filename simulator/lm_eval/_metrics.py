"""lm-eval's offline metrics as convsim metrics: ``lm_eval:<name>``.

Each turn with a reference response is one lm-eval item: the metric function is called
the way lm-eval's generate_until tasks call it (``references=[gold], predictions=[result]``,
or the passthrough ``[gold, result]`` of corpus metrics), and lm-eval's aggregation for
the metric reduces the conversation's items. So ``lm_eval:bleu`` on a conversation is
lm-eval's corpus BLEU over its turns; on a single-turn pack it is per-problem BLEU, and
the run's mean is a mean of those, not one corpus BLEU.

``rouge1``, ``rouge2``, ``rougeL`` and ``rougeLsum`` (F-measure) come from rouge_score
directly: lm-eval's registry would fetch ROUGE from the Hugging Face hub. Any other name
lm-eval cannot compute offline from generated text is refused when the metric is built,
with the list of those it can; the registry never reaches the network.

lm_eval is imported when such a metric is built, never by ``import convsim``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._records import HIGHER_IS_BETTER_DETAIL, Score, TurnRecord, TurnStatus
from convsim.metrics import CORPUS_AGGREGATION, CORPUS_ITEM, MetricTraits

from ._task_pack import aggregation_name, score_document

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = ["LmEvalMetric", "LmEvalTaskMetric", "GENERATION_METRICS", "ROUGE_METRICS"]

GENERATION_METRICS = ("exact_match", "bleu", "chrf", "chrf++", "ter")
"""lm-eval's registered metrics that score generated text against a reference."""
ROUGE_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


class LmEvalMetricError(ConfigError, ValueError):
    """An ``lm_eval:<name>`` that cannot be computed offline from generated text."""


@dataclass(frozen=True)
class _Registered:
    """An lm-eval metric as its registry has it."""

    function: Callable[..., Any]
    aggregation: Callable[[list[Any]], float]
    higher_is_better: bool


def _lm_eval_metric(name: str) -> _Registered:
    """lm-eval's metric function, its aggregation and higher_is_better, from its
    registry only (``get_metric`` would fall back to downloading from the hub)."""
    from lm_eval.api import registry

    if name not in GENERATION_METRICS:
        raise LmEvalMetricError(_refusal(name))
    import lm_eval.api.metrics  # noqa: F401  (fills the registries)

    function = registry.METRIC_REGISTRY.get(name)
    aggregation = registry.get_metric_aggregation(name)
    higher = registry.is_higher_better(name)
    if function is None or aggregation is None:  # pragma: no cover - an lm-eval change
        raise LmEvalMetricError(f"lm-eval {_version()} does not register metric {name!r}")
    return _Registered(function, aggregation, bool(higher))


def _refusal(name: str) -> str:
    offered = ", ".join(f"lm_eval:{n}" for n in (*GENERATION_METRICS, *ROUGE_METRICS))
    return (
        f"lm_eval:{name} is not available: convsim offers lm-eval's metrics that score "
        f"generated text offline ({offered}); lm-eval's loglikelihood and "
        "classification metrics (acc, perplexity, f1, mcc, ...) need outputs a "
        "conversation does not have, and other names would be fetched from the hub"
    )


def _version() -> str:
    from importlib.metadata import version

    return version("lm-eval")


class LmEvalMetric:
    """An lm-eval metric over the conversation's turns that have a reference response."""

    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"reference"}))
    higher_is_better: bool
    cpu_heavy = True

    def __init__(self, qualified: str) -> None:
        self.name = qualified
        metric = qualified.split(":", 1)[1]
        self.metric = metric
        with needs_extra("lm-eval", qualified):
            if metric in ROUGE_METRICS:
                self._item: Callable[[str, str], Any] = _rouge_item(metric)
                self._aggregate: Callable[[list[Any]], float] = _mean
                self.higher_is_better = True
            else:
                registered = _lm_eval_metric(metric)
                self._aggregate, self.higher_is_better = (
                    registered.aggregation,
                    registered.higher_is_better,
                )
                self._item = _lm_eval_item(metric, registered.function)
        self.description = (
            f"lm-eval's {metric} of the responses against the turns' reference responses, "
            "aggregated over the conversation as lm-eval aggregates it."
        )

    def scorer(self, conversation: Conversation) -> _LmEvalScorer:
        return _LmEvalScorer(self, dict(conversation.scenario.reference_responses))


def _lm_eval_item(metric: str, function: Callable[..., Any]) -> Callable[[str, str], Any]:
    """One item, computed as lm-eval's generate_until tasks compute it."""

    def item(gold: str, result: str) -> Any:
        try:
            value = function(references=[gold], predictions=[result])
        except TypeError:  # a corpus metric: the item passes through to the aggregation
            return function([gold, result])
        return value[metric] if isinstance(value, dict) else value

    return item


def _rouge_item(metric: str) -> Callable[[str, str], float]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer([metric], use_stemmer=True)

    def item(gold: str, result: str) -> float:
        return float(scorer.score(gold, result)[metric].fmeasure)

    return item


def _mean(items: Sequence[float]) -> float:
    return sum(items) / len(items)


@dataclass
class _LmEvalScorer:
    metric: LmEvalMetric
    references: dict[str, str]
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        reference = self.references.get(turn.turn_id)
        if reference is not None and turn.status is TurnStatus.COMPLETED:
            self.pairs.append((reference, turn.response or ""))

    def result(self) -> Score:
        if not self.references:
            return Score.not_applicable("the scenario gives no reference responses")
        if not self.pairs:
            return Score.not_applicable("no completed turn has a reference response")
        items = [self.metric._item(gold, result) for gold, result in self.pairs]
        return Score(value=float(self.metric._aggregate(items)), details={"n": len(items)})


class LmEvalTaskMetric:
    """One metric of an lm-eval task run as ``lm-eval:TASK``: the task's own filters and
    process_results on each document's answer (``lm_eval_task:<metric>``)."""

    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"task"}))
    cpu_heavy = False  # a few hundred microseconds a document: a thread hop costs more

    def __init__(self, qualified: str) -> None:
        self.name = qualified
        self.metric = qualified.split(":", 1)[1]
        # lm-eval's own direction for a metric it registers (ter: lower); the task's,
        # once a conversation shows which task it is
        with needs_extra("lm-eval", qualified):
            from lm_eval.api.registry import higher_is_better_registry

            if len(higher_is_better_registry) == 0:
                import lm_eval.api.metrics  # noqa: F401  fills lm-eval's registries
        registered = higher_is_better_registry.get(self.metric, None)
        self.higher_is_better: bool = True if registered is None else bool(registered)
        self.description = (
            f"lm-eval's {self.metric} for the document, from the task's own filters and "
            "process_results (runs with lm-eval:TASK packs)."
        )

    def scorer(self, conversation: Conversation) -> _LmEvalTaskScorer:
        task = conversation.origin  # the lm-eval task an lm-eval:TASK document came from
        if task is not None and hasattr(task, "higher_is_better"):
            higher = task.higher_is_better().get(self.metric)
            self.higher_is_better = bool(higher) if higher is not None else True
        return _LmEvalTaskScorer(self, dict(conversation.scenario.metadata), task)


@dataclass
class _LmEvalTaskScorer:
    metric: LmEvalTaskMetric
    metadata: dict[str, Any]
    task: Any = None
    """The lm-eval task the conversation was built from."""
    response: str | None = None

    def update(self, turn: TurnRecord) -> None:
        if turn.status is TurnStatus.COMPLETED:
            self.response = turn.response or ""

    def result(self) -> Score:
        name = self.metadata.get("lm_eval_task")
        if name is None or self.task is None:
            return Score.not_applicable("not a document of an lm-eval:TASK pack")
        if self.response is None:
            return Score.not_applicable("the document was not answered")
        results = score_document(self.task, self.metadata["doc_id"], self.response)
        mine = {k: v for k, v in results.items() if k.split(",", 1)[0] == self.metric.metric}
        if not mine:
            raise KeyError(f"lm-eval task {name!r} reports no {self.metric.metric!r}")
        value = mine.get(f"{self.metric.metric},none", next(iter(mine.values())))
        aggregation = aggregation_name(self.task.aggregation()[self.metric.metric])
        details: dict[str, Any] = {"lm_eval": results}
        higher = self.task.higher_is_better().get(self.metric.metric)
        if higher is not None:  # the task's own direction, for reports read from files
            details[HIGHER_IS_BETTER_DETAIL] = bool(higher)
        if aggregation in (None, "mean"):
            return Score(value=float(value), details=details)
        details.update({CORPUS_ITEM: value, CORPUS_AGGREGATION: f"lm_eval:{aggregation}"})
        return Score(value=lm_eval_corpus_value(f"lm_eval:{aggregation}", [value]), details=details)


def lm_eval_corpus_value(aggregation: str, items: list[Any]) -> float:
    """``items`` reduced by ``aggregation`` (``lm_eval:bleu`` ...), as lm-eval does: the
    ``lm_eval`` corpus aggregation (entry point ``convsim.corpus_aggregations``)."""
    prefix, _, name = aggregation.partition(":")
    if prefix != "lm_eval" or not name:
        raise ValueError(f"unknown corpus aggregation {aggregation!r}")
    with needs_extra("lm-eval", f"the corpus aggregation {aggregation}"):
        from lm_eval.api.registry import get_aggregation

    function = get_aggregation(name)
    if function is None:
        raise ValueError(f"lm-eval has no aggregation {name!r}")
    return float(function([tuple(i) if isinstance(i, list) else i for i in items]))
