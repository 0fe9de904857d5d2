"""validate_logic: a task's own test cases run against the answer's code, in a sandbox.

Each test here runs real subprocesses (python -I) with real limits: a step that loops is
stopped by its time limit (0.5 s here), a memory bomb by the address-space limit, files
and sockets outside the answer's folder by the audit hook.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from conftest import write_pack

import convsim
from convsim import PackError, load_pack, read_results
from convsim.cli import main
from convsim.metrics import (
    CODE_NOT_ALLOWED,
    SandboxLimits,
    SandboxUnavailable,
    answer_code,
    check_logic,
    run_python,
    score_transcript,
)
from convsim.metrics import _sandbox as sandbox
from convsim.scenarios import CodeTests, code_tests

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs POSIX limits")

ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"]
QUICK = {"timeout_s": 0.5}


def fenced(code: str, words: str = "Here it is:") -> str:
    return f"{words}\n\n```python\n{code}```\n"


def check(code: str, cases: list[str], **settings: Any) -> Any:
    return check_logic([fenced(code)], CodeTests(cases=tuple(cases), **settings), allow_code=True)


# -- good and bad answers ----------------------------------------------------------------


def test_a_correct_solution_passes_every_case() -> None:
    result = check(ADD, ADD_TESTS)
    assert result.score.value == 1.0 and bool(result)
    assert (result.passed, result.total) == (3, 3)
    assert result.score.details["outcomes"] == {"passed": 3}


def test_a_wrong_solution_fails_the_cases_it_gets_wrong() -> None:
    result = check(WRONG_ADD, ADD_TESTS)
    # a - b is right for add(0, 0) only
    assert result.score.value == pytest.approx(1 / 3) and not bool(result)
    failures = result.score.details["failures"]
    assert [f["case"] for f in failures] == [0, 1]
    assert all(f["status"] == "failed" and "AssertionError" in f["message"] for f in failures)


def test_a_later_block_replaces_an_earlier_definition() -> None:
    answer = fenced(WRONG_ADD, "First try:") + fenced(ADD, "Fixed:")
    tests = CodeTests(cases=tuple(ADD_TESTS))
    assert check_logic([answer], tests, allow_code=True).score.value == 1.0


def test_a_block_that_raises_is_recorded_and_the_next_still_runs() -> None:
    answer = fenced("from batching import batch_records\n") + fenced(ADD)
    result = check_logic([answer], CodeTests(cases=tuple(ADD_TESTS)), allow_code=True)
    assert result.score.value == 1.0
    [error] = result.score.details["block_errors"]
    assert error["block"] == 0 and "ModuleNotFoundError" in error["message"]


def test_the_setup_runs_before_the_cases_and_a_broken_setup_fails_the_score() -> None:
    cases = ["assert add(BIG, 1) == BIG + 1"]
    assert check(ADD, cases, setup="BIG = 10 ** 12").score.value == 1.0
    broken = check(ADD, cases, setup="import no_such_module_for_tests")
    assert broken.score.status == "failed" and "the task's setup error" in broken.score.reason


def test_bare_code_counts_and_prose_does_not() -> None:
    assert answer_code([ADD]) == [ADD]
    assert answer_code(["Paris", "The answer is 4.", "add(a, b) returns a + b"]) == []
    result = check_logic(["Paris"], CodeTests(cases=("assert True",)), allow_code=True)
    assert result.score.status == "not_applicable"
    assert result.score.reason == "not applicable: the answer has no Python code"


# -- when it does not run -----------------------------------------------------------------


def test_without_allow_code_nothing_runs_and_the_reason_says_why(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()\n" + ADD
    result = check_logic([fenced(code)], CodeTests(cases=tuple(ADD_TESTS)), allow_code=False)
    assert result.score.status == "not_applicable" and result.run is None
    assert CODE_NOT_ALLOWED in str(result.score.reason) and "--allow-code" in CODE_NOT_ALLOWED
    assert not marker.exists()


def test_without_test_cases_it_is_not_applicable() -> None:
    result = check_logic([fenced(ADD)], None, allow_code=True)
    assert result.score.status == "not_applicable" and "no test cases" in str(result.score.reason)


def test_without_posix_limits_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.os, "name", "nt")
    result = check(ADD, ADD_TESTS)
    assert result.score.status == "not_applicable" and "POSIX" in str(result.score.reason)
    with pytest.raises(SandboxUnavailable, match="POSIX"):
        run_python([ADD], ADD_TESTS)


def test_an_interpreter_that_cannot_start_fails_the_score(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.sys, "executable", "/nonexistent/python")
    result = check(ADD, ADD_TESTS)
    assert result.score.status == "failed" and "cannot start" in str(result.score.reason)


# -- the limits ---------------------------------------------------------------------------


def test_a_case_that_loops_times_out_and_the_next_case_still_runs() -> None:
    started = time.monotonic()
    result = check(ADD, ["while True: pass", *ADD_TESTS], **QUICK)
    assert time.monotonic() - started < 10  # 0.5 s for the loop, not the 60 s test timeout
    assert result.score.value == pytest.approx(3 / 4)
    [failure] = result.score.details["failures"]
    assert failure["case"] == 0 and failure["status"] == "timeout"


def test_an_answer_that_sleeps_at_import_times_out() -> None:
    result = check("import time\ntime.sleep(60)\n" + ADD, ADD_TESTS, **QUICK)
    assert result.score.details["block_errors"][0]["status"] == "timeout"
    assert result.score.value == 0.0  # the block stopped before it defined add


def test_a_loop_that_ignores_the_timer_is_killed_and_its_cases_count_as_not_passed() -> None:
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass\n"
    started = time.monotonic()
    result = check(code, ADD_TESTS, **QUICK)
    assert time.monotonic() - started < 20
    assert result.score.value == 0.0
    assert result.score.details["outcomes"] == {"not_run": 3}
    assert result.score.details["process"].startswith(("ended by SIG", "killed"))


@pytest.mark.parametrize(
    "bomb",
    ["x = bytearray(10 ** 11)", "grow = []\nwhile True:\n    grow.append(bytearray(10 ** 7))"],
    ids=["at-once", "growing"],
)
def test_a_memory_bomb_meets_the_memory_limit(bomb: str) -> None:
    result = check(ADD, [bomb, *ADD_TESTS], memory_mb=256)
    [failure] = result.score.details["failures"]
    assert failure["status"] == "memory" and "MemoryError" in failure["message"]
    assert result.score.value == pytest.approx(3 / 4)  # the process lived on
    assert result.score.details["limits"]["RLIMIT_AS"] == 256 * 1024 * 1024


def test_a_flood_of_output_meets_the_output_limit() -> None:
    result = check("while True:\n    print('x' * 10000)\n" + ADD, ADD_TESTS)
    [error] = result.score.details["block_errors"]
    assert "File too large" in error["message"]
    assert len(result.score.details["output"]) <= 500


def test_an_answer_that_exits_the_process_passes_nothing() -> None:
    result = check("import os\nos._exit(0)\n" + ADD, ADD_TESTS)
    assert result.score.value == 0.0 and result.score.details["outcomes"] == {"not_run": 3}


# -- what the answer may touch ----------------------------------------------------------


def test_reading_a_file_outside_its_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the launch code is 0000")
    code = f"data = open({str(secret)!r}).read()\n"
    result = check(code, ["assert data"])
    [error] = result.score.details["block_errors"]
    assert (
        "PermissionError" in error["message"] and "outside the answer's folder" in error["message"]
    )
    assert "launch code" not in json.dumps(result.score.details)
    assert result.score.value == 0.0


def test_files_inside_its_folder_are_its_own_and_the_folder_is_removed_afterwards() -> None:
    code = "import os\nopen('notes.txt', 'w').write('kept')\nprint(os.getcwd())\n"
    run = run_python([code], ["assert open('notes.txt').read() == 'kept'"])
    assert [s.status for s in run.steps] == ["passed", "passed"]
    folder = Path(run.output.strip())
    assert folder.name.startswith("convsim-code-") and not folder.exists()


def test_writing_outside_its_folder_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "written.txt"
    result = check(f"open({str(target)!r}, 'w').write('x')\n", ["assert True"])
    assert "PermissionError" in result.score.details["block_errors"][0]["message"]
    assert not target.exists()


def test_no_connection_reaches_a_server_on_loopback() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        result = check(code, ["assert True"])
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody ever connected
    assert "PermissionError" in result.score.details["block_errors"][0]["message"]


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import ctypes",
        "import os\nos.kill(os.getppid(), 9)",
    ],
    ids=["subprocess", "system", "ctypes", "kill"],
)
def test_processes_signals_and_native_code_are_refused(code: str) -> None:
    result = check(code + "\n", ["assert True"])
    [error] = result.score.details["block_errors"]
    assert "sandbox:" in error["message"], error


def test_the_environment_holds_no_keys_or_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    code = "import os\nSEEN = dict(os.environ)\n"
    cases = ["assert 'OPENAI_API_KEY' not in SEEN", "assert 'HTTPS_PROXY' not in SEEN"]
    assert check(code, cases).score.value == 1.0


def test_an_interrupted_run_leaves_no_process_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    psutil = pytest.importorskip("psutil")
    started: list[int] = []
    real_communicate = subprocess.Popen.communicate

    def interrupted(self: subprocess.Popen[bytes], *args: Any, **kwargs: Any) -> Any:
        if not started:
            started.append(self.pid)
            raise KeyboardInterrupt  # as a cancellation reaches a blocked thread
        return real_communicate(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_python(["while True: pass"], ["assert True"], limits=SandboxLimits(timeout_s=30))
    assert started and not psutil.pid_exists(started[0])


# -- packs and runs -----------------------------------------------------------------------


def write_code_pack(folder: Path, problems: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "task_name": "code_tests",
        "description": "Write small Python functions",
        "metrics": {"primary": ["validate_logic"]},
        "prompt_templates": {"default": "{question}\n\nAnswer:"},
    }
    (folder / "config.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    lines = "".join(json.dumps(p) + "\n" for p in problems)
    (folder / "problems.jsonl").write_text(lines, encoding="utf-8")
    return folder


PROBLEMS = [
    {
        "id": "right",
        "question": "Write add(a, b).",
        "expected_answer": fenced(ADD),
        "metadata": {"tests": ADD_TESTS},
    },
    {
        "id": "wrong",
        "question": "Write add(a, b).",
        "expected_answer": fenced(WRONG_ADD),
        "metadata": {"tests": {"cases": ADD_TESTS, "timeout_s": 2}},
    },
    {"id": "prose", "question": "What is 2 + 3?", "expected_answer": "5", "metadata": {}},
]


def test_a_pack_run_scores_each_answer_only_with_allow_code(tmp_path: Path) -> None:
    pack = write_code_pack(tmp_path / "pack", PROBLEMS)
    out = tmp_path / "allowed.jsonl"
    args = ["run", str(pack), "--model", "scripted", "--metrics", "validate_logic"]
    result = CliRunner().invoke(main, [*args, "--allow-code", "--out", str(out)])
    assert result.exit_code == 0, result.output
    scores = {r.scenario_id: r.scores["validate_logic"] for r in read_results(out)}
    assert scores["right"].value == 1.0
    assert scores["wrong"].value == pytest.approx(1 / 3)
    assert scores["prose"].status == "not_applicable"  # its answer has no code, no tests

    out = tmp_path / "refused.jsonl"
    result = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    for r in read_results(out):
        assert r.scores["validate_logic"].status == "not_applicable"
    refused = {r.scenario_id: r.scores["validate_logic"].reason for r in read_results(out)}
    assert "--allow-code" in str(refused["right"])


def test_broken_test_cases_are_refused_when_the_pack_loads(tmp_path: Path) -> None:
    problems = [
        {**PROBLEMS[0], "metadata": {"tests": ["assert add(2, 3) == 5", "assert add(("]}},
        {**PROBLEMS[1], "metadata": {"tests": {"cases": ADD_TESTS, "timeout": 3}}},
        {**PROBLEMS[2], "metadata": {"tests": "assert True"}},
        {**PROBLEMS[2], "id": "one", "metadata": {"tests": ["assert ("]}},
    ]
    pack = write_code_pack(tmp_path / "pack", problems)
    with pytest.raises(PackError) as caught:
        load_pack(pack)
    found = {(p.file, p.line, p.field) for p in caught.value.problems}
    assert found == {
        ("problems.jsonl", 1, "metadata.tests.cases.1"),
        ("problems.jsonl", 2, "metadata.tests.timeout"),
        ("problems.jsonl", 3, "metadata.tests"),
        ("problems.jsonl", 4, "metadata.tests.cases.0"),  # once, not also "too few cases"
    }
    result = CliRunner().invoke(main, ["validate", str(pack)])
    assert result.exit_code == 2 and "problems.jsonl:1: metadata.tests.cases.1: not Python" in (
        result.stderr
    )


MULTI_FLOW = {
    "default": {
        "turns": [
            {"turn_id": "write", "prompt_template": "Write add(a, b)."},
            {"turn_id": "fix", "prompt_template": "It is wrong; fix it."},
            {"turn_id": "explain", "prompt_template": "Explain the fix."},
        ]
    }
}


def multi_turn_pack(folder: Path, tests: Any) -> Path:
    scenario = {
        "scenario_id": "fix_add",
        "scenario_description": "Write add, then fix it",
        "reference_responses": {
            "write": fenced(WRONG_ADD),
            "fix": fenced(ADD, "Fixed:"),
            "explain": "It subtracted instead of adding.",
        },
        "metadata": {"tests": tests},
    }
    return write_pack(folder, MULTI_FLOW, [scenario])


@pytest.mark.parametrize(
    ("tests", "value"),
    [
        (ADD_TESTS, 1.0),  # the code of every turn in order: the fix replaces the first try
        ({"cases": ADD_TESTS, "turn_id": "write"}, 1 / 3),  # the first try alone
        ({"cases": ADD_TESTS, "turn_id": "explain"}, None),  # no code in that turn
    ],
)
def test_multi_turn_code_is_tested_in_turn_order_or_one_named_turn(
    tmp_path: Path, tests: Any, value: float | None
) -> None:
    pack = load_pack(multi_turn_pack(tmp_path / "pack", tests), allow_code=True)
    assert all(c.allow_code for c in pack.conversations)
    [result] = convsim.run_sync(pack, "scripted", metrics=["validate_logic"])
    score = result.scores["validate_logic"]
    assert score.value == (pytest.approx(value) if value is not None else None), score


def test_a_test_turn_that_is_not_in_the_flow_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackError) as caught:
        load_pack(multi_turn_pack(tmp_path / "pack", {"cases": ADD_TESTS, "turn_id": "nope"}))
    [problem] = caught.value.problems
    assert (problem.field, problem.message) == ("metadata.tests.turn_id", "unknown turn 'nope'")


def test_transcripts_scored_with_allow_code_run_their_tests() -> None:
    messages = [
        {"role": "user", "content": "Write add(a, b)."},
        {"role": "assistant", "content": fenced(ADD)},
    ]
    metadata = {"tests": ADD_TESTS}
    allowed = score_transcript(messages, ["validate_logic"], metadata=metadata, allow_code=True)
    refused = score_transcript(messages, ["validate_logic"], metadata=metadata)
    assert allowed["validate_logic"].value == 1.0
    assert refused["validate_logic"].status == "not_applicable"


def test_the_test_cases_read_from_metadata() -> None:
    assert code_tests({}) is None
    assert code_tests({"tests": ["assert True"]}) == CodeTests(cases=("assert True",))
    with pytest.raises(ValueError, match="cases"):
        code_tests({"tests": {"setup": "x = 1"}})
    with pytest.raises(ValueError, match="at least 64"):
        SandboxLimits(memory_mb=8)
    with pytest.raises(ValueError, match="positive"):
        SandboxLimits(timeout_s=float("nan"))


def test_the_child_script_is_never_imported_by_convsim() -> None:
    probe = "import sys, convsim.metrics as m; m.METRICS.get('validate_logic')(); " + (
        "print('convsim.metrics._sandbox_child' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_reference_answers_of_coding_help_pass_its_tests() -> None:
    pack = load_pack("coding_help", allow_code=True)
    referenced = {c.conversation_id for c in pack.conversations if c.scenario.reference_responses}
    assert len(referenced) == 6 and all("tests" in c.scenario.metadata for c in pack.conversations)
    answered = [c for c in pack.conversations if c.conversation_id in referenced]
    pack = dataclasses.replace(pack, conversations=tuple(answered))
    results = convsim.run_sync(pack, "scripted", metrics=["validate_logic"])
    assert len(results) == 6
    for result in results:
        score = result.scores["validate_logic"]
        assert score.value == 1.0, (result.conversation_id, score)


def test_a_resume_with_another_allow_code_is_refused(tmp_path: Path) -> None:
    """--allow-code decides whether validate_logic scores or is not applicable: a resume
    must not mix the two in one results file."""
    from click.testing import CliRunner

    from convsim.cli import main

    out = tmp_path / "r.jsonl"
    args = ["run", "coding_help", "-m", "scripted", "-n", "1", "--metrics", "validate_logic",
            "-o", str(out), "--no-progress"]  # fmt: skip
    assert CliRunner().invoke(main, args).exit_code == 0
    again = CliRunner().invoke(main, [*args, "--resume", "--allow-code"])
    assert again.exit_code == 2
    assert "allow_code" in again.stderr
