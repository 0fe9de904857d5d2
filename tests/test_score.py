"""Scoring recorded conversations: convsim score and score_transcript."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from convsim import PackError
from convsim.cli import main
from convsim.metrics import read_transcripts, score_transcript

MESSAGES = [
    {"role": "system", "content": "Be helpful."},
    {"role": "user", "content": "My order A-1042 is late."},
    {"role": "assistant", "content": "Sorry! Let me check."},
    {"role": "user", "content": "What was my order number?"},
    {"role": "assistant", "content": "Your order A-1042."},
]
FACTS = [{"key": "order_id", "value": "A-1042", "introduced_in": 1}]
PROBES = [{"turn_id": 2, "facts": ["order_id"]}]


def line(cid: str, last: str, **extra: object) -> str:
    messages = [*MESSAGES[:-1], {"role": "assistant", "content": last}]
    return json.dumps(
        {"conversation_id": cid, "messages": messages, "facts": FACTS, "probes": PROBES, **extra}
    )


def test_score_transcript_from_python() -> None:
    scores = score_transcript(
        MESSAGES, ["context_retention", "response_length"], facts=FACTS, probes=PROBES
    )
    assert scores["context_retention"].value == 1.0
    assert scores["context_retention"].details["curve"] == {"1": 1.0}
    assert scores["response_length"].value == pytest.approx(3.5)
    plain = score_transcript(MESSAGES, ["context_retention"])["context_retention"]
    # no facts declared: the reference-free fallback follows "What was my order number?"
    assert plain.value == 1.0 and plain.details["mode"] == "reference-free"


def test_turns_are_closed_by_assistant_messages() -> None:
    (transcript,) = read_transcripts_from([line("a", "Your order A-1042.")])
    assert transcript.conversation_id == "a"
    assert [t.turn_id for t in transcript.turns] == ["t1", "t2"]
    assert transcript.turns[1].user_message == "What was my order number?"
    assert [m.role for m in transcript.turns[1].messages] == ["system", "user", "assistant", "user"]


def read_transcripts_from(lines: list[str], tmp: Path | None = None) -> list:
    import tempfile

    folder = Path(tempfile.mkdtemp()) if tmp is None else tmp
    path = folder / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return read_transcripts(path)


def test_score_command_prints_writes_and_aggregates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line("good", "Your order A-1042.") + "\n" + line("bad", "No idea.") + "\n")
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        main,
        ["score", str(path), "--metrics", "context_retention,response_length", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "good" in result.stdout and "aggregate" in result.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["conversation_id"] for r in rows] == ["good", "bad"]
    assert [r["scores"]["context_retention"]["value"] for r in rows] == [1.0, 0.0]


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("{not json", "t.jsonl:1: invalid JSON"),
        (
            json.dumps({"conversation_id": "x", "messages": MESSAGES, "colour": 1}),
            "t.jsonl:1: colour: unknown field",
        ),
        (json.dumps({"conversation_id": "x"}), "t.jsonl:1: messages: a list of messages"),
        (
            json.dumps({"conversation_id": "x", "messages": [{"role": "bot", "content": "x"}]}),
            "t.jsonl:1",
        ),
        (
            json.dumps({"conversation_id": "x", "messages": [{"role": "user", "content": "hi"}]}),
            "no assistant message",
        ),
        (
            json.dumps(
                {"conversation_id": "x", "messages": MESSAGES, "facts": [{"key": "k", "value": 1}]}
            ),
            "t.jsonl:1: facts.0.introduced_in",
        ),
    ],
)
def test_bad_transcripts_exit_2_naming_the_line(tmp_path: Path, content: str, where: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content + "\n")
    result = CliRunner().invoke(main, ["score", str(path), "--metrics", "response_length"])
    assert result.exit_code == 2
    assert where in result.stderr and "Traceback" not in result.stderr


def test_unknown_metric_and_duplicate_ids(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line("a", "x") + "\n" + line("a", "y") + "\n")
    result = CliRunner().invoke(main, ["score", str(path), "--metrics", "nope"])
    assert result.exit_code == 2 and "unknown metric 'nope'" in result.stderr
    with pytest.raises(PackError, match=r"t\.jsonl:2: conversation_id: duplicate 'a'"):
        read_transcripts(path)


def test_score_with_a_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import FakeAdapter

    from convsim.adapters import ADAPTERS

    monkeypatch.setitem(
        ADAPTERS._factories,
        "fakejudge",
        lambda config: FakeAdapter(lambda m, p: '{"score": 5, "reason": "ok"}'),
    )
    path = tmp_path / "t.jsonl"
    path.write_text(line("a", "Your order A-1042.") + "\n")
    out = tmp_path / "s.jsonl"
    args = ["score", str(path), "--metrics", "judge:Is it polite?", "--out", str(out)]
    without = CliRunner().invoke(main, args)
    assert without.exit_code == 0
    row = json.loads(out.read_text())
    assert "needs a judge" in row["scores"]["judge:Is it polite?"]["reason"]
    judged = CliRunner().invoke(main, [*args, "--judge", "fakejudge"])
    assert judged.exit_code == 0, judged.output
    row = json.loads(out.read_text())
    assert row["scores"]["judge:Is it polite?"]["value"] == 1.0
    assert row["scores"]["judge:Is it polite?"]["details"]["judge_calls"] == 2
