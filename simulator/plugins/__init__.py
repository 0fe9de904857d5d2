"""Plugins: hooks into runs, and scores they contribute.

Write a :class:`BasePlugin` subclass, register it under the entry-point group
``convsim.plugins`` (``name = "package.module:Class"``), and ask for it with
``--plugin NAME`` or ``Simulator(..., plugins=[...])``. The bundled ``code_analysis``
plugin measures the Python in each answer (radon, ast, pycodestyle, bandit).

The developer guide's plugin API is here too, beside convsim's: ``BasePlugin(config)``
with ``initialize()``, ``get_capabilities()``, ``get_config_schema()``,
``validate_config()``, ``process()`` and ``cleanup()``; :class:`PluginManager` with
``register_plugin``, ``load_plugin``, ``unload_plugin``, ``get_plugin``,
``list_available_plugins``, ``list_loaded_plugins`` and ``plugin_registry``; and
``PythonComplexityAnalyzer().analyze(tree)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._analyzer import CodeFigures as CodeFigures
    from ._analyzer import CodeReport as CodeReport
    from ._analyzer import PythonComplexityAnalyzer as PythonComplexityAnalyzer
    from ._analyzer import SyntaxProblem as SyntaxProblem
    from ._base import CAPABILITY_HOOKS as CAPABILITY_HOOKS
    from ._base import DEFAULT_HOOK_TIMEOUT_S as DEFAULT_HOOK_TIMEOUT_S
    from ._base import BasePlugin as BasePlugin
    from ._base import NoConfig as NoConfig
    from ._base import PluginMetric as PluginMetric
    from ._base import PluginScores as PluginScores
    from ._base import ScoreRange as ScoreRange
    from ._catalog import plugin_metrics as plugin_metrics
    from ._code_analysis import CodeAnalysisConfig as CodeAnalysisConfig
    from ._code_analysis import CodeAnalysisPlugin as CodeAnalysisPlugin
    from ._cognitive import CognitiveBlock as CognitiveBlock
    from ._cognitive import cognitive_blocks as cognitive_blocks
    from ._manager import PLUGINS as PLUGINS
    from ._manager import PluginFailure as PluginFailure
    from ._manager import PluginManager as PluginManager
    from ._manager import PluginRegistryView as PluginRegistryView
    from ._manager import PluginRun as PluginRun
    from ._performance import PerformanceIssue as PerformanceIssue
    from ._performance import find_performance_issues as find_performance_issues
    from ._style import StyleIssue as StyleIssue
    from ._style import StyleReport as StyleReport
    from ._style import check_style as check_style

__getattr__, __dir__ = _lazy_module(__name__, globals())
