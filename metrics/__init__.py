"""Metrics: the scorer protocols, the one scoring path, the registry and the built-ins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from convsim._records import Score as Score

    from ._asking import AskModel as AskModel
    from ._asking import ask_model as ask_model
    from ._builtin import CustomScoreMetric as CustomScoreMetric
    from ._builtin import ExactMatchMetric as ExactMatchMetric
    from ._builtin import LatencyMetric as LatencyMetric
    from ._builtin import ResponseLengthMetric as ResponseLengthMetric
    from ._builtin import TechnicalAccuracyMetric as TechnicalAccuracyMetric
    from ._builtin import normalize_answer as normalize_answer
    from ._catalog import MetricInfo as MetricInfo
    from ._catalog import registered_metrics as registered_metrics
    from ._corpus import AGGREGATIONS as AGGREGATIONS
    from ._corpus import CORPUS_AGGREGATION as CORPUS_AGGREGATION
    from ._corpus import CORPUS_ITEM as CORPUS_ITEM
    from ._corpus import corpus_value as corpus_value
    from ._domain import financial_signals as financial_signals
    from ._domain import talks_finance as talks_finance
    from ._embedding import Embedder as Embedder
    from ._embedding import TfidfEmbedder as TfidfEmbedder
    from ._embedding import cosine as cosine
    from ._final_state import FinalStateMetric as FinalStateMetric
    from ._final_state import final_environment as final_environment
    from ._goal import goal_met as goal_met
    from ._judge import JudgeSettings as JudgeSettings
    from ._judge import RubricJudgeMetric as RubricJudgeMetric
    from ._judge import judged as judged
    from ._logic import CODE_NOT_ALLOWED as CODE_NOT_ALLOWED
    from ._logic import LogicCheck as LogicCheck
    from ._logic import LogicMetric as LogicMetric
    from ._logic import answer_code as answer_code
    from ._logic import check_logic as check_logic
    from ._nli import NliScores as NliScores
    from ._nli import NliUnavailable as NliUnavailable
    from ._nli import PairClassifier as PairClassifier
    from ._nli import load_pair_classifier as load_pair_classifier
    from ._nli import nli_classifier as nli_classifier
    from ._nli import set_nli_classifier as set_nli_classifier
    from ._protocol import AsyncConversationScorer as AsyncConversationScorer
    from ._protocol import ConversationScorer as ConversationScorer
    from ._protocol import Metric as Metric
    from ._protocol import MetricTraits as MetricTraits
    from ._quality import QualityPart as QualityPart
    from ._quality import ResponseQuality as ResponseQuality
    from ._quality import ResponseQualityMetric as ResponseQualityMetric
    from ._quality import response_quality as response_quality
    from ._registry import DEFAULT_METRICS as DEFAULT_METRICS
    from ._registry import METRICS as METRICS
    from ._registry import register_metric as register_metric
    from ._registry import resolve_metrics as resolve_metrics
    from ._sandbox import SandboxLimits as SandboxLimits
    from ._sandbox import SandboxRun as SandboxRun
    from ._sandbox import SandboxUnavailable as SandboxUnavailable
    from ._sandbox import StepOutcome as StepOutcome
    from ._sandbox import run_python as run_python
    from ._session import ScoredConversation as ScoredConversation
    from ._session import ScoringSession as ScoringSession
    from ._stats import mean as mean
    from ._stats import percentile as percentile
    from ._tool_calls import ToolCallAccuracyMetric as ToolCallAccuracyMetric
    from ._tool_calls import TrajectoryMatchMetric as TrajectoryMatchMetric
    from ._tool_errors import ToolErrorsMetric as ToolErrorsMetric
    from ._transcripts import Transcript as Transcript
    from ._transcripts import TranscriptScores as TranscriptScores
    from ._transcripts import ascore_transcript as ascore_transcript
    from ._transcripts import read_transcripts as read_transcripts
    from ._transcripts import recorded_transcript as recorded_transcript
    from ._transcripts import score_transcript as score_transcript
    from ._transcripts import score_transcripts as score_transcripts

__getattr__, __dir__ = _lazy_module(__name__, globals())
