"""Syntax trees are built one at a time across threads: CPython 3.11's AST constructor
keeps its recursion depth in interpreter-wide state, and two threads parsing at once
can fail with "SystemError: AST constructor recursion depth mismatch"."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from convsim.metrics._security import analyse_code
from convsim.plugins import PythonComplexityAnalyzer

CODE = """\
import os, subprocess

def run(command, items):
    total = ""
    for item in items:
        if item in items:
            total += item
    return subprocess.call(command + total, shell=True)
"""


class _Watch:
    """How many threads were inside ``ast.parse`` at once, at most. Each call waits a
    little for a second thread to come in, so an overlap that can happen does."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.calls = 0
        self._lock = threading.Lock()
        self._overlap = threading.Event()

    def wrap(self, parse: Callable[..., ast.AST]) -> Callable[..., ast.AST]:
        def watched(*args: Any, **kwargs: Any) -> ast.AST:
            with self._lock:
                self.inside += 1
                self.calls += 1
                self.most = max(self.most, self.inside)
                if self.inside > 1:
                    self._overlap.set()
            try:
                self._overlap.wait(0.02)
                return parse(*args, **kwargs)
            finally:
                with self._lock:
                    self.inside -= 1

        return watched


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Watch]:
    """Watching ``ast.parse`` once everything the analysis imports is imported (an
    import under pytest may parse too, to rewrite asserts)."""
    PythonComplexityAnalyzer().report(CODE)
    watching = _Watch()
    monkeypatch.setattr(ast, "parse", watching.wrap(ast.parse))
    yield watching


def test_the_code_analysis_in_threads_builds_one_syntax_tree_at_a_time(watch: _Watch) -> None:
    analyzer = PythonComplexityAnalyzer()
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda code: analyzer.report(code), [CODE] * 8))
    assert {r.figures.security_findings for r in reports} == {reports[0].figures.security_findings}
    assert reports[0].figures.security_findings  # bandit ran, and parsed too
    assert watch.calls >= 8 * 3  # ours, radon's and bandit's parse of each
    assert watch.most == 1


def test_the_security_scorer_in_threads_builds_one_syntax_tree_at_a_time(watch: _Watch) -> None:
    with ThreadPoolExecutor(4) as pool:
        findings = list(pool.map(analyse_code, [CODE] * 8))
    assert all(f and f == findings[0] for f in findings)
    assert watch.most == 1
