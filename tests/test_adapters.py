"""The scripted adapter, model specs and the adapter registry."""

from __future__ import annotations

import pytest

from convsim import ConfigError, RegistryError, ServerError
from convsim.adapters import (
    ADAPTERS,
    GenerationParams,
    Message,
    ModelAdapter,
    ScriptedAdapter,
    Usage,
    create_adapter,
    parse_model_args,
    parse_model_spec,
)


def msgs(*user: str) -> list[Message]:
    out: list[Message] = []
    for text in user:
        out += [Message(role="user", content=text), Message(role="assistant", content="ok")]
    return out[:-1]


@pytest.mark.anyio
async def test_scripted_replays_references_and_counts_tokens() -> None:
    adapter = ScriptedAdapter()
    done = await adapter.generate(msgs("what is 2+2"), GenerationParams(reference="four"))
    assert done.text == "four" and done.finish_reason == "stop"
    assert done.usage.prompt_tokens == 3 and done.usage.completion_tokens == 1
    assert not done.usage.estimated
    ignore = ScriptedAdapter({"use_references": "false"})
    assert (
        await ignore.generate(msgs("what is 2+2"), GenerationParams(reference="four"))
    ).text != "four"


@pytest.mark.anyio
async def test_scripted_is_deterministic_and_seeded() -> None:
    adapter = ScriptedAdapter()
    history = msgs("My dog is called Rex.", "What is my dog called?")
    a = await adapter.generate(history, GenerationParams(seed=1))
    b = await adapter.generate(history, GenerationParams(seed=1))
    assert a.text == b.text
    assert "Rex" in a.text


@pytest.mark.anyio
async def test_scripted_memory_window_forgets_old_facts() -> None:
    history = msgs(
        "My dog is called Rex.", "I like tea.", "The weather is fine.", "What is my dog called?"
    )
    full = await ScriptedAdapter().generate(history, GenerationParams())
    short = await ScriptedAdapter({"memory_turns": 2}).generate(history, GenerationParams())
    assert "Rex" in full.text
    assert "Rex" not in short.text


@pytest.mark.anyio
async def test_scripted_truncates_at_max_tokens() -> None:
    done = await ScriptedAdapter().generate(
        msgs("hi"), GenerationParams(reference="a b c d e", max_tokens=2)
    )
    assert done.text == "a b" and done.finish_reason == "length"


@pytest.mark.anyio
async def test_scripted_fail_rate_is_deterministic() -> None:
    adapter = ScriptedAdapter({"fail_rate": 0.5})
    outcomes = []
    for seed in range(40):
        try:
            await adapter.generate(msgs("hi"), GenerationParams(seed=seed))
            outcomes.append(True)
        except ServerError as exc:
            assert exc.status_code == 500 and exc.infrastructure
            outcomes.append(False)
    assert 5 < outcomes.count(False) < 35
    again = []
    for seed in range(40):
        try:
            await adapter.generate(msgs("hi"), GenerationParams(seed=seed))
            again.append(True)
        except ServerError:
            again.append(False)
    assert again == outcomes


@pytest.mark.parametrize(
    "config", [{"latency": "-1"}, {"fail_rate": 2}, {"memory_turns": 0}, {"colour": "red"}]
)
def test_scripted_rejects_bad_config(config: dict) -> None:
    with pytest.raises(ConfigError, match="invalid scripted"):
        ScriptedAdapter(config)


def test_scripted_fulfils_the_protocol() -> None:
    adapter = ScriptedAdapter()
    assert isinstance(adapter, ModelAdapter)
    assert adapter.model_info().model_type == "scripted"
    assert adapter.check_config({"temperature": 0.5}).temperature == 0.5
    with pytest.raises(ConfigError, match="temperature"):
        adapter.check_config({"temperature": 3})
    assert adapter.validate_config({"temperature": 0.5}) == {"valid": True}
    verdict = adapter.validate_config({"temperature": 3})
    assert verdict["valid"] is False and "temperature" in verdict["error"]
    assert adapter.estimate_cost(Usage(prompt_tokens=10, completion_tokens=5)).total_cost == 0


def test_model_specs() -> None:
    assert parse_model_spec("scripted").model is None
    spec = parse_model_spec("openai-compatible:meta/llama-3:8b")
    assert (spec.type, spec.model) == ("openai-compatible", "meta/llama-3:8b")
    for bad in ["", ":x", "9x", "a b"]:
        with pytest.raises(ConfigError, match="invalid model spec"):
            parse_model_spec(bad)


def test_model_args() -> None:
    assert parse_model_args(["latency=0.5", "base_url=http://h/v1?a=b"]) == {
        "latency": "0.5",
        "base_url": "http://h/v1?a=b",
    }
    for bad in [["latency"], ["=1"], ["a-b=1"]]:
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            parse_model_args(bad)
    with pytest.raises(ConfigError, match="twice"):
        parse_model_args(["a=1", "a=2"])


def test_create_adapter_passes_model_and_args() -> None:
    adapter = create_adapter("scripted:tiny", {"latency": "0.25"})
    assert isinstance(adapter, ScriptedAdapter)
    assert adapter.config.model == "tiny" and adapter.config.latency == 0.25


def test_unknown_adapter_lists_known_types() -> None:
    with pytest.raises(
        RegistryError, match=r"unknown model type 'nope'; known model types: .*scripted"
    ):
        create_adapter("nope:x")
    assert "scripted" in ADAPTERS.names()
