"""The guide's adapter names beside convsim's: ModelConfiguration, the guide's methods
on every adapter, MODEL_ADAPTERS and get_model_adapter, ``module:Class`` specs, and the
frequency and presence penalties."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from anyio.from_thread import start_blocking_portal
from conftest import FakeAdapter, write_pack
from structlog.testing import capture_logs

from convsim import ConfigError, RegistryError, Simulator
from convsim.adapters import (
    ADAPTERS,
    MODEL_ADAPTERS,
    AdapterTypes,
    CachedAdapter,
    Completion,
    Cost,
    GenerationParams,
    Message,
    ModelAdapter,
    ModelConfiguration,
    ModelPool,
    ResponseCache,
    ScriptedAdapter,
    Usage,
    create_adapter,
    get_model_adapter,
)
from convsim.adapters._anthropic import AnthropicAdapter
from convsim.adapters._cache import cache_key
from convsim.adapters._custom_http import CustomHttpAdapter, GuideCustomAdapter
from convsim.adapters._openai import OpenAIAdapter, OpenAICompatibleAdapter
from convsim.adapters.mock import MockModelServer, MockServerConfig

KEY = "sk-guide-0123456789abcdef"
URL = "http://127.0.0.1:9"
HI = [Message(role="user", content="Hi")]


# -- ModelConfiguration ------------------------------------------------------------------


def test_a_model_configuration_reads_as_the_guide_reads_it() -> None:
    config = ModelConfiguration(
        {"api_endpoint": URL, "api_key": KEY, "model_name": "m", "rpm": "120", "region": "eu"}
    )
    assert config.get("api_endpoint") == URL and config.get("api_key") == KEY
    assert config["model_name"] == "m" and config["rpm"] == 120.0 and config["region"] == "eu"
    assert config.get("temperature") is None and config.get("temperature", 0.7) == 0.7
    assert "rpm" in config and "tpm" not in config and len(config) == 5
    assert dict(config) == {
        "api_endpoint": URL, "api_key": KEY, "model_name": "m", "rpm": 120.0, "region": "eu",
    }  # fmt: skip
    assert ModelConfiguration(model_name="m", rpm=1) == ModelConfiguration(
        {"model_name": "m"}, rpm=1
    )
    assert ModelConfiguration.of(config) is config and len(ModelConfiguration.of(None)) == 0
    with pytest.raises(KeyError):
        config["tpm"]
    with pytest.raises(ValueError, match="frozen"):
        config.rpm = 1  # type: ignore[misc]


def test_a_model_configuration_never_shows_a_secret() -> None:
    config = ModelConfiguration(
        api_key=KEY,
        api_endpoint="http://user:pa55word@127.0.0.1:9",
        session_token="tok-0123456789abcdefgh",
    )
    assert config["session_token"] == "tok-0123456789abcdefgh"  # read, it is the value
    with capture_logs() as logs:
        structlog.get_logger().warning("built", config=config)
    shown = [
        repr(config),
        str(config),
        f"{config}",
        json.dumps(config.model_dump()),
        config.model_dump_json(),
        repr(logs),
    ]
    for text in shown:
        assert KEY not in text and "pa55word" not in text and "tok-0123" not in text, text
        assert "***" in text


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"rpm": 0}, "rpm: Input should be greater than 0"),
        ({"api_endpoint": "localhost:8080"}, "api_endpoint: 'localhost:8080' has no scheme"),
        ({"temperature": 3}, "temperature"),
        ({"model_name": ""}, "model_name"),
        ({"max_retries": 99, "timeout": -1}, "timeout: .*; max_retries:"),
        ({"not a name": 1}, "'not a name'|not a name is not a name"),
        (
            {"api_key_env": "NO_SUCH_VARIABLE_FOR_CONVSIM"},
            "NO_SUCH_VARIABLE_FOR_CONVSIM is not set",
        ),
    ],
)
def test_a_bad_model_configuration_names_the_field(data: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        ModelConfiguration(data, env={})


def test_api_key_env_is_read_from_the_mapping_given() -> None:
    config = ModelConfiguration(api_key_env="GUIDE_KEY", env={"GUIDE_KEY": KEY})
    assert config["api_key"] == KEY and KEY not in repr(config)
    given = ModelConfiguration(api_key="mine", api_key_env="GUIDE_KEY", env={})
    assert given["api_key"] == "mine"  # a key given wins, and the variable need not be set


# -- the guide's methods on convsim's adapters ----------------------------------------


def test_convsim_adapters_answer_the_guides_questions() -> None:
    adapter = ScriptedAdapter()
    assert adapter.get_model_info() == {
        "model_id": "scripted/scripted",
        "model_type": "scripted",
        "provider": "convsim",
        "capabilities": ["text_generation"],
        "context_length": None,
        "supports_streaming": False,
    }
    assert adapter.get_default_config() == {
        "temperature": 0.0,
        "max_tokens": 512,
        "top_p": None,
        "frequency_penalty": None,
        "presence_penalty": None,
    }
    assert adapter.get_rate_limits() == {
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "requests_per_day": None,
        "concurrency": None,
    }
    http = OpenAICompatibleAdapter(
        {"model": "m", "base_url": URL, "rpm": 60, "rpd": 1000, "frequency_penalty": 0.3}
    )
    assert http.get_default_config()["frequency_penalty"] == 0.3
    limits = http.get_rate_limits()
    assert (limits["requests_per_minute"], limits["requests_per_day"]) == (60, 1000)


def test_validate_config_answers_and_check_config_raises() -> None:
    adapter = OpenAICompatibleAdapter({"model": "m", "base_url": URL})
    assert adapter.validate_config({"temperature": 0.5, "presence_penalty": -1}) == {"valid": True}
    verdict = adapter.validate_config({"temperature": 5})
    assert verdict["valid"] is False and "temperature" in verdict["error"]
    assert adapter.validate_config({"no_such": 1})["valid"] is False
    assert adapter.check_config({"frequency_penalty": 1.5}).frequency_penalty == 1.5
    with pytest.raises(ConfigError, match="frequency_penalty"):
        adapter.check_config({"frequency_penalty": 2.5})


def test_validate_config_checks_the_guides_model_configuration() -> None:
    """The guide asks validate_config about a model configuration (endpoint, key, model
    and sampling settings together): a good one is valid, a bad field is named."""
    adapter = OpenAICompatibleAdapter({"model": "m", "base_url": URL})
    guide = {"api_endpoint": URL, "api_key": "test-key", "model_name": "m", "temperature": 0.7}
    assert adapter.validate_config(guide) == {"valid": True}
    hot = adapter.validate_config({**guide, "temperature": 3})
    assert hot["valid"] is False and "temperature" in hot["error"]
    ftp = adapter.validate_config({**guide, "api_endpoint": "ftp://host"})
    assert ftp["valid"] is False and "api_endpoint" in ftp["error"]
    seed = adapter.validate_config({**guide, "seed": "abc"})
    assert seed["valid"] is False and "seed" in seed["error"]
    assert "test-key" not in str(adapter.validate_config({**guide, "rpm": -1}))


def test_estimate_cost_takes_both_call_forms() -> None:
    adapter = OpenAICompatibleAdapter(
        {"model": "m", "base_url": URL, "input_price": 2.0, "output_price": 8.0}
    )
    cost = adapter.estimate_cost(1_000_000, 500_000)
    assert cost == {
        "prompt_cost": 2.0,
        "completion_cost": 4.0,
        "total_cost": 6.0,
        "currency": "USD",
    }
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=500_000, total_tokens=1_500_000)
    assert adapter.estimate_cost(usage) == Cost(
        prompt_cost=2.0, completion_cost=4.0, total_cost=6.0
    )
    assert adapter.estimate_cost(prompt_tokens=10, completion_tokens=0)["total_cost"] == 2e-05
    assert adapter.estimate_cost(usage=usage) == adapter.usage_cost(usage)
    unpriced = OpenAICompatibleAdapter({"model": "unknown-model", "base_url": URL})
    assert unpriced.estimate_cost(10, 5) is None and unpriced.estimate_cost(usage) is None
    for bad in [(), (1,), (1, 2, 3), (-1, 2), (1.5, 2), (True, 2)]:
        with pytest.raises(TypeError, match="estimate_cost"):
            adapter.estimate_cost(*bad)


def test_subclasses_written_before_the_guides_forms_keep_working() -> None:
    """An override of validate_config returning GenerationParams, or of
    estimate_cost(usage), is what convsim still asks."""

    class Older(FakeAdapter):
        def validate_config(self, config: Mapping[str, Any]) -> GenerationParams:  # type: ignore[override]
            params = GenerationParams.model_validate(dict(config))
            if params.temperature == 1.0:
                raise ConfigError("temperature 1.0 is refused here")
            return params.model_copy(update={"top_p": 0.5})

        def estimate_cost(self, usage: Usage) -> Cost | None:  # type: ignore[override]
            return Cost(total_cost=usage.total_tokens / 100)

    adapter = Older()
    assert adapter.check_config({"temperature": 0.2}).top_p == 0.5
    with pytest.raises(ConfigError, match="refused here"):
        adapter.check_config({"temperature": 1.0})
    usage = Usage(prompt_tokens=100, completion_tokens=100, total_tokens=200)
    assert adapter.usage_cost(usage) == Cost(total_cost=2.0)
    assert adapter.estimate_cost(usage) == Cost(total_cost=2.0)


def test_the_sync_call_refuses_a_running_event_loop() -> None:
    adapter = ScriptedAdapter()

    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"await adapter\.generate"):
            adapter.generate_response("Hi")

    anyio.run(inside)


def test_the_sync_call_answers_in_the_guides_shape() -> None:
    answer = ScriptedAdapter().generate_response("Hi there", {"max_tokens": 3, "temperature": 0})
    assert set(answer) == {"text", "usage", "model", "finish_reason"}
    assert len(answer["text"].split()) <= 3 and answer["model"] == "scripted"
    assert answer["usage"]["total_tokens"] == (
        answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    )
    with pytest.raises(ConfigError, match="temperature"):
        ScriptedAdapter().generate_response("Hi", {"temperature": 9})
    with pytest.raises(ConfigError, match="not a model setting"):
        ScriptedAdapter().generate_response("Hi", {"reference": "x"})


@pytest.fixture
def mock_server() -> Iterator[MockModelServer]:
    with start_blocking_portal() as portal:
        server = MockModelServer(MockServerConfig())
        portal.call(server.start)
        try:
            yield server
        finally:
            portal.call(server.stop)


def test_an_http_adapter_answers_sync_calls_again_and_again(mock_server: MockModelServer) -> None:
    """Each sync call has an event loop of its own: the connections of one are closed,
    and the next call opens its own."""
    adapter = OpenAICompatibleAdapter({"model": "mock-model", "base_url": mock_server.base_url})
    first = adapter.generate_response("Hello?")
    second = adapter.generate_response("Hello again?", {"max_tokens": 8})
    assert first["text"] and second["text"] and first["model"] == "mock-model"
    guide = get_model_adapter(
        "custom", {"api_endpoint": mock_server.base_url.removesuffix("/v1"), "model_name": "m"}
    )
    assert guide.generate_response("Hello?")["text"]


# -- the registry --------------------------------------------------------------------


def test_custom_is_the_guides_http_backend_and_says_so() -> None:
    config = ModelConfiguration({"api_endpoint": URL, "api_key": KEY, "model_name": "m"})
    adapter = get_model_adapter("custom", config)
    assert isinstance(adapter, GuideCustomAdapter) and isinstance(adapter, CustomHttpAdapter)
    assert adapter.get_model_info()["model_type"] == "custom"
    assert adapter.model_info().model_id == "custom/m" and adapter.registered_type == "custom"
    assert MODEL_ADAPTERS["custom"](config).get_model_info()["model_type"] == "custom"
    assert get_model_adapter("http", config).get_model_info()["model_type"] == "http"
    assert adapter.base_url == URL and adapter.auth_headers() == {"Authorization": f"Bearer {KEY}"}


def test_an_unknown_model_type_is_a_value_error_and_a_key_error() -> None:
    for caught in (ValueError, KeyError, RegistryError):
        with pytest.raises(caught, match=r"unknown model type 'nope'; known model types: .*custom"):
            get_model_adapter("nope", {})
    with pytest.raises(KeyError):
        MODEL_ADAPTERS["nope"]


def test_model_adapters_is_the_registry_as_a_dict() -> None:
    assert "custom" in MODEL_ADAPTERS and "nope" not in MODEL_ADAPTERS
    assert set(MODEL_ADAPTERS) == set(ADAPTERS.names()) and len(MODEL_ADAPTERS) >= 7
    assert MODEL_ADAPTERS["scripted"] is ScriptedAdapter
    mine = AdapterTypes(ADAPTERS.copy())
    mine["fake"] = FakeAdapter
    assert mine["fake"] is FakeAdapter and "fake" in mine and "fake" not in MODEL_ADAPTERS
    del mine["fake"]
    assert "fake" not in mine
    with pytest.raises(KeyError):
        del mine["fake"]
    with pytest.raises(ConfigError, match="not a model type name"):
        mine["a:b"] = FakeAdapter


class Configured(ModelAdapter):
    """A guide-style adapter that refuses a configuration without api_key."""

    def generate_response(self, prompt: str, config: dict | None = None) -> dict:
        return {"text": f"{self.configuration.get('model_name')} says hi"}  # type: ignore[union-attr]

    def validate_config(self, config: dict) -> dict:  # type: ignore[override]
        if "api_key" not in config:
            return {"valid": False, "error": "Missing required field: api_key"}
        return {"valid": True}


def test_a_guide_style_adapter_is_built_by_name_with_a_model_configuration() -> None:
    registry = ADAPTERS.copy()
    registry.register("configured", Configured)
    adapter = get_model_adapter(
        "configured", {"api_key": KEY, "model_name": "m"}, registry=registry
    )
    assert isinstance(adapter.configuration, ModelConfiguration)
    assert adapter.model_info().model_type == "configured"  # as it was registered
    assert adapter.generate_response("Hi")["text"] == "m says hi"
    with pytest.raises(ConfigError, match="Missing required field: api_key"):
        get_model_adapter("configured", {"model_name": "m"}, registry=registry)
    # a turn's settings are not the configuration: its verdict is not asked about them
    assert adapter.check_config({"temperature": 0.2}).temperature == 0.2

    class Strict(Configured):
        def validate_config(self, config: dict) -> dict:  # type: ignore[override]
            return {"valid": bool(config["api_key"])}  # a KeyError for a turn's settings

    assert Strict({"api_key": KEY}).check_config({"top_p": 0.5}).top_p == 0.5
    with pytest.raises(ConfigError, match="top_p"):
        Strict({"api_key": KEY}).check_config({"top_p": 5})


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Importable modules of adapter classes, as a user would write them."""
    (tmp_path / "guide_adapters.py").write_text(
        textwrap.dedent(
            """
            from convsim.adapters import ModelAdapter

            class Echo(ModelAdapter):
                def __init__(self, config):
                    super().__init__(config)
                    self.model_name = config.get("model_name", "echo")

                def generate_response(self, prompt, config=None):
                    return {"text": prompt, "model": self.model_name}

            NOT_A_CLASS = 3

            class NotAnAdapter:
                pass
            """
        )
    )
    (tmp_path / "broken_adapters.py").write_text("import no_such_dependency_for_convsim\n")
    package = tmp_path / "pkg_adapters"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inner.py").write_text("from guide_adapters import Echo as Inner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_module_class_spec_builds_the_users_own_adapter(modules: Path) -> None:
    adapter = create_adapter("guide_adapters:Echo", {"model_name": "e", "rpm": "60"})
    assert type(adapter).__name__ == "Echo" and adapter.registered_type == "guide_adapters:Echo"
    assert isinstance(adapter.configuration, ModelConfiguration)
    assert adapter.rate_limits().requests_per_minute == 60
    assert adapter.generate_response("ping")["text"] == "ping"
    assert type(create_adapter("pkg_adapters.inner:Inner")).__name__ == "Echo"


