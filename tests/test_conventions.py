"""The conventions a new user brings: OPENAI_/ANTHROPIC_ variables as the adapters'
defaults, --base-url and short options, CONVSIM_* variables, and ``run --config``
with flags > environment > file > defaults; no key ever shown."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _listeners import Listener
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner
from conftest import FakeAdapter

from convsim import ConfigError
from convsim.adapters import ADAPTERS, GenerationParams, Message
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main

KEY = "sk-env-0123456789abcdefXYZ"
"""A key shaped like a real one: what must never show."""
CHAT = "/v1/chat/completions"
HI = [Message(role="user", content="Hi")]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the variables under test comes from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "ANTHROPIC_", "CONVSIM_")):
            monkeypatch.delenv(name)


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


@pytest.fixture
def mock(portal: BlockingPortal) -> Iterator[MockModelServer]:
    """The mock server on 127.0.0.1, answering only calls with ``KEY``."""
    with portal.wrap_async_context_manager(MockModelServer(MockServerConfig(api_key=KEY))) as s:
        yield s


def generate(portal: BlockingPortal, adapter: Any) -> str:
    async def call() -> str:
        try:
            return str((await adapter.generate(HI, GenerationParams())).text)
        finally:
            await adapter.aclose()

    return portal.call(call)


def chat_calls(server: MockModelServer) -> int:
    return server.statistics().by_endpoint[CHAT]


# -- the adapters' defaults -------------------------------------------------------------


def test_openai_takes_base_url_and_key_from_the_environment(
    portal: BlockingPortal, mock: MockModelServer
) -> None:
    env = {"OPENAI_BASE_URL": mock.base_url, "OPENAI_API_KEY": KEY}
    adapter = OpenAIAdapter({"model": "mock-model"}, env=env)
    assert adapter.base_url == mock.base_url
    assert generate(portal, adapter)
    stats = mock.statistics()
    assert stats.by_endpoint[CHAT] == 1 and stats.unauthorized == 0  # its URL, its key


def test_openai_compatible_falls_back_on_the_openai_variables(
    portal: BlockingPortal, mock: MockModelServer
) -> None:
    only_key = {"OPENAI_API_KEY": KEY}
    adapter = OpenAICompatibleAdapter({"model": "m", "base_url": mock.base_url}, env=only_key)
    assert generate(portal, adapter)
    both = {"OPENAI_BASE_URL": mock.base_url, "OPENAI_API_KEY": KEY}
    assert generate(portal, OpenAICompatibleAdapter({"model": "m"}, env=both))
    stats = mock.statistics()
    assert stats.by_endpoint[CHAT] == 2 and stats.unauthorized == 0


def test_arguments_win_over_the_environment(portal: BlockingPortal, mock: MockModelServer) -> None:
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-wrong"}
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": mock.base_url, "api_key": KEY}, env=env
    )
    assert generate(portal, adapter)
    named = OpenAICompatibleAdapter(
        {"model": "m", "base_url": mock.base_url, "api_key_env": "MY_KEY"},
        env={**env, "MY_KEY": KEY},
    )
    assert generate(portal, named)
    assert mock.statistics().unauthorized == 0


def test_anthropic_takes_base_url_and_key_from_the_environment(portal: BlockingPortal) -> None:
    def messages_api(request: bytes) -> bytes:
        body = json.dumps(
            {
                "content": [{"type": "text", "text": "Hello."}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 2},
            }
        ).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        return f"{head}\r\nConnection: close\r\n\r\n".encode() + body

    with Listener(messages_api) as listener:
        env = {"ANTHROPIC_BASE_URL": listener.url, "ANTHROPIC_API_KEY": KEY}
        adapter = AnthropicAdapter({"model": "claude"}, env=env)
        assert adapter.base_url == listener.url  # checked before any call could go out
        assert generate(portal, adapter) == "Hello."
        (request,) = listener.requests
    assert request.startswith(b"POST /v1/messages ")
    assert f"x-api-key: {KEY}".encode() in request.replace(b"X-Api-Key", b"x-api-key")


def test_a_bad_or_empty_base_url_variable() -> None:
    with pytest.raises(ConfigError, match=r"OPENAI_BASE_URL: '127\.0\.0\.1:8000/v1' has no scheme"):
        OpenAIAdapter(
            {"model": "m"}, env={"OPENAI_BASE_URL": "127.0.0.1:8000/v1", "OPENAI_API_KEY": "k"}
        )
    # set but empty (``export OPENAI_BASE_URL=``) is unset
    empty = OpenAIAdapter({"model": "m"}, env={"OPENAI_BASE_URL": " ", "OPENAI_API_KEY": "k"})
    assert empty.base_url == "https://api.openai.com/v1"
    with pytest.raises(ConfigError, match=r"needs a base_url .* or set OPENAI_BASE_URL"):
        OpenAICompatibleAdapter({"model": "m"}, env={"OPENAI_BASE_URL": ""})


def test_an_empty_env_mapping_sees_none_of_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """How the evaluation service builds a tenant's adapter: env={}."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with pytest.raises(ConfigError, match="needs a base_url"):
        OpenAICompatibleAdapter({"model": "m"}, env={})
    tenant = OpenAICompatibleAdapter({"model": "m", "base_url": "http://tenant.test/v1"}, env={})
    assert "Authorization" not in tenant.auth_headers()
    with pytest.raises(ConfigError, match="needs an API key"):
        OpenAIAdapter({"model": "m"}, env={})
    paid = OpenAIAdapter({"model": "m", "api_key": "sk-tenant"}, env={})
    assert paid.base_url == "https://api.openai.com/v1"
    claude = AnthropicAdapter({"model": "c", "api_key": "sk-tenant"}, env={})
    assert claude.base_url == "https://api.anthropic.com"
    # without a mapping, the process environment is the default
    assert OpenAIAdapter({"model": "m"}).base_url == "http://127.0.0.1:9/v1"


