"""A user's token cap wins over a pack's per-turn max_tokens: ``--max-tokens N`` (or
``max_tokens`` in the model's arguments) clips a pack's larger value to N and keeps a
smaller one; each clipped turn is counted in the run's statistics, the summary and the
manifest, and the manifest records the cap."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner
from conftest import write_pack

from convsim import ConfigError, JsonlSink, Simulator, SimulatorConfig, read_results, summarize
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main

pytestmark = pytest.mark.anyio

TURNS = [
    {"turn_id": "long", "prompt_template": "Tell me all.", "config": {"max_tokens": 445}},
    {"turn_id": "short", "prompt_template": "In brief?", "config": {"max_tokens": 10}},
    {"turn_id": "unset", "prompt_template": "And then?"},
]


def pack(tmp_path: Path, *, flow: dict[str, Any] | None = None, n: int = 2) -> Path:
    scenarios = [
        {"scenario_id": f"s{i}", "scenario_description": f"scenario {i}", "variables": {}}
        for i in range(n)
    ]
    return write_pack(tmp_path / "pack", {"default": {**(flow or {}), "turns": TURNS}}, scenarios)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


async def test_the_cap_clips_larger_pack_values_and_keeps_smaller_ones(
    tmp_path: Path, fake_adapter: Any
) -> None:
    model = fake_adapter()
    out = tmp_path / "r.jsonl"
    async with Simulator(model, max_tokens=48) as sim:
        handle = sim.run(pack(tmp_path), sink=JsonlSink(out))
        results = [r async for r in handle]
        stats = handle.statistics()
    asked = {params.metadata["turn_id"]: params.max_tokens for _, params in model.calls}
    assert asked == {"long": 48, "short": 10, "unset": 48}  # no pack value: the cap
    for result in results:
        clipped = {t.turn_id: t.max_tokens_clipped_from for t in result.turns}
        assert clipped == {"long": 445, "short": None, "unset": None}
    assert stats.clipped_turns == 2  # one per conversation
    assert summarize(results).clipped_turns == 2
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["settings"]["max_tokens"] == 48
    assert manifest["statistics"]["clipped_turns"] == 2
    # the count survives the results file
    assert sum(t.max_tokens_clipped_from == 445 for r in read_results(out) for t in r.turns) == 2


async def test_without_a_cap_the_pack_decides_and_nothing_is_clipped(
    tmp_path: Path, fake_adapter: Any
) -> None:
    model = fake_adapter()
    async with Simulator(model) as sim:
        handle = sim.run(pack(tmp_path, n=1))
        results = [r async for r in handle]
    asked = {params.metadata["turn_id"]: params.max_tokens for _, params in model.calls}
    assert asked == {"long": 445, "short": 10, "unset": None}
    assert handle.statistics().clipped_turns == 0
    report = summarize(results)
    assert report.clipped_turns == 0 and "clipped_turns" not in report.model_dump(mode="json")
    assert handle.manifest is not None and handle.manifest.settings["max_tokens"] is None


async def test_the_simulated_users_calls_are_capped_too(tmp_path: Path, fake_adapter: Any) -> None:
    turns = [
        {"turn_id": "ask", "role": "user", "prompt_template": "Ask.", "config": {"max_tokens": 90}}
    ]
    folder = write_pack(
        tmp_path / "p",
        {"default": {"turns": turns}},
        [{"scenario_id": "s0", "scenario_description": "d", "variables": {}}],
    )
    model, user = fake_adapter(), fake_adapter(name="user")
    async with Simulator(model, user_model=user, max_tokens=30) as sim:
        (result,) = [r async for r in sim.run(folder)]
    assert [p.max_tokens for _, p in user.calls] == [30]
    assert [p.max_tokens for _, p in model.calls] == [30]
    assert result.turns[0].max_tokens_clipped_from == 90


def test_the_smaller_of_the_two_caps_wins() -> None:
    both = SimulatorConfig.from_arguments(
        "openai-compatible:m", model_args={"max_tokens": "48"}, max_tokens=100
    )
    assert both.token_cap("assistant") == 48
    assert both.model_copy(update={"max_tokens": 20}).token_cap("assistant") == 20
    alone = SimulatorConfig.from_arguments("openai-compatible:m", model_args={"max_tokens": "64"})
    assert alone.token_cap("assistant") == 64
    assert alone.token_cap("user") is None  # no simulated user


@pytest.mark.parametrize("bad", [0, -3, True, "many"])
def test_a_cap_that_is_not_a_positive_count_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_tokens"):
        SimulatorConfig.from_arguments("scripted", max_tokens=bad)


def test_the_cli_refuses_a_zero_cap_without_a_traceback(tmp_path: Path) -> None:
    code, _, err = invoke("run", str(pack(tmp_path)), "--max-tokens", "0")
    assert code == 2
    assert "--max-tokens" in err and "Traceback" not in err


def test_the_cli_cap_clips_the_scripted_answers(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code, stdout, _ = invoke(
        "run", str(pack(tmp_path)), "--max-tokens", "12", "--out", str(out), "--no-progress"
    )
    assert code == 0
    for result in read_results(out):
        assert all(t.usage is not None and t.usage.completion_tokens <= 12 for t in result.turns)
    assert "2 turns clipped to the max_tokens cap" in stdout
    summary = json.loads(out.with_name("r.summary.json").read_text())
    assert summary["clipped_turns"] == 2
    assert "turns clipped to the max_tokens cap: 2" in out.with_name("r.summary.md").read_text()


def test_a_max_tokens_model_arg_caps_a_real_server_over_the_pack(
    tmp_path: Path, portal: BlockingPortal
) -> None:
    """The issue's case: ``--model-arg max_tokens=48`` against a server that writes long
    answers; the pack's 445 no longer wins, its 10 is kept."""
    out = tmp_path / "r.jsonl"
    with portal.wrap_async_context_manager(
        MockModelServer(MockServerConfig(output_tokens=300))
    ) as server:
        code, _, err = invoke(
            "run", str(pack(tmp_path)), "--model", "openai-compatible:mock",
            "--model-arg", f"base_url={server.url}/v1", "--model-arg", "max_tokens=48",
            "--out", str(out), "--no-progress",
        )  # fmt: skip
    assert code == 0, err
    for result in read_results(out):
        tokens = {t.turn_id: t.usage.completion_tokens for t in result.turns if t.usage}
        assert tokens == {"long": 48, "short": 10, "unset": 48}
        assert [t.max_tokens_clipped_from for t in result.turns] == [445, None, None]
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["settings"]["max_tokens"] == 48
    assert manifest["statistics"]["clipped_turns"] == 2


def test_resuming_with_another_cap_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    folder = str(pack(tmp_path))
    code, _, _ = invoke("run", folder, "--max-tokens", "5", "--out", str(out), "--limit", "1")
    assert code == 0
    code, _, err = invoke("run", folder, "--max-tokens", "6", "--out", str(out), "--resume")
    assert code == 2
    assert "max_tokens 5" in err


def test_the_users_max_turns_and_timeout_win_and_are_recorded(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    folder = pack(tmp_path, flow={"max_turns": 1, "conversation_timeout": 100})
    code, _, _ = invoke(
        "run", str(folder), "--max-turns", "3", "--conversation-timeout", "250",
        "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0
    for result in read_results(out):
        assert [t.status.value for t in result.turns] == ["completed"] * 3
    settings = json.loads(out.with_name("r.manifest.json").read_text())["settings"]
    assert settings["max_turns"] == 3 and settings["conversation_timeout"] == 250


def test_the_ray_backend_refuses_the_caps_it_would_not_apply(tmp_path: Path) -> None:
    code, _, err = invoke("run", str(pack(tmp_path)), "--backend", "ray", "--max-tokens", "5")
    assert code == 2
    assert "--max-tokens" in err and "--backend ray" in err
