"""The JSONL results sink: streaming writes, the manifest, resume, damage, a real crash."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import convsim
from convsim import (
    ConversationResult,
    JsonlSink,
    ResultsError,
    RunManifest,
    Simulator,
    Status,
    load_pack,
    read_results,
    run_sync,
)
from convsim.metrics import DEFAULT_METRICS


def write_pack(folder: Path, n: int, *, turns: int = 1, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    flow = {
        "default": {
            "turns": [
                {"turn_id": f"t{k}", "prompt_template": f"Message {k} from {{name}}.{extra}"}
                for k in range(turns)
            ]
        }
    }
    (folder / "turn_configs.yml").write_text(yaml.safe_dump(flow), encoding="utf-8")
    (folder / "scenarios.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "scenario_id": f"c{i:02d}",
                    "scenario_description": "sink test",
                    "variables": {"name": f"N{i}"},
                }
            )
            + "\n"
            for i in range(n)
        ),
        encoding="utf-8",
    )
    return folder


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def ids_in(path: Path) -> list[str]:
    return [
        json.loads(line)["conversation_id"]
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


def assert_each_once(path: Path, expected: set[str]) -> list[ConversationResult]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), "the file must end with a complete line"
    ids = ids_in(path)
    assert sorted(ids) == sorted(expected), "every conversation exactly once"
    results = read_results(path)
    assert [r.conversation_id for r in results] == ids
    return results


async def run_all(
    pack: Path, sink: JsonlSink, **sim_args: Any
) -> tuple[convsim.RunHandle, list[ConversationResult]]:
    async with Simulator("scripted", **sim_args) as sim:
        handle = sim.run(pack, sink=sink)
        results = [r async for r in handle]
    return handle, results


# -- streaming writes and the manifest ----------------------------------------------


@pytest.mark.anyio
async def test_each_result_is_on_disk_when_it_is_yielded(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 4)
    out = tmp_path / "runs" / "x.jsonl"  # a missing folder is created
    snapshots: list[tuple[str, list[str], dict[str, Any]]] = []
    async with Simulator("scripted", model_args={"latency": 0.02}, concurrency=1) as sim:
        handle = sim.run(pack, sink=JsonlSink(out))
        async for result in handle:
            manifest = json.loads(
                (tmp_path / "runs" / "x.manifest.json").read_text(encoding="utf-8")
            )
            snapshots.append(
                (result.conversation_id, out.read_text(encoding="utf-8").splitlines(), manifest)
            )
    first_id, first_lines, first_manifest = snapshots[0]
    assert 1 <= len(first_lines) < 4, "the first line must be there while the run is still going"
    assert first_id in [json.loads(line)["conversation_id"] for line in first_lines]
    # Each snapshot holds the result just yielded, written in full.
    for cid, lines, _ in snapshots:
        on_disk = [ConversationResult.model_validate_json(line) for line in lines]
        assert cid in [r.conversation_id for r in on_disk]
    assert [len(lines) for _, lines, _ in snapshots] == sorted(
        len(lines) for _, lines, _ in snapshots
    )
    # The manifest is written when the run opens and completed when it closes.
    assert first_manifest["run_id"] == handle.run_id and first_manifest["finished_at"] is None
    assert_each_once(out, {f"c{i:02d}" for i in range(4)})


@pytest.mark.anyio
async def test_manifest_beside_the_results(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    handle, results = await run_all(pack, JsonlSink(out), seed=11, concurrency=2, max_turns=3)
    path = tmp_path / "x.manifest.json"
    assert JsonlSink(out).manifest_path == path
    data = json.loads(path.read_text(encoding="utf-8"))
    manifest = RunManifest.model_validate(data)
    assert manifest.run_id == handle.run_id
    assert {r.run_id for r in results} == {handle.run_id}
    assert manifest.pack == "pack" and manifest.pack_hash == load_pack(pack).pack_hash
    assert Path(manifest.pack_path) == pack.resolve()
    assert manifest.model == "scripted" and manifest.user_model is None
    assert manifest.settings["seed"] == 11 and manifest.settings["concurrency"] == 2
    assert manifest.settings["max_turns"] == 3
    assert manifest.settings["metrics"] == list(DEFAULT_METRICS)
    assert manifest.versions["convsim"] == convsim.__version__
    assert manifest.versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {"anyio", "pydantic"} <= manifest.versions.keys()
    assert manifest.finished_at is not None and manifest.started_at <= manifest.finished_at
    assert manifest.statistics is not None
    assert manifest.statistics["done"] == 3 and manifest.statistics["finished"] == 3
    assert manifest.previous_run_ids == []
    # No temporary files are left beside it; the lock file stays (see ResultsLock).
    assert listing(tmp_path) == ["pack", "x.jsonl", "x.jsonl.lock", "x.manifest.json"]


# -- refusing to overwrite, unwritable paths ----------------------------------------


@pytest.mark.anyio
async def test_existing_file_without_resume_is_refused(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 2)
    out = tmp_path / "x.jsonl"
    out.write_bytes(b"precious data\n")
    with pytest.raises(ResultsError) as info:
        await run_all(pack, JsonlSink(out))
    assert str(out) in str(info.value) and "--resume" in str(info.value)
    assert out.read_bytes() == b"precious data\n"  # untouched
    assert not (tmp_path / "x.manifest.json").exists()

    with pytest.raises(ResultsError):
        JsonlSink(out).prepare()
    JsonlSink(out, resume=True).prepare()  # allowed with resume ...
    JsonlSink(out, overwrite=True).prepare()  # ... or overwrite, and prepare() changes nothing
    assert out.read_bytes() == b"precious data\n"


def test_run_sync_refuses_an_existing_file(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 2)
    out = tmp_path / "x.jsonl"
    run_sync(pack, "scripted", out=out)
    before = out.read_bytes()
    with pytest.raises(ResultsError):
        run_sync(pack, "scripted", out=out)
    assert out.read_bytes() == before


@pytest.mark.anyio
async def test_overwrite_replaces_the_file(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 2)
    out = tmp_path / "x.jsonl"
    out.write_text("old junk\n", encoding="utf-8")
    await run_all(pack, JsonlSink(out, overwrite=True))
    assert_each_once(out, {"c00", "c01"})


@pytest.mark.anyio
async def test_reusing_a_sink_never_truncates_earlier_results(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    sink = JsonlSink(out)
    await run_all(pack, sink)
    first = out.read_bytes()
    assert first.count(b"\n") == 3
    with contextlib.suppress(ResultsError):  # refusing is fine; losing results is not
        await run_all(pack, sink)
    assert out.read_bytes().startswith(first)


@pytest.mark.anyio
async def test_wait_raises_the_sink_error_too(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 1)
    out = tmp_path / "x.jsonl"
    out.write_text("x\n", encoding="utf-8")
    async with Simulator("scripted") as sim:
        handle = sim.run(pack, sink=JsonlSink(out))
        with pytest.raises(ResultsError):
            await handle.wait()


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["under_a_file", "a_folder"])
async def test_unwritable_path(tmp_path: Path, kind: str) -> None:
    pack = write_pack(tmp_path / "pack", 1)
    if kind == "under_a_file":
        (tmp_path / "file").write_text("I am a file", encoding="utf-8")
        out = tmp_path / "file" / "x.jsonl"
    else:
        out = tmp_path / "folder.jsonl"
        out.mkdir()
    with pytest.raises(ResultsError) as info:
        JsonlSink(out).prepare()
    assert str(out) in str(info.value)
    with pytest.raises(ResultsError):
        await run_all(pack, JsonlSink(out))
    if kind == "under_a_file":
        assert (tmp_path / "file").read_text(encoding="utf-8") == "I am a file"


@pytest.mark.anyio
async def test_write_before_open_is_an_error(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 1)
    _, (result,) = await run_all(pack, JsonlSink(tmp_path / "a.jsonl"))
    with pytest.raises(ResultsError, match="open"):
        await JsonlSink(tmp_path / "b.jsonl").write(result)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups."""
    inner = getattr(exc, "exceptions", None)
    if inner is None:
        return [exc]
    return [leaf for e in inner for leaf in leaves(e)]


