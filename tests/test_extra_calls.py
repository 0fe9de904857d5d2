"""A task's ``get_model_response`` with a prompt of its own: one more call to the model
under test, through the run's adapter (its budgets, token caps, retries and response
cache), recorded on the turn and counted in the conversation's usage; a failed call
fails the task's scores with its cause; its own prompt, a resume and a re-scoring of
recorded turns call no model."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FakeAdapter

import convsim
from convsim import ConfigError, Simulator
from convsim._errors import BadRequest
from convsim._records import ExtraCall, TurnRecord, TurnStatus
from convsim._types import Message, Usage
from convsim.adapters import Budgets, ResponseCache
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.lm_eval import ExtraCallFailed, MultiTurnTask
from convsim.results import turn_rows

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
EXTRA = "In one short sentence, what did you just suggest?"


class AskingTask(MultiTurnTask):
    """Asks the model, at its first turn, the turn's own prompt (no call) and a prompt
    of its own twice (one call), and reports the extra answer's length."""

    DATASET_PATH = None
    TURN_CONFIG_PATH = None

    def process_turn(
        self,
        doc: Mapping[str, Any],
        turn_config: Mapping[str, Any],
        conversation_history: Sequence[Mapping[str, str]],
        turn_index: int,
    ) -> dict[str, Any]:
        turn = super().process_turn(doc, turn_config, conversation_history, turn_index)
        if turn_index == 0:
            again = self.get_model_response(turn["prompt"], turn_config)
            assert again == turn["response"]  # its own prompt: the answer it gave
            summary = self.get_model_response(EXTRA, turn_config)
            assert self.get_model_response(EXTRA, turn_config) == summary
            turn["metrics"]["summary_words"] = float(len(summary.split()))
        return turn

    def aggregation(self) -> dict[str, Any]:
        return {"summary_words": "mean", "response_length": "mean"}

    def higher_is_better(self) -> dict[str, bool]:
        return {"summary_words": True, "response_length": True}


def _files(folder: Path, scenarios: int = 1) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    docs = [
        {
            "scenario_id": f"trip_{i}",
            "scenario_description": f"planning trip number {i} to Lisbon",
            "variables": {"city": "Lisbon"},
        }
        for i in range(scenarios)
    ]
    (folder / "scenarios.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    flows = {
        "default": {
            "turns": [
                {"turn_id": "ask", "role": "assistant", "prompt_template": "Plan {scenario}."},
                {
                    "turn_id": "more",
                    "role": "assistant",
                    "prompt_template": "And what should I pack for {city}?",
                },
            ]
        }
    }
    (folder / "turn_configs.yml").write_text(yaml.safe_dump(flows))
    return {
        "dataset_path": str(folder / "scenarios.jsonl"),
        "turn_config_path": str(folder / "turn_configs.yml"),
    }


@pytest.fixture
async def mock() -> AsyncIterator[MockModelServer]:
    # no cached-token counts: the lines' versions here are those of extra calls alone
    config = MockServerConfig(ttft_ms=0, itl_ms=0, prefix_cache=False)
    async with MockModelServer(config) as server:
        yield server


def _requests(server: MockModelServer) -> int:
    return int(server.statistics().by_endpoint.get(CHAT, 0))


def _model(server: MockModelServer) -> dict[str, Any]:
    return {
        "model": "openai-compatible:mock-model",
        "model_args": {"base_url": server.base_url},
        "preflight": False,
        "metrics": [],
    }


async def _run(pack: Any, sink: Any = None, **settings: Any) -> list[convsim.ConversationResult]:
    budgets = settings.pop("budgets", None)
    async with Simulator(budgets=budgets, **settings) as sim:
        return [r async for r in sim.run(pack, sink=sink)]


def _summed(usages: Sequence[Usage]) -> Usage:
    total = Usage()
    for usage in usages:
        total = total + usage
    return total


