"""Judges see a reasoning model's answers only, unless asked (--judge-sees-reasoning):
then each answer is preceded by its reasoning, marked, and the prompt (so the response
cache's key) differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FakeAdapter, write_pack

import convsim
from convsim._errors import ConfigError
from convsim._records import TurnRecord, TurnStatus
from convsim._types import GenerationParams, Message
from convsim.adapters._cache import cache_key
from convsim.cli import main
from convsim.metrics import METRICS
from convsim.metrics._judge import REASONING_NOTE, JudgeSettings, RubricJudgeMetric
from convsim.results._sinks import manifest_path
from convsim.scenarios import load_pack

pytestmark = pytest.mark.anyio

THOUGHT = "The user is upset; 91 = 7 * 13."
ANSWER = "91 is not prime."
GRADE = '{"score": 5, "reason": "fine"}'


def judge() -> FakeAdapter:
    return FakeAdapter(lambda messages, params: GRADE, name="judge-model")


def record(*, reasoning: str | None = THOUGHT, history: tuple[Message, ...] = ()) -> TurnRecord:
    return TurnRecord(
        conversation_id="c",
        turn_index=0,
        turn_id="t0",
        role="assistant",
        status=TurnStatus.COMPLETED,
        user_message="Is 91 prime?",
        messages=(*history, Message(role="user", content="Is 91 prime?")),
        response=ANSWER,
        reasoning=reasoning,
    )


async def rubric_prompt(turn: TurnRecord, *, sees: bool) -> str:
    grader = judge()
    metric = RubricJudgeMetric("judge:right?", "right?", JudgeSettings(grader, sees_reasoning=sees))
    scorer = metric.scorer(None)  # type: ignore[arg-type]
    await scorer.update(turn)
    assert (await scorer.result()).value == 1.0
    ((messages, _),) = grader.calls
    return messages[0].content


async def test_a_judge_sees_the_answer_only_by_default() -> None:
    prompt = await rubric_prompt(record(), sees=False)
    assert ANSWER in prompt
    assert THOUGHT not in prompt and "<reasoning>" not in prompt and REASONING_NOTE not in prompt


async def test_asked_to_the_judge_sees_the_reasoning_before_the_answer_marked() -> None:
    earlier = Message(role="assistant", content="Hello.", reasoning="Greet them.")
    prompt = await rubric_prompt(
        record(history=(Message(role="user", content="hi"), earlier)), sees=True
    )
    assert prompt.startswith(REASONING_NOTE)
    assert f"<reasoning>\n{THOUGHT}\n</reasoning>\n{ANSWER}" in prompt
    assert "assistant: <reasoning>\nGreet them.\n</reasoning>\nHello." in prompt


async def test_an_answer_without_reasoning_is_shown_bare_but_the_prompt_still_differs() -> None:
    hidden = await rubric_prompt(record(reasoning=None), sees=False)
    shown = await rubric_prompt(record(reasoning=None), sees=True)
    assert "<reasoning>\n" not in shown and ANSWER in shown
    assert shown != hidden  # the note: a cached grade of one is never the other's


async def test_the_cache_key_of_a_judge_call_differs_both_ways() -> None:
    params = GenerationParams(max_tokens=200, temperature=0.0)
    keys = {
        cache_key({"model": "judge"}, [Message(role="user", content=prompt)], params)
        for prompt in [
            await rubric_prompt(record(), sees=False),
            await rubric_prompt(record(), sees=True),
        ]
    }
    assert len(keys) == 2


async def goal_prompt(tmp_path: Path, *, sees: bool) -> str:
    folder = write_pack(
        tmp_path / f"p{sees}",
        {"default": {"turns": [{"turn_id": "t0", "prompt_template": "Is 91 prime?"}]}},
        [
            {
                "scenario_id": "s",
                "scenario_description": "x",
                "goal": {"description": "answer", "all_of": [{"kind": "judge", "value": "right?"}]},
            }
        ],
    )
    grader = judge()
    metric = METRICS.get("goal_achievement")().with_judge(
        JudgeSettings(grader, sees_reasoning=sees)
    )
    scorer = metric.scorer(load_pack(folder).conversations[0])
    await scorer.update(record())
    assert (await scorer.result()).value == 1.0
    ((messages, _),) = grader.calls
    return messages[0].content


async def test_goal_criteria_judged_both_ways(tmp_path: Path) -> None:
    hidden = await goal_prompt(tmp_path, sees=False)
    shown = await goal_prompt(tmp_path, sees=True)
    assert ANSWER in hidden and THOUGHT not in hidden
    assert shown.startswith(REASONING_NOTE) and f"{THOUGHT}\n</reasoning>\n{ANSWER}" in shown


def test_the_simulator_passes_the_setting_and_records_it(tmp_path: Path) -> None:
    config = convsim.SimulatorConfig.from_arguments(
        "scripted", judge="scripted", judge_sees_reasoning=True
    )
    assert config.judge is not None and config.judge.sees_reasoning
    default = convsim.SimulatorConfig.from_arguments("scripted", judge="scripted")
    assert default.judge is not None and not default.judge.sees_reasoning
    sim = convsim.Simulator(config)
    assert sim.judge is not None and sim.judge.sees_reasoning


@pytest.mark.parametrize("value", ["yes", 1])
def test_a_setting_that_is_not_a_bool_is_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match="judge_sees_reasoning must be True or False"):
        convsim.SimulatorConfig.from_arguments(
            "scripted", judge="scripted", judge_sees_reasoning=value
        )


def test_the_setting_without_a_judge_is_refused() -> None:
    with pytest.raises(ConfigError, match="judge_sees_reasoning given without a judge"):
        convsim.SimulatorConfig.from_arguments("scripted", judge_sees_reasoning=True)


@pytest.mark.parametrize("command", ["run", "score"])
def test_the_cli_flag_needs_a_judge(command: str, tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text("", encoding="utf-8")
    target = "customer_support" if command == "run" else str(tmp_path / "r.jsonl")
    args = [command, target, "--metrics", "judge:polite?", "--judge-sees-reasoning"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--judge-sees-reasoning needs --judge" in result.output


def test_a_run_with_the_flag_records_it_in_its_manifest(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "customer_support",
            "--limit",
            "1",
            "--metrics",
            "judge:polite?",
            "--judge",
            "scripted",
            "--judge-sees-reasoning",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code in (0, 1), result.output
    manifest = json.loads(manifest_path(out).read_text(encoding="utf-8"))
    assert manifest["settings"]["judge_sees_reasoning"] is True