class FailingSink:
    """A ResultSink whose disk fills up on the second write."""

    def __init__(self) -> None:
        self.writes = 0
        self.closed: RunManifest | None = None

    async def open(self, manifest: RunManifest) -> set[str]:
        return set()

    async def write(self, result: ConversationResult) -> None:
        self.writes += 1
        if self.writes == 2:
            raise ResultsError("results.jsonl: cannot write results: No space left on device")

    async def close(self, manifest: RunManifest) -> None:
        self.closed = manifest


def test_failing_sink_fixture_is_a_result_sink() -> None:
    assert isinstance(FailingSink(), convsim.ResultSink)
    assert isinstance(JsonlSink("x.jsonl"), convsim.ResultSink)


@pytest.mark.anyio
async def test_a_sink_write_failure_surfaces_as_results_error(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 6)
    sink = FailingSink()
    with pytest.raises(ResultsError, match="No space left"):
        await run_all(pack, sink, model_args={"latency": 0.01}, concurrency=3)


@pytest.mark.anyio
async def test_a_sink_write_failure_stops_the_run(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 6)
    sink = FailingSink()
    with pytest.raises(ResultsError, match="No space left"):
        await run_all(pack, sink, model_args={"latency": 0.01}, concurrency=3)
    assert sink.closed is not None  # the manifest is still finalised
    assert 2 <= sink.writes < 6  # no new conversations after the failure


