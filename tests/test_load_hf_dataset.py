"""``convsim load --dataset hf:NAME[:SPLIT] --columns ...``: datasets of the ``datasets``
library (saved folders and data files here: no network), their columns mapped, bad
columns and rows named, the offline cache honoured; and ``--dataset-turns first``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from test_load_cli import invoke, serve_mock, target

from convsim import ConfigError
from convsim.load import ShareGPTSessions
from convsim.load._hf_dataset import parse_columns, read_hf_dataset

datasets = pytest.importorskip("datasets")

CHAT = [
    {"from": "human", "value": "first question"},
    {"from": "gpt", "value": "one two three"},
    {"from": "human", "value": "second question"},
]


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict(
        {
            "question": ["What is a prefix cache?", "Why stream tokens?"],
            "max_out": [7, 3],
            "persona": ["You are terse.", None],
            "chat": [CHAT, CHAT[:1]],
        }
    ).save_to_disk(str(folder))
    return folder


def test_prompt_and_output_length_columns(saved: Path) -> None:
    conversations = read_hf_dataset(
        f"hf:{saved}", "prompt=question,output_len=max_out,system=persona"
    )
    sessions = ShareGPTSessions(tuple(conversations))
    scripts = sorted((sessions.session(i) for i in range(2)), key=lambda s: s.session_id)
    assert [s.turns[0].user for s in scripts] == ["What is a prefix cache?", "Why stream tokens?"]
    assert [s.turns[0].max_tokens for s in scripts] == [7, 3]  # tokens, as given
    assert [s.system for s in scripts] == ["You are terse.", None]
    assert all(len(s.turns) == 1 and s.turns[0].exact_output for s in scripts)


def test_a_conversations_column_keeps_every_turn(saved: Path) -> None:
    conversations = read_hf_dataset(f"hf:{saved}", "conversations=chat")
    assert [c.users for c in conversations] == [
        ("first question", "second question"),
        ("first question",),
    ]
    first = ShareGPTSessions(tuple(conversations), first_turn_only=True)
    assert {len(first.session(i).turns) for i in range(2)} == {1}


def test_a_prompt_column_is_found_without_columns(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "data.jsonl").write_text('{"prompt": "hello"}\n{"prompt": "again"}\n')
    conversations = read_hf_dataset(f"hf:{folder}", None)  # data files load_dataset reads
    assert [c.users for c in conversations] == [("hello",), ("again",)]


def test_splits_of_a_saved_dataset_dict(tmp_path: Path) -> None:
    folder = tmp_path / "dict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"prompt": ["a"]}),
            "test": datasets.Dataset.from_dict({"prompt": ["b"]}),
        }
    ).save_to_disk(str(folder))
    assert read_hf_dataset(f"hf:{folder}:test", None)[0].users == ("b",)
    assert read_hf_dataset(f"hf:{folder}", None)[0].users == ("a",)
    with pytest.raises(ConfigError, match=r"no split 'dev' in .* \(splits: train, test\)"):
        read_hf_dataset(f"hf:{folder}:dev", None)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            "prompt=text",
            "--columns prompt=text: no column 'text' in hf:{saved} (its columns: question, "
            "max_out, persona, chat)",
        ),
        ("prompt=question,output_len=tokens", "no column 'tokens'"),
        (None, "no column named prompt, conversations or messages; name the columns"),
        ("system=persona", "name the column of the user message (prompt=COLUMN)"),
        ("conversations=chat,output_len=max_out", "output_len goes with prompt"),
        ("prompt=persona", "row 1, column 'persona': expected text, got None"),
        ("prompt=question,output_len=question", "row 0, column 'question': expected a whole"),
    ],
)
def test_bad_columns_and_rows_are_named(saved: Path, columns: str | None, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_hf_dataset(f"hf:{saved}", columns)
    assert message.format(saved=saved) in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt", "invalid --columns 'prompt': expected FIELD=COLUMN"),
        ("prompt=a,answer=b", "unknown field 'answer'; fields: prompt, output_len, system"),
        ("prompt=a,prompt=b", "prompt given twice"),
        ("prompt=a,conversations=b", "not both"),
    ],
)
def test_column_spec_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_columns(text)


def test_a_bad_output_length_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "zero"
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "n": [4, 0]}).save_to_disk(str(folder))
    with pytest.raises(ConfigError, match="row 1, column 'n': expected at least 1 token"):
        read_hf_dataset(f"hf:{folder}", "prompt=prompt,output_len=n")


def test_offline_and_not_cached_exits_2_at_once(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "empty-cache"),
    }
    done = subprocess.run(
        [
            sys.executable, "-m", "convsim", "load", "--model", "openai-compatible:m",
            "--no-preflight", "--concurrency", "1", "--max-requests", "1",
            "--dataset", "hf:someone/not-cached",
        ],
        env=env, capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "cannot load 'someone/not-cached'" in done.stderr
    assert "HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_the_extra_the_error_names_it(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets fails
    with pytest.raises(ConfigError, match=r"pip install 'convsim\[datasets\]'"):
        read_hf_dataset(f"hf:{saved}", None)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with start_blocking_portal() as portal, serve_mock(portal, ttft_ms=1, itl_ms=0) as mock:
        yield mock


def test_an_hf_dataset_runs_against_the_mock(server: Any, saved: Path, tmp_path: Path) -> None:
    reqs = tmp_path / "r.jsonl"
    code, _, stderr = invoke(
        *target(server), "--dataset", f"hf:{saved}",
        "--columns", "prompt=question,output_len=max_out", "--repeat", "1",
        "--concurrency", "2", "--no-calibrate", "--requests", str(reqs),
    )  # fmt: skip
    assert code == 0, stderr
    rows = [json.loads(line) for line in reqs.read_text().splitlines()]
    assert sorted(r["output_tokens"] for r in rows) == [3, 7]


def test_first_turns_only_make_single_turn_sessions(server: Any, tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"id": "a", "conversations": CHAT}) + "\n")
    reqs = tmp_path / "r.jsonl"
    code, stdout, stderr = invoke(
        *target(server), "--dataset", str(data), "--dataset-turns", "first",
        "--request-rate", "50", "--arrival", "constant", "--duration", "0.2",
        "--max-schedule-delay-ms", "1000", "--max-loop-lag-ms", "1000",
        "--no-calibrate", "--requests", str(reqs),
    )  # fmt: skip
    assert code == 0, stderr
    rows = [json.loads(line) for line in reqs.read_text().splitlines()]
    assert rows and {r["turn_index"] for r in rows} == {0}
    assert "one request each" in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--columns", "prompt=a"], "--columns goes with --dataset hf:NAME"),
        (["--dataset-turns", "first"], "--dataset-turns goes with --dataset"),
    ],
)
def test_dataset_options_without_their_dataset(args: list[str], message: str) -> None:
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--no-preflight", "--concurrency", "1",
        "--max-requests", "1", *args,
    )  # fmt: skip
    assert code == 2 and message in stderr and "Traceback" not in stderr
