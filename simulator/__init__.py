"""convsim: an async, actor-style conversational simulator and evaluation engine."""

from __future__ import annotations

from ._errors import AdapterError as AdapterError
from ._errors import AuthError as AuthError
from ._errors import BadRequest as BadRequest
from ._errors import ConfigError as ConfigError
from ._errors import ConvsimError as ConvsimError
from ._errors import InvalidTransition as InvalidTransition
from ._errors import PackError as PackError
from ._errors import PackProblem as PackProblem
from ._errors import ProtocolError as ProtocolError
from ._errors import RateLimited as RateLimited
from ._errors import RegistryError as RegistryError
from ._errors import ResultsError as ResultsError
from ._errors import ServerError as ServerError
from ._errors import TemplateError as TemplateError
from ._errors import Timeout as Timeout
from ._records import ConversationResult as ConversationResult
from ._records import ErrorInfo as ErrorInfo
from ._records import Score as Score
from ._records import Status as Status
from ._records import TerminationReason as TerminationReason
from ._records import TurnRecord as TurnRecord
from ._records import TurnStatus as TurnStatus
from ._report import RunReport as RunReport
from ._report import summarize as summarize
from ._runtime import RunHandle as RunHandle
from ._runtime import RunStatistics as RunStatistics
from ._runtime import Simulator as Simulator
from ._runtime import run_sync as run_sync
from ._sinks import JsonlSink as JsonlSink
from ._sinks import ResultSink as ResultSink
from ._sinks import RunManifest as RunManifest
from ._sinks import read_results as read_results
from ._state import ConversationState as ConversationState
from ._version import __version__ as __version__
from .scenarios import Pack as Pack
from .scenarios import list_packs as list_packs
from .scenarios import load_pack as load_pack

__all__ = [
    "__version__",
    # running
    "Simulator",
    "RunHandle",
    "RunStatistics",
    "run_sync",
    "ConversationState",
    # packs
    "Pack",
    "load_pack",
    "list_packs",
    # results
    "ConversationResult",
    "TurnRecord",
    "TurnStatus",
    "Status",
    "TerminationReason",
    "ErrorInfo",
    "Score",
    "ResultSink",
    "JsonlSink",
    "RunManifest",
    "read_results",
    "RunReport",
    "summarize",
    # errors
    "ConvsimError",
    "ConfigError",
    "RegistryError",
    "PackError",
    "PackProblem",
    "TemplateError",
    "InvalidTransition",
    "ResultsError",
    "AdapterError",
    "RateLimited",
    "ServerError",
    "Timeout",
    "BadRequest",
    "AuthError",
    "ProtocolError",
]
