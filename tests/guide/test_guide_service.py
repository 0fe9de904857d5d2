"""The guide's evaluation (test_integration.py's ``create_evaluation``) followed to its
end on the service tests/_guide_service.py starts: the guide's task class, installed
through an entry point, runs on the guide's model (an operator endpoint of that name)
and is scored by its own ``process_results``; with a second model and task, the models
are compared."""

from __future__ import annotations

import pytest
from _service import Server

from convsim.client import EvaluationClient

GUIDE_MODEL = {
    "model_id": "openai/gpt-3.5-turbo",
    "model_type": "openai",
    "config": {"temperature": 0.0},
}
GUIDE_TASK = "single_turn_scenarios_my_new_task"


@pytest.mark.integration
@pytest.mark.slow
def test_the_guides_evaluation_runs_to_its_end(guide_service: Server) -> None:
    scripted = {"model_id": "reference", "model_type": "scripted", "config": {"use_references": 1}}
    with EvaluationClient("http://localhost:8000", "test-key") as client:
        alone = client.create_evaluation(models=[GUIDE_MODEL], tasks=[GUIDE_TASK])
        both = client.create_evaluation(
            models=[GUIDE_MODEL, scripted], tasks=[GUIDE_TASK, "single_turn_qa"], limit=3
        )
        done = client.wait(alone.id, timeout=120)
        summary = client.get_summary(alone.id)
        compared = client.wait(both.id, timeout=120)
        comparisons = client.get_comparison(both.id)
    assert done.status == "done", done.error
    assert done.models[0]["model"] == "endpoint:openai/gpt-3.5-turbo"
    assert done.models[0]["config"] == {"temperature": "0.0"}
    assert done.progress == {"total": 3, "done": 3, "failed": 0}
    for metric in ("task:exact_match", "task:custom_score"):
        assert summary["metrics"][metric]["n"] == 3, metric
    assert compared.status == "done", compared.error
    assert [c["task"] for c in comparisons] == [GUIDE_TASK, "single_turn_qa"]
    on_task = {m["metric"]: m for m in comparisons[0]["comparison"]["metrics"]}
    # the reference answers match the task's expected answers; the mock model's do not
    exact = on_task["task:exact_match"]
    assert exact["pairs"] == 3 and exact["candidate_mean"] == 1.0 > exact["base_mean"]
