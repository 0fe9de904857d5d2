"""The parts of an evaluation of several pairs that need no server: the store's pairs and
sums, the stored plan (older jobs included), the result stream's order, imported keys,
and task classes installed through entry points."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from convsim import ConfigError
from convsim.cli import main
from convsim.service import ServiceSettings, Store
from convsim.service._app import _events
from convsim.service._plan import arg_text, plan_of
from convsim.service._store import MIGRATIONS, JobProgress, JobRow

INSTALLED = Path(__file__).parent / "guide" / "installed"


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "service.db")
    store.create_key("alice")
    return store


def test_a_jobs_counts_and_cost_are_its_pairs_sums(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add_job("j", "alice", {"models": [], "tasks": []}, None, pair_totals=[3, 3, 5])
    job = store.job("j")
    assert job is not None and job.total == 11
    store.record_progress("j", JobProgress(done=2, failed=1, cost_usd=0.5), pair=0)
    store.record_progress("j", JobProgress(done=4, failed=0, cost_usd=0.25), pair=2)
    store.record_progress("j", JobProgress(done=3, failed=0, cost_usd=0.75), pair=0)  # later
    job = store.job("j")
    assert job is not None and (job.done, job.failed, job.cost_usd) == (7, 0, 1.0)
    key = store.key("alice")
    assert key is not None and key.spent_usd == pytest.approx(1.0)  # each change added once
    store.set_total("j", 4, pair=2)
    job = store.job("j")
    assert job is not None and job.total == 10
    store.set_pair_state("j", 0, "running")
    store.set_pair_state("j", 0, "done")
    store.set_pair_state("j", 1, "running")
    store.end_pairs("j", "cancelled")
    pairs = store.pairs(["j", "other"])
    assert pairs["other"] == []
    assert [(p.pair, p.state, p.total, p.done) for p in pairs["j"]] == [
        (0, "done", 3, 3),
        (1, "cancelled", 3, 0),
        (2, "cancelled", 4, 4),
    ]
    assert pairs["j"][0].started is not None and pairs["j"][0].finished is not None


def test_a_job_stored_before_pairs_is_its_one_pair(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as raw:
        for step, script in enumerate(MIGRATIONS[:3]):
            raw.executescript(f"{script} PRAGMA user_version = {step + 1};")
        raw.execute("INSERT INTO keys (name, hash, created) VALUES ('k', 'h', 0)")
        old = {"pack": "single_turn_qa", "model": "scripted", "model_args": {"latency": "1"},
               "conversations": ["a", "b"], "trials": 2}  # fmt: skip
        raw.execute(
            "INSERT INTO jobs (id, key_name, state, request, created) "
            "VALUES ('j', 'k', 'running', ?, 0)",
            (json.dumps(old),),
        )
    store = Store(db)  # migrated: the pairs table is there, empty for the old job
    assert store.pairs(["j"]) == {"j": []}
    store.record_progress("j", JobProgress(done=1, failed=1, cost_usd=0.0))
    store.set_total("j", 2)
    job = store.job("j")
    assert job is not None and (job.done, job.failed, job.total) == (1, 1, 2)
    plan = plan_of(job.request)
    assert not plan.several and len(plan.pairs) == 1
    assert plan.models[0].model == "scripted" and plan.models[0].plain == {"latency": "1"}
    assert plan.tasks[0].source == {
        "pack": "single_turn_qa",
        "pack_dir": None,
        "trials": 2,
        "conversations": ["a", "b"],
    }
    assert plan.results_name("j", 0) == "j.jsonl"


def test_pairs_go_task_by_task_each_model_in_turn() -> None:
    stored = {
        "trials": 1,
        "models": [{"model_id": m, "model": f"scripted:{m}"} for m in ("a", "b")],
        "tasks": [{"name": t, "pack": t, "conversations": ["x"]} for t in ("p", "q", "r")],
    }
    plan = plan_of(stored)
    assert [plan.label(p) for p in plan.pairs] == [
        "a on p", "b on p", "a on q", "b on q", "a on r", "b on r",
    ]  # fmt: skip
    assert plan.several and plan.results_name("j", 4) == "j.4.jsonl"
    assert plan.tasks[2].source["trials"] == 1


def test_model_arguments_are_spelled_as_adapters_read_them() -> None:
    assert [arg_text(v) for v in (0.0, 1, True, False, "x")] == ["0.0", "1", "true", "false", "x"]


@dataclass
class _FinishingStore:
    """A store whose job finishes while its state is read: the runner writes its last
    result and ends the job between the stream's read of the file and of the state."""

    path: Path
    calls: int = 0
    pair_rows: dict[str, list[Any]] = field(default_factory=dict)

    def job(self, job_id: str) -> JobRow:
        self.calls += 1
        with self.path.open("a") as fh:
            fh.write(json.dumps({"conversation_id": f"late-{self.calls}"}) + "\n")
        return JobRow(job_id, "alice", "done", {}, None, 0.0, 0.0, 1.0, None)

    def pairs(self, job_ids: list[str]) -> dict[str, list[Any]]:
        return {job_id: [] for job_id in job_ids}