# -- the command line -------------------------------------------------------------------


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_run_with_the_environments_defaults_and_short_options(
    tmp_path: Path, mock: MockModelServer
) -> None:
    out = tmp_path / "r.jsonl"
    env = {"OPENAI_BASE_URL": mock.base_url, "OPENAI_API_KEY": KEY}
    result = invoke(
        "run", "customer_support", "-m", "openai-compatible:mock-model", "-n", "2", "-c", "2",
        "-o", str(out), env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert len(results(out)) == 2
    stats = mock.statistics()
    assert stats.by_endpoint[CHAT] > 0 and stats.unauthorized == 0
    _no_key_in(tmp_path, result)


def test_base_url_flag(tmp_path: Path, mock: MockModelServer) -> None:
    out = tmp_path / "r.jsonl"
    result = invoke(
        "run", "customer_support", "-m", "openai-compatible:mock-model", "-n", "1",
        "--base-url", mock.base_url, "-o", str(out), env={"OPENAI_API_KEY": KEY},
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert chat_calls(mock) > 0
    manifest = json.loads((tmp_path / "r.manifest.json").read_text())
    assert mock.base_url in json.dumps(manifest)  # recorded as --model-arg base_url is


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-url", "http://a/v1", "--model-arg", "base_url=http://b/v1"],
         "--base-url and --model-arg base_url=... both give the base URL"),
        (["--user-base-url", "http://a/v1"], "--user-base-url needs --user-model"),
        (["--judge-base-url", "http://a/v1"], "--judge-base-url needs --judge"),
        (["--base-url", "127.0.0.1:8000/v1", "-m", "openai-compatible:m"], "has no scheme"),
    ],
)  # fmt: skip
def test_base_url_flags_misused_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = invoke("run", "customer_support", "-o", str(tmp_path / "r.jsonl"), *args)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def _recording(monkeypatch: pytest.MonkeyPatch, name: str, seen: list[dict[str, Any]]) -> None:
    """Register model type ``name``: a fake that records the arguments it was built with."""

    def build(config: dict[str, Any]) -> FakeAdapter:
        seen.append(dict(config))
        return FakeAdapter(lambda m, p: '{"score": 5, "reason": "ok"}', name=name)

    monkeypatch.setitem(ADAPTERS._factories, name, build)


def test_user_and_judge_base_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    _recording(monkeypatch, "recorded", seen)
    result = invoke(
        "run", "customer_support", "-n", "1", "-o", str(tmp_path / "r.jsonl"),
        "--user-model", "recorded:user", "--user-base-url", "http://user.test/v1",
        "--judge", "recorded:judge", "--judge-base-url", "http://judge.test/v1",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    by_model = {c["model"]: c["base_url"] for c in seen}
    assert by_model == {"user": "http://user.test/v1", "judge": "http://judge.test/v1"}


def test_score_takes_the_judges_base_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    _recording(monkeypatch, "recorded", seen)
    path = tmp_path / "t.jsonl"
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    path.write_text(json.dumps({"conversation_id": "a", "messages": turns}) + "\n")
    args = ["score", str(path), "--metrics", "judge:Is it polite?"]
    judged = invoke(*args, "--judge", "recorded:j", "--judge-base-url", "http://judge.test/v1")
    assert judged.exit_code == 0, judged.stderr
    assert seen == [{"model": "j", "base_url": "http://judge.test/v1"}]
    alone = invoke(*args, "--judge-base-url", "http://judge.test/v1")
    assert alone.exit_code == 2 and "--judge-base-url needs --judge" in alone.stderr


# -- CONVSIM_* variables and --config ---------------------------------------------------


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_precedence_flag_then_environment_then_file_then_default(tmp_path: Path) -> None:
    config = write_config(tmp_path, "pack: customer_support\nlimit: 3\nseed: 7\n")
    out = tmp_path / "r.jsonl"

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, int | None, int]:
        """Conversations recorded, and the limit and seed the manifest says."""
        result = invoke("run", "-o", str(out), "--overwrite", *args, env=env)
        assert result.exit_code == 0, result.stderr
        settings = json.loads((tmp_path / "r.manifest.json").read_text())["settings"]
        return len(results(out)), settings["limit"], settings["seed"]

    env = {"CONVSIM_RUN_LIMIT": "2", "CONVSIM_RUN_SEED": "5"}
    assert run("--config", str(config), "-n", "1", "--seed", "3", env=env) == (1, 1, 3)
    assert run("--config", str(config), env=env) == (2, 2, 5)
    assert run("--config", str(config)) == (3, 3, 7)
    assert run("customer_support") == (14, None, 0)


