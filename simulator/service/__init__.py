"""The evaluation service: jobs over HTTP, durable in SQLite, for many users' keys.

A job runs every model it names on every task it names (``models``/``tasks``, the
developer guide's form, or one ``pack`` and one ``model``). ``convsim serve`` runs it;
:func:`create_app` gives the ASGI app to mount elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._app import Evaluation as Evaluation
    from ._app import EvaluationModel as EvaluationModel
    from ._app import EvaluationPair as EvaluationPair
    from ._app import create_app as create_app
    from ._intake import EvaluationRequest as EvaluationRequest
    from ._jobs import JobRunner as JobRunner
    from ._plan import ModelEntry as ModelEntry
    from ._settings import Endpoint as Endpoint
    from ._settings import KeyLimits as KeyLimits
    from ._settings import ServiceSettings as ServiceSettings
    from ._store import Store as Store
    from ._summaries import EvaluationSummary as EvaluationSummary
    from ._summaries import ModelComparison as ModelComparison
    from ._summaries import PairSummary as PairSummary

__getattr__, __dir__ = _lazy_module(__name__, globals())
