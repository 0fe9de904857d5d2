"""The code-analysis plugin: the Python in each answer measured and checked.

Each answer's fenced Python blocks (```python, ```py or unlabelled) are analysed by
:class:`PythonComplexityAnalyzer`: cyclomatic complexity, maintainability index and
Halstead figures (radon), syntax and structure (ast), and security findings (bandit,
the analyser behind ``code_security_score``). Each answer with code gets turn scores
``code_analysis:<figure>``; the conversation gets a summary over its answers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from convsim._extras import needs_extra
from convsim._records import ConversationResult, Score, TurnStatus
from convsim.metrics import MetricTraits
from convsim.metrics._builtin import python_blocks
from convsim.metrics._security import analyse_code

from ._base import BasePlugin, PluginMetric, PluginScores, ScoreRange

__all__ = ["CodeAnalysisPlugin", "PythonComplexityAnalyzer", "CodeFigures"]


@dataclass(frozen=True)
class CodeFigures:
    """What the analyser found in one piece of Python."""

    syntax_ok: bool
    lines: int
    functions: int = 0
    classes: int = 0
    cyclomatic_complexity: float | None = None
    """The most complex block's cyclomatic complexity (radon)."""
    mean_complexity: float | None = None
    maintainability_index: float | None = None
    """0-100, higher is easier to maintain (radon's MI)."""
    halstead_volume: float | None = None
    halstead_difficulty: float | None = None
    halstead_effort: float | None = None
    security_findings: int | None = None
    """bandit's findings (plus literal ``../`` paths); None when it could not analyse."""
    high_severity_findings: int | None = None


class PythonComplexityAnalyzer:
    """Complexity, maintainability, Halstead figures, structure and security of Python."""

    def __init__(self) -> None:
        """An analyser, once radon is known to be there.

        Raises:
            MissingExtra: radon is not installed (the ``code`` extra).
        """
        with needs_extra("code", "the code_analysis plugin"):
            import radon  # noqa: F401

    def analyse(self, code: str) -> CodeFigures:
        from radon.complexity import cc_visit
        from radon.metrics import h_visit, mi_visit

        lines = len([line for line in code.splitlines() if line.strip()])
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return CodeFigures(syntax_ok=False, lines=lines)
        nodes = list(ast.walk(tree))
        functions = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in nodes)
        classes = sum(isinstance(n, ast.ClassDef) for n in nodes)
        blocks = cc_visit(code)
        complexities = [b.complexity for b in blocks] or [1]
        halstead = h_visit(code).total
        findings = analyse_code(code)
        return CodeFigures(
            syntax_ok=True,
            lines=lines,
            functions=functions,
            classes=classes,
            cyclomatic_complexity=float(max(complexities)),
            mean_complexity=sum(complexities) / len(complexities),
            maintainability_index=float(mi_visit(code, multi=True)),
            halstead_volume=float(halstead.volume),
            halstead_difficulty=float(halstead.difficulty),
            halstead_effort=float(halstead.effort),
            security_findings=None if findings is None else len(findings),
            high_severity_findings=None
            if findings is None
            else sum(1 for f in findings if str(f["severity"]).upper().endswith("HIGH")),
        )


class CodeAnalysisConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_complexity: int = Field(default=10, ge=1)
    """A block above this cyclomatic complexity counts as too complex in the summary."""


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
    """Scoring a conversation runs radon and bandit over every answer with code: on a
    busy machine, with many conversations scored at once, that can pass the default 10 s
    without anything being wrong."""

    def initialize(self, config: BaseModel) -> None:
        super().initialize(config)
        self.analyzer = PythonComplexityAnalyzer()

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
        the counts and of Halstead's figures."""
        ok = [b for b in blocks if b.syntax_ok]
        out: dict[str, float] = {"syntax_ok": float(all(b.syntax_ok for b in blocks))}
        if ok:
            out["cyclomatic_complexity"] = max(b.cyclomatic_complexity or 1.0 for b in ok)
            out["maintainability_index"] = min(b.maintainability_index or 0.0 for b in ok)
            for name in ("halstead_volume", "halstead_difficulty", "halstead_effort"):
                out[name] = sum(getattr(b, name) or 0.0 for b in ok)
            analysed = [b for b in ok if b.security_findings is not None]
            if analysed:
                out["security_findings"] = float(sum(b.security_findings or 0 for b in analysed))
                out["high_severity_findings"] = float(
                    sum(b.high_severity_findings or 0 for b in analysed)
                )
            out["functions"] = float(sum(b.functions for b in ok))
            out["classes"] = float(sum(b.classes for b in ok))
        out["lines"] = float(sum(b.lines for b in blocks))
        return out

    def process(
        self, data: dict[str, Any], context: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The guide's call: analyse ``data["code"]`` (Python) and return its figures."""
        language = (context or {}).get("language", "python")
        if str(language).lower() not in ("python", "py", "python3"):
            return {"language": language, "supported": False}
        figures = self.analyzer.analyse(str(data.get("code", "")))
        return {"language": "python", "supported": True, **figures.__dict__}

    def score(self, result: ConversationResult) -> PluginScores | None:
        cfg: Any = self.config
        turn_scores: dict[str, dict[str, Score]] = {}
        sound: list[float] = []
        unchecked = 0
        for turn in result.turns:
            if turn.status is not TurnStatus.COMPLETED or not turn.response:
                continue
            blocks = [self.analyzer.analyse(code) for code in python_blocks(turn.response)]
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
