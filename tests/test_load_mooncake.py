"""Mooncake-format traces: prompts sharing exactly the prefix blocks their hash ids
declare, replayed at their timestamps (ms), and bad lines named."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from anyio.from_thread import start_blocking_portal
from test_load_cli import invoke, serve_mock

from convsim import ConfigError
from convsim.load import LoadPlan, TokenText
from convsim.load._mooncake import (
    MooncakeSessions,
    is_mooncake,
    read_mooncake,
)
from convsim.load._offered import SessionRequests, session_requests
from convsim.load._plan import _workload


def trace_file(path: Path, *requests: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def req(ts: float, hash_ids: list[int], input_length: int, output_length: int = 8) -> dict:
    return {
        "timestamp": ts,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": hash_ids,
    }


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(("tokens_per_word", "words_per_block"), [(1.0, 512), (1.25, 410)])
def test_requests_share_exactly_their_common_blocks(
    tmp_path: Path, tokens_per_word: float, words_per_block: int
) -> None:
    path = trace_file(
        tmp_path / "t.jsonl",
        req(0, [1, 2, 3], 3 * 512),
        req(10, [1, 2, 4], 3 * 512),
        req(20, [5, 2, 3], 3 * 512),
    )
    sessions = MooncakeSessions(read_mooncake(path), text=TokenText(tokens_per_word))
    a, b, c = (sessions.session(i).turns[0].user.split() for i in range(3))  # type: ignore[union-attr]
    assert len(a) == len(b) == 3 * words_per_block
    # two blocks in common: exactly 2 x 512 tokens of the same text, then different text
    assert common_prefix(a, b) == 2 * words_per_block
    assert a[2 * words_per_block :] != b[2 * words_per_block :]
    # a different first block: no common prefix, though later ids are the same
    assert common_prefix(a, c) == 0


def test_a_block_is_the_same_text_wherever_its_id_is(tmp_path: Path) -> None:
    path = trace_file(
        tmp_path / "t.jsonl",
        req(0, [7, 8], 1000),  # 512 + 488 tokens: the last block cut to what is left
        req(5, [7], 300),  # the first 300 tokens of block 7
    )
    sessions = MooncakeSessions(read_mooncake(path))
    long, short = (sessions.session(i).turns[0].user.split() for i in range(2))  # type: ignore[union-attr]
    assert len(long) == 1000 and len(short) == 300
    assert long[:300] == short
    script = sessions.session(0)
    assert script.turns[0].max_tokens == 8 and script.turns[0].input_tokens == 1000
    assert len(script.turns) == 1 and script.system is None
    again = MooncakeSessions(read_mooncake(path)).session(0).turns[0].user
    assert again == script.turns[0].user  # drawn from the id and the seed alone
    other_seed = MooncakeSessions(read_mooncake(path), seed=1).session(0).turns[0].user
    assert other_seed != script.turns[0].user


def test_the_schedule_is_the_timestamps_in_ms(tmp_path: Path) -> None:
    path = trace_file(
        tmp_path / "t.jsonl", req(1000, [1], 10), req(1500, [2], 20, 4), req(4000, [3], 30)
    )
    schedule = read_mooncake(path).schedule()
    assert np.allclose(schedule.offsets, [0.0, 0.5, 3.0])
    assert schedule.input_tokens == (10, 20, 30) and schedule.output_tokens == (8, 4, 8)
    assert is_mooncake(path)
    plain = tmp_path / "plain.txt"
    plain.write_text("0\n0.5\n")
    assert not is_mooncake(plain)
    assert session_requests(MooncakeSessions(read_mooncake(path))) == SessionRequests(True, 1.0)


def test_block_size_sets_the_blocks(tmp_path: Path) -> None:
    path = trace_file(tmp_path / "t.jsonl", req(0, [1, 2, 3], 600))
    sessions = MooncakeSessions(read_mooncake(path, block_size=256))
    assert len(sessions.session(0).turns[0].user.split()) == 600  # type: ignore[union-attr]
    with pytest.raises(
        ConfigError, match=r"t.jsonl:1: hash_ids: 3 blocks, but input_length 600 takes 2 blocks"
    ):
        read_mooncake(path)  # 512 a block: two blocks


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([req(5, [1], 10), req(4, [2], 10)], ":2: timestamp: 4 is earlier than the line before"),
        ([{"timestamp": 0, "input_length": 10, "hash_ids": [1]}], ":1: output_length: Field"),
        ([req(0, [-1], 10)], ":1: hash_ids.0: Input should be greater than or equal to 0"),
        ([req(0, [], 10)], ":1: hash_ids: List should have at least 1 item"),
        ([req(0, [1], 0)], ":1: input_length: Input should be greater than or equal to 1"),
        ([req(0, [1, 2], 10)], "takes 1 block of 512 tokens (is --block-size the trace's?)"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, lines: list[dict], message: str) -> None:
    path = trace_file(tmp_path / "t.jsonl", *lines)
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_mooncake(path)


def test_a_broken_line_and_an_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(req(0, [1], 10)) + "\n{oops\n")
    with pytest.raises(ConfigError, match=r"t.jsonl:2: line: Invalid JSON"):
        read_mooncake(path)
    path.write_text("# nothing\n\n")
    with pytest.raises(ConfigError, match="holds no requests"):
        read_mooncake(path)


def test_the_trace_brings_the_workload(tmp_path: Path) -> None:
    path = trace_file(tmp_path / "t.jsonl", req(0, [1], 10))
    assert isinstance(_workload(LoadPlan(trace=str(path)), None), MooncakeSessions)
    with pytest.raises(ConfigError, match="brings its requests' prompts: drop --synthetic"):
        _workload(LoadPlan(trace=str(path), synthetic="input_tokens=1,output_tokens=1"), None)
    plain = tmp_path / "plain.txt"
    plain.write_text("0\n")
    with pytest.raises(ConfigError, match="--block-size goes with a Mooncake trace"):
        _workload(LoadPlan(trace=str(plain), block_size=16), None)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with start_blocking_portal() as portal, serve_mock(portal, ttft_ms=1, itl_ms=0) as mock:
        yield mock


def test_a_mooncake_trace_replays_against_the_mock(server: Any, tmp_path: Path) -> None:
    path = trace_file(
        tmp_path / "t.jsonl",
        req(10_000, [1, 2], 600, 5),
        req(10_050, [1, 3], 700, 6),
        req(10_100, [4], 100, 7),
        req(10_150, [1, 2], 1024, 3),
    )
    reqs, out = tmp_path / "r.jsonl", tmp_path / "r.json"
    code, stdout, stderr = invoke(
        "--model", "openai-compatible:mock-model", "--model-arg", f"base_url={server.base_url}",
        "--trace", str(path), "--no-calibrate", "--max-schedule-delay-ms", "1000",
        "--max-loop-lag-ms", "1000", "--requests", str(reqs), "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    rows = sorted(
        (json.loads(line) for line in reqs.read_text().splitlines()), key=lambda r: r["session_id"]
    )
    assert [r["session_id"] for r in rows] == ["r0", "r1", "r2", "r3"]
    assert [r["scheduled_s"] for r in rows] == pytest.approx([0.0, 0.05, 0.1, 0.15])
    assert [r["output_tokens"] for r in rows] == [5, 6, 7, 3]
    result = json.loads(out.read_text())
    assert result["requests"]["completed"] == 4
    assert "requests/s" in stdout


def test_block_size_without_a_mooncake_trace_exits_2(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("0\n0.1\n")
    code, _, stderr = invoke(
        "--model", "openai-compatible:m", "--no-preflight", "--trace", str(plain),
        "--block-size", "64",
    )  # fmt: skip
    assert code == 2 and "--block-size goes with a Mooncake trace" in stderr
    assert "Traceback" not in stderr
