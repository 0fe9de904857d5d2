"""The guide's "Adding Model Adapters" code, copied with only its imports changed
(custom_model_adapter.py, concrete_model_adapters.py), run against a loopback backend:
built by name, through the Simulator and through ``convsim run``, with a rate budget and
a retry after an injected 503."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _generate_server import Backend, serving
from click.testing import CliRunner
from concrete_model_adapters import MODEL_ADAPTERS as GUIDE_ADAPTERS
from concrete_model_adapters import get_model_adapter as guide_get_model_adapter
from custom_model_adapter import CustomModelAdapter

import convsim
from convsim import ConfigError, ConversationResult, Simulator, load_pack
from convsim.adapters import (
    MODEL_ADAPTERS,
    ModelConfiguration,
    Usage,
    get_model_adapter,
    is_bridged,
)
from convsim.cli import main

PACK = "single_turn_qa"
KEY = "test-key-0123456789abcdef"
RPM = 1200.0
"""Fast enough for a test, slow enough that the budget shows: 50 ms between calls."""


def _answers() -> dict[tuple[str, ...], str]:
    """The texts that tell each problem of the bundled pack apart in its prompt (its
    question and context), with the expected answer."""
    answers = {}
    for conversation in load_pack(PACK).conversations:
        scenario = conversation.scenario
        told_apart_by = (str(scenario.variables["question"]), str(scenario.variables["context"]))
        answers[told_apart_by] = scenario.reference_responses["answer"]
    return answers


@pytest.fixture
def backend() -> Backend:
    return Backend(answers=_answers(), faults=[503])


@pytest.fixture
def endpoint(backend: Backend) -> Iterator[str]:
    with serving(backend) as url:
        yield url


def _configuration(endpoint: str, **more: Any) -> ModelConfiguration:
    return ModelConfiguration(
        {"api_endpoint": endpoint, "api_key": KEY, "model_name": "custom-model", **more}
    )


def _check_run(results: list[ConversationResult], backend: Backend) -> None:
    """What a run of the whole pack through the guide's adapter must show."""
    assert len(results) == len(backend.answers) == 30
    assert all(r.status.value == "DONE" for r in results), [r.error for r in results]
    turns = [turn for r in results for turn in r.turns]
    # the injected 503 was retried once, and the retry shows on its turn
    assert sorted(turn.attempts for turn in turns) == [1] * 29 + [2]
    retried = next(turn for turn in turns if turn.attempts == 2)
    assert retried.timings is not None and (retried.timings.retry_wait_s or 0) > 0
    assert len(backend.requests) == 31
    # the budget: the first calls go out together, so the later ones wait for it
    assert sum((turn.timings.queue_wait_s or 0) for turn in turns if turn.timings) > 0
    # the settings reach the guide's request: the pack's, over the guide's defaults
    sent = backend.requests[-1]
    assert sent["temperature"] == 0.0 and sent["max_tokens"] == 64 and sent["top_p"] == 1.0
    assert sent["_auth"] == f"Bearer {KEY}" and sent["model"] == "custom-model"
    # usage is the server's, and the cost is the guide's estimate_cost of it
    for result in results:
        assert result.usage is not None and result.usage.source == "server"
        expected = result.usage.prompt_tokens * 0.0001 + result.usage.completion_tokens * 0.0002
        assert result.cost_usd == pytest.approx(expected)
        assert result.scores["exact_match"].value == 1.0


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_guides_adapter_runs_a_bundled_pack_through_the_simulator(
    backend: Backend, endpoint: str
) -> None:
    adapter = CustomModelAdapter(_configuration(endpoint, rpm=RPM))
    assert is_bridged(adapter)
    started = time.monotonic()
    async with Simulator(adapter, concurrency=4) as simulator:
        results = [result async for result in simulator.run(load_pack(PACK))]
    _check_run(results, backend)
    # 31 calls at RPM are at least 30 intervals apart, however fast the backend is
    assert time.monotonic() - started >= 30 * 60 / RPM * 0.99
    assert results[0].model == "custom/custom-model"  # the guide's get_model_info


