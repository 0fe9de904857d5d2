"""consistency: the assistant against itself and against what the user said of themself."""

from __future__ import annotations

from typing import Any

import pytest

from convsim.metrics import score_transcript
from convsim.metrics._consistency import Statement, statements


def score(*pairs: tuple[str, str]) -> object:
    messages = []
    for user, assistant in pairs:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return score_transcript(messages, ["consistency"])["consistency"]


def test_the_assistant_contradicting_its_own_age_lowers_the_score() -> None:
    steady = score(
        ("How old are you?", "I'm 25, and I live in Lisbon."),
        ("Nice. Tell me more.", "I am 25 years old and I live in Lisbon, near the river."),
    )
    shifting = score(
        ("How old are you?", "I'm 25, and I live in Lisbon."),
        ("Nice. Tell me more.", "I am 31 years old and I live in Porto."),
    )
    assert steady.value == 1.0  # type: ignore[attr-defined]
    assert shifting.value == 0.0  # type: ignore[attr-defined]
    found = {(c["slot"], c["earlier"], c["stated"]) for c in shifting.details["contradictions"]}  # type: ignore[attr-defined]
    assert found == {("age", "25", "31"), ("home", "lisbon", "porto")}


def test_contradicting_what_the_user_said_of_themself_counts() -> None:
    wrong = score(
        ("Hi, my name is Dana and I have two kids.", "Hello Dana!"),
        ("Can you recap?", "Sure: your name is Maria and you have three kids."),
    )
    right = score(
        ("Hi, my name is Dana and I have two kids.", "Hello Dana!"),
        ("Can you recap?", "Sure: your name is Dana and you have two kids."),
    )
    assert right.value == 1.0 and wrong.value == 0.0  # type: ignore[attr-defined]
    assert {c["about"] for c in wrong.details["contradictions"]} == {"the user"}  # type: ignore[attr-defined]


def test_a_flipped_polarity_is_a_contradiction() -> None:
    flipped = score(
        ("Do you like jazz?", "I love jazz, especially live."),
        ("What about concerts?", "Honestly I don't like jazz at all."),
    )
    assert flipped.value == 0.0  # type: ignore[attr-defined]
    (c,) = flipped.details["contradictions"]  # type: ignore[attr-defined]
    assert (c["slot"], c["earlier"], c["stated"]) == ("likes:jazz", "yes", "no")


def test_the_user_changing_their_mind_is_not_held_against_the_assistant() -> None:
    result = score(
        ("I have two dogs.", "Two dogs, lovely."),
        ("Actually I have three dogs now.", "Great, so you have three dogs."),
    )
    assert result.value == 1.0  # type: ignore[attr-defined]


def test_nothing_stated_twice_is_not_applicable() -> None:
    result: Any = score(("What's the weather?", "Sunny and warm today."))
    assert result.value is None and result.status == "not_applicable"
    assert result.reason.startswith("not applicable: nothing to check:")
    assert result.details["statements"] == 0 and result.details["checks"] == 0


def test_statements_never_restated_are_no_evidence_not_a_consistent_one() -> None:
    # the assistant and the user say things of themselves, but nothing is said twice:
    # nothing was verified, so there is no "consistent" 1.0
    result: Any = score(
        ("I'm 30. I live in Lisbon.", "I'm a chatbot and I love jazz."),
        ("Cool. Any plans?", "I work as a guide, so I'll be busy."),
    )
    assert result.value is None and result.status == "not_applicable"
    assert result.reason.startswith("not applicable: no evidence:")
    assert result.details["checks"] == 0
    assert result.details["statements"] == 3 and result.details["user_statements"] == 2
    # one restatement that agrees is a check, and it gives a value
    checked: Any = score(
        ("I'm 30. I live in Lisbon.", "I'm a chatbot and I love jazz."),
        ("Cool. Any plans?", "Since you live in Lisbon, a walk by the river."),
    )
    assert checked.value == 1.0 and checked.details["checks"] == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My name is Ana.", [Statement("speaker", "name", "ana")]),
        ("I'm 42.", [Statement("speaker", "age", "42")]),
        ("I'm 42 minutes late", []),
        ("I don't have a car", [Statement("speaker", "has:car", "no")]),
        ("My favourite colour is green.", [Statement("speaker", "favorite:colour", "green")]),
    ],
)
def test_what_the_patterns_read(text: str, expected: list[Statement]) -> None:
    assert statements(text) == expected


def test_the_assistant_is_held_to_its_persona_from_the_metadata(tmp_path: object) -> None:
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from convsim.cli import main

    persona = "your persona: i've three dogs.\nyour persona: i live in texas."
    messages = [
        {"role": "user", "content": "hi, do you have pets?"},
        {"role": "assistant", "content": "i have no dogs, i live in ohio."},
        {"role": "user", "content": "and your family?"},
        {"role": "assistant", "content": "i have three dogs and i live in texas."},
    ]
    held = score_transcript(messages, ["consistency"], metadata={"persona": persona})
    contradictions = held["consistency"].details["contradictions"]
    found = {(c["about"], c["slot"], c["earlier"], c["stated"]) for c in contradictions}
    assert found == {
        ("its persona", "count:dog", "3", "0"),
        ("its persona", "home", "texas", "ohio"),
    }
    assert held["consistency"].value == pytest.approx(0.5)  # the second answer keeps to it
    assert score_transcript(messages, ["consistency"])["consistency"].value == pytest.approx(0.0)

    # the same through `convsim score`, the persona in the transcript's metadata
    path = Path(str(tmp_path)) / "persona.jsonl"
    row = {"conversation_id": "p", "metadata": {"persona": persona.splitlines()}}
    path.write_text(json.dumps({**row, "messages": messages}) + "\n")
    out = path.with_suffix(".scores.jsonl")
    result = CliRunner().invoke(
        main, ["score", str(path), "--metrics", "consistency", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["scores"]["consistency"]["value"] == pytest.approx(0.5)


def test_a_description_is_not_another_value() -> None:
    from convsim.metrics._consistency import values_differ

    assert values_differ("lisbon", "porto") and values_differ("3", "0")
    assert not values_differ("lisbon", "a big city")
    assert not values_differ("nurse", "nurse on night shifts")
    described = score(
        ("I live in Lisbon.", "Nice."),
        ("Tips?", "Since you live in a big city, walk."),
    )
    assert described.value == 1.0  # type: ignore[attr-defined]
