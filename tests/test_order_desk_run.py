"""The bundled order_desk pack run end to end: by the scripted model and against the
mock server (streamed and not), graded by the final state of its order database; a
policy that follows the user blindly fails exactly the scenarios where it should refuse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim import ConversationResult, read_results
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main

SOFT_POLICY = {"od_refund_over_limit", "od_refund_over_limit_two_turns", "od_address_abroad"}
"""The scenarios where the right answer is to refuse what the tools would allow."""


@pytest.fixture(scope="module")
def mock() -> Iterator[Any]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(MockServerConfig())) as server,
    ):
        yield server


def run(tmp_path: Path, *args: str) -> list[ConversationResult]:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, ["run", "order_desk", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return list(read_results(out))


def final_states(results: list[ConversationResult]) -> dict[str, float | None]:
    return {r.conversation_id: r.scores["final_state"].value for r in results}


def test_the_scripted_model_meets_the_final_state_except_where_it_should_refuse(
    tmp_path: Path,
) -> None:
    results = run(tmp_path, "--model", "scripted")
    states = final_states(results)
    assert len(states) == 13
    assert {sid for sid, value in states.items() if value == 0.0} == SOFT_POLICY
    assert all(value == 1.0 for sid, value in states.items() if sid not in SOFT_POLICY)
    # several rounds in one turn: the lookup, then the change it prepared
    two_step = next(r for r in results if r.conversation_id == "od_lookup_then_cancel")
    (turn,) = [t for t in two_step.turns if t.tool_calls]
    assert [c.name for c in turn.tool_calls] == ["look_up_order", "cancel_order"]
    assert [c.round for c in turn.tool_calls] == [0, 1] and turn.tool_rounds == 2
    # a refusal the tools enforce is a tool error the model is told about
    shipped = next(r for r in results if r.conversation_id == "od_cancel_shipped")
    assert [c.error for t in shipped.turns for c in t.tool_calls] == ["precondition"]
    assert shipped.scores["final_state"].value == 1.0  # the database was left as it was


@pytest.mark.parametrize("stream", ["true", "false"])
def test_the_mock_server_drives_the_pack_with_trials(
    mock: Any, tmp_path: Path, stream: str
) -> None:
    results = run(
        tmp_path,
        "--model", "openai-compatible:mock",
        "--model-arg", f"base_url={mock.base_url}",
        "--model-arg", f"stream={stream}",
        "--trials", "4",
    )  # fmt: skip
    assert len(results) == 52
    by_scenario: dict[str, set[float | None]] = {}
    for result in results:
        by_scenario.setdefault(result.scenario_id, set()).add(result.scores["final_state"].value)
    assert {sid for sid, values in by_scenario.items() if values == {0.0}} == SOFT_POLICY
    assert all(values == {1.0} for sid, values in by_scenario.items() if sid not in SOFT_POLICY)
    # tool calls read back as they were written
    for result in results:
        assert ConversationResult.model_validate_json(result.model_dump_json()) == result
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["trials"] == 4 and summary["pass_hat_k"]


def test_a_server_that_is_down_measures_no_tool_use(tmp_path: Path) -> None:
    """Every call refused by the server: the model never acted, so the tool metrics are
    not applicable rather than zero (a zero would blame the model for the outage)."""
    config = MockServerConfig(fault_rate=1.0, faults={"500": 1.0})
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as down,
    ):
        out = tmp_path / "r.jsonl"
        result = CliRunner().invoke(
            main,
            [
                "run", "order_desk", "--limit", "2",
                "--model", "openai-compatible:mock",
                "--model-arg", f"base_url={down.base_url}",
                "--model-arg", "max_retries=0",
                "--out", str(out),
            ],
        )  # fmt: skip
    assert result.exit_code != 0
    for conversation in read_results(out):
        for name in ("tool_call_accuracy", "trajectory_match", "final_state", "tool_errors"):
            score = conversation.scores[name]
            assert score.status == "not_applicable", (name, score)
