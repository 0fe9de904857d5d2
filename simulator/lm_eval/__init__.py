"""convsim and EleutherAI's lm-evaluation-harness, both ways round.

- ``--model convsim`` for lm-eval (:class:`ConvsimLM`, :func:`register_lm_eval_model`):
  any convsim adapter answers lm-eval's requests, and multi-turn tasks run whole
  conversations through convsim's runtime.
- ``convsim run lm-eval:TASK``: an lm-eval task as a pack, scored by the task itself
  (``lm_eval_task:<metric>``); ``lm_eval:<name>``: lm-eval's offline metrics.
- ``convsim lm-eval-tasks``: packs written as lm-eval tasks.
- The developer guide's task API: :class:`AdvancedTask`, :class:`MultiTurnTask`,
  :class:`MetricsEngine`, :func:`register_task` (``task:NAME`` packs, ``task:<key>``).
- The guide's metrics: :class:`MetricsEngine` (``calculate_metric``, ``validate_logic``,
  ``assess_response_quality``) and :class:`CustomMetricsEngine`; custom metrics an engine
  registers are metrics of convsim's registry (entry-point group
  ``convsim.metric_engines`` for engines a package declares).

This package sits above the runtime. The layers below reach it only by name, through
the entry points it declares (``convsim.metric_prefixes``, ``convsim.pack_sources``,
``convsim.corpus_aggregations``, ``convsim.commands``, ``convsim.metric_sources``), as a
third-party package would.
Nothing here is imported by ``import convsim``, and lm_eval itself is imported only when
something needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._custom_metrics import CustomMetricsEngine as CustomMetricsEngine
    from ._engine_metrics import ENGINE_GROUP as ENGINE_GROUP
    from ._engine_metrics import EngineMetric as EngineMetric
    from ._engine_metrics import EngineRegistration as EngineRegistration
    from ._engine_metrics import register_engine_metrics as register_engine_metrics
    from ._export import ExportedTask as ExportedTask
    from ._export import export_lm_eval_tasks as export_lm_eval_tasks
    from ._logprobs import UnscorableRequest as UnscorableRequest
    from ._logprobs import continuation_logprob as continuation_logprob
    from ._logprobs import rolling_logprob as rolling_logprob
    from ._metrics_engine import MetricsEngine as MetricsEngine
    from ._metrics_engine import QualityScore as QualityScore
    from ._model import ConvsimLM as ConvsimLM
    from ._model import FailedRequest as FailedRequest
    from ._model import LogprobsUnsupported as LogprobsUnsupported
    from ._model import register_lm_eval_model as register_lm_eval_model
    from ._multi_turn import ExtraCallFailed as ExtraCallFailed
    from ._multi_turn import MultiTurnTask as MultiTurnTask
    from ._task_pack import load_lm_eval_task as load_lm_eval_task
    from ._tasks import TASKS as TASKS
    from ._tasks import AdvancedTask as AdvancedTask
    from ._tasks import register_task as register_task

__getattr__, __dir__ = _lazy_module(__name__, globals())
