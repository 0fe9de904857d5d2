"""The code-analysis plugin's analyses, each on good and bad code: ``process`` returns
the guide's sections beside convsim's flat figures, and a run records the new figures
as turn scores."""

from __future__ import annotations

import ast
import textwrap
from typing import Any

import pytest

import convsim
from convsim import ConfigError
from convsim.plugins import (
    CodeAnalysisPlugin,
    PythonComplexityAnalyzer,
    check_style,
    find_performance_issues,
)

GOOD = textwrap.dedent(
    '''
    def unique_words(text: str) -> list[str]:
        """The words of ``text``, each once, in order."""
        seen = set()
        out = []
        for word in text.split():
            if word not in seen:
                seen.add(word)
                out.append(word)
        return out


    def report(words: list[str]) -> str:
        return ", ".join(words)
    '''
).lstrip()

BAD = textwrap.dedent(
    """
    import pickle,subprocess
    def load(blob, cmd, names: list[str]):
      data = pickle.loads(blob)
      subprocess.call(cmd, shell=True)
      text = ""
      for a in data:
        for b in data:
          if a == b and a in names:
            text += str(a)
      return text
    """
).lstrip()


@pytest.fixture(scope="module")
def plugin() -> CodeAnalysisPlugin:
    analysis = CodeAnalysisPlugin()
    assert analysis.initialize() is True
    return analysis


def analysed(plugin: CodeAnalysisPlugin, code: str) -> dict[str, Any]:
    result = plugin.process({"code": code}, {"language": "python"})
    assert isinstance(result, dict)
    return result


def test_the_guides_sections_beside_the_flat_figures(plugin: CodeAnalysisPlugin) -> None:
    result = analysed(plugin, GOOD)
    for section in ("syntax", "complexity", "style", "security", "performance"):
        assert section in result
    flat = ("syntax_ok", "lines", "functions", "cyclomatic_complexity", "maintainability_index")
    for figure in (*flat, "security_findings", "cognitive_complexity"):
        assert figure in result
    assert result["functions"] == 2 and result["syntax_ok"] is True


def test_syntax(plugin: CodeAnalysisPlugin) -> None:
    assert analysed(plugin, GOOD)["syntax"] == {"valid": True, "errors": []}
    broken = analysed(plugin, "def f(x):\n    return x\n\ndef g(:\n    pass\n")
    assert broken["syntax"]["valid"] is False and broken["syntax_ok"] is False
    (error,) = broken["syntax"]["errors"]
    assert error["line"] == 4 and error["message"]
    # nothing else can be measured, and nothing claims to be
    for section in ("complexity", "style", "security", "performance"):
        assert broken[section]["analysed"] is False
        assert broken[section]["reason"] == "the code does not parse"
    assert broken["complexity"]["cyclomatic_complexity"] is None
    assert all(broken[s]["score"] is None for s in ("style", "security", "performance"))
    null_byte = analysed(plugin, "x = 1\0")["syntax"]
    assert null_byte["valid"] is False and null_byte["errors"][0]["line"] is None


def test_complexity(plugin: CodeAnalysisPlugin) -> None:
    good = analysed(plugin, GOOD)["complexity"]
    bad = analysed(plugin, BAD)["complexity"]
    assert good["analysed"] and bad["analysed"]
    assert good["cyclomatic_complexity"] == 3  # unique_words: 1 + for, if
    assert good["cognitive_complexity"] == 3  # for +1, if +2
    assert bad["cyclomatic_complexity"] == 5  # load: 1 + for, for, if, and
    assert bad["cognitive_complexity"] == 7  # for +1, for +2, if +3, and +1
    assert [b["name"] for b in good["blocks"]] == ["unique_words", "report"]
    assert good["blocks"][1] == {
        "name": "report",
        "line": 12,
        "cyclomatic_complexity": 1,
        "cognitive_complexity": 0,
    }
    assert 0 <= bad["maintainability_index"] < good["maintainability_index"] <= 100