# -- resume -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_resume_after_a_simulated_crash(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 6, turns=2)
    out = tmp_path / "x.jsonl"
    first, _ = await run_all(pack, JsonlSink(out), concurrency=1)
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) == 6
    ids = [json.loads(line)["conversation_id"] for line in lines]

    # One conversation was cancelled, and the process died while writing the last line.
    cancelled = json.loads(lines[2])
    cancelled["status"] = Status.CANCELLED.value
    cancelled["termination_reason"] = "cancelled"
    lines[2] = json.dumps(cancelled) + "\n"
    torn = lines[-1][: len(lines[-1]) // 2]
    crashed = "".join(lines[:-1]) + torn
    out.write_text(crashed, encoding="utf-8")
    assert not out.read_bytes().endswith(b"\n")
    kept = {ids[0], ids[1], ids[3], ids[4]}
    # read_results sees only complete lines (the cancelled one included).
    assert [r.conversation_id for r in read_results(out)] == ids[:5]

    second, rerun = await run_all(pack, JsonlSink(out, resume=True))
    assert sorted(r.conversation_id for r in rerun) == sorted([ids[2], ids[5]])
    stats = second.statistics()
    assert (stats.resumed, stats.total, stats.done) == (4, 2, 2)

    final = assert_each_once(out, set(ids))
    assert all(r.status is Status.DONE for r in final)
    by_id = {r.conversation_id: r for r in final}
    for cid in kept:
        assert by_id[cid].run_id == first.run_id  # kept, not run again
    for cid in (ids[2], ids[5]):
        assert by_id[cid].run_id == second.run_id
    # Kept lines are preserved byte for byte.
    text = out.read_text(encoding="utf-8")
    for i in (0, 1, 3, 4):
        assert lines[i] in text
    manifest = RunManifest.model_validate_json(
        (tmp_path / "x.manifest.json").read_text(encoding="utf-8")
    )
    assert manifest.run_id == second.run_id
    assert manifest.previous_run_ids == [first.run_id]
    assert not [name for name in listing(tmp_path) if name.endswith(".tmp")]


@pytest.mark.anyio
async def test_resume_of_a_complete_file_runs_nothing(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    first, _ = await run_all(pack, JsonlSink(out))
    before = out.read_bytes()
    second, results = await run_all(pack, JsonlSink(out, resume=True))
    assert results == []
    assert out.read_bytes() == before
    stats = second.statistics()
    assert (stats.resumed, stats.total, stats.started) == (3, 0, 0)
    manifest = json.loads((tmp_path / "x.manifest.json").read_text(encoding="utf-8"))
    assert manifest["previous_run_ids"] == [first.run_id]


@pytest.mark.anyio
async def test_resume_drops_duplicate_lines(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    await run_all(pack, JsonlSink(out))
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join([*lines, lines[0]]), encoding="utf-8")
    _, results = await run_all(pack, JsonlSink(out, resume=True))
    assert results == []
    assert_each_once(out, {"c00", "c01", "c02"})


@pytest.mark.anyio
async def test_resume_into_a_missing_file_runs_everything(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 2)
    out = tmp_path / "new.jsonl"
    _, results = await run_all(pack, JsonlSink(out, resume=True))
    assert len(results) == 2
    assert_each_once(out, {"c00", "c01"})


@pytest.mark.anyio
@pytest.mark.parametrize("manifest", ["kept", "deleted"])
async def test_resume_with_a_changed_pack_is_refused(tmp_path: Path, manifest: str) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    await run_all(pack, JsonlSink(out))
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(lines[:2]), encoding="utf-8")  # one conversation still to run
    if manifest == "deleted":
        (tmp_path / "x.manifest.json").unlink()
    old_manifest = (tmp_path / "x.manifest.json").read_bytes() if manifest == "kept" else None
    before = out.read_bytes()

    write_pack(pack, 3, extra=" (edited)")  # same ids, different prompts
    assert load_pack(pack).pack_hash != json.loads(lines[0])["pack_hash"]
    with pytest.raises(ResultsError) as info:
        await run_all(pack, JsonlSink(out, resume=True))
    assert str(out) in str(info.value)
    assert out.read_bytes() == before  # nothing was rewritten
    if old_manifest is not None:
        assert "pack" in str(info.value) and "hash" in str(info.value)
        assert (tmp_path / "x.manifest.json").read_bytes() == old_manifest


# -- reading results ----------------------------------------------------------------


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    run_sync(pack, "scripted", out=out)
    return out


def test_read_results_round_trips(results_file: Path) -> None:
    results = read_results(results_file)
    assert sorted(r.conversation_id for r in results) == ["c00", "c01", "c02"]
    assert all(isinstance(r, ConversationResult) and r.status is Status.DONE for r in results)
    assert read_results(str(results_file)) == results


def test_read_results_ignores_a_torn_last_line(results_file: Path) -> None:
    lines = results_file.read_text(encoding="utf-8").splitlines(keepends=True)
    results_file.write_text("".join(lines[:2]) + lines[2][:40], encoding="utf-8")
    assert [r.conversation_id for r in read_results(results_file)] == [
        json.loads(line)["conversation_id"] for line in lines[:2]
    ]


def test_read_results_ignores_a_lone_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"schema_version": 1, "run_id": "ab')
    assert read_results(path) == []
    path.write_bytes(b"")
    assert read_results(path) == []


def test_read_results_refuses_a_corrupt_middle_line(results_file: Path) -> None:
    lines = results_file.read_text(encoding="utf-8").splitlines(keepends=True)
    results_file.write_text(lines[0] + lines[1][:30] + "\n" + lines[2], encoding="utf-8")
    with pytest.raises(ResultsError) as info:
        read_results(results_file)
    assert f"{results_file}:2" in str(info.value) and "damaged" in str(info.value)


def test_read_results_refuses_json_that_is_not_a_result(results_file: Path) -> None:
    lines = results_file.read_text(encoding="utf-8").splitlines(keepends=True)
    results_file.write_text(lines[0] + '{"hello": "world"}\n' + lines[2], encoding="utf-8")
    with pytest.raises(ResultsError, match=":2: not a convsim result"):
        read_results(results_file)


def test_read_results_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such results file"):
        read_results(tmp_path / "nope.jsonl")


@pytest.mark.anyio
async def test_resume_refuses_a_corrupt_middle_line(results_file: Path) -> None:
    pack = results_file.parent / "pack"
    lines = read(results_file).splitlines(keepends=True)
    damaged = lines[0] + "garbage\n" + lines[2]
    write(results_file, damaged)
    with pytest.raises(ResultsError, match="damaged"):
        await run_all(pack, JsonlSink(results_file, resume=True))
    assert read(results_file) == damaged


# -- a real crash -------------------------------------------------------------------

CRASHING_RUN = """
import sys
import anyio
import convsim
from convsim.adapters import ScriptedAdapter

pack, out = sys.argv[1], sys.argv[2]
answer = ScriptedAdapter.generate

async def generate(self, messages, params):
    if params.metadata["conversation_id"] >= "c10":
        await anyio.sleep_forever()  # from c10 on, no answer: only the kill ends the run
    return await answer(self, messages, params)

ScriptedAdapter.generate = generate
convsim.run_sync(pack, "scripted", out=out, concurrency=2)
"""


def test_resume_after_sigkill(tmp_path: Path) -> None:
    n = 40
    pack = write_pack(tmp_path / "pack", n)
    out = tmp_path / "crash.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN, str(pack), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        give_up = time.monotonic() + 30  # a hang guard, not a speed check
        while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < give_up, "the subprocess wrote nothing"
            time.sleep(0.005)
        # killed while it writes c03..c09, or once it waits for c10 and c11: mid-run either way
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    written_before = read_results(out)
    assert 3 <= len(written_before) <= 10, "killed mid-run"
    crashed_run = {r.run_id for r in written_before}
    assert len(crashed_run) == 1

    resumed = run_sync(pack, "scripted", out=out, resume=True)
    assert {r.conversation_id for r in resumed}.isdisjoint(
        r.conversation_id for r in written_before
    )
    final = assert_each_once(out, {f"c{i:02d}" for i in range(n)})
    assert all(r.status is Status.DONE for r in final)
    before_ids = {r.conversation_id for r in written_before}
    assert {r.conversation_id for r in final if r.run_id in crashed_run} == before_ids
    assert len(resumed) == n - len(before_ids)
    manifest = RunManifest.model_validate_json(
        (tmp_path / "crash.manifest.json").read_text(encoding="utf-8")
    )
    assert manifest.previous_run_ids == sorted(crashed_run)
    assert manifest.statistics is not None and manifest.statistics["resumed"] == len(before_ids)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("second", "message"),
    [
        (("scripted", 2), "was written with seed 1, not 2"),
        (("scripted:other", 1), "was written with model 'scripted', not 'scripted:other'"),
    ],
)
async def test_resume_refuses_other_model_or_seed(
    tmp_path: Path, second: tuple[str, int], message: str
) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    await run_all(pack, JsonlSink(out), seed=1)
    spec, seed = second
    async with Simulator(spec, seed=seed) as sim:
        with pytest.raises(ResultsError, match=message):
            await sim.run(pack, sink=JsonlSink(out, resume=True)).wait()
    assert len(out.read_text().splitlines()) == 3  # nothing lost
