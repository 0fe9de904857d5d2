"""``--junit FILE`` on run, report, compare and load: JUnit XML that validates against
the schema GitLab's and Jenkins' readers expect (tests/data/junit.xsd), one test case per
gate and, for run and report, one per conversation."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim import ResultsError, Status, TerminationReason, read_results
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from convsim.results._junit import (
    JUnitCase,
    JUnitFailure,
    JUnitSuite,
    conversation_suite,
    write_junit,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def schema() -> Any:
    return xmlschema.XMLSchema(DATA / "junit.xsd")


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """Ten conversations of four packs; three FAILED for infrastructure reasons."""
    copy = tmp_path / "results.jsonl"
    shutil.copy(DATA / "results_v1.jsonl", copy)
    return copy


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def suites(path: Path, schema: Any) -> dict[str, ET.Element]:
    """The file's suites by name, once it validated; their counts checked."""
    schema.validate(str(path))
    found = {}
    for suite in ET.parse(path).getroot():
        cases = suite.findall("testcase")
        assert int(suite.get("tests", "")) == len(cases)
        assert int(suite.get("failures", "")) == sum(c.find("failure") is not None for c in cases)
        assert int(suite.get("skipped", "")) == sum(c.find("skipped") is not None for c in cases)
        assert len({(c.get("classname"), c.get("name")) for c in cases}) == len(cases)
        found[suite.get("name", "")] = suite
    return found


def failures(suite: ET.Element) -> dict[str, ET.Element]:
    return {
        case.get("name", ""): failure
        for case in suite.findall("testcase")
        if (failure := case.find("failure")) is not None
    }


def test_report_writes_gates_and_conversations(results: Path, schema: Any) -> None:
    out = results.parent / "ci" / "reports" / "junit.xml"  # folders that do not exist yet
    code, stdout, _ = invoke(
        "report", str(results), "--fail-under", "response_length=100",
        "--fail-under", "latency=0", "--min-scored", "8", "--junit", str(out),
    )  # fmt: skip
    assert code == 100  # the file is written before the gate's exit
    assert f"junit: {out} (12 test cases, 4 failed)" in stdout
    found = suites(out, schema)
    assert list(found) == ["gates", "conversations"]
    gates = found["gates"]
    assert [c.get("name") for c in gates.findall("testcase")] == [
        "fail-under response_length>=100",
        "fail-under latency>=0",
    ]
    [failed] = failures(gates).values()
    assert failed.get("message") == (
        "response_length mean 12.22 < 100 (8 of 10 conversations scored, 2 not applicable)"
    )
    assert "passed: fail-under latency>=0: latency mean" in (gates.findtext("system-out") or "")
    conversations = found["conversations"]
    expected = {r.conversation_id for r in read_results(results)}
    assert {c.get("name") for c in conversations.findall("testcase")} == expected
    failed_conversations = failures(conversations)
    assert set(failed_conversations) == {
        "code_parse_duration",
        "cs_late_delivery",
        "geo_capital_france",
    }
    failure = failed_conversations["cs_late_delivery"]
    assert failure.get("type") == "infrastructure_error"
    assert failure.get("message") == (
        "FAILED (infrastructure_error): ServerError: scripted failure (fail_rate=0.2)"
    )
    assert "status_code: 500" in (failure.text or "")
    case = conversations.find("testcase[@name='cs_late_delivery']")
    assert case is not None and case.get("classname") == "convsim.customer_support"


def test_report_without_gates_has_only_conversations(results: Path, schema: Any) -> None:
    out = results.parent / "junit.xml"
    code, _, _ = invoke("report", str(results), "--junit", str(out))
    assert code == 0
    assert list(suites(out, schema)) == ["conversations"]


def test_run_marks_timed_out_conversations_and_the_gate(tmp_path: Path, schema: Any) -> None:
    out, junit = tmp_path / "run.jsonl", tmp_path / "junit.xml"
    code, _, err = invoke(
        "run", "multi_session_memory", "--model", "scripted", "--model-arg", "latency=5",
        "--conversation-timeout", "0.2", "--limit", "2", "--out", str(out),
        "--fail-under", "context_retention=0.5", "--junit", str(junit), "--no-progress",
    )  # fmt: skip
    assert code == 5, err  # the timeouts decide the exit; the report still has the gate
    found = suites(junit, schema)
    timed_out = failures(found["conversations"])
    assert len(timed_out) == 2
    for failure in timed_out.values():
        assert failure.get("type") == TerminationReason.CONVERSATION_TIMEOUT.value
        assert (failure.get("message") or "").startswith("TIMED_OUT (")
    assert len(failures(found["gates"])) == 1


def test_compare_writes_one_case_per_gate(results: Path, schema: Any) -> None:
    out = results.parent / "compare.xml"
    code, _, _ = invoke(
        "compare", str(results), str(results), "--fail-if-worse", "response_length",
        "--fail-under", "exact_match=0.5", "--min-scored", "2", "--junit", str(out),
    )  # fmt: skip
    assert code == 0
    [gates] = suites(out, schema).values()
    assert [c.get("name") for c in gates.findall("testcase")] == [
        "fail-if-worse response_length",
        "fail-under exact_match>=0.5",
    ]
    assert failures(gates) == {}


