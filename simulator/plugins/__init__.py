"""Plugins: hooks into runs, and scores they contribute.

Write a :class:`BasePlugin` subclass, register it under the entry-point group
``convsim.plugins`` (``name = "package.module:Class"``), and ask for it with
``--plugin NAME`` or ``Simulator(..., plugins=[...])``. The bundled ``code_analysis``
plugin measures the Python in each answer (radon, ast, bandit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._base import DEFAULT_HOOK_TIMEOUT_S as DEFAULT_HOOK_TIMEOUT_S
    from ._base import BasePlugin as BasePlugin
    from ._base import NoConfig as NoConfig
    from ._base import PluginMetric as PluginMetric
    from ._base import PluginScores as PluginScores
    from ._base import ScoreRange as ScoreRange
    from ._catalog import plugin_metrics as plugin_metrics
    from ._code_analysis import CodeAnalysisPlugin as CodeAnalysisPlugin
    from ._code_analysis import CodeFigures as CodeFigures
    from ._code_analysis import PythonComplexityAnalyzer as PythonComplexityAnalyzer
    from ._manager import PLUGINS as PLUGINS
    from ._manager import PluginFailure as PluginFailure
    from ._manager import PluginManager as PluginManager
    from ._manager import PluginRun as PluginRun

__getattr__, __dir__ = _lazy_module(__name__, globals())
