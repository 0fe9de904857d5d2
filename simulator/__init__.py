"""convsim: an async, actor-style conversational simulator and evaluation engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_module as _lazy_module
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from ._errors import AdapterCodeError as AdapterCodeError
    from ._errors import AdapterError as AdapterError
    from ._errors import AuthError as AuthError
    from ._errors import BadRequest as BadRequest
    from ._errors import ConfigError as ConfigError
    from ._errors import ConvsimError as ConvsimError
    from ._errors import EgressRefused as EgressRefused
    from ._errors import EndpointError as EndpointError
    from ._errors import InvalidTransition as InvalidTransition
    from ._errors import LocalResourceError as LocalResourceError
    from ._errors import MalformedResponse as MalformedResponse
    from ._errors import MissingExtra as MissingExtra
    from ._errors import PackError as PackError
    from ._errors import PackProblem as PackProblem
    from ._errors import ProtocolError as ProtocolError
    from ._errors import QuotaExhausted as QuotaExhausted
    from ._errors import RateLimited as RateLimited
    from ._errors import RegistryError as RegistryError
    from ._errors import ResponseTooLarge as ResponseTooLarge
    from ._errors import ResultsError as ResultsError
    from ._errors import ServerError as ServerError
    from ._errors import TemplateError as TemplateError
    from ._errors import Timeout as Timeout
    from ._errors import TranscriptTooLong as TranscriptTooLong
    from ._otel import OpenTelemetry as OpenTelemetry
    from ._records import ConversationResult as ConversationResult
    from ._records import ErrorInfo as ErrorInfo
    from ._records import ExtraCall as ExtraCall
    from ._records import MetricTiers as MetricTiers
    from ._records import Score as Score
    from ._records import Status as Status
    from ._records import TerminationReason as TerminationReason
    from ._records import ToolCallRecord as ToolCallRecord
    from ._records import TurnRecord as TurnRecord
    from ._records import TurnStatus as TurnStatus
    from ._runtime._config import JudgeConfig as JudgeConfig
    from ._runtime._config import ModelRef as ModelRef
    from ._runtime._config import SimulatorConfig as SimulatorConfig
    from ._runtime._handle import RunHandle as RunHandle
    from ._runtime._handle import RunStatistics as RunStatistics
    from ._runtime._packs import load_pack as load_pack
    from ._runtime._simulator import Simulator as Simulator
    from ._runtime._simulator import run_sync as run_sync
    from ._runtime._state import ConversationState as ConversationState
    from ._telemetry import Telemetry as Telemetry
    from ._types import RequestIds as RequestIds
    from .adapters import AppReply as AppReply
    from .adapters import app as app
    from .results._report import RunReport as RunReport
    from .results._report import Summarizer as Summarizer
    from .results._report import summarize as summarize
    from .results._report import summarize_file as summarize_file
    from .results._sinks import JsonlSink as JsonlSink
    from .results._sinks import ResultSink as ResultSink
    from .results._sinks import ResultsLock as ResultsLock
    from .results._sinks import RunManifest as RunManifest
    from .results._sinks import iter_results as iter_results
    from .results._sinks import read_results as read_results
    from .scenarios import Pack as Pack
    from .scenarios import list_packs as list_packs

__getattr__, __dir__ = _lazy_module(__name__, globals(), also=["__version__"])