@pytest.mark.parametrize(
    ("spec", "error", "said"),
    [
        ("guide_adapters:Missing", ConfigError, "guide_adapters.Missing is nothing"),
        ("guide_adapters:NOT_A_CLASS", ConfigError, "is a int, not a subclass"),
        ("guide_adapters:NotAnAdapter", ConfigError, "is a type, not a subclass"),
        ("broken_adapters:Echo", ConfigError, "importing broken_adapters failed"),
        ("no_such_module_for_convsim:Echo", RegistryError, "on PYTHONPATH"),
        ("pkg_adapters.nope:Echo", RegistryError, "unknown model type 'pkg_adapters.nope'"),
    ],
)
def test_a_module_class_spec_that_names_no_adapter_says_why(
    modules: Path, spec: str, error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=said):
        create_adapter(spec)


@pytest.mark.anyio
async def test_the_pool_builds_a_module_class_spec_once(modules: Path) -> None:
    async with ModelPool(concurrency=2) as pool:
        first = pool.get("guide_adapters:Echo", {"model_name": "e"})
        assert pool.get("guide_adapters:Echo", {"model_name": "e"}) is first
        assert pool.get("guide_adapters:Echo", {"model_name": "f"}) is not first
        assert first.rate_limits().concurrency == 2  # sized by the pool
        completion = await first.generate(HI, GenerationParams())
        assert completion.text == "Hi"