@pytest.mark.anyio
async def test_a_stream_has_every_result_written_before_its_job_ended(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"conversation_id": "first"}) + "\n")
    service = SimpleNamespace(
        stopping=threading.Event(),
        runner=SimpleNamespace(results_dir=tmp_path),
        store=_FinishingStore(path),
    )
    plan = plan_of({"pack": "p", "model": "scripted", "conversations": ["x"]})
    events: AsyncIterator[bytes] = _events(service, "j", 0, plan)  # type: ignore[arg-type]
    seen = [event async for event in events]
    kinds = [next(line for line in e.split(b"\n") if line.startswith(b"event:")) for e in seen]
    assert kinds == [b"event: result", b"event: result", b"event: end"]
    assert b"first" in seen[0] and b"late-1" in seen[1]


def test_an_operator_imports_a_key_from_standard_input(tmp_path: Path) -> None:
    db = tmp_path / "service.db"
    runner = CliRunner()
    args = ["serve", "keys", "create", "--db", str(db), "--name", "guide", "--key-stdin"]
    done = runner.invoke(main, args, input="test-key\n")
    assert done.exit_code == 0, done.output
    assert "test-key" not in done.output
    assert Store(db).key_name("test-key") == "guide"
    again = runner.invoke(main, [*args[:-2], "other", "--key-stdin"], input="test-key\n")
    assert again.exit_code == 2 and "that key exists already" in again.output
    short = runner.invoke(main, [*args[:-2], "short", "--key-stdin"], input="abc\n")
    assert short.exit_code == 2 and "at least 8 characters" in short.output
    spaced = runner.invoke(main, [*args[:-2], "spaced", "--key-stdin"], input="a key with spaces\n")
    assert spaced.exit_code == 2 and "Traceback" not in spaced.output
    with pytest.raises(ConfigError, match="at least 8"):
        Store(db).create_key("empty", "")


def test_pack_sources_are_the_registered_ones() -> None:
    assert ServiceSettings(pack_sources=["task", "lm-eval", "task"]).pack_sources == [
        "task",
        "lm-eval",
    ]
    with pytest.raises(ValueError, match="unknown pack source nope; registered sources: "):
        ServiceSettings(pack_sources=["nope"])


def test_a_task_class_installed_through_an_entry_point_loads_by_name() -> None:
    """The guide's task class, decorated with @register_task and registered in the
    entry-point group convsim.tasks by its package, in a fresh interpreter."""
    code = (
        "import convsim\n"
        "from convsim.lm_eval import TASKS\n"
        "pack = convsim.load_pack('task:single_turn_scenarios_my_new_task')\n"
        "import guide_extensions.my_new_task as m\n"
        "assert TASKS.get('single_turn_scenarios_my_new_task') is m.MyNewTask\n"
        "print(pack.name, len(pack))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**_env(), "PYTHONPATH": str(INSTALLED)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["task:single_turn_scenarios_my_new_task", "3"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