def test_style(plugin: CodeAnalysisPlugin) -> None:
    good = analysed(plugin, GOOD)["style"]
    assert good == {"analysed": True, "issues": [], "score": 1.0,
                    "checker": "pycodestyle", "max_line_length": 88}  # fmt: skip
    bad = analysed(plugin, BAD)["style"]
    rules = {(issue["line"], issue["rule"]) for issue in bad["issues"]}
    assert {(1, "E231"), (1, "E401"), (2, "E302"), (3, "E111")} <= rules
    assert all(
        issue["type"] in ("error", "warning") and issue["message"] for issue in bad["issues"]
    )
    assert 0.0 <= bad["score"] < 0.5  # most of its lines break a rule


def test_style_line_length_is_a_setting() -> None:
    line = "x = '" + "y" * 90 + "'\n"
    assert [i.rule for i in check_style(line).issues] == ["E501"]  # 96 > 88
    assert check_style(line, max_line_length=100).issues == ()
    lenient = CodeAnalysisPlugin({"max_line_length": 100})
    assert lenient.initialize() is True
    assert analysed(lenient, line)["style"]["issues"] == []
    with pytest.raises(ConfigError, match="max_line_length"):
        CodeAnalysisPlugin({"max_line_length": 5}).initialize()


def test_a_snippet_without_a_final_newline_is_not_a_style_issue() -> None:
    assert check_style("x = 1").issues == ()
    assert check_style("").score is None  # no line, no score


def test_security(plugin: CodeAnalysisPlugin) -> None:
    good = analysed(plugin, GOOD)["security"]
    assert good == {"analysed": True, "issues": [], "score": 1.0, "checker": "bandit"}
    bad = analysed(plugin, BAD)["security"]
    found = {(i["line"], i["rule"], i["type"]) for i in bad["issues"]}
    assert (3, "B301", "unsafe_deserialization") in found
    assert (4, "B602", "command_injection") in found
    assert bad["score"] < 0.6  # a high and a medium finding at least


def test_performance(plugin: CodeAnalysisPlugin) -> None:
    good = analysed(plugin, GOOD)["performance"]
    assert good == {"analysed": True, "issues": [], "score": 1.0}
    bad = analysed(plugin, BAD)["performance"]
    found = [(i["line"], i["type"]) for i in bad["issues"]]
    assert found == [
        (7, "nested_loop_same_sequence"),
        (8, "list_membership_in_loop"),
        (9, "string_concatenation_in_loop"),
    ]
    assert bad["score"] == pytest.approx(1 - 3 * 0.15)


def code(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # nested loops over the same sequence, however it is written
        (
            code("for a in xs:", "    for b in xs:", "        pass"),
            [(2, "nested_loop_same_sequence")],
        ),
        (
            code("for i in range(len(xs)):", "    for j in range(len(xs)):", "        pass"),
            [(2, "nested_loop_same_sequence")],
        ),
        (code("pairs = [(a, b) for a in xs for b in xs]"), [(1, "nested_loop_same_sequence")]),
        # over two sequences, or a fixed grid: fine
        (code("for a in xs:", "    for b in ys:", "        pass"), []),
        (code("for i in range(3):", "    for j in range(3):", "        pass"), []),
        # string concatenation in a loop: +=, or s = s + ...
        (code("s = ''", "for x in xs:", "    s += x"), [(3, "string_concatenation_in_loop")]),
        (
            code("s = ''", "while xs:", "    s = s + xs.pop()"),
            [(3, "string_concatenation_in_loop")],
        ),
        (code("for x in xs:", "    out += f'{x},'"), [(2, "string_concatenation_in_loop")]),
        # a number summed in a loop, or a string built once: fine
        (code("total = 0", "for x in xs:", "    total += x"), []),
        (code("s = ''", "s += 'x'"), []),
        # membership in a list in a loop: a name bound to a list, or one built there
        (
            code("seen = []", "for x in xs:", "    if x in seen:", "        pass"),
            [(3, "list_membership_in_loop")],
        ),
        (
            code("def f(xs, names: list[str]):", "    return [x for x in xs if x not in names]"),
            [(2, "list_membership_in_loop")],
        ),
        (
            code("for x in xs:", "    if x in list(ys):", "        pass"),
            [(2, "list_membership_in_loop")],
        ),
        # a set, a list outside any loop, or a short display of constants: fine
        (code("seen = set()", "for x in xs:", "    if x in seen:", "        pass"), []),
        (code("seen = []", "ok = 1 in seen"), []),
        (code("for x in xs:", "    if x in ['a', 'b']:", "        pass"), []),
    ],
)
def test_each_performance_pattern(source: str, expected: list[tuple[int, str]]) -> None:
    issues = find_performance_issues(ast.parse(source))
    assert [(i.line, i.type) for i in issues] == expected