@pytest.mark.slow
def test_the_guides_adapter_runs_a_bundled_pack_through_convsim_run(
    backend: Backend, endpoint: str, tmp_path: Path
) -> None:
    out = tmp_path / "guide.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "run", PACK, "--model", "custom_model_adapter:CustomModelAdapter",
            "--model-arg", f"api_endpoint={endpoint}", "--model-arg", "api_key_env=GUIDE_KEY",
            "--model-arg", "model_name=custom-model", "--model-arg", f"rpm={RPM:g}",
            "-c", "4", "-o", str(out),
        ],
        env={"GUIDE_KEY": KEY},
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr
    results = convsim.read_results(out)
    _check_run(results, backend)
    manifest = json.loads(out.with_name("guide.manifest.json").read_text())
    assert manifest["model"] == "custom_model_adapter:CustomModelAdapter"
    assert manifest["settings"]["model_args"]["rpm"] == f"{RPM:g}"
    for written in (out, out.with_name("guide.manifest.json")):
        assert KEY not in written.read_text()
    assert KEY not in result.output + result.stderr


def test_a_wrong_adapter_configuration_exits_2_with_the_guides_own_verdict(
    endpoint: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "run", PACK, "--model", "custom_model_adapter:CustomModelAdapter",
            "--model-arg", f"api_endpoint={endpoint}", "--model-arg", "model_name=m",
            "-o", str(tmp_path / "r.jsonl"),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 2
    assert "Missing required field: api_key" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_guides_registration_block_builds_its_adapter(endpoint: str) -> None:
    config = _configuration(endpoint)
    adapter = guide_get_model_adapter("custom", config)
    assert isinstance(adapter, CustomModelAdapter)
    assert GUIDE_ADAPTERS["custom"] is CustomModelAdapter
    with pytest.raises(ValueError, match="Unsupported model type: nope"):
        guide_get_model_adapter("nope", config)


def test_the_guides_adapter_answers_the_guides_calls(backend: Backend, endpoint: str) -> None:
    adapter = CustomModelAdapter(_configuration(endpoint))
    backend.faults.clear()
    question = "What is the capital of France?"
    answer = adapter.generate_response(question, adapter.get_default_config())
    assert answer["text"] == "Paris" and answer["model"] == "custom-model"
    assert adapter.get_model_info()["model_type"] == "custom"
    assert adapter.validate_config(dict(adapter.configuration or {})) == {"valid": True}
    assert adapter.validate_config({"api_endpoint": endpoint})["valid"] is False
    cost = adapter.estimate_cost(1000, 500)
    assert cost["total_cost"] == pytest.approx(0.2) and cost["currency"] == "USD"
    # convsim reads the guide's answers as its own
    assert adapter.model_info().model_type == "custom"
    assert adapter.default_config().frequency_penalty == 0.0
    assert adapter.usage_cost(Usage(prompt_tokens=1000, completion_tokens=500)).total_cost == (
        pytest.approx(0.2)
    )
    limits = adapter.rate_limits()
    assert (limits.requests_per_minute, limits.tokens_per_minute) == (60, 90000)


def test_the_integration_tests_custom_adapter_check_without_a_service() -> None:
    """The body of the guide's ``test_custom_model_adapter``, imports changed."""
    config = ModelConfiguration(
        {
            "api_endpoint": "http://localhost:8080",
            "api_key": "test-key",
            "model_name": "custom-model",
        }
    )
    adapter = get_model_adapter("custom", config)
    assert adapter is not None
    model_info = adapter.get_model_info()
    assert model_info["model_type"] == "custom"
    assert MODEL_ADAPTERS["custom"] is type(adapter)
    with pytest.raises(ValueError, match="unknown model type 'nope'"):
        get_model_adapter("nope", config)
    with pytest.raises(ConfigError, match="api_endpoint"):
        ModelConfiguration({"api_endpoint": "localhost:8080"})