async def test_a_prompt_of_its_own_is_one_call_through_the_runs_adapter(
    mock: MockModelServer, tmp_path: Path
) -> None:
    budgets = Budgets()
    pack = AskingTask(_files(tmp_path)).to_pack()
    (result,) = await _run(pack, budgets=budgets, **_model(mock))
    assert result.status.value == "DONE"
    assert _requests(mock) == 3  # two turns, one extra call (asked twice, made once)
    assert sum(s.requests for s in budgets.statistics()) == 3  # the run's rate budget
    first, second = result.turns
    (call,) = first.extra_calls
    assert second.extra_calls == ()
    assert call.prompt == EXTRA and call.error is None and not call.cached
    assert call.response and call.attempts == 1 and call.latency_s is not None
    assert call.usage is not None and call.usage.total_tokens > 0
    # the tokens of every call count, the extra one too
    assert result.usage == _summed([first.usage, second.usage, call.usage])  # type: ignore[list-item]
    score = result.scores["task:summary_words"]
    assert score.status == "ok" and score.value == len(call.response.split())
    # kept in the results line, and read back the same
    line = json.loads(result.model_dump_json())
    assert line["turns"][0]["extra_calls"][0]["prompt"] == EXTRA
    assert "extra_calls" not in line["turns"][1]  # omitted when there are none
    assert convsim.ConversationResult.model_validate_json(result.model_dump_json()) == result
    # the turn rows (CSV, frames) say so, and add up to the conversation's usage
    rows = list(turn_rows(result, "r.jsonl"))
    assert [r["extra_calls"] for r in rows] == [1, 0]
    assert rows[0]["extra_prompt_tokens"] == call.usage.prompt_tokens
    assert rows[1]["extra_prompt_tokens"] is None
    for side in ("prompt_tokens", "completion_tokens"):
        total = sum(r[side] + (r[f"extra_{side}"] or 0) for r in rows)
        assert total == getattr(result.usage, side)


async def test_only_a_line_with_extra_calls_is_written_as_schema_3(
    mock: MockModelServer, tmp_path: Path
) -> None:
    """An older convsim (which reads up to 2) reads every line without extra calls, and
    is told to upgrade by one with them rather than failing on an unknown field."""
    (result,) = await _run(AskingTask(_files(tmp_path)).to_pack(), **_model(mock))
    assert json.loads(result.model_dump_json())["schema_version"] == 6  # the answers' ids
    result = type(result).model_validate(  # as from a server that sends no ids
        {
            **result.model_dump(exclude={"schema_version", "turns"}),
            "turns": tuple(dataclasses.replace(t, request_ids=()) for t in result.turns),
        }
    )
    assert json.loads(result.model_dump_json())["schema_version"] == 3
    plain = result.model_copy(
        update={"turns": tuple(dataclasses.replace(t, extra_calls=()) for t in result.turns)}
    )
    assert json.loads(plain.model_dump_json())["schema_version"] == 2


async def test_the_extra_call_has_the_turns_history_and_settings(tmp_path: Path) -> None:
    adapter = FakeAdapter(lambda messages, params: f"answer to {messages[-1].content}")
    pack = AskingTask(_files(tmp_path)).to_pack()
    (result,) = await _run(pack, model=adapter, max_tokens=7, metrics=[])
    assert len(adapter.calls) == 3
    (turn_messages, turn_params), _, (extra_messages, extra_params) = adapter.calls
    assert extra_messages[:-1] == turn_messages[:-1]
    assert extra_messages[-1] == Message(role="user", content=EXTRA)
    assert extra_params == turn_params and extra_params.max_tokens == 7  # the token cap
    assert result.turns[0].extra_calls[0].response == f"answer to {EXTRA}"


async def test_a_second_run_with_the_cache_calls_no_model(
    mock: MockModelServer, tmp_path: Path
) -> None:
    pack = AskingTask(_files(tmp_path / "task")).to_pack()
    cache = ResponseCache(tmp_path / "cache")
    (first,) = await _run(pack, cache=cache, **_model(mock))
    assert _requests(mock) == 3
    (second,) = await _run(pack, cache=cache, **_model(mock))
    assert _requests(mock) == 3  # nothing asked the second time
    (call,) = second.turns[0].extra_calls
    assert call.cached and call.latency_s is None
    assert call.response == first.turns[0].extra_calls[0].response
    assert second.usage == Usage()  # a cached answer cost nothing
    assert second.scores["task:summary_words"] == first.scores["task:summary_words"]


