"""Used as a library, convsim prints nothing unless the application configures logging."""

from __future__ import annotations

import subprocess
import sys

# A run whose conversations all fail, plus an error event from library code: the most
# convsim would ever want to say.
RUN = """
import convsim
from convsim._log import get_logger
results = convsim.run_sync(
    "customer_support", "scripted", model_args={"fail_rate": 1.0}, limit=3
)
assert [r.status.value for r in results] == ["FAILED"] * 3
get_logger("convsim.runtime").error("library_error_event", detail="x")
"""


def _run(prelude: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", prelude + RUN], capture_output=True, text=True, check=True
    )


def test_nothing_is_printed_when_the_application_configures_no_logging() -> None:
    done = _run("")
    assert done.stdout == "" and done.stderr == ""


def test_standard_library_logging_receives_the_events() -> None:
    done = _run("import logging\nlogging.basicConfig(level=logging.INFO)\n")
    assert done.stdout == ""
    assert "INFO:convsim.runtime:event='run_started'" in done.stderr
    assert "pack='customer_support'" in done.stderr
    assert "ERROR:convsim.runtime:event='library_error_event' detail='x'" in done.stderr
    assert "conversation_finished" not in done.stderr  # a debug event, below INFO


def test_a_structlog_configuration_takes_the_events() -> None:
    prelude = (
        "import structlog, sys\n"
        "structlog.configure(processors=[structlog.processors.JSONRenderer()],"
        " logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))\n"
    )
    done = _run(prelude)
    assert done.stdout == ""
    assert '"event": "run_started"' in done.stderr
    assert '"event": "library_error_event"' in done.stderr
