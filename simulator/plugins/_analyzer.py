"""The Python analyser behind the code-analysis plugin.

:class:`PythonComplexityAnalyzer` measures one piece of Python:

- syntax (ast), with the line and column of an error;
- complexity: cyclomatic (radon) and cognitive (SonarSource's definition, ``_cognitive``)
  per function and method, and for the code outside them; the maintainability index
  and Halstead figures (radon);
- style: PEP 8 issues (pycodestyle, ``_style``);
- security: bandit's findings (the analyser behind ``code_security_score``), scored as
  that metric scores them;
- performance: static anti-patterns (``_performance``).

:meth:`~PythonComplexityAnalyzer.report` gives all of it (:class:`CodeReport`);
:meth:`~PythonComplexityAnalyzer.analyse` the flat figures convsim records as scores
(:class:`CodeFigures`); :meth:`~PythonComplexityAnalyzer.analyze` the complexity of a
syntax tree, as the guide calls it. A figure that could not be measured is None, never
a number standing in for one.
"""

from __future__ import annotations

import ast
import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

from convsim._extras import needs_extra
from convsim._python_ast import PARSING, parse
from convsim.metrics._security import SEVERITY_COST, analyse_code

from ._cognitive import MODULE_BLOCK, cognitive_blocks
from ._performance import PerformanceIssue, find_performance_issues
from ._style import DEFAULT_MAX_LINE_LENGTH, StyleReport, check_style

__all__ = [
    "PythonComplexityAnalyzer",
    "CodeFigures",
    "CodeReport",
    "SyntaxProblem",
    "PERFORMANCE_ISSUE_COST",
]

PERFORMANCE_ISSUE_COST = 0.15
"""What each performance anti-pattern takes off the performance score (the guide's)."""


@dataclass(frozen=True)
class CodeFigures:
    """What the analyser found in one piece of Python, as flat figures."""

    syntax_ok: bool
    lines: int
    functions: int = 0
    classes: int = 0
    cyclomatic_complexity: float | None = None
    """The most complex block's cyclomatic complexity (radon); the code outside
    functions counts as a block when there is any."""
    mean_complexity: float | None = None
    maintainability_index: float | None = None
    """0-100, higher is easier to maintain (radon's MI)."""
    halstead_volume: float | None = None
    halstead_difficulty: float | None = None
    halstead_effort: float | None = None
    security_findings: int | None = None
    """bandit's findings (plus literal ``../`` paths); None when it could not analyse."""
    high_severity_findings: int | None = None
    cognitive_complexity: int | None = None
    """The most complex block's cognitive complexity (SonarSource's definition)."""
    style_issues: int | None = None
    """PEP 8 issues pycodestyle found."""
    performance_issues: int | None = None
    """Performance anti-patterns found."""


@dataclass(frozen=True)
class SyntaxProblem:
    """Why the code does not parse, and where."""

    line: int | None
    column: int | None
    message: str


@dataclass(frozen=True)
class CodeReport:
    """Everything the analyser found in one piece of Python. A part is None when it
    could not be analysed (the code does not parse; bandit skipped it)."""

    figures: CodeFigures
    syntax_errors: tuple[SyntaxProblem, ...]
    complexity: dict[str, Any] | None
    style: StyleReport | None
    security: tuple[dict[str, Any], ...] | None
    performance: tuple[PerformanceIssue, ...] | None

    def sections(self) -> dict[str, dict[str, Any]]:
        """The guide's shape: ``syntax``, ``complexity``, ``style``, ``security`` and
        ``performance``; each section that could not be analysed says so
        (``analysed: False`` and a ``reason``) and claims no score."""
        unparsed = "the code does not parse"
        out: dict[str, dict[str, Any]] = {
            "syntax": {
                "valid": self.figures.syntax_ok,
                "errors": [asdict(e) for e in self.syntax_errors],
            }
        }
        if self.complexity is None:
            out["complexity"] = {
                "analysed": False,
                "reason": unparsed,
                "cyclomatic_complexity": None,
                "cognitive_complexity": None,
            }
        else:
            out["complexity"] = {"analysed": True, **self.complexity}
            out["complexity"]["maintainability_index"] = self.figures.maintainability_index
        if self.style is None:
            out["style"] = _not_analysed(unparsed)
        else:
            out["style"] = {
                "analysed": True,
                "issues": [asdict(i) for i in self.style.issues],
                "score": self.style.score,
                "checker": self.style.checker,
                "max_line_length": self.style.max_line_length,
            }
        if self.security is None:
            reason = unparsed if not self.figures.syntax_ok else "bandit could not analyse it"
            out["security"] = _not_analysed(reason)
        else:
            out["security"] = {
                "analysed": True,
                "issues": [_security_issue(f) for f in self.security],
                "score": security_score(self.security),
                "checker": "bandit",
            }
        if self.performance is None:
            out["performance"] = _not_analysed(unparsed)
        else:
            out["performance"] = {
                "analysed": True,
                "issues": [asdict(i) for i in self.performance],
                "score": performance_score(self.performance),
            }
        return out


