"""The developer guide's multi-turn task (MyConversationTask), imports adapted, on convsim.

The guide's placeholder ``calculate_*`` methods (constants) are left out: the base class's
come from convsim's scorers, and these tests check that they do.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import convsim
from convsim import ConfigError, PackError
from convsim.lm_eval import TASKS, MultiTurnTask, register_task
from convsim.scenarios import BUNDLED_PACKS_DIR, load_pack

PACK = BUNDLED_PACKS_DIR / "multi_session_memory"
NAME = "multi_turn_scenarios_my_conversation_task_tests"

# --- the guide's example ("Multi-Turn Task Implementation", Step 1), imports adapted ----


@register_task(NAME)
class MyConversationTask(MultiTurnTask):
    """
    Multi-turn conversation task for [specific domain].
    """

    VERSION = 1.0
    DATASET_PATH = str(PACK / "scenarios.jsonl")
    TURN_CONFIG_PATH = str(PACK / "turn_configs.yml")

    def __init__(self, config=None):
        super().__init__(config)
        self.load_turn_configurations()

    def load_turn_configurations(self):
        """Load turn-specific configurations."""
        with open(self.turn_config_file()) as f:  # adapted: the path the task resolves
            self.turn_configs = yaml.safe_load(f)

    def test_docs(self):
        """Load conversation scenarios."""
        return self.dataset["test"]

    def get_conversation_flow(self, doc):
        """Define the conversation flow for this scenario."""
        scenario_type = doc.get("scenario_type", "default")
        return self.turn_configs.get(scenario_type, self.turn_configs["default"])

    def process_turn(self, doc, turn_config, conversation_history, turn_index):
        """Process a single turn in the conversation."""

        # Build context from conversation history
        context = self.build_conversation_context(conversation_history)

        # Generate prompt for this turn
        prompt = self.generate_turn_prompt(doc, turn_config, context, turn_index)

        # Get model response
        response = self.get_model_response(prompt, turn_config)

        # Evaluate turn
        turn_metrics = self.evaluate_turn(doc, turn_config, response, conversation_history)

        return {
            "turn_index": turn_index,
            "prompt": prompt,
            "response": response,
            "metrics": turn_metrics,
        }

    def generate_turn_prompt(self, doc, turn_config, context, turn_index):
        """Generate prompt for a specific turn."""
        template = turn_config.get("prompt_template", "")

        # Fill in template variables
        prompt = template.format(
            context=context,
            scenario=doc.get("scenario_description", ""),
            turn_index=turn_index,
            **doc.get("variables", {}),
        )

        return prompt

    def evaluate_turn(self, doc, turn_config, response, conversation_history):
        """Evaluate a single turn's response."""
        metrics = {}

        # Standard turn metrics
        metrics["response_length"] = len(response.split())
        metrics["relevance_score"] = self.calculate_relevance(response, doc)

        # Turn-specific metrics
        for metric_name in turn_config.get("evaluation_metrics", []):
            if hasattr(self, f"calculate_{metric_name}"):
                metrics[metric_name] = getattr(self, f"calculate_{metric_name}")(
                    response, doc, conversation_history
                )

        return metrics

    def evaluate_conversation(self, doc, conversation_turns):
        """Evaluate the entire conversation."""
        conversation_metrics = {}

        # Aggregate turn metrics
        turn_metrics = [turn["metrics"] for turn in conversation_turns]
        conversation_metrics.update(self.aggregate_turn_metrics(turn_metrics))

        # Conversation-level metrics
        conversation_metrics["context_retention"] = self.calculate_context_retention(
            conversation_turns
        )
        conversation_metrics["goal_achievement"] = self.calculate_goal_achievement(
            doc, conversation_turns
        )
        conversation_metrics["coherence_score"] = self.calculate_coherence(conversation_turns)

        return conversation_metrics

    def aggregation(self):  # the guide's aggregation: mean and std
        return {name: ["mean", "std"] for name in self.higher_is_better()}

    def higher_is_better(self):
        return {
            "context_retention": True,
            "goal_achievement": True,
            "coherence_score": True,
            "response_length": None,
        }


# --- under convsim ----------------------------------------------------------------------