def test_the_service_never_imports_a_module_class_spec(modules: Path) -> None:
    from convsim.service._job_model import Refused, _allowed_args

    with pytest.raises(Refused, match="unknown model type"):
        _allowed_args("guide_adapters:Echo")


# -- frequency and presence penalties --------------------------------------------------


def _body(adapter: Any, params: GenerationParams) -> dict[str, Any]:
    return adapter.request(HI, params, False).body  # type: ignore[no-any-return]


def test_penalties_are_sent_where_the_api_has_them() -> None:
    both = GenerationParams(frequency_penalty=0.4, presence_penalty=-0.2)
    compatible = OpenAICompatibleAdapter({"model": "m", "base_url": URL})
    body = _body(compatible, both)
    assert (body["frequency_penalty"], body["presence_penalty"]) == (0.4, -0.2)
    assert "frequency_penalty" not in _body(compatible, GenerationParams())
    openai = OpenAIAdapter({"model": "gpt-4o-mini", "api_key": KEY})
    assert _body(openai, both)["presence_penalty"] == -0.2
    reasoning = OpenAIAdapter({"model": "o3-mini", "api_key": KEY})
    assert "frequency_penalty" not in _body(reasoning, both)  # they take only a seed
    guide = CustomHttpAdapter({"model": "m", "base_url": URL})
    assert "frequency_penalty" not in _body(guide, both)  # the guide's body has none