def _not_analysed(reason: str) -> dict[str, Any]:
    return {"analysed": False, "reason": reason, "issues": [], "score": None}


def _security_issue(finding: dict[str, Any]) -> dict[str, Any]:
    """A bandit finding in the guide's terms: its ``type`` is the finding's category
    (``command_injection``, ..., ``other``), its ``rule`` bandit's test id."""
    return {
        "line": finding["line"],
        "type": finding["category"],
        "rule": finding["test_id"],
        "severity": finding["severity"],
        "message": finding["message"],
    }


def security_score(findings: tuple[dict[str, Any], ...]) -> float:
    """1 less each finding's severity cost, floored at 0: ``code_security_score``'s rule."""
    cost = sum(SEVERITY_COST.get(str(f["severity"]).upper(), 0.0) for f in findings)
    return max(0.0, 1.0 - cost)


def performance_score(issues: tuple[PerformanceIssue, ...]) -> float:
    """1 less :data:`PERFORMANCE_ISSUE_COST` per anti-pattern, floored at 0."""
    return max(0.0, 1.0 - PERFORMANCE_ISSUE_COST * len(issues))


def _parsed(code: str) -> ast.Module | SyntaxProblem:
    try:
        return parse(code)
    except SyntaxError as exc:
        return SyntaxProblem(exc.lineno, exc.offset, exc.msg)
    except (ValueError, RecursionError, MemoryError) as exc:  # a null byte, too deep
        return SyntaxProblem(None, None, f"{type(exc).__name__}: {exc}")