def _value(result: convsim.ConversationResult, name: str) -> float:
    score = result.scores[name]
    assert score.status == "ok", (name, score.reason)
    assert score.value is not None
    return score.value


@pytest.fixture(scope="module")
def run() -> list[convsim.ConversationResult]:
    task = MyConversationTask()
    return convsim.run_sync(
        task.to_pack(),
        "scripted",
        seed=3,
        metrics=["context_retention", "goal_achievement", "coherence", "response_length"],
    )


def test_the_pack_has_a_conversation_per_document_prompted_by_the_task() -> None:
    task = MyConversationTask()
    pack = task.to_pack()
    docs = [json.loads(line) for line in (PACK / "scenarios.jsonl").read_text().splitlines()]
    assert [c.conversation_id for c in pack.conversations] == [d["scenario_id"] for d in docs]
    assert pack.name == f"task:{NAME}" and pack.kind == "multi_turn"
    assert set(pack.metrics) == {f"task:{m}" for m in task.higher_is_better()}
    assert pack.pack_hash != load_pack(PACK).pack_hash


def test_the_model_is_sent_the_prompts_generate_turn_prompt_makes(
    run: list[convsim.ConversationResult],
) -> None:
    task = MyConversationTask()
    docs = {d["scenario_id"]: d for d in task.test_docs()}
    result = run[0]
    doc = docs[result.conversation_id]
    first = result.turns[0]
    expected = task.generate_turn_prompt(
        doc, task.turn_config(doc, first.turn_id), "", first.turn_index
    )
    assert first.prompt == expected and first.user_message == expected
    second = result.turns[1]
    history = [
        {"role": "user", "content": first.prompt},
        {"role": "assistant", "content": first.response},
    ]
    assert second.prompt == task.generate_turn_prompt(
        doc,
        task.turn_config(doc, second.turn_id),
        task.build_conversation_context(history),
        second.turn_index,
    )


def test_conversation_metrics_are_convsims_own_scorers(
    run: list[convsim.ConversationResult],
) -> None:
    assert len(run) == 14 and all(r.status.value == "DONE" for r in run)
    for result in run:
        for ours, convsims in [
            ("task:context_retention", "context_retention"),
            ("task:goal_achievement", "goal_achievement"),
            ("task:coherence_score", "coherence"),
        ]:
            assert _value(result, ours) == pytest.approx(_value(result, convsims))
    values = [_value(r, "task:coherence_score") for r in run]
    assert len(set(values)) > 1  # it moves with the conversation: no constant


def test_turn_metrics_are_averaged_over_the_turns(run: list[convsim.ConversationResult]) -> None:
    for result in run:
        words = [len((t.response or "").split()) for t in result.turns if t.response is not None]
        assert _value(result, "task:response_length") == pytest.approx(statistics.fmean(words))


def test_a_model_that_forgets_scores_lower_retention(
    run: list[convsim.ConversationResult],
) -> None:
    forgetful = convsim.run_sync(
        MyConversationTask().to_pack(),
        "scripted",
        model_args={"memory_turns": 1},
        seed=3,
        metrics=["context_retention"],
    )
    remembers = statistics.fmean(_value(r, "task:context_retention") for r in run)
    forgets = statistics.fmean(_value(r, "task:context_retention") for r in forgetful)
    assert forgets < remembers - 0.2


def test_aggregate_reduces_by_the_tasks_aggregation(run: list[convsim.ConversationResult]) -> None:
    summary = MyConversationTask().aggregate(run)
    values = [_value(r, "task:coherence_score") for r in run]
    assert summary["coherence_score"]["mean"] == pytest.approx(statistics.fmean(values))
    assert summary["coherence_score"]["std"] == pytest.approx(statistics.pstdev(values))


class PromptOfItsOwn(MyConversationTask):
    def process_turn(self, doc, turn_config, conversation_history, turn_index):
        response = self.get_model_response("a prompt the model never saw", turn_config)
        return {"turn_index": turn_index, "response": response, "metrics": {}}