def test_anthropic_has_no_penalties_and_says_so() -> None:
    adapter = AnthropicAdapter({"model": "claude", "api_key": KEY})
    with pytest.raises(ConfigError, match="Messages API has no presence_penalty"):
        adapter.check_config({"presence_penalty": 0.1})
    assert adapter.validate_config({"frequency_penalty": 0.1})["valid"] is False
    with pytest.raises(ConfigError, match="frequency_penalty: the Messages API has no such"):
        AnthropicAdapter({"model": "claude", "api_key": KEY, "frequency_penalty": 0.1})
    body = _body(adapter, GenerationParams(temperature=0.5))
    assert "frequency_penalty" not in body and "presence_penalty" not in body


def test_penalties_are_out_of_range_beyond_two() -> None:
    for value in (-2.1, 2.1):
        with pytest.raises(ValueError, match="frequency_penalty"):
            GenerationParams(frequency_penalty=value)


def test_penalties_are_part_of_the_response_cache_key() -> None:
    identity = {"adapter": "A"}
    keys = {
        cache_key(identity, HI, GenerationParams()),
        cache_key(identity, HI, GenerationParams(frequency_penalty=0.5)),
        cache_key(identity, HI, GenerationParams(presence_penalty=0.5)),
    }
    assert len(keys) == 3