def test_another_language_is_not_analysed(plugin: CodeAnalysisPlugin) -> None:
    result = plugin.process({"code": "int main() { return 0; }"}, {"language": "c"})
    assert result == {
        "error": "Unsupported language: c",
        "language": "c",
        "supported": False,
        "supported_languages": ["python"],
    }
    assert analysed(plugin, "x = 1")["language"] == "python"  # no context: Python
    assert plugin.process({"code": "x = 1"}, {"language": "Python3"})["supported"] is True


@pytest.mark.parametrize(
    ("data", "context"),
    [
        ("def f(): pass", {"language": "python"}),
        ({"source": "x = 1"}, {"language": "python"}),
        ({"code": 42}, {"language": "python"}),
        ({"code": "x = 1"}, "python"),
    ],
)
def test_process_refuses_what_is_not_code(
    plugin: CodeAnalysisPlugin, data: Any, context: Any
) -> None:
    with pytest.raises(TypeError, match="process"):
        plugin.process(data, context)


def test_process_works_on_a_plugin_built_but_not_initialised() -> None:
    result = CodeAnalysisPlugin().process({"code": GOOD}, {})
    assert result["syntax"]["valid"] is True and result["style"]["score"] == 1.0


def test_the_plugin_says_what_it_analyses() -> None:
    capabilities = CodeAnalysisPlugin().get_capabilities()
    assert capabilities[:5] == [
        "syntax_analysis",
        "complexity_analysis",
        "style_analysis",
        "security_analysis",
        "performance_analysis",
    ]
    assert {"score", "process"} <= set(capabilities)


def test_analyze_takes_a_tree_as_the_guide_calls_it() -> None:
    analyzer = PythonComplexityAnalyzer()
    tree = ast.parse(GOOD)
    assert analyzer.analyze(tree)["cognitive_complexity"] == 3
    function = tree.body[0]
    assert analyzer.analyze(function)["blocks"][0]["name"] == "unique_words"
    assert analyzer.analyze(ast.parse("1 if a else 2", mode="eval"))["cognitive_complexity"] == 1
    with pytest.raises(TypeError, match=r"ast\.parse"):
        analyzer.analyze(GOOD)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="module or a statement"):
        analyzer.analyze(ast.Name(id="x"))
    # convsim's call on source text stays
    figures = analyzer.analyse(GOOD)
    assert figures.cyclomatic_complexity == 3 and figures.cognitive_complexity == 3


def test_code_outside_functions_counts_as_a_block() -> None:
    script = "import sys\nfor arg in sys.argv:\n    if arg:\n        print(arg)\n"
    figures = PythonComplexityAnalyzer().analyse(script)
    assert figures.cyclomatic_complexity == 3 and figures.cognitive_complexity == 3


def test_a_run_records_the_new_figures_as_turn_scores() -> None:
    results = convsim.run_sync("coding_help", "scripted", plugins=["code_analysis"])
    scored = [s for r in results for s in r.turn_scores.values() if "code_analysis:lines" in s]
    assert scored
    for scores in scored:
        if scores["code_analysis:syntax_ok"].value == 1.0:
            assert scores["code_analysis:cognitive_complexity"].value >= 0
            assert scores["code_analysis:style_issues"].value >= 0
            assert scores["code_analysis:performance_issues"].value >= 0
    plugin = CodeAnalysisPlugin()
    for figure in ("cognitive_complexity", "style_issues", "performance_issues"):
        assert plugin.score_range(f"code_analysis:{figure}") == (0.0, float("inf"))
