"""The evaluation service on loopback, driven by its Python client: keys, jobs, streamed
results, a server killed mid-job and restarted, and the refusals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _listeners import Listener
from _service import Server, cli

import convsim
from convsim.client import EvaluationClient, NotFound, Unauthorized


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    s.start()
    yield s
    s.stop()


def _key(server: Server, name: str) -> str:
    return server.key(name)


@pytest.mark.slow
def test_an_evaluation_runs_streams_and_summarises(server: Server) -> None:
    key = _key(server, "alice")
    with EvaluationClient(server.url, key) as client:
        evaluation = client.create_evaluation("customer_support", "scripted", limit=5)
        assert evaluation.status in ("queued", "running", "done")
        streamed = list(client.iter_results(evaluation.id))
        assert len(streamed) == 5
        assert len({r["conversation_id"] for r in streamed}) == 5
        done = client.wait(evaluation.id, timeout=60)
        assert done.status == "done" and done.progress["done"] == 5
        summary = client.get_summary(evaluation.id)
        assert summary["conversations"] == 5
        # where the token counts came from: the scripted model counts its own
        assert summary["token_sources"]["server"] > 0
        assert summary["token_sources"]["estimate"] == summary["token_sources"]["tokenizer"] == 0
        # per metric: applicable (scored + failed), scored and not applicable
        for name, m in summary["metrics"].items():
            assert m["applicable"] == m["n"] + m["failed"], name
            assert m["applicable"] + m["not_applicable"] == 5, name
        usages = [t["usage"] for r in streamed for t in r["turns"] if t["usage"]]
        assert usages and {u["source"] for u in usages} == {"server"}
        assert [e.id for e in client.list_evaluations()] == [evaluation.id]


@pytest.mark.slow
def test_refusals_no_key_a_revoked_key_and_another_keys_job(server: Server) -> None:
    alice, bob = _key(server, "alice"), _key(server, "bob")
    with EvaluationClient(server.url, alice) as client:
        job = client.create_evaluation("customer_support", "scripted", limit=1)
    assert httpx.get(server.url + "/v1/evaluations").status_code == 401
    assert (
        httpx.get(
            server.url + "/v1/evaluations", headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    with EvaluationClient(server.url, bob) as other, pytest.raises(NotFound):
        other.get_evaluation(job.id)
    cli("serve", "keys", "revoke", "--db", str(server.db), "--name", "alice")
    with EvaluationClient(server.url, alice) as client, pytest.raises(Unauthorized):
        client.list_evaluations()


@pytest.mark.slow
def test_secrets_given_to_a_job_are_never_stored_or_shown(tmp_path: Path) -> None:
    secret = "sk-live-THIS-MUST-NOT-LEAK-0123456789"
    with Listener() as model:
        server = Server(tmp_path, ["--allow-base-url", model.url])
        server.start()
        try:
            with EvaluationClient(server.url, server.key("alice")) as client:
                job = client.create_evaluation(
                    "customer_support",
                    "openai-compatible:m",
                    model_args={"api_key": secret, "base_url": model.url + "/v1"},
                    limit=1,
                )
                assert job.raw["model_args"]["api_key"] == "***"
                assert client.wait(job.id, timeout=60).status == "done"
        finally:
            server.stop()
        assert model.heard(f"Bearer {secret}")  # the tenant's key went to the tenant's model
    assert secret.encode() not in server.everything_written()


@pytest.mark.slow
def test_a_killed_server_finishes_its_job_after_a_restart(server: Server, tmp_path: Path) -> None:
    key = _key(server, "alice")
    with EvaluationClient(server.url, key) as client:
        job = client.create_evaluation(
            "customer_support", "scripted", model_args={"latency": "0.2"}, limit=12, concurrency=2
        )
        results = server.results / f"{job.id}.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not results.exists() or len(results.read_text().splitlines()) < 3
        ):
            time.sleep(0.1)
    before = len(results.read_text().splitlines())
    assert 3 <= before < 12
    server.kill()  # SIGKILL mid-job
    server.start()
    with EvaluationClient(server.url, key) as client:
        done = client.wait(job.id, timeout=120)
    assert done.status == "done"
    finished = convsim.read_results(results)
    ids = [r.conversation_id for r in finished]
    assert len(ids) == 12 == len(set(ids))  # none lost, none twice


@pytest.mark.slow
def test_an_uploaded_pack_is_validated_before_the_job_is_accepted(server: Server) -> None:
    from convsim.client import Invalid

    key = _key(server, "alice")
    folder = convsim.load_pack("customer_support").path
    files = {p.name: p.read_text() for p in folder.iterdir() if p.suffix in (".jsonl", ".yml")}
    with EvaluationClient(server.url, key) as client:
        job = client.create_evaluation(model="scripted", pack_files=files, limit=2)
        assert client.wait(job.id, timeout=60).status == "done"
        broken = dict(files)
        lines = broken["scenarios.jsonl"].splitlines()
        lines[1] = lines[1].replace('"scenario_id"', '"scenario_idd"')
        broken["scenarios.jsonl"] = "\n".join(lines) + "\n"
        with pytest.raises(Invalid) as refused:
            client.create_evaluation(model="scripted", pack_files=broken)
        where = [tuple(p["loc"]) for p in refused.value.problems]
        assert any(loc[2] == "scenarios.jsonl" and 2 in loc for loc in where), where
        with pytest.raises(Invalid):
            client.create_evaluation(model="scripted", pack_files={"../evil.yml": "x"})


@pytest.mark.slow
def test_the_guides_integration_test_with_convsims_names(server: Server) -> None:
    client = EvaluationClient(base_url=server.url, api_key=_key(server, "guide"))
    evaluation = client.create_evaluation(
        pack="single_turn_qa", model="scripted", model_args={"memory_turns": "4"}
    )
    assert evaluation.id is not None
    assert evaluation.status in ["queued", "running", "done"]
    client.close()


@pytest.mark.slow
def test_request_size_and_jobs_per_key_are_limited(server: Server) -> None:
    key = _key(server, "busy")
    headers = {"Authorization": f"Bearer {key}"}
    huge = {"model": "scripted", "pack_files": {"scenarios.jsonl": "x" * (2 * 1024 * 1024)}}
    assert httpx.post(server.url + "/v1/evaluations", json=huge, headers=headers).status_code == 413
    slow = {"pack": "customer_support", "model": "scripted", "model_args": {"latency": "1"}}
    codes = [
        httpx.post(server.url + "/v1/evaluations", json=slow, headers=headers).status_code
        for _ in range(5)
    ]
    assert codes == [201, 201, 201, 201, 429]  # four at once per key by default


def test_a_database_from_a_newer_convsim_is_refused(tmp_path: Path) -> None:
    import sqlite3

    from convsim.service import Store

    db = tmp_path / "new.db"
    Store(db)
    with sqlite3.connect(db) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(convsim.ConfigError, match="newer convsim"):
        Store(db)


@pytest.mark.slow
def test_a_finished_job_says_how_many_conversations_it_ran(server: Server) -> None:
    """Its run records the total: a job whose request names no conversations (as an
    older convsim stored them) still has one once it ran."""
    import sqlite3

    with EvaluationClient(server.url, _key(server, "alice")) as client:
        job = client.create_evaluation("customer_support", "scripted", limit=2, trials=2)
        done = client.wait(job.id, timeout=60)
        assert done.progress == {"total": 2, "done": 2, "failed": 0}
        with sqlite3.connect(server.db) as raw:
            raw.execute(
                "UPDATE jobs SET request = json_remove(request, '$.conversations') WHERE id = ?",
                (job.id,),
            )
        assert client.get_evaluation(job.id).progress["total"] == 2


def test_an_older_database_gains_the_total_column(tmp_path: Path) -> None:
    import sqlite3

    from convsim.service import Store
    from convsim.service._store import MIGRATIONS

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as raw:
        for step, script in enumerate(MIGRATIONS[:2]):
            raw.executescript(f"{script} PRAGMA user_version = {step + 1};")
        raw.execute(
            "INSERT INTO jobs (id, key_name, state, request, created, done) "
            "VALUES ('j', 'k', 'done', '{\"pack\": \"p\", \"model\": \"m\"}', 0, 3)"
        )
    job = Store(db).job("j")
    assert job is not None and job.total is None and job.done == 3