class Recording(FakeAdapter):
    """Remembers the settings of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[GenerationParams] = []

    async def generate(self, messages: Any, params: GenerationParams) -> Completion:
        self.params.append(params)
        return await super().generate(messages, params)


def _penalty_pack(tmp_path: Path) -> Path:
    flows = {
        "default": {
            "turns": [
                {
                    "turn_id": "t1",
                    "prompt_template": "Hello",
                    "config": {"frequency_penalty": 0.7, "presence_penalty": 0.1},
                },
                {"turn_id": "t2", "prompt_template": "Again"},
            ]
        }
    }
    scenario = {"scenario_id": "s1", "scenario_type": "default", "scenario_description": "hi"}
    return write_pack(tmp_path / "pack", flows, [scenario])


@pytest.mark.anyio
async def test_a_packs_penalties_reach_the_model_over_its_defaults(tmp_path: Path) -> None:
    adapter = Recording()
    async with Simulator(adapter) as simulator:
        results = [r async for r in simulator.run(_penalty_pack(tmp_path))]
    assert results[0].status.value == "DONE"
    first, second = adapter.params
    assert (first.frequency_penalty, first.presence_penalty) == (0.7, 0.1)
    assert second.frequency_penalty is None


def test_a_pack_with_penalties_is_refused_for_anthropic_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"turn 't1'.*no frequency_penalty"):
        Simulator(AnthropicAdapter({"model": "claude", "api_key": KEY})).check(
            _load(_penalty_pack(tmp_path))
        )


def _load(path: Path) -> Any:
    from convsim import load_pack

    return load_pack(path)


def test_cached_adapters_answer_the_guides_questions_as_the_inner_one(tmp_path: Path) -> None:
    inner = OpenAICompatibleAdapter(
        {"model": "m", "base_url": URL, "input_price": 1.0, "output_price": 1.0}
    )
    cached = CachedAdapter(inner, ResponseCache(tmp_path))
    assert cached.get_model_info() == inner.get_model_info()
    assert cached.get_default_config() == inner.get_default_config()
    assert cached.get_rate_limits() == inner.get_rate_limits()
    assert cached.estimate_cost(10, 10) == inner.estimate_cost(10, 10)
    assert cached.validate_config({"temperature": 9})["valid"] is False
