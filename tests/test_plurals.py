"""Counts in words agree with their number: "1 conversation", "2 conversations"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import convsim
from convsim._plural import counted
from convsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("simulator", "adapters", "scenarios", "metrics")
NOUNS = (
    "conversations requests turns points scenarios metrics answers hits misses checks "
    "errors calls files lines actors workers sessions trials failures jobs keys rows "
    "attempts times probes facts items documents tasks values samples grades messages "
    "bytes characters words results tokens entries problems"
).split()
COUNT_THEN_NOUN = re.compile(
    r"\{(?P<expr>[^{}]*)\}\s+(?:of\s+\{[^{}]*\}\s+)?(?P<noun>" + "|".join(NOUNS) + r")\b"
    r"(?P<after> (?:a|the)\b)?"
)
"""An f-string's ``{count} nouns`` (or ``{n} of {count} nouns``): the plural whatever
the count. A noun followed by "a" or "the" is a verb ("{name} calls a model")."""


@pytest.mark.parametrize(("count", "words"), [
    (0, "0 conversations"), (1, "1 conversation"), (2, "2 conversations"),
    (1200, "1200 conversations"),
])  # fmt: skip
def test_counted(count: int, words: str) -> None:
    assert counted(count, "conversation") == words


def test_counted_with_another_plural_and_thousands() -> None:
    assert counted(1, "miss", "misses") == "1 miss"
    assert counted(3, "miss", "misses") == "3 misses"
    assert counted(1200, "request", grouped=True) == "1,200 requests"


def test_no_message_writes_a_count_before_a_fixed_plural() -> None:
    found = []
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for match in COUNT_THEN_NOUN.finditer(line):
                    if match["after"] or re.search(r":[^}]*[fge%]$", match["expr"]):
                        continue  # a verb, or a measure with decimals: "1.0 seconds"
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "use convsim._plural.counted:\n" + "\n".join(found)


def test_one_conversation_is_said_in_the_singular(tmp_path: Path) -> None:
    out = tmp_path / "one.jsonl"
    runner = CliRunner()
    words = []
    for args in (
        ["run", "customer_support", "--limit", "1", "--dry-run"],
        ["run", "customer_support", "--limit", "1", "--out", str(out), "--no-progress",
         f"--cache={tmp_path / 'cache'}"],
        ["report", str(out), "--csv", str(tmp_path / "one.csv")],
    ):  # fmt: skip
        done = runner.invoke(main, args)
        assert done.exit_code == 0, done.output
        words.append(done.output)
    said = "\n".join(words)
    assert "1 conversation," in said and "1 conversation;" in said and "(1 conversation)" in said
    assert not re.search(r"\b1 (conversations|turns|hits|misses|answers|calls)\b", said)
    again = runner.invoke(main, ["run", "customer_support", "--limit", "1", "--no-progress",
                                 "--out", str(tmp_path / "two.jsonl"),
                                 f"--cache={tmp_path / 'cache'}"])  # fmt: skip
    cache = next(line for line in again.output.splitlines() if line.startswith("cache:"))
    assert re.match(r"cache: \d+ hits?, 0 misses, 0 answers kept", cache)
    assert convsim.read_results(out)[0].status is convsim.Status.DONE
