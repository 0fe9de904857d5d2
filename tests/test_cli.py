"""The command line: exit codes, messages, outputs, signals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Convsim

from convsim import read_results
from convsim.cli import main

GUIDE = str(Path(__file__).parent / "data" / "guide_example")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_list_shows_every_bundled_pack() -> None:
    code, out, _ = invoke("list")
    assert code == 0
    for name in (
        "customer_support",
        "multi_session_memory",
        "coding_help",
        "order_desk",
        "single_turn_qa",
    ):
        assert name in out


def test_validate_reports_ok_and_notes() -> None:
    code, out, _ = invoke("validate", GUIDE)
    assert code == 0
    assert "ok: guide_example (multi_turn, 3 conversations" in out
    assert "optional turn 'refinement' will be skipped" in out


def test_validate_bad_pack_exits_2_with_file_line_field(tmp_path: Path) -> None:
    (tmp_path / "turn_configs.yml").write_text(
        "default:\n  turns:\n    - turn_id: a\n      prompt_template: 'hi {name}'\n"
        "special:\n  turns:\n    - turn_id: b\n      prompt_template: 'x'\n      colour: red\n"
    )
    (tmp_path / "scenarios.jsonl").write_text(
        '{"scenario_id": "s1", "scenario_description": "x"}\n{"scenario_id": oops}\n'
    )
    code, _, err = invoke("validate", str(tmp_path))
    assert code == 2
    assert "turn_configs.yml:9: special.turns.0.colour: unknown field" in err
    assert "scenarios.jsonl:1: variables:" in err and "{name}" in err
    assert "scenarios.jsonl:2: invalid JSON" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "no_such_pack"], "no scenario pack 'no_such_pack'"),
        (["run", GUIDE, "--model", "nope"], "unknown model type 'nope'"),
        (["run", GUIDE, "--model", "scripted", "--model-arg", "latency"], "expected KEY=VALUE"),
        (["run", GUIDE, "--model-arg", "latency=-1"], "latency"),
        (["run", GUIDE, "--model-arg", "colour=red"], "colour"),
        (["run", GUIDE, "--metrics", "latency,nope"], "unknown metric 'nope'"),
        (["run", GUIDE, "--num-fewshot", "2"], "single-turn packs only"),
    ],
)
def test_bad_run_input_exits_2_with_one_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, err = invoke(*args, "--out", str(tmp_path / "r.jsonl"))
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "flag", ["--concurrency=0", "--limit=-1", "--conversation-timeout=0", "--max-turns=0"]
)
def test_bad_cli_values_exit_2(tmp_path: Path, flag: str) -> None:
    code, _, err = invoke("run", GUIDE, flag, "--out", str(tmp_path / "r.jsonl"))
    assert code == 2
    assert "Invalid value" in err


def test_unwritable_output_exits_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = invoke("run", GUIDE, "--out", str(blocker / "r.jsonl"))
    assert code == 2
    assert "cannot write results" in err


def test_existing_output_needs_resume_or_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert invoke("run", GUIDE, "--out", str(out))[0] == 0
    code, _, err = invoke("run", GUIDE, "--out", str(out))
    assert code == 2 and "pass --resume" in err
    assert invoke("run", GUIDE, "--out", str(out), "--overwrite")[0] == 0
    assert len(read_results(out)) == 3


def test_run_writes_results_manifest_and_summaries(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "guide.jsonl"
    code, stdout, _ = invoke("run", GUIDE, "--model", "scripted", "--out", str(out), "--seed", "7")
    assert code == 0
    results = read_results(out)
    assert sorted(r.conversation_id for r in results) == [
        "budget-planning",
        "db-migration",
        "trip-planning",
    ]
    assert {r.status.value for r in results} == {"DONE"}
    assert {r.seed for r in results} != {0}
    manifest = json.loads((tmp_path / "runs" / "guide.manifest.json").read_text())
    assert manifest["settings"]["seed"] == 7 and manifest["model"] == "scripted"
    assert manifest["statistics"]["done"] == 3
    summary = json.loads((tmp_path / "runs" / "guide.summary.json").read_text())
    assert summary["statuses"]["DONE"] == 3
    assert summary["metrics"]["response_length"]["n"] == 3
    assert "| DONE | 3 |" in (tmp_path / "runs" / "guide.summary.md").read_text()
    assert "DONE" in stdout and "response_length" in stdout


def test_resume_skips_recorded_conversations(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert invoke("run", GUIDE, "--out", str(out), "--limit", "1")[0] == 0
    first = read_results(out)
    assert len(first) == 1
    code, _, err = invoke("run", GUIDE, "--out", str(out), "--resume")
    assert code == 0
    results = read_results(out)
    assert len(results) == 3 and len({r.conversation_id for r in results}) == 3
    assert results[0] == first[0]
    assert "1 resumed" in err


def test_report_prints_and_writes_summaries(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    invoke("run", "single_turn_qa", "--out", str(out), "--limit", "5")
    code, stdout, _ = invoke("report", str(out))
    assert code == 0
    assert "exact_match" in stdout and "custom_score" in stdout
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["conversations"] == 5
    assert summary["metrics"]["exact_match"]["mean"] == 1.0  # scripted replays the references


def test_report_missing_file_exits_2(tmp_path: Path) -> None:
    code, _, err = invoke("report", str(tmp_path / "none.jsonl"))
    assert code == 2 and "no such results file" in err


def test_json_logs_on_stderr(tmp_path: Path) -> None:
    code, _, err = invoke(
        "--log-format",
        "json",
        "--log-level",
        "info",
        "run",
        GUIDE,
        "--out",
        str(tmp_path / "r.jsonl"),
    )
    assert code == 0
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "run_started" in names and "run_finished" in names
    finished = next(e for e in events if e["event"] == "run_finished")
    assert finished["done"] == 3 and finished["level"] == "info"


def stop_pack(folder: Path) -> Path:
    """Eight conversations: slow-0..5 each ask the model once; quick-0 and quick-1 have
    no {topic}, so their one (optional) turn is skipped and they end DONE without a call.
    The quick ones come third and fourth, after two slow ones have started."""
    folder.mkdir()
    (folder / "turn_configs.yml").write_text(
        "default:\n  turns:\n    - turn_id: ask\n      optional: true\n"
        "      prompt_template: 'Help me with {topic}.'\n"
    )
    slow = [f"slow-{i}" for i in range(6)]
    ids = [*slow[:2], "quick-0", "quick-1", *slow[2:]]
    (folder / "scenarios.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "scenario_id": cid,
                    "scenario_description": "stop test",
                    "variables": {"topic": "tea"} if cid.startswith("slow") else {},
                }
            )
            + "\n"
            for cid in ids
        )
    )
    return folder


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigint_stops_gracefully_and_keeps_results(tmp_path: Path) -> None:
    """Ctrl-C: no new conversations, in-flight ones CANCELLED after the grace period,
    finished ones kept, exit code 130, no traceback."""
    out = tmp_path / "r.jsonl"
    with Convsim(
        "run",
        str(stop_pack(tmp_path / "pack")),
        "--model-arg",
        "latency=3600",  # the slow conversations cannot finish: only the stop ends them
        "--concurrency",
        "4",
        "--grace-period",
        "0.05",
        "--out",
        str(out),
    ) as run:
        # both quick conversations written: slow-0 and slow-1 are in flight by then
        run.wait_for(lambda: out.exists() and out.read_text().count("\n") >= 2, "two results")
        run.interrupt()
        assert run.finish() == 130, run.stderr
    assert "Traceback" not in run.stderr
    results = read_results(out)
    assert len({r.conversation_id for r in results}) == len(results)
    statuses = {r.conversation_id: r.status.value for r in results}
    assert {cid for cid, s in statuses.items() if s == "DONE"} == {"quick-0", "quick-1"}
    cancelled = {cid for cid, s in statuses.items() if s == "CANCELLED"}
    assert {"slow-0", "slow-1"} <= cancelled
    assert cancelled | {"quick-0", "quick-1"} == set(statuses)
    # four slots, held by slow conversations until the stop: slow-4 and slow-5 never start
    assert not {"slow-4", "slow-5"} & set(statuses)
    for result in results:
        if result.conversation_id in cancelled:
            assert result.termination_reason.value == "cancelled"
            assert any(t.error is not None and t.error.type == "Cancelled" for t in result.turns)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_second_sigint_stops_at_once(tmp_path: Path) -> None:
    """With an hour of grace and hour-long calls, only the second signal can end the run."""
    out = tmp_path / "r.jsonl"
    with Convsim(
        "--log-format",
        "json",
        "--log-level",
        "info",
        "run",
        "customer_support",
        "--model-arg",
        "latency=3600",
        "--grace-period",
        "3600",
        "--out",
        str(out),
    ) as run:
        # logged once the signal handler is installed; the first conversation starts
        # before the run next yields to the event loop
        run.wait_for_line('"run_started"')
        run.interrupt()
        # the second signal only once the first has been handled: two signals sent
        # back to back can arrive as one
        run.wait_for_line("stopping: in-flight conversations get the grace period")
        run.interrupt()
        assert run.finish() == 130, run.stderr
    assert "stopping at once" in run.stderr and "Traceback" not in run.stderr
    results = read_results(out)
    assert results and {r.status.value for r in results} == {"CANCELLED"}


def test_user_turns_without_a_user_model_exit_2_and_leave_no_file(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "turn_configs.yml").write_text(
        "default:\n  turns:\n    - turn_id: u\n      role: user\n      prompt_template: ask\n"
    )
    (pack / "scenarios.jsonl").write_text('{"scenario_id": "s", "scenario_description": "x"}\n')
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("run", str(pack), "--out", str(out))
    assert code == 2 and "--user-model" in err and "Traceback" not in err
    assert not out.exists()
    assert invoke("run", str(pack), "--user-model", "scripted", "--out", str(out))[0] == 0
    (result,) = read_results(out)
    assert result.status.value == "DONE" and result.user_usage is not None


@pytest.mark.parametrize("args", [["--model", "nope"], ["--metrics", "bogus"]])
def test_bad_input_leaves_no_results_file(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "r.jsonl"
    assert invoke("run", GUIDE, *args, "--out", str(out))[0] == 2
    assert not out.exists() and not (tmp_path / "r.manifest.json").exists()
    assert invoke("run", GUIDE, "--out", str(out))[0] == 0  # the corrected command just works
