"""The metric registry (entry-point group ``convsim.metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import TypeVar

from convsim._registry import Registry

from ._protocol import Metric

__all__ = ["METRICS", "register_metric", "resolve_metrics", "DEFAULT_METRICS"]

METRICS: Registry[Metric] = Registry(
    "metric",
    group="convsim.metrics",
    prefix_group="convsim.metric_prefixes",
    source_group="convsim.metric_sources",
)
"""Name -> factory of a :class:`Metric`. Entry points in ``convsim.metrics`` add names,
those in ``convsim.metric_prefixes`` add prefixes (``lm_eval`` serves ``lm_eval:<name>``,
declared by convsim.lm_eval), and those in ``convsim.metric_sources`` register names they
learn when called (convsim.lm_eval's ``engines``: the custom metrics of the metric engines
packages declare in ``convsim.metric_engines``)."""

DEFAULT_METRICS = ("latency", "response_length", "context_retention", "goal_achievement")
"""Metrics every run scores unless told otherwise: cheap ones, which report "not
applicable" where a scenario declares no facts or goal. CPU-heavy metrics (coherence,
conversation_flow, code_security_score, ...) are asked for by packs or ``--metrics``."""

_B = "convsim.metrics._builtin:"
for _name, _cls in [
    ("latency", "LatencyMetric"),
    ("response_length", "ResponseLengthMetric"),
    ("exact_match", "ExactMatchMetric"),
    ("custom_score", "CustomScoreMetric"),
    ("technical_accuracy", "TechnicalAccuracyMetric"),
]:
    METRICS.register(_name, _B + _cls)

METRICS.register("context_retention", "convsim.metrics._retention:ContextRetentionMetric")
METRICS.register("goal_achievement", "convsim.metrics._goal:GoalAchievementMetric")
METRICS.register("coherence", "convsim.metrics._coherence:CoherenceMetric")
METRICS.register("lexical_coherence", "convsim.metrics._coherence:LexicalCoherenceMetric")
METRICS.register("nli_coherence", "convsim.metrics._nli_coherence:NliCoherenceMetric")
METRICS.register("consistency", "convsim.metrics._consistency:ConsistencyMetric")
METRICS.register("conversation_flow", "convsim.metrics._coherence:ConversationFlowMetric")
METRICS.register("semantic_similarity", "convsim.metrics._coherence:SemanticSimilarityMetric")
METRICS.register("code_security_score", "convsim.metrics._security:CodeSecurityMetric")
METRICS.register("domain_expertise", "convsim.metrics._domain:DomainExpertiseMetric")
METRICS.register("financial_reasoning", "convsim.metrics._domain:FinancialReasoningMetric")
METRICS.register("validate_logic", "convsim.metrics._logic:LogicMetric")
METRICS.register("response_quality", "convsim.metrics._quality:ResponseQualityMetric")
METRICS.register("tool_call_accuracy", "convsim.metrics._tool_calls:ToolCallAccuracyMetric")
METRICS.register("trajectory_match", "convsim.metrics._tool_calls:TrajectoryMatchMetric")
METRICS.register("final_state", "convsim.metrics._final_state:FinalStateMetric")
METRICS.register("tool_errors", "convsim.metrics._tool_errors:ToolErrorsMetric")


DIALOGUE_JUDGES = (
    "judge:conversation_completeness",
    "judge:knowledge_retention",
    "judge:role_adherence",
    "judge:turn_relevancy",
)
"""The built-in conversational judge metrics: names under the ``judge:`` prefix that
are not rubric text (registered by name too, so that ``convsim metrics`` lists them)."""


def _rubric(name: str) -> Metric:
    if name in DIALOGUE_JUDGES:
        from ._dialogue_judges import dialogue_judge

        return dialogue_judge(name)
    from ._judge import rubric_metric

    return rubric_metric(name)


for _name in (
    "engagement_quality",
    "clarity_score",
    "analysis_depth",
    "recommendation_quality",
    "detail_level",
    "accuracy",
    "depth_of_analysis",
):
    METRICS.register(_name, partial(_rubric, _name))
for _name in DIALOGUE_JUDGES:
    METRICS.register(_name, partial(_rubric, _name))
METRICS.register_prefix("judge:", _rubric)


M = TypeVar("M", bound=Callable[..., Metric])


def register_metric(name: str, *, registry: Registry[Metric] = METRICS) -> Callable[[M], M]:
    """Class decorator: ``@register_metric("my_metric")`` registers a metric factory."""

    def decorate(factory: M) -> M:
        registry.register(name, factory)
        return factory

    return decorate


def resolve_metrics(names: Iterable[str], *, registry: Registry[Metric] = METRICS) -> list[Metric]:
    """Instantiate the metrics called ``names`` (duplicates dropped, order kept)."""
    return [registry.get(name)() for name in dict.fromkeys(names)]
