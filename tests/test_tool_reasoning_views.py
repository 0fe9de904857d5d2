"""Tool calls and reasoning as results show them: the HTML transcript view (reasoning
collapsed, each tool call with its arguments, result, error kind and latency, TTFOT
beside TTFT) and the columns of ``convsim.results.load``."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import convsim
from convsim._records import ConversationResult, ToolCallRecord, TurnTimings
from convsim.results import load
from convsim.results._html import TURN_FIELDS, _detail, render_html
from convsim.results._sinks import result_line

THOUGHT = "They want order A-1001; look it up first."
LOOKUP = ToolCallRecord(0, "call_0_0", "look_up_order", '{"order_id": "A-1001"}', '{"total": 42}')
REFUND = ToolCallRecord(
    1, "call_0_1", "refund", '{"order_id": "A-1001"', "arguments are not JSON",
    error="invalid_arguments", latency_s=0.000123,
)  # fmt: skip


@pytest.fixture(scope="module")
def plain() -> ConversationResult:
    (result,) = convsim.run_sync("customer_support", "scripted", limit=1, metrics=[])
    return result


def with_tools(plain: ConversationResult) -> ConversationResult:
    first, *rest = plain.turns
    assert first.timings is not None
    used = dataclasses.replace(
        first,
        reasoning=THOUGHT,
        reasoning_tokens=12,
        tool_calls=(LOOKUP, REFUND),
        tool_rounds=2,
        tool_round_limit=True,
        timings=TurnTimings(
            **{**dataclasses.asdict(first.timings), "ttft_s": 0.25, "ttfot_s": 0.75}
        ),
    )
    return plain.model_copy(update={"turns": [used, *rest]})


def turns_shown(result: ConversationResult) -> list[dict[str, Any]]:
    """The turns as the page's transcript view gets them."""
    return [dict(zip(TURN_FIELDS, t, strict=True)) for t in _detail(result)["turns"]]


def test_the_transcript_view_carries_reasoning_tool_calls_and_ttfot(
    plain: ConversationResult,
) -> None:
    first, second = turns_shown(with_tools(plain))[:2]
    assert first["reasoning"] == THOUGHT and first["reasoning_tokens"] == 12
    assert (first["ttft_s"], first["ttfot_s"]) == (0.25, 0.75)
    assert first["tools"] == [
        [0, "look_up_order", '{"order_id": "A-1001"}', '{"total": 42}', None, None],
        [1, "refund", '{"order_id": "A-1001"', "arguments are not JSON", "invalid_arguments",
         0.000123],
    ]  # fmt: skip
    assert first["tool_round_limit"] is True
    assert second["reasoning"] is None and second["tools"] == []


def test_a_plain_run_carries_no_invented_reasoning_or_tools(plain: ConversationResult) -> None:
    for turn in turns_shown(plain):
        assert turn["reasoning"] is None and turn["reasoning_tokens"] is None
        assert turn["tools"] == [] and turn["tool_round_limit"] is False
        assert turn["ttfot_s"] == turn["ttft_s"]  # no reasoning: the first token is output


def test_results_load_has_tool_and_reasoning_columns(
    plain: ConversationResult, tmp_path: Path
) -> None:
    path = tmp_path / "r.jsonl"
    other = plain.model_copy(update={"conversation_id": "other"})
    path.write_bytes(result_line(with_tools(plain)) + result_line(other))
    frames = load(path)
    used, bare = frames.conversations.to_dict("records")
    assert (used["tool_calls"], used["tool_errors"], used["tool_rounds"]) == (2, 1, 2)
    assert (used["reasoning_turns"], used["reasoning_tokens"]) == (1, 12)
    assert (bare["tool_calls"], bare["tool_errors"], bare["tool_rounds"]) == (0, 0, 0)
    assert bare["reasoning_turns"] == 0 and _missing(bare["reasoning_tokens"])
    turns = frames.turns[frames.turns["conversation_id"] == plain.conversation_id]
    assert len(turns) == len(plain.turns)
    first = turns.iloc[0]
    assert (first["tool_calls"], first["tool_errors"], first["tool_rounds"]) == (2, 1, 2)
    assert bool(first["tool_round_limit"]) and bool(first["has_reasoning"])
    assert first["reasoning_tokens"] == 12
    assert (first["ttft_s"], first["ttfot_s"]) == (0.25, 0.75)
    rest = turns.iloc[1:]
    assert not rest["has_reasoning"].any() and (rest["tool_calls"] == 0).all()


def _missing(value: Any) -> bool:
    return value is None or value != value  # pandas gives NaN for None in a number column


def test_the_page_draws_them_and_its_script_parses(
    plain: ConversationResult, tmp_path: Path
) -> None:
    page = render_html([with_tools(plain)], title="t")
    # reasoning folded away, each call and its result as messages, TTFOT beside TTFT
    assert 'el("details", null, "reasoning")' in page and '"msg toolcall"' in page
    assert '"TTFOT "' in page and '"msg tool err"' in page
    if shutil.which("node") is None:
        return
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert scripts
    source = tmp_path / "page.js"
    source.write_text("\n".join(scripts), encoding="utf-8")
    checked = subprocess.run(
        ["node", "--check", str(source)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr
