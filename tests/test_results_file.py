"""The results file under stress: retried failures, two writers, long conversations, a
full disk, text that cannot be encoded, hostile lines."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs
from test_sinks import read, run_all, write_pack

import convsim
from convsim import (
    BadRequest,
    ConfigError,
    ConversationResult,
    JsonlSink,
    ResultsError,
    ResultsLock,
    RunManifest,
    ServerError,
    Simulator,
    Status,
    Summarizer,
    TerminationReason,
    read_results,
    summarize_file,
)
from convsim._records import SCHEMA_VERSION
from convsim.adapters import Completion, GenerationParams, Message, ScriptedAdapter
from convsim.cli import main

DATA = Path(__file__).parent / "data"


def invoke(*args: str) -> tuple[int, str, str]:
    """The CLI in this process; a traceback fails the test (catch_exceptions=False)."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


async def ainvoke(*args: str) -> tuple[int, str, str]:
    """The CLI from an async test (it runs its own event loop: in a worker thread)."""
    return await anyio.to_thread.run_sync(lambda: invoke(*args))


def leftovers(folder: Path) -> list[Path]:
    return list(folder.glob(".*.tmp"))


def ids_in(path: Path) -> list[str]:
    return [json.loads(line)["conversation_id"] for line in path.read_bytes().splitlines()]