def test_a_process_turn_asking_another_prompt_asks_the_model_once_per_turn() -> None:
    pack = PromptOfItsOwn().to_pack()
    (result,) = convsim.run_sync(pack, "scripted", limit=1, metrics=[])
    assert result.status.value == "DONE"
    assert result.scores["task:context_retention"].status == "ok"
    for turn in result.turns:  # tests/test_extra_calls.py tests the call itself
        (call,) = turn.extra_calls
        assert call.prompt == "a prompt the model never saw" and call.response


def test_hooks_that_need_a_run_say_so_outside_one() -> None:
    task = MyConversationTask()
    doc = task.test_docs()[0]
    turn_config = task.turn_config(doc, task.get_conversation_flow(doc)["turns"][0]["turn_id"])
    with pytest.raises(ConfigError, match="only while convsim scores a conversation"):
        task.process_turn(doc, turn_config, [], 0)
    with pytest.raises(ConfigError, match="scores a conversation convsim ran"):
        task.calculate_context_retention([])
    # the text-only hooks work anywhere
    assert task.evaluate_turn(doc, turn_config, "three words here", [])["response_length"] == 3


def test_a_broken_turn_config_names_file_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "scenarios.jsonl").write_text(
        json.dumps({"scenario_id": "s1", "scenario_description": "d"}) + "\n"
    )
    (tmp_path / "turn_configs.yml").write_text(
        "default:\n  turns:\n    - turn_id: a\n      prompt_template: hi\n      tempo: 3\n"
    )
    task = MultiTurnTask(
        {
            "dataset_path": str(tmp_path / "scenarios.jsonl"),
            "turn_config_path": str(tmp_path / "turn_configs.yml"),
        }
    )
    with pytest.raises(PackError) as caught:
        task.to_pack()
    assert "turn_configs.yml:5: default.turns.0.tempo: unknown field" in str(caught.value)


def test_a_task_by_registered_name() -> None:
    pack = load_pack(f"task:{NAME}")
    assert pack.name == f"task:{NAME}" and len(pack) == 14
    with pytest.raises(ConfigError, match="no task 'nope' is registered"):
        load_pack("task:nope")


# --- under lm-eval ----------------------------------------------------------------------


def _evaluate(model: str, model_args: str) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from convsim.lm_eval import register_lm_eval_model

    register_lm_eval_model()
    results = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[MyConversationTask().to_lm_eval_task()],
        task_manager=TaskManager(include_defaults=False),  # the default one indexes ~7 s
    )
    assert results is not None
    return results


