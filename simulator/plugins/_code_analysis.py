"""The code-analysis plugin: the Python in each answer measured and checked.

In a run, each answer's fenced Python blocks (```python, ```py or unlabelled) are
analysed by :class:`~convsim.plugins.PythonComplexityAnalyzer` (syntax, cyclomatic and
cognitive complexity, maintainability, Halstead figures, style, security,
performance). Each answer with code gets turn scores ``code_analysis:<figure>``; the
conversation gets a summary over its answers.

On demand, :meth:`CodeAnalysisPlugin.process` analyses one piece of code (the guide's
call) and returns the guide's sections (``syntax``, ``complexity``, ``style``,
``security``, ``performance``) beside the flat figures of a run (``syntax_ok``,
``cyclomatic_complexity``...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from convsim._records import ConversationResult, Score, TurnStatus
from convsim.metrics import MetricTraits
from convsim.metrics._builtin import python_blocks

from ._analyzer import CodeFigures, PythonComplexityAnalyzer
from ._base import BasePlugin, PluginMetric, PluginScores, ScoreRange
from ._style import DEFAULT_MAX_LINE_LENGTH

__all__ = ["CodeAnalysisPlugin", "CodeAnalysisConfig", "ANALYSES", "PYTHON_NAMES"]

ANALYSES = (
    "syntax_analysis",
    "complexity_analysis",
    "style_analysis",
    "security_analysis",
    "performance_analysis",
)
"""What :meth:`CodeAnalysisPlugin.process` analyses (the guide's capability names)."""

PYTHON_NAMES = ("python", "py", "python3")
"""The ``language`` values :meth:`CodeAnalysisPlugin.process` analyses: only Python."""


class CodeAnalysisConfig(BaseModel):
    """The code-analysis plugin's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_complexity: int = Field(default=10, ge=1)
    """A block above this cyclomatic complexity counts as too complex in the summary."""
    max_line_length: int = Field(default=DEFAULT_MAX_LINE_LENGTH, ge=20)
    """The longest line the style check allows."""


_FIGURES = (
    "cyclomatic_complexity",
    "maintainability_index",
    "halstead_volume",
    "halstead_difficulty",
    "halstead_effort",
    "security_findings",
    "high_severity_findings",
    "functions",
    "classes",
    "lines",
    "cognitive_complexity",
    "style_issues",
    "performance_issues",
)


_ANSWER = MetricTraits("turn")
_FIGURE_WORDS: tuple[tuple[str, bool | None, str], ...] = (
    ("syntax_ok", True, "1 when every Python block of the answer parses (ast), else 0."),
    ("cyclomatic_complexity", False, "The most complex block's cyclomatic complexity (radon)."),
    ("maintainability_index", True, "The least maintainable block's index, 0-100 (radon's MI)."),
    ("halstead_volume", None, "Halstead volume of the answer's Python, summed over blocks."),
    ("halstead_difficulty", False, "Halstead difficulty, summed over the answer's blocks."),
    ("halstead_effort", False, "Halstead effort, summed over the answer's blocks."),
    ("security_findings", False, "bandit's findings (and literal ../ paths) in the answer."),
    ("high_severity_findings", False, "bandit's high-severity findings in the answer."),
    ("functions", None, "Functions defined in the answer's Python."),
    ("classes", None, "Classes defined in the answer's Python."),
    ("lines", None, "Non-blank lines of Python in the answer."),
    (
        "cognitive_complexity",
        False,
        "The most complex block's cognitive complexity (SonarSource's definition).",
    ),
    ("style_issues", False, "PEP 8 issues pycodestyle finds in the answer's Python."),
    ("performance_issues", False, "Performance anti-patterns in the answer's Python."),
)


class CodeAnalysisPlugin(BasePlugin):
    """Turn scores ``code_analysis:<figure>`` for every answer with Python in it, and a
    conversation summary ``code_analysis:summary`` (the share of answers whose code
    parses, stays within ``max_complexity`` and has no security finding). An answer whose
    code parses but that bandit could not analyse has no verdict: it is left out of the
    share (counted as ``unchecked``), never taken for one without findings."""

    name: ClassVar[str] = "code_analysis"
    version: ClassVar[str] = "1.0"
    metrics: ClassVar[tuple[PluginMetric, ...]] = (
        PluginMetric(
            "code_analysis:summary",
            MetricTraits("conversation"),
            "Share of the answers with Python whose code parses, stays within "
            "max_complexity and has no security finding.",
            higher_is_better=True,
        ),
        *(
            PluginMetric(f"code_analysis:{figure}", _ANSWER, words, higher_is_better=higher)
            for figure, higher, words in _FIGURE_WORDS
        ),
    )
    Config: ClassVar[type[BaseModel]] = CodeAnalysisConfig
    hook_timeout: ClassVar[float] = 60.0
    """Scoring a conversation runs radon, pycodestyle and bandit over every answer with
    code: on a busy machine, with many conversations scored at once, that can pass the
    default 10 s without anything being wrong."""

    def initialize(self, config: Mapping[str, Any] | BaseModel | None = None) -> bool:
        """Take the settings (checked) and make the analyser ready.

        Raises:
            ConfigError: settings it refuses.
            MissingExtra: radon or pycodestyle is not installed (the ``code`` extra).
        """
        ready = super().initialize(config)
        self.analyzer = PythonComplexityAnalyzer()
        return ready

    def _settings(self) -> CodeAnalysisConfig:
        """The checked settings, initialising on first use (``process`` may be called
        on a plugin the caller built but did not initialise)."""
        if not isinstance(getattr(self, "config", None), CodeAnalysisConfig) or not hasattr(
            self, "analyzer"
        ):
            self.initialize()
        config: CodeAnalysisConfig = self.config
        return config

    def get_capabilities(self) -> list[str]:
        """What :meth:`process` analyses (the guide's names), then the hooks it
        implements."""
        return [*ANALYSES, *super().get_capabilities()]

    def score_range(self, name: str) -> ScoreRange | None:
        figure = name.removeprefix("code_analysis:")
        if figure in ("summary", "syntax_ok"):
            return ScoreRange(0.0, 1.0)
        if figure == "maintainability_index":
            return ScoreRange(0.0, 100.0)
        if figure in _FIGURES:
            return ScoreRange(0.0)
        return None

    def _merged(self, blocks: list[CodeFigures]) -> dict[str, float]:
        """One answer's figures over its code blocks: worst complexity and MI, sums of
        the counts and of Halstead's figures. A figure no block measured is left out."""
        ok = [b for b in blocks if b.syntax_ok]
        out: dict[str, float] = {"syntax_ok": float(all(b.syntax_ok for b in blocks))}
        if ok:
            for name, pick in (
                ("cyclomatic_complexity", max),
                ("cognitive_complexity", max),
                ("maintainability_index", min),
            ):
                values = [getattr(b, name) for b in ok if getattr(b, name) is not None]
                if values:
                    out[name] = float(pick(values))
            for name in ("halstead_volume", "halstead_difficulty", "halstead_effort"):
                values = [getattr(b, name) for b in ok if getattr(b, name) is not None]
                if values:
                    out[name] = float(sum(values))
            analysed = [b for b in ok if b.security_findings is not None]
            if analysed:
                out["security_findings"] = float(sum(b.security_findings or 0 for b in analysed))
                out["high_severity_findings"] = float(
                    sum(b.high_severity_findings or 0 for b in analysed)
                )
            for name in ("style_issues", "performance_issues"):
                values = [getattr(b, name) for b in ok if getattr(b, name) is not None]
                if values:
                    out[name] = float(sum(values))
            out["functions"] = float(sum(b.functions for b in ok))
            out["classes"] = float(sum(b.classes for b in ok))
        out["lines"] = float(sum(b.lines for b in blocks))
        return out

    def process(self, data: Any, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The guide's call: analyse ``data["code"]``, Python by default
        (``context["language"]``).

        Returns:
            For Python, the guide's sections (``syntax`` with ``valid`` and ``errors``,
            ``complexity``, ``style``, ``security``, ``performance``, each with its
            issues and a score, see :class:`~convsim.plugins.CodeReport`) and the flat
            figures of a run (``syntax_ok``, ``cyclomatic_complexity``...). For another
            language, ``error`` saying it is not supported (nothing is measured).

        Raises:
            TypeError: ``data`` is not a mapping with the code as a string under
                ``"code"``, or ``context`` is not a mapping.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("code"), str):
            raise TypeError(
                "process(data, context): data must be a mapping with the code as a string "
                f"under 'code', not {_describe(data)}"
            )
        if context is not None and not isinstance(context, Mapping):
            raise TypeError(f"process(data, context): context must be a mapping, not {context!r}")
        language = (context or {}).get("language", "python")
        if str(language).lower() not in PYTHON_NAMES:
            return {
                "error": f"Unsupported language: {language}",
                "language": language,
                "supported": False,
                "supported_languages": ["python"],
            }
        settings = self._settings()
        report = self.analyzer.report(data["code"], max_line_length=settings.max_line_length)
        return {
            "language": "python",
            "supported": True,
            **report.sections(),
            **asdict(report.figures),
        }

    def score(self, result: ConversationResult) -> PluginScores | None:
        cfg = self._settings()
        turn_scores: dict[str, dict[str, Score]] = {}
        sound: list[float] = []
        unchecked = 0
        for turn in result.turns:
            if turn.status is not TurnStatus.COMPLETED or not turn.response:
                continue
            blocks = [
                self.analyzer.analyse(code, max_line_length=cfg.max_line_length)
                for code in python_blocks(turn.response)
            ]
            if not blocks:
                continue
            figures = self._merged(blocks)
            turn_scores[turn.turn_id] = {
                f"code_analysis:{name}": Score(value=value) for name, value in figures.items()
            }
            if figures["syntax_ok"] == 1.0 and "security_findings" not in figures:
                unchecked += 1  # parses, but its security is unknown: no verdict
                continue
            sound.append(
                float(
                    figures["syntax_ok"] == 1.0
                    and figures.get("cyclomatic_complexity", 0.0) <= cfg.max_complexity
                    and figures["security_findings"] == 0.0
                )
            )
        details = {
            "answers_with_code": len(sound) + unchecked,
            "unchecked": unchecked,
            "max_complexity": cfg.max_complexity,
        }
        if not sound:
            summary = (
                Score.not_applicable(
                    "no evidence: bandit could not analyse the Python of any answer", **details
                )
                if unchecked
                else Score.not_applicable("no answer holds Python code")
            )
        else:
            summary = Score(value=sum(sound) / len(sound), details=details)
        return PluginScores(scores={"code_analysis:summary": summary}, turn_scores=turn_scores)


def _describe(data: object) -> str:
    if isinstance(data, Mapping):
        return f"a mapping with keys {sorted(map(str, data))}"
    return f"a {type(data).__name__}"
