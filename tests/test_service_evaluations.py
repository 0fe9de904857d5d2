"""Evaluations of several models on several tasks, on a live service on loopback: one
job per evaluation, a result set per (model, task) pair, the models compared, and the
service's guarantees (limits, cancellation, a restart after SIGKILL) for every pair."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _listeners import Listener, internal_page
from _service import Server

import convsim
from convsim.client import EvaluationClient, Invalid, LimitReached, ServiceError

pytestmark = pytest.mark.slow  # convsim serve runs in a subprocess

INSTALLED = Path(__file__).parent / "guide" / "installed"
"""A package as installed (its dist-info declares entry points): the guide's task class
(``convsim.tasks``) and a pack source ``mirror:`` (``convsim.pack_sources``)."""

GOOD = {"model_id": "good", "model_type": "scripted", "config": {"use_references": True}}
FORGETFUL = {"model_id": "forgetful", "model_type": "scripted", "config": {"memory_turns": 1}}
TASKS = ["customer_support", "single_turn_qa"]


def _installed_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(INSTALLED), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(
        tmp_path_factory.mktemp("service"), ["--pack-source", "mirror"], env=_installed_env()
    )
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def key(server: Server) -> str:
    return server.key("alice")


@pytest.fixture(scope="module")
def client(server: Server, key: str) -> Iterator[EvaluationClient]:
    with EvaluationClient(server.url, key) as c:
        yield c


def _by_pair(streamed: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for result in streamed:
        found[result["pair"]["index"]].append(result)
    return dict(found)


def test_two_models_on_two_tasks_give_four_result_sets_and_a_comparison(
    client: EvaluationClient, server: Server, key: str
) -> None:
    job = client.create_evaluation(models=[GOOD, FORGETFUL], tasks=TASKS, limit=3)
    assert job.status in ("queued", "running")
    assert [m["model_id"] for m in job.models] == ["good", "forgetful"]
    assert job.models[0]["config"] == {"use_references": "true"}
    assert job.tasks == TASKS and job.progress["total"] == 12
    assert [(p["model_id"], p["task"]) for p in job.pairs] == [
        ("good", "customer_support"),
        ("forgetful", "customer_support"),
        ("good", "single_turn_qa"),
        ("forgetful", "single_turn_qa"),
    ]
    streamed = list(client.iter_results(job.id))
    done = client.wait(job.id, timeout=60)
    assert done.status == "done" and done.progress == {"total": 12, "done": 12, "failed": 0}
    assert [p["status"] for p in done.pairs] == ["done"] * 4
    assert [p["progress"]["done"] for p in done.pairs] == [3] * 4

    # four result sets: each pair's conversations once, tagged with the pair
    sets = _by_pair(streamed)
    assert sorted(sets) == [0, 1, 2, 3]
    for index, results in sets.items():
        pair = done.pairs[index]
        ids = [r["conversation_id"] for r in results]
        assert len(ids) == 3 == len(set(ids))
        assert {r["pair"]["task"] for r in results} == {pair["task"]}
        assert {r["pack"] for r in results} == {pair["task"]}
    assert {r["conversation_id"] for r in sets[0]} == {r["conversation_id"] for r in sets[1]}
    files = sorted(p.name for p in server.results.glob(f"{job.id}.*.jsonl"))
    assert files == [f"{job.id}.{i}.jsonl" for i in range(4)]

    # a summary per pair, and the forgetful model compared with the first, per task
    summary = client.get_summary(job.id)
    assert [(p["model_id"], p["task"]) for p in summary["pairs"]] == [
        (p["model_id"], p["task"]) for p in done.pairs
    ]
    assert [p["summary"]["conversations"] for p in summary["pairs"]] == [3] * 4
    assert client.get_summary(job.id, pair=1) == summary["pairs"][1]["summary"]
    comparisons = client.get_comparison(job.id)
    assert comparisons == summary["comparisons"]
    assert [(c["task"], c["base"], c["candidate"]) for c in comparisons] == [
        ("customer_support", "good", "forgetful"),
        ("single_turn_qa", "good", "forgetful"),
    ]
    support = comparisons[0]["comparison"]
    assert support["paired"] == 3 and support["only_in_base"] == []
    retention = next(m for m in support["metrics"] if m["metric"] == "context_retention")
    # the model that keeps one turn in mind retains less than the one that keeps all
    assert retention["candidate_mean"] < retention["base_mean"] == 1.0
    assert retention["losses"] >= 1

    # the stream resumes across pairs from Last-Event-ID
    headers = {"Authorization": f"Bearer {key}", "Last-Event-ID": "5"}
    with httpx.stream(
        "GET", f"{server.url}/v1/evaluations/{job.id}/results", headers=headers, timeout=30
    ) as response:
        body = response.read().decode()
    ids = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]
    assert ids == list(range(6, 13))


def test_one_pair_of_an_evaluation_is_read_alone(
    client: EvaluationClient, server: Server, key: str
) -> None:
    job = client.create_evaluation(models=[GOOD, FORGETFUL], pack="single_turn_qa", limit=2)
    client.wait(job.id, timeout=60)
    base = f"{server.url}/v1/evaluations/{job.id}"
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{base}/report", headers=headers).status_code == 409  # which pair?
    page = httpx.get(f"{base}/pairs/1/report", headers=headers, timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert httpx.get(f"{base}/pairs/2/summary", headers=headers).status_code == 404
    bob = {"Authorization": f"Bearer {server.key('bob')}"}
    for path in ("/comparison", "/pairs/0/summary", "/pairs/0/report", "/summary"):
        assert httpx.get(base + path, headers=bob).status_code == 404, path


def test_a_failed_pair_does_not_stop_the_others(tmp_path: Path) -> None:
    with Listener(internal_page("no", "401 Unauthorized")) as broken:  # fails its check
        server = Server(tmp_path, ["--allow-base-url", f"{broken.url}/v1"])
        server.start()
        try:
            with EvaluationClient(server.url, server.key("alice")) as client:
                down = {
                    "model_id": "down",
                    "model_type": "openai-compatible",
                    "config": {"base_url": f"{broken.url}/v1"},
                }
                job = client.create_evaluation(models=[down, GOOD], pack="single_turn_qa", limit=2)
                done = client.wait(job.id, timeout=60)
                summary = client.get_summary(job.id)
        finally:
            server.stop()
    assert done.status == "failed"
    assert [p["status"] for p in done.pairs] == ["failed", "done"]
    assert done.error is not None and done.error.startswith("down on single_turn_qa: ")
    assert "HTTP 401" in done.error and done.pairs[1]["error"] is None
    assert done.pairs[1]["progress"]["done"] == 2
    assert summary["pairs"][0]["summary"] is None and summary["pairs"][0]["note"]
    note = summary["comparisons"][0]["note"]
    assert summary["comparisons"][0]["comparison"] is None and "down" in note


def test_cancelling_an_evaluation_ends_every_pair(client: EvaluationClient) -> None:
    slow = {"model_id": "slow", "model_type": "scripted", "config": {"latency": 30}}
    job = client.create_evaluation(models=[slow, GOOD], tasks=TASKS, limit=1, concurrency=1)
    client.cancel(job.id)
    done = client.wait(job.id, timeout=30)
    assert done.status == "cancelled"
    assert [p["status"] for p in done.pairs] == ["cancelled"] * 4
    assert done.progress["done"] == 0


def test_an_evaluation_is_one_job_within_the_keys_limits(server: Server) -> None:
    key = server.key("small", "jobs=1", "conversations=5", "max_tokens=100")
    with EvaluationClient(server.url, key) as client:
        with pytest.raises(Invalid) as refused:  # 2 models x 3 conversations > 5
            client.create_evaluation(models=[GOOD, FORGETFUL], pack="customer_support", limit=3)
        assert [tuple(p["loc"]) for p in refused.value.problems] == [("body", "limit")]
        assert "2 pairs" in str(refused.value)
        capped = {**GOOD, "config": {"max_tokens": 500}}
        with pytest.raises(Invalid) as refused:
            client.create_evaluation(models=[FORGETFUL, capped], pack="single_turn_qa", limit=1)
        assert [tuple(p["loc"]) for p in refused.value.problems] == [
            ("body", "models", 1, "config", "max_tokens")
        ]
        slow = {"model_id": "slow", "model_type": "scripted", "config": {"latency": 30}}
        job = client.create_evaluation(models=[slow, GOOD], tasks=TASKS, limit=1, concurrency=1)
        with pytest.raises(LimitReached):  # the evaluation of 4 pairs is the key's one job
            client.create_evaluation(pack="single_turn_qa", limit=1)
        client.cancel(job.id)


def test_models_are_refused_at_their_place(
    client: EvaluationClient, server: Server, key: str
) -> None:
    def refused(**job: Any) -> list[tuple[Any, ...]]:
        with pytest.raises(Invalid) as caught:
            client.create_evaluation(**job)
        return [tuple(p["loc"]) for p in caught.value.problems]

    def posted(**body: Any) -> list[tuple[Any, ...]]:
        answer = httpx.post(
            f"{server.url}/v1/evaluations", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert answer.status_code == 422
        return [tuple(p["loc"]) for p in answer.json()["detail"]]

    untyped = {"model_id": "who"}
    assert refused(models=[GOOD, untyped], tasks=TASKS) == [("body", "models", 1, "model_type")]
    assert refused(models=[GOOD, GOOD], tasks=TASKS) == [("body", "models", 1, "model_id")]
    odd = {**FORGETFUL, "config": {"temperature": 0.5}}
    assert refused(models=[GOOD, odd], tasks=TASKS) == [
        ("body", "models", 1, "config", "temperature")
    ]
    unknown = {"model_id": "x", "model_type": "nope"}
    assert refused(models=[unknown], tasks=TASKS) == [("body", "models", 0, "model_type")]
    assert refused(models=[GOOD], tasks=["single_turn_qa", "nope"]) == [("body", "tasks", 1)]
    assert posted(models=[GOOD], tasks=TASKS, model="scripted") == [("body", "models")]
    assert refused(models=[GOOD], tasks=TASKS, pack="single_turn_qa") == [("body",)]
    assert refused(models=[GOOD], tasks=["single_turn_qa", "single_turn_qa"]) == [("body", "tasks")]


def test_installed_task_classes_and_pack_sources_are_named_as_tasks(
    client: EvaluationClient,
) -> None:
    task = "single_turn_scenarios_my_new_task"
    job = client.create_evaluation(models=[GOOD], tasks=[task, "mirror:single_turn_qa"], limit=2)
    done = client.wait(job.id, timeout=60)
    assert done.status == "done", done.error
    assert done.tasks == [task, "mirror:single_turn_qa"]
    summary = client.get_summary(job.id)
    scored = summary["pairs"][0]["summary"]["metrics"]
    assert "task:exact_match" in scored and scored["task:exact_match"]["n"] == 2
    assert summary["pairs"][1]["summary"]["conversations"] == 2
    classic = client.create_evaluation(pack=task, model="scripted", limit=1)
    assert client.wait(classic.id, timeout=60).status == "done"
    assert classic.pack == task

    with pytest.raises(Invalid) as refused:
        client.create_evaluation(models=[GOOD], tasks=["single_turn_qa", "my_old_task"])
    problem = refused.value.problems[0]
    assert problem["loc"] == ["body", "tasks", 1]
    assert "registered tasks: single_turn_scenarios_my_new_task" in problem["msg"]
    assert "convsim.tasks" in problem["msg"]
    with pytest.raises(Invalid, match="takes no lm-eval: packs"):
        client.create_evaluation(models=[GOOD], tasks=["lm-eval:hellaswag"])


def test_a_killed_server_finishes_a_two_by_two_evaluation_after_a_restart(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path)
    server.start()
    key = server.key("alice")
    slow_good = {**GOOD, "config": {"use_references": True, "latency": 0.2}}
    slow_forgetful = {**FORGETFUL, "config": {"memory_turns": 1, "latency": 0.2}}
    try:
        with EvaluationClient(server.url, key) as client:
            job = client.create_evaluation(
                models=[slow_good, slow_forgetful], tasks=TASKS, limit=6, concurrency=2
            )
        second = server.results / f"{job.id}.1.jsonl"  # forgetful on customer_support
        deadline = time.monotonic() + 60
        while not second.exists() or len(second.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, "the second pair never started"
            time.sleep(0.05)
        server.kill()  # SIGKILL mid-evaluation: pair 0 done, 1 half-way, 2 and 3 queued
        first = (server.results / f"{job.id}.0.jsonl").read_bytes()
        written = len(second.read_text().splitlines())
        assert 2 <= written < 6
        assert not (server.results / f"{job.id}.2.jsonl").exists()
        server.start()
        with EvaluationClient(server.url, key) as client:
            done = client.wait(job.id, timeout=120)
            streamed = list(client.iter_results(job.id))
    finally:
        server.stop()
    assert done.status == "done", done.error
    assert done.progress == {"total": 24, "done": 24, "failed": 0}
    assert [p["progress"]["done"] for p in done.pairs] == [6] * 4
    assert (server.results / f"{job.id}.0.jsonl").read_bytes() == first  # not run again
    for index in range(4):
        path = server.results / f"{job.id}.{index}.jsonl"
        ids = [json.loads(line)["conversation_id"] for line in path.read_text().splitlines()]
        assert len(ids) == 6 == len(set(ids)), index  # none lost, none twice
        assert len(convsim.read_results(path)) == 6
    assert len(streamed) == 24
    assert len({(r["pair"]["index"], r["conversation_id"]) for r in streamed}) == 24


def test_a_job_of_one_pair_is_what_a_job_always_was(client: EvaluationClient) -> None:
    """A job asked for in convsim's form is what it always was: one pair, one file, its
    summary as before, results untagged."""
    job = client.create_evaluation("single_turn_qa", "scripted", limit=2)
    assert len(job.pairs) == 1 and job.model == "scripted" and job.pack == "single_turn_qa"
    streamed = list(client.iter_results(job.id))
    assert len(streamed) == 2 and all("pair" not in r for r in streamed)
    assert client.get_summary(job.id)["conversations"] == 2
    assert client.get_comparison(job.id) == []
    with pytest.raises(ServiceError):
        client.get_summary(job.id, pair=1)


@pytest.mark.anyio
async def test_the_async_client_runs_an_evaluation_of_several(server: Server, key: str) -> None:
    from convsim.client import AsyncEvaluationClient

    async with AsyncEvaluationClient(server.url, key) as client:
        job = await client.create_evaluation(
            models=[GOOD, FORGETFUL], tasks=["single_turn_qa"], limit=2
        )
        streamed = [result async for result in client.iter_results(job.id)]
        done = await client.wait(job.id, timeout=60, poll=0.1)
        comparisons = await client.get_comparison(job.id)
        second = await client.get_summary(job.id, pair=1)
    assert done.status == "done" and [p["model_id"] for p in done.pairs] == ["good", "forgetful"]
    assert sorted(r["pair"]["index"] for r in streamed) == [0, 0, 1, 1]
    assert [(c["base"], c["candidate"]) for c in comparisons] == [("good", "forgetful")]
    assert second["conversations"] == 2
