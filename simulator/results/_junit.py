"""JUnit XML files, the form GitLab and Jenkins show as test reports.

The shape is Ant's JUnit report, which both read: a ``<testsuites>`` root holding
``<testsuite>`` elements (with their counts, time, timestamp and hostname, their
``<properties>``, ``<system-out>`` and ``<system-err>``), each holding ``<testcase>``
elements with a ``<failure>`` (its type and message) or ``<skipped>``. GitLab shows a
test case's ``classname`` as its suite and keeps the first of two cases with one name,
so names are unique within a class. Text XML 1.0 cannot carry (control characters in a
model's error message) is replaced, so that the file always parses.
"""

from __future__ import annotations

import contextlib
import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .._errors import ResultsError
from .._records import ConversationResult, Status

__all__ = [
    "JUnitCase",
    "JUnitFailure",
    "JUnitSuite",
    "conversation_suite",
    "junit_xml",
    "write_junit",
]

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters outside XML 1.0's ``Char`` production."""


def _text(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)


@dataclass(frozen=True)
class JUnitFailure:
    """Why a test case failed."""

    type: str
    message: str
    details: str = ""
    """The element's text: what a reader needs beyond the message."""


@dataclass(frozen=True)
class JUnitCase:
    """One test case: passed, failed (``failure``) or skipped (``skipped``, a reason)."""

    name: str
    classname: str
    time_s: float = 0.0
    failure: JUnitFailure | None = None
    skipped: str | None = None


@dataclass(frozen=True)
class JUnitSuite:
    """A named group of test cases, with what a reader sees beside them."""

    name: str
    cases: Sequence[JUnitCase]
    properties: Mapping[str, str] = field(default_factory=dict)
    output: str = ""
    """The suite's ``<system-out>``."""


def conversation_suite(
    results: Iterable[ConversationResult],
    *,
    name: str = "conversations",
    properties: Mapping[str, str] | None = None,
) -> JUnitSuite:
    """One test case per conversation of ``results`` (the lines of a results file: a
    conversation recorded twice counts by its last line): failed when it FAILED or
    TIMED_OUT, with its error; skipped when it was CANCELLED (an interrupted run)."""
    cases: dict[str, JUnitCase] = {}
    for result in results:
        cases.pop(result.conversation_id, None)
        cases[result.conversation_id] = _conversation_case(result)
    return JUnitSuite(name, list(cases.values()), properties=dict(properties or {}))


def _conversation_case(result: ConversationResult) -> JUnitCase:
    reason = result.termination_reason.value
    case = JUnitCase(
        name=result.conversation_id,
        classname=f"convsim.{result.pack}",
        time_s=max(result.timings.duration_s, 0.0),
    )
    if result.status is Status.CANCELLED:
        return JUnitCase(case.name, case.classname, case.time_s, skipped=f"cancelled ({reason})")
    if result.status not in (Status.FAILED, Status.TIMED_OUT):
        return case
    error = result.error
    message = f"{result.status.value} ({reason})"
    details = [f"status: {result.status.value}", f"termination_reason: {reason}"]
    if error is not None:
        message = f"{result.status.value} ({reason}): {error.type}: {error.message}"
        details.append(f"error: {error.type}: {error.message}")
        for label, value in (
            ("turn", error.turn_id),
            ("side", error.side),
            ("attempts", error.attempts),
            ("status_code", error.status_code),
        ):
            if value is not None:
                details.append(f"{label}: {value}")
    failure = JUnitFailure(type=reason, message=message, details="\n".join(details))
    return JUnitCase(case.name, case.classname, case.time_s, failure=failure)


def _seconds(value: float) -> str:
    """A duration as ``xs:decimal``: no exponent."""
    return f"{max(value, 0.0):.3f}"


def junit_xml(
    suites: Sequence[JUnitSuite], *, timestamp: datetime, hostname: str
) -> ET.ElementTree:
    """The JUnit document of ``suites``, stamped with ``timestamp`` (shown in UTC, without
    a zone, as the format asks) and ``hostname``."""
    stamp = timestamp.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    root = ET.Element("testsuites")
    for index, suite in enumerate(suites):
        failures = sum(c.failure is not None for c in suite.cases)
        skipped = sum(c.failure is None and c.skipped is not None for c in suite.cases)
        element = ET.SubElement(
            root,
            "testsuite",
            {
                "name": _text(suite.name),
                "tests": str(len(suite.cases)),
                "failures": str(failures),
                "errors": "0",
                "skipped": str(skipped),
                "time": _seconds(sum(c.time_s for c in suite.cases)),
                "timestamp": stamp,
                "hostname": _text(hostname) or "localhost",
                "id": str(index),
                "package": _text(suite.name),
            },
        )
        properties = ET.SubElement(element, "properties")
        for key, value in suite.properties.items():
            ET.SubElement(properties, "property", {"name": _text(key), "value": _text(value)})
        for case in suite.cases:
            _case_element(element, case)
        ET.SubElement(element, "system-out").text = _text(suite.output)
        ET.SubElement(element, "system-err").text = ""
    ET.indent(root)
    return ET.ElementTree(root)


def _case_element(parent: ET.Element, case: JUnitCase) -> None:
    element = ET.SubElement(
        parent,
        "testcase",
        {
            "name": _text(case.name),
            "classname": _text(case.classname),
            "time": _seconds(case.time_s),
        },
    )
    if case.failure is not None:
        failure = ET.SubElement(
            element,
            "failure",
            {"type": _text(case.failure.type), "message": _text(case.failure.message)},
        )
        failure.text = _text(case.failure.details)
    elif case.skipped is not None:
        ET.SubElement(element, "skipped", {"message": _text(case.skipped)})


def write_junit(
    path: str | Path,
    suites: Sequence[JUnitSuite],
    *,
    timestamp: datetime | None = None,
    hostname: str | None = None,
) -> Path:
    """Write ``suites`` to ``path`` as JUnit XML, creating its folder when missing; the
    file is replaced whole, never left half-written.

    Raises:
        ResultsError: the file or its folder cannot be written.
    """
    target = Path(path)
    document = junit_xml(
        suites,
        timestamp=timestamp or datetime.now(timezone.utc),
        hostname=hostname or socket.gethostname(),
    )
    tmp = target.with_name(target.name + ".tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as fh:
            document.write(fh, encoding="utf-8", xml_declaration=True)
            fh.write(b"\n")
        tmp.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ResultsError(f"{target}: cannot write the JUnit file: {exc.strerror}") from None
    return target