class PythonComplexityAnalyzer:
    """Complexity, maintainability, Halstead figures, structure, style, security and
    performance of Python (see the module)."""

    def __init__(self) -> None:
        """An analyser, once radon and pycodestyle are known to be there.

        Raises:
            MissingExtra: radon or pycodestyle is not installed (the ``code`` extra).
        """
        with needs_extra("code", "the code_analysis plugin"):
            import pycodestyle  # noqa: F401
            import radon  # noqa: F401

    def analyze(self, tree: ast.AST) -> dict[str, Any]:
        """The complexity of a syntax tree (the guide's call: ``analyze(ast.parse(code))``).

        Returns:
            ``cyclomatic_complexity`` and ``cognitive_complexity`` of the most complex
            block (a function, a method, or the code outside them), the mean
            cyclomatic and the total cognitive complexity, and ``blocks``: each one's
            name, line and both figures.

        Raises:
            TypeError: ``tree`` is not a syntax tree (for source text, use
                :meth:`analyse` or ``ast.parse`` it first).
        """
        from radon.complexity import cc_visit_ast
        from radon.visitors import ComplexityVisitor, Function

        if not isinstance(tree, ast.AST):
            raise TypeError(
                f"analyze() takes a syntax tree (ast.parse(code)), not {type(tree).__name__}"
            )
        module = _as_module(tree)
        if any(isinstance(n, ast.stmt) and not hasattr(n, "lineno") for n in ast.walk(module)):
            module = ast.fix_missing_locations(copy.deepcopy(module))  # radon reads lines
        cognitive = cognitive_blocks(module)
        radon_blocks = cc_visit_ast(module)  # functions, methods, classes, closures
        every = [b.complexity for b in radon_blocks]
        cyclomatic: dict[tuple[str, int | None], int] = {}
        for block in radon_blocks:
            if isinstance(block, Function):
                name = f"{block.classname}.{block.name}" if block.is_method else block.name
                cyclomatic.setdefault((name, block.lineno), block.complexity)
        if cognitive and cognitive[0].name == MODULE_BLOCK:  # code outside functions
            outside = ComplexityVisitor.from_ast(module).complexity
            cyclomatic[(MODULE_BLOCK, 1)] = outside
            every.append(outside)
        every = every or [1]
        return {
            "cyclomatic_complexity": max(every),
            "cognitive_complexity": max((b.complexity for b in cognitive), default=0),
            "mean_cyclomatic_complexity": sum(every) / len(every),
            "total_cognitive_complexity": sum(b.complexity for b in cognitive),
            "blocks": [
                {
                    "name": b.name,
                    "line": b.line,
                    "cyclomatic_complexity": cyclomatic.get((b.name, b.line)),
                    "cognitive_complexity": b.complexity,
                }
                for b in cognitive
            ],
        }

    def analyse(self, code: str, *, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> CodeFigures:
        """The flat figures of ``code`` (convsim's call); see :meth:`report`."""
        return self.report(code, max_line_length=max_line_length).figures

    def report(self, code: str, *, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> CodeReport:
        """Everything the analyser finds in ``code`` (see the module)."""
        from radon.metrics import h_visit_ast, mi_visit

        lines = len([line for line in code.splitlines() if line.strip()])
        tree = _parsed(code)
        if isinstance(tree, SyntaxProblem):
            figures = CodeFigures(syntax_ok=False, lines=lines)
            return CodeReport(figures, (tree,), None, None, None, None)
        nodes = list(ast.walk(tree))
        complexity = self.analyze(tree)
        halstead = h_visit_ast(tree).total
        with PARSING:  # radon parses the code again
            maintainability = mi_visit(code, multi=True)
        findings = analyse_code(code)
        style = check_style(code, max_line_length=max_line_length)
        performance = tuple(find_performance_issues(tree))
        figures = CodeFigures(
            syntax_ok=True,
            lines=lines,
            functions=sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in nodes),
            classes=sum(isinstance(n, ast.ClassDef) for n in nodes),
            cyclomatic_complexity=float(complexity["cyclomatic_complexity"]),
            mean_complexity=float(complexity["mean_cyclomatic_complexity"]),
            maintainability_index=_finite(maintainability),
            halstead_volume=_finite(halstead.volume),
            halstead_difficulty=_finite(halstead.difficulty),
            halstead_effort=_finite(halstead.effort),
            security_findings=None if findings is None else len(findings),
            high_severity_findings=None
            if findings is None
            else sum(1 for f in findings if str(f["severity"]).upper().endswith("HIGH")),
            cognitive_complexity=int(complexity["cognitive_complexity"]),
            style_issues=len(style.issues),
            performance_issues=len(performance),
        )
        return CodeReport(
            figures=figures,
            syntax_errors=(),
            complexity=complexity,
            style=style,
            security=None if findings is None else tuple(findings),
            performance=performance,
        )


def _as_module(tree: ast.AST) -> ast.Module:
    """``tree`` as a module: a statement (a function, a class...) becomes one's body."""
    if isinstance(tree, ast.Module):
        return tree
    if isinstance(tree, ast.stmt):
        return ast.Module(body=[tree], type_ignores=[])
    if isinstance(tree, ast.Interactive):
        return ast.Module(body=tree.body, type_ignores=[])
    if isinstance(tree, ast.Expression):
        return ast.Module(body=[ast.Expr(value=tree.body)], type_ignores=[])
    raise TypeError(f"analyze() takes a module or a statement, not an ast.{type(tree).__name__}")


def _finite(value: float) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None
