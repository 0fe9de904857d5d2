"""``convsim lm-eval`` run in the test process, for the command-line tests of lm-eval.

lm-eval's command line indexes every one of its ~14,000 built-in task files before it
runs anything (10-20 s). The tests name only their own tasks (``--include_path``), so
here lm-eval indexes only those; everything else is the real command: convsim's
``lm-eval`` command, lm-eval's argument parsing, evaluation and output.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner, Result

from convsim.cli import main

COMMAND_ENVIRONMENT = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "LM_HARNESS_CACHE_PATH")
"""What ``convsim lm-eval`` sets in os.environ when it is not set already."""


def invoke_lm_eval(monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    """``convsim lm-eval ARGS``, in process; its output and exit code."""
    from lm_eval import tasks

    class OwnTasksOnly(tasks.TaskManager):  # type: ignore[misc]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **{**kw, "include_defaults": False})

    monkeypatch.setattr(tasks, "TaskManager", OwnTasksOnly)
    for name in COMMAND_ENVIRONMENT:
        # unset, as in a fresh shell, and put back as it was after the test: the command
        # sets them for the rest of the process
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return CliRunner().invoke(main, ["lm-eval", *args])