async def test_a_failed_extra_call_fails_the_tasks_scores_with_its_cause(tmp_path: Path) -> None:
    def behave(messages: Sequence[Message], params: Any) -> Any:
        if messages[-1].content == EXTRA:
            return BadRequest("the model refuses this prompt", status_code=400, attempts=1)
        return "fine"

    adapter = FakeAdapter(behave)
    pack = AskingTask(_files(tmp_path)).to_pack()
    (result,) = await _run(pack, model=adapter, metrics=["response_length"])
    assert result.status.value == "DONE" and result.error is None  # the conversation ran
    assert len(adapter.calls) == 3  # the failed call is not asked again by the next metric
    for name in ("task:summary_words", "task:response_length"):
        score = result.scores[name]
        assert score.status == "failed"
        assert "ExtraCallFailed" in (score.reason or "")
        assert "BadRequest: the model refuses this prompt" in (score.reason or "")
    assert result.scores["response_length"].status == "ok"  # other metrics are untouched
    (call,) = result.turns[0].extra_calls
    assert call.response is None and call.error is not None
    assert (call.error.type, call.error.status_code) == ("BadRequest", 400)


async def test_a_resume_does_not_call_again_for_a_finished_conversation(
    mock: MockModelServer, tmp_path: Path
) -> None:
    pack = AskingTask(_files(tmp_path / "task", scenarios=2)).to_pack()
    out = tmp_path / "results.jsonl"
    async with Simulator(**_model(mock)) as sim:
        first = [r async for r in sim.run(pack, sink=convsim.JsonlSink(out), limit=1)]
    assert len(first) == 1 and len(first[0].turns[0].extra_calls) == 1
    assert _requests(mock) == 3
    async with Simulator(**_model(mock)) as sim:
        rest = [r async for r in sim.run(pack, sink=convsim.JsonlSink(out, resume=True))]
    assert [r.conversation_id for r in rest] == ["trip_1"]
    assert _requests(mock) == 6  # the second conversation's own: two turns and one extra
    kept = {r.conversation_id: r for r in convsim.read_results(out)}
    assert kept["trip_0"].turns[0].extra_calls == first[0].turns[0].extra_calls


def _recorded(prompt: str, extra: tuple[ExtraCall, ...] = ()) -> TurnRecord:
    return TurnRecord(
        conversation_id="trip_0",
        turn_index=0,
        turn_id="ask",
        role="assistant",
        status=TurnStatus.COMPLETED,
        prompt=prompt,
        user_message=prompt,
        messages=(Message(role="user", content=prompt),),
        response="Walk the Alfama.",
        extra_calls=extra,
    )


def test_scoring_recorded_turns_reads_their_extra_calls_and_calls_no_model(
    tmp_path: Path,
) -> None:
    task = AskingTask(_files(tmp_path))
    pack = task.to_pack()
    (conversation,) = pack.conversations
    origin = conversation.origin
    prompt = conversation.render(conversation.flow.turns[0], [])
    recorded = ExtraCall(prompt=EXTRA, response="I suggested a walk.")
    results = origin.results(conversation, [_recorded(prompt, (recorded,))])
    assert isinstance(results, dict) and results["summary_words"] == 4.0
    failed = ExtraCall(prompt=EXTRA, error=convsim.ErrorInfo(type="Timeout", message="slow"))
    with pytest.raises(ExtraCallFailed, match="Timeout: slow"):
        origin.results(conversation, [_recorded(prompt, (failed,))])
    # without a recorded answer there is no model to ask: it says so
    with pytest.raises(ConfigError, match="scored without calling a model"):
        origin.results(conversation, [_recorded(prompt)])