def test_the_config_file_is_itself_an_option_variable(tmp_path: Path) -> None:
    config = write_config(tmp_path, "limit: 1\nconcurrency: 1\nmodel-arg: {latency: 0}\n")
    out = tmp_path / "r.jsonl"
    env = {"CONVSIM_RUN_CONFIG": str(config)}
    result = invoke("run", "customer_support", "-o", str(out), env=env)
    assert result.exit_code == 0, result.stderr
    assert len(results(out)) == 1
    assert f"config {config}: limit=1, concurrency=1, model-arg=[latency=0]" in result.stderr


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("pack: customer_support\nconcurrency: many\n", "run.yaml:2: concurrency: 'many' is not"),
        ("limit: 1\nlimits: 3\n", "run.yaml:2: limits: run has no such option"),
        ("max-turns: [1, 2]\n", "run.yaml:1: max-turns: takes one value"),
        ("model-arg:\n  - rpm=10\n  - latency\n", "run.yaml:3: model-arg.1: 'latency' is not KEY"),
        ("progress: maybe\n", "run.yaml:1: progress: Input should be a valid boolean"),
        ("limit: 1\nmax_turns: 2\nmax-turns: 3\n", "run.yaml:3: max-turns: repeats 'max_turns'"),
        ("- limit: 1\n", "run.yaml:1: a config file holds a mapping of option names"),
        ("limit: 1\n  bad: [\n", "run.yaml:2: invalid YAML"),
        ("judge-combine: median\n", "run.yaml:1: judge-combine: 'median' is not one of"),
    ],
)  # fmt: skip
def test_a_bad_config_file_exits_2_naming_file_line_and_field(
    tmp_path: Path, text: str, problem: str
) -> None:
    config = write_config(tmp_path, text)
    out = tmp_path / "r.jsonl"
    result = invoke("run", "customer_support", "--config", str(config), "-o", str(out))
    assert result.exit_code == 2
    assert f"{tmp_path}/{problem}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_every_problem_of_a_config_file_in_one_pass(tmp_path: Path) -> None:
    config = write_config(tmp_path, "concurrency: 0\nnope: 1\nlimit: -1\nseed: x\n")
    result = invoke("run", "customer_support", "--config", str(config))
    assert result.exit_code == 2
    lines = re.findall(r"run\.yaml:(\d+): (\S+):", result.stderr)
    assert lines == [("1", "concurrency"), ("2", "nope"), ("3", "limit"), ("4", "seed")]


def test_keys_stay_out_of_the_echo_results_and_logs(tmp_path: Path, mock: MockModelServer) -> None:
    user_url = mock.base_url.replace("http://", f"http://someone:{KEY}@")
    config = write_config(
        tmp_path,
        f"pack: customer_support\nmodel: openai-compatible:mock-model\nlimit: 1\n"
        f"model-arg:\n  api_key: {KEY}\n  base_url: {mock.base_url}\n"
        f"user-model: openai-compatible:mock-model\nuser-base-url: {user_url}\n"
        f"user-model-arg: {{api_key: {KEY}}}\n",
    )
    out = tmp_path / "r.jsonl"
    result = invoke(
        "--log-format", "json", "--log-level", "debug",
        "run", "--config", str(config), "-o", str(out), f"--html={tmp_path / 'r.html'}",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert chat_calls(mock) > 0 and mock.statistics().unauthorized == 0
    assert f"api_key=***, base_url={mock.base_url}" in result.stderr  # the echo
    assert "user-base-url=http://***@127.0.0.1" in result.stderr
    assert '"event": "config_file_read"' in result.stderr
    _no_key_in(tmp_path, result)


def _no_key_in(folder: Path, result: Any) -> None:
    assert KEY not in result.stdout and KEY not in result.stderr
    written = [p for p in folder.iterdir() if p.name != "run.yaml"]
    assert written
    for path in written:
        assert KEY not in path.read_text(errors="replace"), path.name