def test_under_lm_eval_the_convsim_model_runs_the_conversations(
    run: list[convsim.ConversationResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert TASKS.get(NAME) is MyConversationTask
    results = _evaluate("convsim", "model=scripted,seed=3,concurrency=8")
    (got,) = results["results"].values()
    for name in ("context_retention", "coherence_score", "response_length"):
        values = [_value(r, f"task:{name}") for r in run]
        assert got[f"{name},none"] == pytest.approx(statistics.fmean(values)), name
        assert got[f"{name}_std,none"] == pytest.approx(statistics.pstdev(values)), name


def test_under_lm_eval_another_model_is_refused_before_generating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.models.dummy import DummyLM

    asked: list[Any] = []
    monkeypatch.setattr(DummyLM, "generate_until", lambda self, requests: asked.append(requests))
    with pytest.raises(ValueError, match="needs `--model convsim`"):
        _evaluate("dummy", "")
    assert asked == []


def test_the_docs_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = (Path(__file__).parents[1] / "docs" / "task_api.md").read_text(encoding="utf-8")
    (source,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", docs, flags=re.S)
        if "class MyConversationTask" in block
    ]
    for name in ("scenarios.jsonl", "turn_configs.yml"):
        shutil.copy(PACK / name, tmp_path / name)
    module_file = tmp_path / "my_conversation_task.py"
    module_file.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("my_conversation_task", module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_conversation_task", module)
    spec.loader.exec_module(module)
    task = module.MyConversationTask()
    (result,) = convsim.run_sync(task.to_pack(), "scripted", limit=1, metrics=["coherence"])
    assert _value(result, "task:coherence_score") == pytest.approx(_value(result, "coherence"))


def _task_files(tmp_path: Path, turns: str) -> dict[str, str]:
    (tmp_path / "scenarios.jsonl").write_text(
        json.dumps({"scenario_id": "s1", "scenario_description": "planning a trip"}) + "\n"
    )
    (tmp_path / "turn_configs.yml").write_text("default:\n  turns:\n" + turns)
    return {
        "dataset_path": str(tmp_path / "scenarios.jsonl"),
        "turn_config_path": str(tmp_path / "turn_configs.yml"),
    }


def test_a_task_metric_as_a_turn_metric_is_refused_up_front(tmp_path: Path) -> None:
    config = _task_files(
        tmp_path,
        "    - turn_id: a\n      prompt_template: hi\n"
        "      evaluation_metrics: ['task:response_length']\n",
    )
    with pytest.raises(ConfigError, match=r"default\.a: evaluation_metrics task:response_length"):
        MultiTurnTask(config).to_pack()


def test_repeated_turns_get_their_turns_config(tmp_path: Path) -> None:
    config = _task_files(
        tmp_path,
        "    - turn_id: chat\n      prompt_template: 'Tell me more ({turn_index})'\n"
        "      repeat: 3\n",
    )
    (result,) = convsim.run_sync(MultiTurnTask(config).to_pack(), "scripted", metrics=[])
    assert result.status.value == "DONE"
    assert [t.turn_id for t in result.turns] == ["chat", "chat.2", "chat.3"]
    assert 0 < _value(result, "task:coherence_score") <= 1


class LowerIsBetter(MyConversationTask):
    def higher_is_better(self):
        return {**super().higher_is_better(), "response_length": False}


def test_the_report_takes_the_tasks_own_direction() -> None:
    results = convsim.run_sync(LowerIsBetter().to_pack(), "scripted", limit=2, metrics=[])
    report = convsim.summarize(results)
    assert report.metrics["task:response_length"].higher_is_better is False
    assert report.metrics["task:coherence_score"].higher_is_better is True


def test_a_configured_instance_is_refused_under_lm_eval(tmp_path: Path) -> None:
    task = MyConversationTask({"dataset_path": str(PACK / "scenarios.jsonl")})
    with pytest.raises(ConfigError, match="loads the registered class"):
        task.lm_eval_context(task.test_docs()[0])


def test_a_tasks_files_run_code_only_when_the_class_allows_it(tmp_path: Path) -> None:
    config = _task_files(tmp_path, "    - turn_id: a\n      prompt_template: hi\n")
    goal = {"description": "d", "all_of": [{"kind": "python", "value": "shutil:rmtree"}]}
    scenario = {"scenario_id": "s1", "scenario_description": "d", "goal": goal}
    (tmp_path / "scenarios.jsonl").write_text(json.dumps(scenario) + "\n")
    with pytest.raises(PackError, match=r"scenarios\.jsonl:1: goal\.all_of\.0\.value"):
        MultiTurnTask(config).to_pack()

    class Trusted(MultiTurnTask):
        ALLOW_CODE = True

    assert len(Trusted(config).to_pack()) == 1


class _CountingTask(MyConversationTask):
    """The guide's task, counting how often its conversation hooks run."""

    evaluations = 0

    def evaluate_conversation(self, doc, conversation_turns):  # type: ignore[no-untyped-def]
        type(self).evaluations += 1
        return super().evaluate_conversation(doc, conversation_turns)


def test_two_runs_of_a_document_scored_in_turn_keep_their_own_evaluation() -> None:
    """Trials of a document are scored at the same time, their metrics interleaved: each
    conversation's hooks run once, whichever of its metrics asks, and each asks for its
    own records' results."""
    pack = _CountingTask().to_pack()
    (first,) = convsim.run_sync(pack, "scripted", limit=1, metrics=[], seed=1)
    (second,) = convsim.run_sync(pack, "scripted", limit=1, metrics=[], seed=2)
    conversation = pack.conversations[0]
    origin = conversation.origin
    assert _CountingTask.evaluations == 2  # once per run
    one = origin.results(conversation, first.turns)
    other = origin.results(conversation, second.turns)
    again = origin.results(conversation, first.turns)
    assert _CountingTask.evaluations == 2  # each run's evaluation is kept, not redone
    assert again is one and other is not one