def test_compare_without_gates_writes_an_empty_suite(results: Path, schema: Any) -> None:
    out = results.parent / "compare.xml"
    code, _, _ = invoke("compare", str(results), str(results), "--junit", str(out))
    assert code == 0
    [gates] = suites(out, schema).values()
    assert gates.get("tests") == "0"


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    config = MockServerConfig(ttft_ms=5, itl_ms=1)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as mock,
    ):
        yield mock


def test_load_writes_its_checks(server: Any, tmp_path: Path, schema: Any) -> None:
    out = tmp_path / "load" / "junit.xml"
    code, _, err = invoke(
        "load", "--model", "openai-compatible:mock-model",
        "--model-arg", f"base_url={server.base_url}", "--no-calibrate",
        "--synthetic", "turns=1,input_tokens=16,output_tokens=4",
        "--rate", "20", "--duration", "0.3", "--max-schedule-delay-ms", "-1",
        "--slo", "e2e_p99<=60s", "--junit", str(out),
    )  # fmt: skip
    assert code == 0, err  # checks without --fail-on-*: reported, not gates
    [load] = suites(out, schema).values()
    assert [c.get("name") for c in load.findall("testcase")] == [
        "valid",
        "meets SLO e2e_p99<=60000ms",
    ]
    found = failures(load)
    assert (found["valid"].get("message") or "").startswith("the run is invalid: ")
    assert "not judged" in (found["meets SLO e2e_p99<=60000ms"].get("message") or "")
    props = {p.get("name"): p.get("value") for p in load.iter("property")}
    assert props == {"model": "openai-compatible:mock-model"}


# -- the writer ---------------------------------------------------------------------------


def test_cancelled_is_skipped_and_the_last_line_counts(results: Path, schema: Any) -> None:
    first, second, *_ = read_results(results)
    cancelled = second.model_copy(
        update={"status": Status.CANCELLED, "termination_reason": TerminationReason.CANCELLED}
    )
    retried = first.model_copy(update={"status": Status.DONE, "error": None})
    suite = conversation_suite([first, cancelled, retried])
    assert [c.name for c in suite.cases] == [second.conversation_id, first.conversation_id]
    assert suite.cases[0].skipped == "cancelled (cancelled)" and suite.cases[0].failure is None
    assert suite.cases[1].failure is None  # the retry passed
    path = write_junit(results.parent / "j.xml", [suite])
    [written] = suites(path, schema).values()
    assert written.get("skipped") == "1"


def test_text_xml_cannot_carry_is_replaced(tmp_path: Path, schema: Any) -> None:
    nasty = 'bad \x00 byte \x1b[31mred\x1b[0m \ud800 <tag> & "quotes"\n'
    suite = JUnitSuite(
        "suite \x07",
        [JUnitCase(nasty, "cls", 1.5, failure=JUnitFailure("t\x01", nasty, nasty))],
        properties={"key": nasty},
        output=nasty,
    )
    path = write_junit(
        tmp_path / "j.xml",
        [suite],
        timestamp=datetime(2026, 1, 31, 12, 0, 0, tzinfo=timezone.utc),
        hostname="ci-runner",
    )
    [written] = suites(path, schema).values()
    assert written.get("timestamp") == "2026-01-31T12:00:00"
    assert written.get("hostname") == "ci-runner" and written.get("time") == "1.500"
    failure = written.find("testcase/failure")
    assert failure is not None
    assert (
        failure.get("message") == 'bad \ufffd byte \ufffd[31mred\ufffd[0m \ufffd <tag> & "quotes"\n'
    )


def test_a_path_that_cannot_be_written_exits_2_before_the_work(results: Path) -> None:
    blocker = results.parent / "a-file"
    blocker.write_text("not a folder")
    for path, why in (
        (blocker / "junit.xml", f"{blocker} is not a folder"),
        (blocker / "deeper" / "junit.xml", f"{blocker} is not a folder"),
        (results.parent, "is a directory"),
    ):
        code, stdout, err = invoke("report", str(results), "--junit", str(path))
        assert code == 2 and "--junit" in err and "Traceback" not in err, err
        assert why in " ".join(err.split())
        assert stdout == ""  # refused before the summary


def test_a_file_that_cannot_be_written_is_a_located_error(tmp_path: Path) -> None:
    folder = tmp_path / "taken"
    (folder / "junit.xml.tmp").mkdir(parents=True)  # where the file is first written
    with pytest.raises(ResultsError, match=r"junit\.xml: cannot write the JUnit file"):
        write_junit(folder / "junit.xml", [])
    assert not (folder / "junit.xml").exists()


def test_every_command_offers_junit() -> None:
    for command in ("run", "report", "compare", "load"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert "--junit FILE" in result.stdout, command
