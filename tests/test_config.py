"""SimulatorConfig: what a Simulator is built from, the same from Python and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

import convsim
from convsim import ConfigError, JudgeConfig, ModelRef, Simulator, SimulatorConfig
from convsim.cli import main


def test_keyword_arguments_build_the_config() -> None:
    sim = Simulator(
        "scripted",
        model_args={"latency": "0"},
        concurrency=8,
        seed=3,
        judge="scripted",
        judge_samples=2,
        judge_combine="majority",
        metrics=["latency"],
    )
    assert sim.config == SimulatorConfig(
        model=ModelRef(spec="scripted", args={"latency": "0"}),
        concurrency=8,
        seed=3,
        judge=JudgeConfig(model="scripted", samples=2, combine="majority"),
        metrics=("latency",),
    )
    assert sim.concurrency == 8 and sim.judge is not None and sim.judge.samples == 2


def test_the_settings_read_back_from_the_simulator() -> None:
    sim = Simulator("scripted", model_args={"latency": "0"}, max_turns=3, grace_period=1.5)
    assert sim.model_args == {"latency": "0"} and sim.user_model_args == {}
    assert (sim.max_turns, sim.conversation_timeout, sim.grace_period) == (3, None, 1.5)


def test_a_config_is_frozen_and_takes_no_other_settings() -> None:
    config = SimulatorConfig(model="scripted", concurrency=4)
    with pytest.raises(ValidationError):
        config.concurrency = 5  # type: ignore[misc]
    assert Simulator(config).config is config
    with pytest.raises(ConfigError, match="takes no other settings \\(seed\\)"):
        Simulator(config, seed=1)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"conversation_timeout": -1}, "conversation_timeout"),
        ({"max_turns": 0}, "max_turns"),
        ({"grace_period": -1}, "grace_period"),
        ({"metrics": "latency"}, "metrics"),
        ({"colour": "red"}, "colour"),
        ({"model_args": {"x": "1"}, "model": object()}, "not a model"),
        ({"user_model_args": {"x": "1"}}, "user_model_args given without a model"),
        ({"judge_args": {"x": "1"}}, "judge_args given without a judge"),
    ],
)
def test_bad_settings_are_named(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulatorConfig.from_arguments(**settings)


def test_a_bad_spec_is_refused_before_anything_is_built() -> None:
    with pytest.raises(ConfigError, match=r"model: .*invalid model spec .not a spec!"):
        SimulatorConfig.from_arguments("not a spec!")


def test_an_object_that_is_not_an_adapter_is_refused_with_what_to_do() -> None:
    class Structural:  # has generate(), but is not a ModelAdapter
        async def generate(self, messages: Any, params: Any) -> Any:
            return None

    with pytest.raises(ConfigError, match="subclass it and implement generate"):
        Simulator(Structural())  # type: ignore[arg-type]


def test_secrets_in_model_arguments_never_show() -> None:
    ref = ModelRef(spec="openai:gpt-4o-mini", args={"api_key": "sk-secret", "rpm": 60})
    config = SimulatorConfig(model=ref)
    assert "sk-secret" not in repr(ref) and "sk-secret" not in repr(config)
    assert ref.redacted_args() == {"api_key": "***", "rpm": "60"}
    assert "sk-secret" not in config.model_dump_json()
    assert config.model_dump()["model"]["args"] == {"api_key": "***", "rpm": 60}
    assert ref.args["api_key"] == "sk-secret"  # what builds the adapter keeps it
    with pytest.raises(ValidationError) as info:  # a bad config does not echo its input
        SimulatorConfig(model={"spec": "openai:x", "args": {"api_key": "sk-secret"}, "x": 1})
    assert "sk-secret" not in str(info.value)


def test_the_command_line_builds_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[SimulatorConfig] = []
    original = Simulator.__init__

    def spy(self: Simulator, model: Any = "scripted", **kw: Any) -> None:
        original(self, model, **kw)
        seen.append(self.config)

    monkeypatch.setattr(Simulator, "__init__", spy)
    out = tmp_path / "r.jsonl"
    args = ["run", "single_turn_qa", "--model-arg", "latency=0", "--concurrency", "3"]
    args += ["--seed", "7", "--limit", "2", "--metrics", "latency", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert seen == [
        SimulatorConfig.from_arguments(
            "scripted", model_args={"latency": "0"}, concurrency=3, seed=7, metrics=["latency"]
        )
    ]
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["settings"]["concurrency"] == 3 and manifest["settings"]["seed"] == 7
    assert manifest["settings"]["model_args"] == {"latency": "0"}
    assert convsim.read_results(out)[0].seed != 7  # each conversation derives its own


@pytest.mark.anyio
@pytest.mark.parametrize("own", [{"concurrency": "3"}, {}])
async def test_an_adapter_instance_serves_one_simulator_after_another(
    own: dict[str, str],
) -> None:
    from convsim.adapters import create_adapter
    from convsim.adapters.mock import MockModelServer, MockServerConfig

    async with MockModelServer(MockServerConfig()) as server:
        adapter = create_adapter(
            "openai-compatible:mock-model", {"base_url": server.base_url, **own}
        )
        cap = adapter.rate_limits().concurrency
        try:
            for _ in range(2):
                async with Simulator(adapter, concurrency=8, metrics=[]) as sim:
                    results = [r async for r in sim.run("single_turn_qa", limit=2)]
                assert [r.status.value for r in results] == ["DONE", "DONE"]
            # the caller's adapter keeps its own pool and cap
            assert adapter.rate_limits().concurrency == cap == int(own.get("concurrency", 64))
        finally:
            await adapter.aclose()
