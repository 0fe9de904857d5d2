"""convsim: an async, actor-style conversational simulator and evaluation engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_module as _lazy_module
from ._version import __version__ as __version__

_public = _lazy_module(
    __name__,
    globals(),
    {
        "._runtime": ["Simulator", "RunHandle", "RunStatistics", "run_sync"],
        "._config": ["SimulatorConfig", "ModelRef", "JudgeConfig"],
        "._state": ["ConversationState"],
        ".scenarios": ["Pack", "list_packs"],
        "._packs": ["load_pack"],
        "._records": [
            "ConversationResult",
            "TurnRecord",
            "TurnStatus",
            "Status",
            "TerminationReason",
            "ErrorInfo",
            "Score",
        ],
        "._sinks": [
            "ResultSink",
            "JsonlSink",
            "RunManifest",
            "ResultsLock",
            "read_results",
            "iter_results",
        ],
        "._report": ["RunReport", "Summarizer", "summarize", "summarize_file"],
        "._errors": [
            "ConvsimError",
            "ConfigError",
            "MissingExtra",
            "RegistryError",
            "PackError",
            "PackProblem",
            "TemplateError",
            "InvalidTransition",
            "TranscriptTooLong",
            "ResultsError",
            "AdapterError",
            "RateLimited",
            "QuotaExhausted",
            "ServerError",
            "Timeout",
            "BadRequest",
            "AuthError",
            "ProtocolError",
            "LocalResourceError",
            "EndpointError",
            "MalformedResponse",
            "ResponseTooLarge",
            "EgressRefused",
        ],
    },
    also=["__version__"],
)
__getattr__, __dir__ = _public.getattr, _public.dir

if TYPE_CHECKING:
    from ._config import JudgeConfig as JudgeConfig
    from ._config import ModelRef as ModelRef
    from ._config import SimulatorConfig as SimulatorConfig
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
    from ._packs import load_pack as load_pack
    from ._records import ConversationResult as ConversationResult
    from ._records import ErrorInfo as ErrorInfo
    from ._records import Score as Score
    from ._records import Status as Status
    from ._records import TerminationReason as TerminationReason
    from ._records import TurnRecord as TurnRecord
    from ._records import TurnStatus as TurnStatus
    from ._report import RunReport as RunReport
    from ._report import Summarizer as Summarizer
    from ._report import summarize as summarize
    from ._report import summarize_file as summarize_file
    from ._runtime import RunHandle as RunHandle
    from ._runtime import RunStatistics as RunStatistics
    from ._runtime import Simulator as Simulator
    from ._runtime import run_sync as run_sync
    from ._sinks import JsonlSink as JsonlSink
    from ._sinks import ResultSink as ResultSink
    from ._sinks import ResultsLock as ResultsLock
    from ._sinks import RunManifest as RunManifest
    from ._sinks import iter_results as iter_results
    from ._sinks import read_results as read_results
    from ._state import ConversationState as ConversationState
    from .scenarios import Pack as Pack
    from .scenarios import list_packs as list_packs
