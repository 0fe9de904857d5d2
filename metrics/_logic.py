"""validate_logic: does the answers' Python pass the task's own test cases?

The test cases come from the scenario's (or problem's) ``metadata.tests``
(:class:`~convsim.scenarios.CodeTests`). The answers' code is every fenced Python block
of the answered turns, in turn order (an answer that is bare code counts as one block),
or of the one turn ``tests.turn_id`` names. The blocks run in one namespace, then the
setup, then each case, in a sandboxed subprocess (:mod:`._sandbox`: a time limit per
step, a memory limit, files kept in a temporary folder, no sockets or processes).

The value is the share of cases that passed. A case that failed, raised, ran out of time
or memory, or never ran because the answer's code ended the process counts as not
passed: the answer was run and did not pass it. Not applicable: no test cases, no
Python in the answers, code not allowed (the pack was not loaded with ``allow_code``,
``--allow-code``), or no POSIX resource limits here. Failed: the sandbox could not
start, or the task's own setup raised.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from convsim._python_ast import parse
from convsim._records import Score, TurnRecord, TurnStatus
from convsim.scenarios import CodeTests, code_tests

from ._builtin import python_blocks
from ._protocol import MetricTraits
from ._sandbox import (
    SandboxLimits,
    SandboxRun,
    SandboxUnavailable,
    run_python,
    sandbox_unavailable,
)

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = ["LogicCheck", "LogicMetric", "answer_code", "check_logic", "CODE_NOT_ALLOWED"]

CODE_NOT_ALLOWED = (
    "running the answer's code and the task's tests needs --allow-code (allow_code=True); "
    "allow it only for packs and models you trust"
)
_LISTED = 10
"""Failures listed in details, at most."""
_STATEMENTS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
    ast.AugAssign,
    ast.For,
    ast.While,
    ast.If,
    ast.With,
    ast.Try,
)


def _bare_code(text: str) -> bool:
    """Whether an answer without fences is Python code: it parses, and defines, imports,
    assigns or controls something (``Paris`` parses too, as a bare name)."""
    try:
        tree = parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(node, _STATEMENTS) for node in tree.body)


def answer_code(responses: Sequence[str]) -> list[str]:
    """The Python of ``responses``, in order: each one's fenced Python blocks, or the
    whole response when it is bare code."""
    blocks: list[str] = []
    for text in responses:
        fenced = python_blocks(text)
        if fenced:
            blocks.extend(fenced)
        elif _bare_code(text):
            blocks.append(text)
    return blocks


@dataclass(frozen=True)
class LogicCheck:
    """The outcome of running a task's test cases against an answer's code.

    True (as a bool) when every case passed; ``score`` holds the share that did, or why
    there is none (not applicable, failed).
    """

    score: Score
    run: SandboxRun | None = None
    """The sandbox run, when the code ran."""

    def __bool__(self) -> bool:
        return self.score.value == 1.0

    @property
    def passed(self) -> int:
        """Cases that passed (0 when nothing ran)."""
        return 0 if self.run is None else sum(c.status == "passed" for c in self.run.cases())

    @property
    def total(self) -> int:
        """Cases run (0 when nothing ran)."""
        return 0 if self.run is None else len(self.run.cases())


def check_logic(
    responses: Sequence[str], tests: CodeTests | None, *, allow_code: bool
) -> LogicCheck:
    """Run ``tests`` against the Python of ``responses`` (in order), when allowed.

    Blocks the calling thread while the subprocess runs: call it off the event loop.
    """
    if tests is None:
        return LogicCheck(Score.not_applicable("the task has no test cases (metadata.tests)"))
    blocks = answer_code(responses)
    if not blocks:
        return LogicCheck(Score.not_applicable("the answer has no Python code"))
    if not allow_code:
        return LogicCheck(Score.not_applicable(CODE_NOT_ALLOWED, cases=len(tests.cases)))
    why = sandbox_unavailable()
    if why is not None:
        return LogicCheck(Score.not_applicable(why))
    limits = SandboxLimits(timeout_s=tests.timeout_s, memory_mb=tests.memory_mb)
    try:
        run = run_python(blocks, tests.cases, setup=tests.setup, limits=limits)
    except SandboxUnavailable as exc:
        return LogicCheck(Score.failed(str(exc)))
    return LogicCheck(_score(run, len(blocks)), run)


def _ending(run: SandboxRun) -> str:
    if run.killed:
        return "killed: it outlived the time of all its steps"
    if run.returncode is not None and run.returncode < 0:
        import signal

        try:
            name = signal.Signals(-run.returncode).name
        except ValueError:
            name = str(-run.returncode)
        return f"ended by {name} (a resource limit, or the answer's own doing)"
    return f"exit status {run.returncode}"


def _score(run: SandboxRun, blocks: int) -> Score:
    setup = next((s for s in run.steps if s.step == "setup"), None)
    if setup is not None and setup.status not in ("passed", "not_run"):
        return Score.failed(f"the task's setup {setup.status}: {setup.message}", output=run.output)
    cases = run.cases()
    counts = Counter(c.status for c in cases)
    passed = counts.get("passed", 0)
    failures = [
        {"case": c.index, "status": c.status, "message": c.message}
        for c in cases
        if c.status != "passed"
    ]
    block_errors = [
        {"block": s.index, "status": s.status, "message": s.message}
        for s in run.steps
        if s.step == "block" and s.status != "passed"
    ]
    details: dict[str, Any] = {
        "passed": passed,
        "cases": len(cases),
        "outcomes": dict(sorted(counts.items())),
        "failures": failures[:_LISTED],
        "blocks": blocks,
        "block_errors": block_errors[:_LISTED],
        "process": _ending(run),
        "limits": run.limits,
    }
    if run.output:
        details["output"] = run.output[:500]
    return Score(value=passed / len(cases), details=details)


class LogicMetric:
    """Share of the task's own test cases the answers' Python passes."""

    name = "validate_logic"
    higher_is_better = True
    cpu_heavy = True  # scored in a worker thread: it waits on a subprocess
    traits = MetricTraits("conversation", needs=frozenset({"tests"}))
    description = (
        "Share of the task's own test cases (metadata.tests) that pass against the "
        "Python in the answers, run in a subprocess with time and memory limits, files "
        "kept in a temporary folder and no sockets; only where code is allowed "
        "(--allow-code), else not applicable. Blind to code the tests do not exercise."
    )

    def scorer(self, conversation: Conversation) -> _LogicScorer:
        try:
            tests = code_tests(conversation.scenario.metadata)
        except ValueError as exc:
            return _LogicScorer(None, False, f"{conversation.source}: metadata.tests: {exc}")
        return _LogicScorer(tests, conversation.allow_code)


@dataclass
class _LogicScorer:
    tests: CodeTests | None
    allow_code: bool
    problem: str | None = None
    """Why the test cases could not be read."""
    responses: list[str] = field(default_factory=list)
    tested_turn_seen: bool = False

    def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        wanted = self.tests.turn_id if self.tests is not None else None
        if wanted is None or turn.turn_id == wanted:
            self.responses.append(turn.response)
            self.tested_turn_seen = True

    def result(self) -> Score:
        if self.problem is not None:
            return Score.failed(self.problem)
        if not self.tested_turn_seen:
            wanted = self.tests.turn_id if self.tests is not None else None
            return Score.not_applicable(
                f"turn {wanted!r} was not answered" if wanted else "no completed turns"
            )
        return check_logic(self.responses, self.tests, allow_code=self.allow_code).score