class Flaky(ScriptedAdapter):
    """Answers like ``scripted``, except that the conversations in ``down`` meet a server
    error (infrastructure), those in ``refused`` a 400 (the model's side), and those in
    ``text`` get that answer."""

    def __init__(
        self,
        *,
        down: Sequence[str] = (),
        refused: Sequence[str] = (),
        text: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.down, self.refused, self.text = set(down), set(refused), text or {}

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        cid = params.metadata["conversation_id"]
        if cid in self.down:
            raise ServerError("upstream 503", model="scripted", status_code=503)
        if cid in self.refused:
            raise BadRequest("bad request", model="scripted", status_code=400)
        completion = await super().generate(messages, params)
        if cid in self.text:
            completion = completion.model_copy(update={"text": self.text[cid]})
        return completion


async def run_with(adapter: Any, pack: Path, sink: JsonlSink) -> list[ConversationResult]:
    async with Simulator(adapter) as sim:
        return [r async for r in sim.run(pack, sink=sink)]


# -- --retry-failed: the latest record of a conversation counts ---------------------


@pytest.mark.anyio
async def test_retry_failed_reruns_infrastructure_failures_only(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 5, turns=2)
    out = tmp_path / "x.jsonl"
    first = await run_with(Flaky(down=["c01", "c03"], refused=["c02"]), pack, JsonlSink(out))
    reasons = {r.conversation_id: r.termination_reason for r in first}
    assert reasons["c01"] is reasons["c03"] is TerminationReason.INFRASTRUCTURE_ERROR
    assert reasons["c02"] is TerminationReason.MODEL_ERROR

    # --resume alone keeps failures as they are
    assert await run_with(Flaky(), pack, JsonlSink(out, resume=True)) == []
    # --retry-failed runs the infrastructure failures again; the model's failure stays
    retried = await run_with(Flaky(), pack, JsonlSink(out, resume=True, retry_failed=True))
    assert sorted(r.conversation_id for r in retried) == ["c01", "c03"]
    assert all(r.status is Status.DONE for r in retried)
    # both lines are in the file, the new one last ...
    assert sorted(ids_in(out)) == ["c00", "c01", "c01", "c02", "c03", "c03", "c04"]
    # ... and every reader counts only the last one
    latest = {r.conversation_id: r for r in read_results(out)}
    assert len(latest) == 5 == len(read_results(out))
    assert latest["c01"].status is latest["c03"].status is Status.DONE
    assert latest["c02"].termination_reason is TerminationReason.MODEL_ERROR
    report = summarize_file(out)
    assert report.conversations == 5
    assert report.statuses == {"DONE": 4, "FAILED": 1, "TIMED_OUT": 0, "CANCELLED": 0}
    assert report.errors == {"BadRequest": 1}
    assert report == convsim.summarize(read_results(out))
    code, _, _ = await ainvoke("report", str(out))
    assert code == 0
    assert json.loads(read(tmp_path / "x.summary.json"))["conversations"] == 5
    code, stdout, _ = await ainvoke("score", str(out), "--metrics", "response_length")
    assert code == 0 and "x.jsonl: 5 conversations" in stdout

    # nothing left to retry; resuming drops the superseded lines (atomically)
    assert await run_with(Flaky(), pack, JsonlSink(out, resume=True, retry_failed=True)) == []
    assert sorted(ids_in(out)) == ["c00", "c01", "c02", "c03", "c04"]
    assert {r.conversation_id: r for r in read_results(out)} == latest
    assert not leftovers(tmp_path)


@pytest.mark.anyio
async def test_retry_failed_reruns_conversation_timeouts(tmp_path: Path) -> None:
    """A timeout counts against --max-failure-rate, so --retry-failed runs it again."""

    class Stalled(Flaky):
        async def generate(
            self, messages: Sequence[Message], params: GenerationParams
        ) -> Completion:
            if params.metadata["conversation_id"] == "c01":
                await anyio.sleep_forever()  # a server that never answers
            return await super().generate(messages, params)

    pack = write_pack(tmp_path / "pack", 3, turns=2)
    out = tmp_path / "x.jsonl"
    async with Simulator(Stalled(), conversation_timeout=0.05) as sim:
        first = [r async for r in sim.run(pack, sink=JsonlSink(out))]
    assert {r.conversation_id: r.status for r in first}["c01"] is Status.TIMED_OUT
    async with Simulator(Flaky(), conversation_timeout=0.05) as sim:
        sink = JsonlSink(out, resume=True, retry_failed=True)
        retried = [r async for r in sim.run(pack, sink=sink)]
    assert [(r.conversation_id, r.status) for r in retried] == [("c01", Status.DONE)]
    assert {r.status for r in read_results(out)} == {Status.DONE}


@pytest.mark.anyio
async def test_a_retry_that_fails_again_still_counts_once(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    await run_with(Flaky(down=["c00"]), pack, JsonlSink(out))
    again = await run_with(
        Flaky(down=["c00"]), pack, JsonlSink(out, resume=True, retry_failed=True)
    )
    assert [r.conversation_id for r in again] == ["c00"]
    assert summarize_file(out).statuses["FAILED"] == 1
    assert [r.run_id for r in read_results(out) if r.conversation_id == "c00"] == [again[0].run_id]


def test_retry_failed_needs_resume(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="resume"):
        JsonlSink(tmp_path / "x.jsonl", retry_failed=True)
    code, _, err = invoke("run", "customer_support", "--out", str(tmp_path / "x.jsonl"),
                          "--retry-failed")  # fmt: skip
    assert code == 2 and "--retry-failed needs --resume" in err


def test_cli_retry_failed(tmp_path: Path) -> None:
    out = tmp_path / "qa.jsonl"
    args = ["run", "single_turn_qa", "--out", str(out), "--model-arg", "fail_rate=0.3"]
    assert invoke(*args)[0] == 3  # infrastructure failures, and none tolerated
    failed = {r.conversation_id for r in read_results(out) if r.status is Status.FAILED}
    assert failed
    code, _, _ = invoke(*args, "--resume", "--retry-failed", "--max-failure-rate", "1")
    assert code == 0
    assert len(ids_in(out)) == 30 + len(failed)  # appended, not rewritten
    summary = json.loads((tmp_path / "qa.summary.json").read_text())
    assert summary["conversations"] == 30  # each conversation once
    assert len(summary["runs"]) == 2


# -- one run per results file ------------------------------------------------------


@pytest.mark.anyio
async def test_a_second_sink_on_a_file_in_use_is_refused(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 4)
    out = tmp_path / "x.jsonl"
    await run_all(pack, JsonlSink(out))
    before = out.read_bytes(), (tmp_path / "x.manifest.json").read_bytes()
    holder = JsonlSink(out, resume=True)
    holder.prepare()  # locked from here until close
    with pytest.raises(ResultsError) as info:
        await run_all(pack, JsonlSink(out, resume=True))
    assert "is being written by another convsim run" in str(info.value)
    assert f"pid {os.getpid()}" in str(info.value)
    assert (out.read_bytes(), (tmp_path / "x.manifest.json").read_bytes()) == before
    holder.lock.release()
    await run_all(pack, JsonlSink(out, resume=True))  # free again


class Gated(ScriptedAdapter):
    """Answers once ``gate`` is set; ``called`` says a call is waiting (the run is on)."""

    def __init__(self) -> None:
        super().__init__()
        self.called, self.gate = anyio.Event(), anyio.Event()

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        self.called.set()
        await self.gate.wait()
        return await super().generate(messages, params)


@pytest.mark.anyio
async def test_two_runs_of_one_simulator_on_one_file(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 6)
    out = tmp_path / "x.jsonl"
    adapter = Gated()
    async with Simulator(adapter, concurrency=2) as sim:
        first = sim.run(pack, sink=JsonlSink(out, resume=True))
        with anyio.fail_after(10):
            await adapter.called.wait()
        second = sim.run(pack, sink=JsonlSink(out, resume=True))
        with pytest.raises(ResultsError, match="being written by another convsim run"):
            await second.wait()
        adapter.gate.set()
        await first.wait()
    assert sorted(ids_in(out)) == [f"c{i:02d}" for i in range(6)]


HOLD_LOCK = """
import sys
from convsim import ResultsLock
lock = ResultsLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
"""


@contextmanager
def holding_lock(out: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the lock of ``out`` until the block ends (or it is
    killed in it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def test_another_process_holding_the_file(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    assert invoke("run", str(pack), "--out", str(out))[0] == 0
    kept = ("x.jsonl", "x.manifest.json", "x.summary.json", "x.summary.md")
    before = [(tmp_path / name).read_bytes() for name in kept]
    with holding_lock(out) as proc:
        for args in (
            ("run", str(pack), "--out", str(out), "--resume"),
            ("run", str(pack), "--out", str(out), "--overwrite"),
            ("report", str(out)),
            ("score", str(out), "--metrics", "response_length"),
        ):
            code, _, err = invoke(*args)
            assert code == 2, args
            assert f"is being written by another convsim run (pid {proc.pid}?)" in err
            assert str(out) in err and "Traceback" not in err
        assert [(tmp_path / name).read_bytes() for name in kept] == before
        # a process that dies, even by SIGKILL, leaves no stale lock
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    code, _, err = invoke("run", str(pack), "--out", str(out), "--resume")
    assert code == 0, err


def other_names(path: Path) -> dict[str, Path]:
    """More names of ``path``: a symlink to it, the file through a symlinked folder, and
    a hard link."""
    symlink = path.with_name("sym.jsonl")
    symlink.symlink_to(path.name)
    (path.parent / "linked").symlink_to(path.parent, target_is_directory=True)
    hard = path.with_name("hard.jsonl")
    os.link(path, hard)
    return {
        "symlink": symlink,
        "folder symlink": path.parent / "linked" / path.name,
        "hard link": hard,
    }


@pytest.mark.anyio
async def test_a_file_in_use_is_refused_under_any_of_its_names(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 4)
    out = tmp_path / "x.jsonl"
    await run_all(pack, JsonlSink(out))
    before = out.read_bytes()
    names = [out, *other_names(out).values()]
    for holder_name in names:
        holder = JsonlSink(holder_name, resume=True)
        holder.prepare()  # locked from here until released
        for name in names:
            if name != holder_name:
                with pytest.raises(ResultsError, match="being written by another convsim run"):
                    await run_all(pack, JsonlSink(name, resume=True))
        holder.lock.release()
    assert out.read_bytes() == before
    await run_all(pack, JsonlSink(tmp_path / "hard.jsonl", resume=True))  # free again


@pytest.mark.anyio
async def test_two_runs_on_one_file_through_a_link(tmp_path: Path) -> None:
    """The reviewer's case: two runs at once, one through another name of the file,
    must not write each conversation twice."""
    pack = write_pack(tmp_path / "pack", 6)
    out = tmp_path / "x.jsonl"
    out.touch()
    names = other_names(out)
    for name in names.values():
        adapter = Gated()
        async with Simulator(adapter, concurrency=2) as sim:
            first = sim.run(pack, sink=JsonlSink(out, overwrite=True))
            with anyio.fail_after(10):
                await adapter.called.wait()
            second = sim.run(pack, sink=JsonlSink(name, overwrite=True))
            with pytest.raises(ResultsError, match="being written by another convsim run"):
                await second.wait()
            adapter.gate.set()
            await first.wait()
        assert sorted(ids_in(out)) == [f"c{i:02d}" for i in range(6)]


@pytest.mark.parametrize("kind", ["symlink", "folder symlink", "hard link"])
def test_another_process_holding_the_file_under_another_name(tmp_path: Path, kind: str) -> None:
    pack = write_pack(tmp_path / "pack", 3)
    out = tmp_path / "x.jsonl"
    assert invoke("run", str(pack), "--out", str(out))[0] == 0
    name = other_names(out)[kind]
    before = out.read_bytes()
    with holding_lock(out) as proc:
        for args in (
            ("run", str(pack), "--out", str(name), "--resume"),
            ("run", str(pack), "--out", str(name), "--overwrite"),
            ("report", str(name)),
        ):
            code, _, err = invoke(*args)
            assert code == 2, args
            assert "is being written by another convsim run" in err
            assert str(name) in err and "Traceback" not in err
            assert len(err.strip().splitlines()) == 1, err
        if kind != "hard link":  # the lock file beside the real path names the holder
            assert f"(pid {proc.pid}?)" in err
        assert out.read_bytes() == before
    code, _, err = invoke("run", str(pack), "--out", str(name), "--resume")
    assert code == 0, err


@pytest.mark.anyio
async def test_a_resume_that_rewrites_the_file_keeps_it_locked(tmp_path: Path) -> None:
    """Resuming replaces the file in one step (a new inode): the writer locks the new
    file, and a symlink to it stays a symlink."""
    pack = write_pack(tmp_path / "pack", 4)
    out = tmp_path / "x.jsonl"
    await run_all(pack, JsonlSink(out))
    lines = out.read_bytes().splitlines(keepends=True)
    cancelled = json.loads(lines[0])
    cancelled["status"] = Status.CANCELLED.value
    out.write_bytes(json.dumps(cancelled).encode() + b"\n" + b"".join(lines[1:]))
    link = tmp_path / "link.jsonl"
    link.symlink_to(out)
    holder = JsonlSink(link, resume=True)
    manifest = RunManifest.model_validate_json((tmp_path / "x.manifest.json").read_text())
    (tmp_path / "link.manifest.json").write_text(manifest.model_dump_json())
    inode = out.stat().st_ino
    done = await holder.open(manifest)
    try:
        assert len(done) == 3 and out.stat().st_ino != inode  # rewritten
        assert link.is_symlink() and link.resolve() == out.resolve()
        os.link(out, tmp_path / "late.jsonl")  # a name made after the rewrite
        with pytest.raises(ResultsError, match="being written by another convsim run"):
            JsonlSink(tmp_path / "late.jsonl", resume=True).prepare()
    finally:
        await holder.close(manifest)
    JsonlSink(tmp_path / "late.jsonl", resume=True).prepare()  # released


def test_without_flock_the_lock_goes_by_name_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A platform or file system without flock (Windows, some network mounts): the lock
    file still excludes a second writer by name; that hard links are not guarded is
    logged, not a crash."""
    from convsim.results import _lock

    def no_flock(fd: int) -> bool:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_lock, "_flock", no_flock)
    path = tmp_path / "x.jsonl"
    path.touch()
    with (
        capture_logs() as logs,
        ResultsLock(path),
        pytest.raises(ResultsError, match="being written by another convsim run"),
    ):
        ResultsLock(path).acquire()
    [event] = [e for e in logs if e["event"] == "results_lock_by_name_only"]
    assert event["log_level"] == "warning" and event["reason"] == "No locks available"


def test_the_lock_is_not_reentrant_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    with ResultsLock(path) as one:
        one.acquire()  # the same instance counts
        one.release()
        with pytest.raises(ResultsError):
            ResultsLock(path).acquire()
    with ResultsLock(path):
        pass


# -- each message stored once -------------------------------------------------------


@pytest.mark.anyio
async def test_a_line_grows_linearly_with_the_conversation(tmp_path: Path) -> None:
    sizes = {}
    for turns in (10, 40):
        pack = write_pack(tmp_path / f"p{turns}", 1, turns=turns)
        out = tmp_path / f"x{turns}.jsonl"
        _, (result,) = await run_all(pack, JsonlSink(out))
        sizes[turns] = out.stat().st_size
        line = out.read_text(encoding="utf-8")
        # the first message was sent with every turn, but is stored once, in the transcript
        assert line.count('{"role":"user","content":"Message 0 from N0."}') == 1
        assert json.loads(line)["schema_version"] == 2
        (back,) = read_results(out)
        assert back == result
        assert [t.messages for t in back.turns] == [t.messages for t in result.turns]
        assert back.turns[-1].messages == result.transcript[:-1]
    assert sizes[40] < 5 * sizes[10]  # 4x the turns: about 4x the bytes, not 16x


def test_a_python_dump_keeps_every_turns_messages_whole() -> None:
    """Only the file (JSON) stores each message once; a dict for a DataFrame or an
    export of one's own has each turn's full history, and validates back the same."""
    result = max(read_results(DATA / "results_v1.jsonl"), key=lambda r: len(r.transcript))
    assert max(len(t.messages) for t in result.turns) > 2
    dumped = result.model_dump()
    assert [len(t["messages"]) for t in dumped["turns"]] == [len(t.messages) for t in result.turns]
    assert all("messages_prefix" not in t for t in dumped["turns"])
    assert ConversationResult.model_validate(dumped).turns == result.turns
    as_json = result.model_dump(mode="json")
    assert max(t["messages_prefix"] for t in as_json["turns"]) > 2
    assert ConversationResult.model_validate(as_json).turns == result.turns


def test_results_written_before_still_read_and_summarise_the_same() -> None:
    """tests/data/results_v1.jsonl was written by the previous version (schema 1, every
    turn's messages in full); results_v1.summary.json is what it summarised them to."""
    path = DATA / "results_v1.jsonl"
    results = read_results(path)
    assert {r.schema_version for r in results} == {1}
    expected = (DATA / "results_v1.summary.json").read_text(encoding="utf-8")
    assert summarize_file(path).model_dump_json(indent=2) + "\n" == expected
    assert convsim.summarize(results).model_dump_json(indent=2) + "\n" == expected
    for result in results:
        line = result.model_dump_json()
        again = ConversationResult.model_validate_json(line)
        assert again.turns == result.turns and again.transcript == result.transcript
        assert (
            json.loads(line)["schema_version"] == 2
            and len(line)
            < len(
                json.dumps(json.loads(result.model_dump_json()))  # never longer than before
            )
            + 1
        )


def test_summary_from_a_file_equals_the_summary_of_its_results(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    lines = (DATA / "results_v1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join([*lines, lines[1]]), encoding="utf-8")  # a conversation twice
    assert summarize_file(path) == convsim.summarize(read_results(path))
    assert summarize_file(path).conversations == len(lines)
    fed = Summarizer()
    for result in read_results(path):
        fed.add(result)
    assert fed.report() == summarize_file(path)


@pytest.mark.parametrize(
    "change",
    [
        {"messages_prefix": 99},
        {"messages_prefix": -1},
        {"messages_prefix": "2"},
        {"messages_prefix": 0, "messages": "x"},
    ],
)
def test_a_bad_messages_prefix_is_located(tmp_path: Path, change: dict[str, Any]) -> None:
    (result,) = read_results(DATA / "results_v1.jsonl")[:1]
    data = json.loads(result.model_dump_json())
    data["turns"][0].update(change)
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")
    with pytest.raises(ResultsError) as info:
        read_results(path)
    assert f"{path}:1: not a convsim result" in str(info.value)
    assert "messages_prefix" in str(info.value)


def test_a_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    data = json.loads((DATA / "results_v1.jsonl").read_text(encoding="utf-8").splitlines()[0])
    data["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")
    with pytest.raises(ResultsError, match=r"x.jsonl:1: .*newer convsim"):
        read_results(path)


# -- a full disk --------------------------------------------------------------------


def enospc(*_: Any, **__: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def file_state(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("compacting", [True, False])
def test_a_full_disk_while_resuming_keeps_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compacting: bool
) -> None:
    pack = write_pack(tmp_path / "pack", 4)
    out = tmp_path / "runs" / "x.jsonl"
    assert invoke("run", str(pack), "--out", str(out), "--limit", "3")[0] == 0
    if compacting:  # a torn last line: resuming rewrites the file
        with out.open("ab") as fh:
            fh.write(b'{"schema_version": 2, "run_')
    before = file_state(out.parent)
    import convsim.results._sinks

    # the disk is full at the first fsync: the rewrite (compacting) or the manifest
    monkeypatch.setattr(convsim.results._sinks.os, "fsync", enospc)
    code, _, err = invoke("run", str(pack), "--out", str(out), "--resume")
    assert code == 2
    assert "No space left on device" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert file_state(out.parent) == before  # nothing changed, no temporary file left
    monkeypatch.undo()
    assert invoke("run", str(pack), "--out", str(out), "--resume")[0] == 0
    assert sorted(ids_in(out)) == ["c00", "c01", "c02", "c03"]


class FillingFile:
    """A results file whose disk fills up part-way through the ``fail_at``-th write."""

    def __init__(self, real: Any, fail_at: int) -> None:
        self.real, self.fail_at, self.writes = real, fail_at, 0

    def write(self, data: Any) -> int:
        self.writes += 1
        if self.writes == self.fail_at:
            self.real.write(bytes(data[: len(data) // 2]))  # half the line got out
            enospc()
        return int(self.real.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_write_failing_mid_line_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    import convsim.results._sinks

    pack = write_pack(tmp_path / "pack", 8)
    out = tmp_path / "x.jsonl"

    def filling_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        real = builtins.open(file, mode, *args, **kwargs)  # noqa: SIM115 (the sink closes it)
        return (
            FillingFile(real, fail_at=3) if mode == "ab" and kwargs.get("buffering") == 0 else real
        )

    monkeypatch.setattr(convsim.results._sinks, "open", filling_open, raising=False)
    code, _, err = invoke("run", str(pack), "--out", str(out), "--concurrency", "1")
    assert code == 2 and "No space left on device" in err and "Traceback" not in err
    raw = out.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 2  # the half line was cut off
    assert len(read_results(out)) == 2
    monkeypatch.undo()
    assert invoke("run", str(pack), "--out", str(out), "--resume")[0] == 0
    assert sorted(ids_in(out)) == [f"c{i:02d}" for i in range(8)]


# -- text that cannot be encoded --------------------------------------------------------


@pytest.mark.anyio
async def test_half_an_emoji_is_repaired_not_fatal(tmp_path: Path) -> None:
    pack = write_pack(tmp_path / "pack", 4)
    out = tmp_path / "x.jsonl"
    adapter = Flaky(text={"c00": "half \ud83d emoji", "c01": "split \ud83d\ude00 pair"})
    results = await run_with(adapter, pack, JsonlSink(out))
    assert sorted(r.status.value for r in results) == ["DONE"] * 4
    out.read_bytes().decode("utf-8")  # strict UTF-8
    by_id = {r.conversation_id: r for r in read_results(out)}
    assert by_id["c00"].turns[0].response == "half \ufffd emoji"
    assert by_id["c00"].transcript[-1].content == "half \ufffd emoji"
    assert by_id["c01"].turns[0].response == "split \U0001f600 pair"
    # resuming over it, and reading it back again
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:3]))
    again = await run_with(adapter, pack, JsonlSink(out, resume=True))
    assert len(again) == 1
    assert len(read_results(out)) == 4
    assert invoke("report", str(out))[0] == 0


def test_escaped_surrogates_written_by_another_tool_read_back_repaired(tmp_path: Path) -> None:
    line = (DATA / "results_v1.jsonl").read_text(encoding="utf-8").splitlines()[0]
    data = json.loads(line)
    data["scenario_type"] = "lone \ud83d"
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(data) + "\n", encoding="ascii")  # as "\\ud83d"
    (result,) = read_results(path)
    assert result.scenario_type == "lone \ufffd"
    code, _, _ = invoke("report", str(path))
    assert code == 0 and "lone \ufffd" in (tmp_path / "x.summary.md").read_text()


# -- hostile lines ------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def hostile_lines(valid: str) -> dict[str, tuple[bytes, str]]:
    """name -> (a line, what the error must say)."""
    data = json.loads(valid)
    data["usage"]["prompt_tokens"] = 0
    big = json.dumps(data).replace('"prompt_tokens": 0', '"prompt_tokens": ' + "9" * 5000)
    nested = json.dumps({**data, "error": None}).replace('"error": null', '"error": ' + DEEP)
    return {
        "huge_integer": (big.encode(), "too many digits"),
        "deep_nesting": (nested.encode(), "nested too deeply"),
        "deep_bare": (DEEP.encode(), "nested too deeply"),
        "invalid_utf8": (valid.encode().replace(b"scenario", b"scen\xff\xferio", 1), "UTF-8"),
        "not_an_object": (b"[1, 2, 3]", "not an object"),
        "wrong_shape": (json.dumps({**data, "turns": "many"}).encode(), "turns"),
    }


@pytest.mark.parametrize("where", ["first", "middle"])
@pytest.mark.parametrize(
    "kind",
    ["huge_integer", "deep_nesting", "deep_bare", "invalid_utf8", "not_an_object", "wrong_shape"],
)
def test_hostile_lines_give_exit_2_with_file_and_line(
    tmp_path: Path, kind: str, where: str
) -> None:
    valid = (DATA / "results_v1.jsonl").read_bytes().splitlines()
    bad, what = hostile_lines(valid[0].decode())[kind]
    lines = [bad, *valid[:2]] if where == "first" else [valid[0], bad, valid[1]]
    number = lines.index(bad) + 1
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ResultsError) as info:
        read_results(path)
    assert f"{path}:{number}: " in str(info.value) and what in str(info.value)
    commands = [["report", str(path)], ["score", str(path), "--metrics", "response_length"]]
    if kind == "deep_bare" and where == "first":
        # nothing says this is a results file: score reads it as transcripts (not covered here)
        commands.pop()
    for command in commands:
        code, _, err = invoke(*command)
        assert code == 2, (command, err)
        assert f"x.jsonl:{number}" in err and "Traceback" not in err, err


def test_a_huge_line_is_refused_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import convsim.results._sinks

    monkeypatch.setattr(convsim.results._sinks, "MAX_LINE_BYTES", 1000)
    valid = (DATA / "results_v1.jsonl").read_bytes().splitlines()[0]
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": "' + b"x" * 5000 + b'"}\n' + valid + b"\n")
    code, _, err = invoke("report", str(path))
    assert code == 2 and "x.jsonl:1: a line longer than 1000 bytes" in err


def test_a_torn_last_line_is_still_ignored_but_a_complete_bad_one_is_not(tmp_path: Path) -> None:
    valid = (DATA / "results_v1.jsonl").read_bytes().splitlines()
    path = tmp_path / "x.jsonl"
    path.write_bytes(valid[0] + b"\n" + valid[1][:100])
    assert len(read_results(path)) == 1
    path.write_bytes(valid[0] + b"\n" + b"9" * 5000 + b"\n")
    with pytest.raises(ResultsError, match=":2: "):
        read_results(path)


def test_run_sync_retries_failed_conversations(tmp_path: Path) -> None:
    out = tmp_path / "qa.jsonl"
    first = convsim.run_sync("single_turn_qa", "scripted", out=out, model_args={"fail_rate": 0.3})
    failed = {r.conversation_id for r in first if r.status is Status.FAILED}
    assert failed
    again = convsim.run_sync(
        "single_turn_qa",
        "scripted",
        out=out,
        resume=True,
        retry_failed=True,
        model_args={"fail_rate": 0.3},
    )
    assert {r.conversation_id for r in again} == failed  # only the failed ones ran again
    assert len(read_results(out)) == 30
