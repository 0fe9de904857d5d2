"""``convsim run`` says when a run failed: an unreachable endpoint stops it at once (exit
4) without touching the results file, a run whose endpoint goes away stops early (exit
4) and resumes later, infrastructure failures beyond --max-failure-rate exit 3."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner

from convsim import Status, read_results
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


def serve(portal: BlockingPortal, **config: Any) -> Any:
    return portal.wrap_async_context_manager(MockModelServer(MockServerConfig(**config)))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_server_down_exits_4_at_once_with_one_line_and_no_results(tmp_path: Path) -> None:
    port = closed_port()
    out = tmp_path / "r.jsonl"
    t0 = time.perf_counter()
    code, stdout, err = invoke(
        "run", "customer_support", "--model", "openai:m",
        "--model-arg", f"base_url=http://127.0.0.1:{port}/v1", "--out", str(out),
        env={"OPENAI_API_KEY": "sk-test"},
    )  # fmt: skip
    assert time.perf_counter() - t0 < 5
    assert code == 4
    assert err.strip() == (
        f"error: model under test: http://127.0.0.1:{port}/v1: connection refused — is the "
        "server running?"
    )
    assert "Traceback" not in err and stdout == ""
    assert list(tmp_path.iterdir()) == []  # no results file, no manifest


def test_an_existing_results_file_is_not_touched(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text("keep me\n")
    code, _, _ = invoke(
        "run", "customer_support", "--model", "openai-compatible:m",
        "--model-arg", f"base_url=http://127.0.0.1:{closed_port()}/v1", "--out", str(out),
        "--overwrite",
    )  # fmt: skip
    assert code == 4
    assert out.read_text() == "keep me\n"


def test_a_wrong_key_exits_4_naming_the_variable(tmp_path: Path, portal: BlockingPortal) -> None:
    with serve(portal, api_key="sk-right") as server:
        code, _, err = invoke(
            "run", "customer_support", "--model", "openai:m",
            "--model-arg", f"base_url={server.base_url}", "--out", str(tmp_path / "r.jsonl"),
            env={"OPENAI_API_KEY": "sk-wrong"},
        )  # fmt: skip
    assert code == 4
    [line] = errors(err)
    assert f"401 from {server.base_url}/chat/completions" in line
    assert "the API key was refused — check OPENAI_API_KEY / api_key_env" in line
    assert "sk-wrong" not in err
    assert not (tmp_path / "r.jsonl").exists()


def test_a_base_url_without_v1_gets_the_hint(tmp_path: Path, portal: BlockingPortal) -> None:
    with serve(portal) as server:
        code, _, err = invoke(
            "run", "customer_support", "--model", "openai-compatible:m",
            "--model-arg", f"base_url={server.url}", "--out", str(tmp_path / "r.jsonl"),
        )  # fmt: skip
    assert code == 4
    [line] = errors(err)
    assert f"404 from {server.url}/chat/completions — does base_url end in /v1" in line


def test_the_breaker_stops_a_run_and_resume_completes_it(
    tmp_path: Path, portal: BlockingPortal
) -> None:
    out = tmp_path / "r.jsonl"
    args = [
        "run", "customer_support", "--model", "openai-compatible:mock-model",
        "--model-arg", "max_retries=0", "--concurrency", "1", "--circuit-breaker", "3",
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    with serve(portal, fault_rate=1.0, faults={"500": 1.0}) as server:
        port = server.url.rsplit(":", 1)[1]
        base = ["--model-arg", f"base_url={server.base_url}"]
        code, _, err = invoke(*args, *base)
    assert code == 4
    assert "stopped early: 3 conversations in a row failed for infrastructure reasons" in err
    assert "--resume" in err
    recorded = read_results(out)
    assert [r.status for r in recorded] == [Status.FAILED] * 3  # 11 never started
    assert out.with_name("r.summary.json").exists()  # summaries are still written

    with serve(portal, port=int(port)):  # the endpoint is back, same address
        code, _, err = invoke(*args, *base, "--resume", "--concurrency", "14")
    assert code == 0, err
    recorded = read_results(out)
    assert len(recorded) == 14 and len({r.conversation_id for r in recorded}) == 14
    assert Counter(r.status for r in recorded) == {Status.FAILED: 3, Status.DONE: 11}


def test_without_preflight_the_breaker_catches_a_dead_server(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code, _, err = invoke(
        "run", "customer_support", "--model", "openai-compatible:m",
        "--model-arg", f"base_url=http://127.0.0.1:{closed_port()}/v1",
        "--model-arg", "max_retries=0", "--no-preflight", "--circuit-breaker", "2",
        "--concurrency", "1", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 4
    assert "stopped early: 2 conversations in a row" in err
    assert len(read_results(out)) == 2


def test_infrastructure_failures_exit_3_unless_tolerated(tmp_path: Path) -> None:
    args = [
        "run", "customer_support", "--model-arg", "fail_rate=0.3", "--circuit-breaker", "0",
        "--no-progress",
    ]  # fmt: skip
    code, _, err = invoke(*args, "--out", str(tmp_path / "a.jsonl"))
    failed = sum(r.status is Status.FAILED for r in read_results(tmp_path / "a.jsonl"))
    assert 0 < failed < 14
    assert code == 3
    assert f"{failed} of 14 conversations failed for infrastructure reasons" in err
    assert "above --max-failure-rate 0" in err
    assert (tmp_path / "a.summary.md").exists()

    code, _, err = invoke(*args, "--out", str(tmp_path / "b.jsonl"), "--max-failure-rate", "0.9")
    assert code == 0, err


def test_a_clean_run_exits_0(tmp_path: Path) -> None:
    code, _, _ = invoke("run", "customer_support", "--out", str(tmp_path / "r.jsonl"))
    assert code == 0


def test_bad_values_exit_2(tmp_path: Path) -> None:
    for option, value in (("--max-failure-rate", "1.5"), ("--circuit-breaker", "-1")):
        code, _, _ = invoke(
            "run", "customer_support", option, value, "--out", str(tmp_path / "r.jsonl")
        )
        assert code == 2
    assert not (tmp_path / "r.jsonl").exists()


def test_help_documents_the_exit_codes() -> None:
    code, out, _ = invoke("run", "--help")
    assert code == 0
    flat = " ".join(out.split())
    for text in ("0 ", "2 ", "3 ", "4 ", "130 ", "--max-failure-rate", "--no-preflight"):
        assert text in flat
    assert "Exit codes" in flat
