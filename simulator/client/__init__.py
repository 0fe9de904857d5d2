"""A Python client of the evaluation service (``convsim serve``), sync and async.

``EvaluationClient(base_url, api_key)`` and ``AsyncEvaluationClient`` offer
``create_evaluation`` (convsim's ``pack=``/``model=`` form, or the developer guide's
``models=[...]``/``tasks=[...]``: every model on every task as one job),
``get_evaluation``, ``list_evaluations``, ``wait``, ``iter_results``, ``get_summary``,
``get_comparison`` and ``cancel``; errors are typed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._client import AsyncEvaluationClient as AsyncEvaluationClient
    from ._client import Evaluation as Evaluation
    from ._client import EvaluationClient as EvaluationClient
    from ._client import Invalid as Invalid
    from ._client import LimitReached as LimitReached
    from ._client import NotFound as NotFound
    from ._client import ServiceError as ServiceError
    from ._client import Unauthorized as Unauthorized

__getattr__, __dir__ = _lazy_module(__name__, globals())
