"""Every public name the developer guide uses outside its task sections (architecture,
model adapters, custom metrics, plugins, integration tests, best practices), where it
lives in convsim, and a check that it is there and answers as the guide calls it.

test_guide_names.py runs each check; run as a script, this prints the table as
markdown (the README's "the guide's imports -> convsim's imports", in full)::

    python tests/guide/_guide_names.py > guide-names.md

Statuses: ``yes`` (the guide's name, as the guide calls it), ``partly`` (there, with the
difference the note gives), ``no`` (not honoured, for the reason the note gives; its
check shows what convsim does instead).
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:  # the guide's copies, when run as a script
    sys.path.insert(0, str(HERE))

__all__ = ["NAMES", "GuideName", "main", "table"]


@dataclass(frozen=True)
class GuideName:
    """One name of the guide and where convsim has it."""

    section: str
    guide: str
    convsim: str
    status: str
    note: str
    check: Callable[[], None]


_names: list[GuideName] = []


def _name(
    section: str, guide: str, convsim: str, status: str = "yes", note: str = ""
) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def record(check: Callable[[], None]) -> Callable[[], None]:
        _names.append(GuideName(section, guide, convsim, status, note, check))
        return check

    return record


def _callable_as(function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``function`` takes the guide's call (its signature binds the arguments)."""
    inspect.signature(function).bind(*args, **kwargs)


def _guide_config() -> Any:
    from convsim.adapters import ModelConfiguration

    return ModelConfiguration(
        {"api_endpoint": "http://localhost:8080", "api_key": "test-key", "model_name": "m"}
    )


# -- Architecture Overview -----------------------------------------------------------------

ARCH = "Architecture"


@_name(ARCH, "Task Registry", "`convsim.lm_eval.TASKS`, `convsim.lm_eval.register_task`")
def _task_registry() -> None:
    from convsim.lm_eval import TASKS, register_task

    assert TASKS.group == "convsim.tasks" and callable(register_task)


@_name(
    ARCH,
    "Model Manager",
    "`convsim.adapters`: `MODEL_ADAPTERS`, `get_model_adapter`, `ModelPool`",
    note="adapters are shared services: one pool, budget and retry policy per endpoint",
)
def _model_manager() -> None:
    from convsim.adapters import MODEL_ADAPTERS, ModelPool, get_model_adapter

    assert "custom" in MODEL_ADAPTERS and callable(get_model_adapter) and ModelPool


@_name(
    ARCH,
    "Metrics Engine",
    "`convsim.lm_eval.MetricsEngine` (the guide's API) over `convsim.metrics.METRICS`",
)
def _metrics_engine() -> None:
    from convsim.lm_eval import MetricsEngine
    from convsim.metrics import METRICS

    assert MetricsEngine.metric_registry is METRICS


@_name(ARCH, "Executor", "`convsim.Simulator`, `convsim.run_sync`")
def _executor() -> None:
    import convsim

    assert inspect.isclass(convsim.Simulator) and callable(convsim.run_sync)


@_name(
    ARCH,
    "lm-evaluation-harness (base classes, registry)",
    "`convsim.lm_eval`: model `convsim` (`ConvsimLM`), `export_lm_eval_tasks`, "
    "`lm-eval:TASK` packs",
)
def _harness() -> None:
    from convsim.lm_eval import ConvsimLM, export_lm_eval_tasks, load_lm_eval_task

    assert ConvsimLM and callable(export_lm_eval_tasks) and callable(load_lm_eval_task)


@_name(
    ARCH,
    "Task Extensions",
    "`convsim.lm_eval.AdvancedTask`, `MultiTurnTask`; entry-point group `convsim.tasks`",
)
def _task_extensions() -> None:
    from convsim.lm_eval import AdvancedTask, MultiTurnTask

    assert issubclass(MultiTurnTask, AdvancedTask)


@_name(
    ARCH,
    "Model Adapters (extension point)",
    "`convsim.adapters.ModelAdapter`; entry-point group `convsim.adapters`",
)
def _adapter_extensions() -> None:
    from convsim.adapters import ADAPTERS

    assert ADAPTERS.group == "convsim.adapters"


@_name(
    ARCH,
    "Custom Metrics (extension point)",
    "`convsim.metrics.register_metric`, `convsim.lm_eval.CustomMetricsEngine`; "
    "entry-point groups `convsim.metrics`, `convsim.metric_engines`",
)
def _metric_extensions() -> None:
    from convsim.lm_eval import ENGINE_GROUP
    from convsim.metrics import METRICS, register_metric

    assert callable(register_metric) and METRICS.group == "convsim.metrics"
    assert ENGINE_GROUP == "convsim.metric_engines"


@_name(
    ARCH,
    "Plugins (extension point)",
    "`convsim.plugins.BasePlugin`; entry-point group `convsim.plugins`",
)
def _plugin_extensions() -> None:
    from convsim.plugins import PLUGINS

    assert PLUGINS.group == "convsim.plugins"


@_name(
    ARCH,
    "Data Loaders",
    "`convsim.scenarios.PACK_SOURCES`; entry-point group `convsim.pack_sources`",
)
def _data_loaders() -> None:
    from convsim.scenarios import PACK_SOURCES, PackSource

    assert PACK_SOURCES.prefix_group == "convsim.pack_sources" and PackSource


@_name(
    ARCH,
    "Execution Environments",
    "`convsim.metrics.run_python` (sandbox, `SandboxLimits`, `--allow-code`); "
    "`convsim.distributed` (Ray)",
    "partly",
    "no registry of runtime environments: the code sandbox and the Ray backend are the two",
)
def _environments() -> None:
    from convsim.metrics import SandboxLimits, run_python

    assert callable(run_python) and SandboxLimits().timeout_s > 0


# -- Adding Model Adapters -----------------------------------------------------------------

AD = "Model adapters"


@_name(
    AD,
    "`evaluation_engine.core.model_adapters`, `evaluation_engine.core.advanced_model_config`",
    "`convsim.adapters`",
)
def _adapter_modules() -> None:
    import convsim.adapters as adapters

    assert {"ModelAdapter", "ModelConfiguration", "get_model_adapter"} <= set(adapters.__all__)


@_name(
    AD,
    "`ModelAdapter` (subclassed with `generate_response` only)",
    "`convsim.adapters.ModelAdapter`",
    note="its async `generate` is bridged to a subclass's sync `generate_response`",
)
def _model_adapter() -> None:
    from convsim.adapters import ModelAdapter, is_bridged

    class Guide(ModelAdapter):
        def generate_response(self, prompt: str, config: dict[str, Any] | None = None) -> Any:
            return {"text": prompt}

    adapter = Guide(_guide_config())
    assert is_bridged(adapter) and adapter.configuration is not None


@_name(
    AD,
    "`ModelConfiguration({...})`, `config.get(key)`",
    "`convsim.adapters.ModelConfiguration`",
    note="checked when made (ConfigError naming the field); api_key shown as `***`",
)
def _model_configuration() -> None:
    from convsim import ConfigError
    from convsim.adapters import ModelConfiguration

    config = _guide_config()
    assert config.get("api_key") == "test-key" and "test-key" not in repr(config)
    try:
        ModelConfiguration({"api_endpoint": "localhost:8080"})
    except ConfigError as exc:
        assert "api_endpoint" in str(exc)
    else:
        raise AssertionError("an endpoint without a scheme was accepted")


@_name(
    AD,
    "configuration keys `api_endpoint`, `api_key`, `model_name`",
    "fields of `ModelConfiguration` (convsim's adapters also take `base_url`, `model`)",
)
def _configuration_keys() -> None:
    from convsim.adapters import ModelConfiguration

    assert {"api_endpoint", "api_key", "model_name"} <= set(ModelConfiguration.model_fields)


@_name(
    AD,
    "`get_model_info()` -> `model_id`, `model_type`, `provider`, `capabilities`, "
    "`context_length`, `supports_streaming`",
    "`ModelAdapter.get_model_info()` (convsim's form: `model_info()`)",
)
def _get_model_info() -> None:
    from convsim.adapters import get_model_adapter

    info = get_model_adapter("custom", _guide_config()).get_model_info()
    assert set(info) == {
        *("model_id", "model_type", "provider"),
        *("capabilities", "context_length", "supports_streaming"),
    }
    assert info["model_type"] == "custom" and "code_generation" in info["capabilities"]


@_name(
    AD,
    "`generate_response(prompt, config)` -> `text`, `usage` (`prompt_tokens`, "
    "`completion_tokens`, `total_tokens`), `model`, `finish_reason`",
    "`ModelAdapter.generate_response` (convsim's form: `async generate(messages, params)`)",
    note="sync, with the adapter's budgets and retries; refused inside a running event loop",
)
def _generate_response() -> None:
    from _generate_server import Backend, serving

    from convsim.adapters import ModelConfiguration, get_model_adapter

    backend = Backend(answers={("capital",): "Paris"})
    with serving(backend) as url:
        config = {"api_endpoint": url, "api_key": "k-0123456789", "model_name": "m"}
        adapter = get_model_adapter("custom", ModelConfiguration(config))
        answer = adapter.generate_response("The capital of France?", {"temperature": 0.0})
    assert answer["text"] == "Paris" and answer["finish_reason"] == "stop"
    assert set(answer["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert answer["model"] == "m"
    sent = backend.requests[-1]
    assert {"model", "prompt", "max_tokens", "temperature", "top_p", "stop"} <= set(sent)
    assert sent["temperature"] == 0.0


@_name(
    AD,
    "`get_default_config()` -> `temperature`, `max_tokens`, `top_p`, "
    "`frequency_penalty`, `presence_penalty`",
    "`ModelAdapter.get_default_config()` (convsim's form: `default_config()`)",
    "partly",
    "None where the backend's own default applies, not the guide's example values",
)
def _get_default_config() -> None:
    from convsim.adapters import GenerationParams, get_model_adapter

    config = get_model_adapter("custom", _guide_config()).get_default_config()
    assert {"temperature", "max_tokens", "top_p", "frequency_penalty", "presence_penalty"} <= (
        set(config)
    )
    assert {"frequency_penalty", "presence_penalty"} <= set(GenerationParams.model_fields)


@_name(
    AD,
    '`validate_config(config)` -> `{"valid": bool, "error": str}`',
    "`ModelAdapter.validate_config` (convsim's raising form: `check_config`)",
    "yes",
    "a model configuration (`api_endpoint`, `api_key`, `model_name`...) is checked as "
    "`ModelConfiguration` checks it, sampling settings alone as a turn's; the guide's "
    "required fields are not required by convsim's adapters (a local server needs no key)",
)
def _validate_config() -> None:
    from convsim.adapters import get_model_adapter

    adapter = get_model_adapter("custom", _guide_config())
    assert adapter.validate_config({"temperature": 0.5}) == {"valid": True}
    refused = adapter.validate_config({"temperature": 3})
    assert refused["valid"] is False and "temperature" in refused["error"]
    assert adapter.validate_config(dict(_guide_config())) == {"valid": True}
    hot = adapter.validate_config({**dict(_guide_config()), "temperature": 3})
    assert hot["valid"] is False and "temperature" in hot["error"]


@_name(
    AD,
    "`estimate_cost(prompt_tokens, completion_tokens)` -> `prompt_cost`, "
    "`completion_cost`, `total_cost`, `currency`",
    "`ModelAdapter.estimate_cost` (also `estimate_cost(usage)`; `usage_cost`)",
    note="None when no price is known (configure `input_price`/`output_price`)",
)
def _estimate_cost() -> None:
    from convsim.adapters import ModelConfiguration, get_model_adapter

    priced = ModelConfiguration({**_guide_config(), "input_price": 1.0, "output_price": 2.0})
    cost = get_model_adapter("custom", priced).estimate_cost(1_000_000, 500_000)
    assert cost is not None and cost["total_cost"] == 2.0 and cost["currency"] == "USD"
    assert get_model_adapter("custom", _guide_config()).estimate_cost(10, 10) is None


@_name(
    AD,
    "`get_rate_limits()` -> `requests_per_minute`, `tokens_per_minute`, `requests_per_day`",
    "`ModelAdapter.get_rate_limits()` (convsim's form: `rate_limits()`)",
    note="plus `concurrency`; None is unlimited; `rpm`/`tpm` of the configuration enforced",
)
def _get_rate_limits() -> None:
    from convsim.adapters import ModelConfiguration, get_model_adapter

    limited = ModelConfiguration({**_guide_config(), "rpm": 60, "tpm": 90000})
    limits = get_model_adapter("custom", limited).get_rate_limits()
    assert limits["requests_per_minute"] == 60 and limits["tokens_per_minute"] == 90000
    assert "requests_per_day" in limits


@_name(
    AD,
    "`CustomModelAdapter` (the guide's class; model type `custom`)",
    '`MODEL_ADAPTERS["custom"]` (the guide\'s POST `{api_endpoint}/generate` backend); '
    "the guide's class itself: tests/guide/custom_model_adapter.py",
)
def _custom_adapter() -> None:
    from convsim.adapters import MODEL_ADAPTERS, ModelAdapter

    assert issubclass(MODEL_ADAPTERS["custom"], ModelAdapter)


@_name(
    AD,
    "`MODEL_ADAPTERS`, `get_model_adapter(model_type, config)`; unknown type -> `ValueError`",
    "`convsim.adapters.MODEL_ADAPTERS`, `convsim.adapters.get_model_adapter`",
    note="unknown type: `convsim.RegistryError`, a ValueError and a KeyError, listing the types",
)
def _get_model_adapter() -> None:
    from convsim.adapters import MODEL_ADAPTERS, get_model_adapter

    assert {"custom", "openai", "anthropic"} <= set(MODEL_ADAPTERS)
    try:
        get_model_adapter("nope", _guide_config())
    except ValueError as exc:
        assert "custom" in str(exc)
    else:
        raise AssertionError("an unknown model type was built")


@_name(
    AD,
    '`raise Exception("Custom model API error: ...")`',
    "`convsim.AdapterError` and its kinds (`BadRequest`, `ServerError`, `RateLimited`, ...)",
    "partly",
    "typed errors (retried or not by kind) in place of a bare Exception",
)
def _api_error() -> None:
    from _generate_server import Backend, serving

    from convsim import AdapterError, BadRequest
    from convsim.adapters import ModelConfiguration, get_model_adapter

    with serving(Backend(faults=[400])) as url:
        config = {"api_endpoint": url, "api_key": "k-0123456789", "model_name": "m"}
        adapter = get_model_adapter("custom", ModelConfiguration(config))
        try:
            adapter.generate_response("hi", {})
        except BadRequest as exc:
            assert isinstance(exc, AdapterError)
        else:
            raise AssertionError("a 400 was not an error")


# -- Adding Custom Metrics -----------------------------------------------------------------

ME = "Custom metrics"
FENCE = "`" * 3
TURNS = [
    {"prompt": "How do I sort a list in Python?", "response": "Use sorted(items)."},
    {"prompt": "And in reverse?", "response": "Pass reverse=True to sorted."},
]


def _engine() -> Any:
    from convsim.lm_eval import CustomMetricsEngine
    from convsim.metrics import METRICS

    class Engine(CustomMetricsEngine):
        metric_registry = METRICS.copy()  # the checks leave convsim's registry as it was

    return Engine()


@_name(
    ME, "`evaluation_engine.core.metrics_engine.MetricsEngine`", "`convsim.lm_eval.MetricsEngine`"
)
def _metrics_engine_class() -> None:
    from convsim.lm_eval import MetricsEngine

    assert callable(MetricsEngine().calculate_metric)


@_name(
    ME,
    "`calculate_metric(metric_name, *args, **kwargs)`; unknown -> `ValueError`",
    "`MetricsEngine.calculate_metric`",
    note="unknown: `convsim.RegistryError` (a ValueError) listing the metrics",
)
def _calculate_metric() -> None:
    engine = _engine()
    assert 0.0 <= engine.calculate_metric("code_security_score", "x = 1") <= 1.0
    try:
        engine.calculate_metric("nope")
    except ValueError:
        return
    raise AssertionError("an unknown metric was calculated")


@_name(
    ME,
    "`MetricsEngine().custom_engine` (the guide's registration block)",
    "not honoured",
    "no",
    "the guide's block is a second MetricsEngine holding a CustomMetricsEngine that "
    "subclasses MetricsEngine: as one class it recurses. convsim's MetricsEngine "
    "dispatches `calculate_metric` itself; the block runs as written over it "
    "(tests/guide/metrics_engine.py)",
)
def _custom_engine() -> None:
    from metrics_engine import MetricsEngine as GuideEngine

    from convsim.lm_eval import MetricsEngine

    assert not hasattr(MetricsEngine(), "custom_engine")
    shared = MetricsEngine.metric_registry
    MetricsEngine.metric_registry = shared.copy()  # the guide's engine registers its metric
    try:
        guide = GuideEngine()
        assert guide.custom_engine.calculate_metric("code_security_score", "x = 1") == 1.0
    finally:
        MetricsEngine.metric_registry = shared


@_name(
    ME,
    "`CustomMetricsEngine(MetricsEngine)`, `register_custom_metrics()`, `custom_metrics`",
    "`convsim.lm_eval.CustomMetricsEngine` (registers its metrics in `convsim.metrics.METRICS`)",
)
def _custom_metrics_engine() -> None:
    from convsim.lm_eval import CustomMetricsEngine, MetricsEngine

    engine = _engine()
    assert isinstance(engine, CustomMetricsEngine) and issubclass(
        CustomMetricsEngine, MetricsEngine
    )
    engine.register_custom_metrics()
    assert set(engine.custom_metrics) == {
        *("domain_expertise_score", "technical_accuracy", "code_security_score"),
        *("financial_reasoning", "conversation_flow"),
    }


@_name(
    ME,
    "metric names `domain_expertise_score`, `technical_accuracy`, `code_security_score`, "
    "`financial_reasoning`, `conversation_flow`",
    "metrics of `convsim.metrics.METRICS` (`convsim run --metrics NAME`)",
    note="`domain_expertise_score` once a CustomMetricsEngine is made or declared "
    "(`convsim.metric_engines`)",
)
def _metric_names() -> None:
    engine = _engine()
    for name in engine.custom_metrics:
        assert name in engine.metric_registry, name


@_name(
    ME,
    "`calculate_domain_expertise(response, reference, domain)`; domains `finance`, "
    "`programming`, `machine_learning`",
    "`CustomMetricsEngine.calculate_domain_expertise`",
    note="None (not applicable) for a domain it has no terms for",
)
def _domain_expertise() -> None:
    engine = _engine()
    answer = "Diversification lowers portfolio risk when the correlation between assets is low."
    for domain in ("finance", "programming", "machine_learning"):
        _callable_as(engine.calculate_domain_expertise, answer, "ref", domain)
    assert engine.calculate_domain_expertise(answer, "diversification", "finance") > 0.0


@_name(
    ME,
    '`calculate_technical_accuracy(response, reference, context)`; `context["language"]`',
    "`CustomMetricsEngine.calculate_technical_accuracy`",
    "partly",
    "scores the answer's fenced Python blocks (None without one, where the guide "
    "guesses from characters such as `=` whether it is code); correctness is "
    "`validate_logic`'s, with the task's tests",
)
def _technical_accuracy() -> None:
    engine = _engine()
    python = {"language": "python"}
    good = engine.calculate_technical_accuracy(
        f"{FENCE}python\ndef f():\n    return 1\n{FENCE}", "", python
    )
    bad = engine.calculate_technical_accuracy(f"{FENCE}python\ndef f( return\n{FENCE}", "", python)
    assert good is not None and bad is not None and good > bad
    assert engine.calculate_technical_accuracy("no code here", "", python) is None


@_name(
    ME,
    "`calculate_code_security_score(code, language)`, `calculate_code_security` (the name "
    "its registration calls)",
    "`CustomMetricsEngine.calculate_code_security_score`, `MetricsEngine.calculate_code_security`",
)
def _code_security() -> None:
    engine = _engine()
    risky = "import os\npassword = 'hunter2'\nos.system('rm ' + path)\n"
    assert engine.calculate_code_security_score(risky, "python") < 1.0
    assert engine.calculate_code_security("x = 1\n") == 1.0


@_name(
    ME,
    "`calculate_financial_reasoning(response, context)`",
    "`CustomMetricsEngine.calculate_financial_reasoning`",
    "partly",
    "None (not applicable) where nothing financial is said, unless "
    '`context["domain"]` is `finance`',
)
def _financial_reasoning() -> None:
    engine = _engine()
    plan = "Risk and return: 60% equities at 8% gives 4.8%; hedge volatility. 1. Buy. 2. Hold."
    assert engine.calculate_financial_reasoning(plan, {}) > 0.5
    assert engine.calculate_financial_reasoning("I like turtles.", {}) is None
    assert engine.calculate_financial_reasoning("I like turtles.", {"domain": "finance"}) == 0.0


@_name(
    ME,
    "`calculate_conversation_flow(conversation_turns)` (turns with `prompt`, `response`)",
    "`CustomMetricsEngine.calculate_conversation_flow`",
    "partly",
    "None (not applicable) for fewer than two turns, where the guide says 0.0",
)
def _conversation_flow() -> None:
    engine = _engine()
    flow = engine.calculate_conversation_flow(TURNS)
    assert flow is not None and 0.0 < flow <= 1.0
    assert engine.calculate_conversation_flow(TURNS[:1]) is None


@_name(
    ME,
    "`assess_response_quality(response, reference)`",
    "`MetricsEngine.assess_response_quality`; metric `response_quality`",
    note="a float (`QualityScore`) with its parts; also `prompt=`, `required_keywords=`",
)
def _assess_response_quality() -> None:
    engine = _engine()
    good = engine.assess_response_quality("Paris is the capital of France.", "Paris")
    assert good is not None and 0.0 < good <= 1.0


@_name(
    ME,
    "`validate_logic(response, reference)`",
    "`MetricsEngine.validate_logic`; metric `validate_logic`",
    note="runs the task's tests in a sandbox only with `--allow-code`; else not applicable",
)
def _validate_logic() -> None:
    from convsim.metrics import LogicCheck

    assert isinstance(_engine().validate_logic("def f(): return 1", None), LogicCheck)


@_name(
    ME,
    "`contains_quantitative_analysis`, `mentions_risk_factors`, "
    "`includes_implementation_details` (used, not defined, by the guide's class)",
    "methods of `convsim.lm_eval.MetricsEngine`",
)
def _financial_signals() -> None:
    engine = _engine()
    assert engine.contains_quantitative_analysis("a 6% return: 0.6 x 8 + 0.4 x 3")
    assert engine.mentions_risk_factors("the main risk is a drawdown")
    assert not engine.includes_implementation_details("nice")


@_name(
    ME,
    "`calculate_topic_consistency`, `calculate_response_relevance`, "
    "`calculate_progression_quality` (used, not defined, by the guide's class)",
    "methods of `convsim.lm_eval.MetricsEngine`; metrics `topic_consistency`, "
    "`response_relevance`, `progression_quality`",
)
def _flow_parts() -> None:
    engine = _engine()
    for part in ("topic_consistency", "response_relevance", "progression_quality"):
        value = getattr(engine, f"calculate_{part}")(TURNS)
        assert value is None or 0.0 <= value <= 1.0, part


@_name(
    ME,
    "`get_domain_terminology`, `validate_term_usage`, `extract_term_context`, "
    "`is_code_content`, `validate_syntax`, `check_best_practices`",
    "not honoured",
    "no",
    "helpers the guide's own class defines (its copy, tests/guide/custom_metrics.py, "
    "has them); convsim's CustomMetricsEngine scores with its own parts instead",
)
def _guide_helpers() -> None:
    from custom_metrics import CustomMetricsEngine as GuideEngine

    helpers = ("get_domain_terminology", "validate_term_usage", "extract_term_context")
    helpers += ("is_code_content", "validate_syntax", "check_best_practices")
    convsims = _engine()
    for helper in helpers:
        assert callable(getattr(GuideEngine, helper)) and not hasattr(convsims, helper), helper


@_name(
    ME,
    "`numpy`, `sklearn.metrics.pairwise.cosine_similarity` (imported by the guide's class)",
    "not needed: `convsim.metrics.cosine`, `TfidfEmbedder`",
    "partly",
    "the guide's copy imports them, unused; scikit-learn is in the `dev` extra only",
)
def _third_party() -> None:
    from convsim.metrics import TfidfEmbedder, cosine

    texts = ["portfolio risk", "portfolio risk", "bananas"]
    same, other = cosine(TfidfEmbedder(), texts, [(0, 1), (0, 2)]) or [0.0, 1.0]
    assert same > other


# -- Creating Plugins ----------------------------------------------------------------------

PL = "Plugins"
HELLO = {"code": "def hello(): print('Hello, World!')"}


def _plugin() -> Any:
    from convsim.plugins import CodeAnalysisPlugin

    plugin = CodeAnalysisPlugin()
    assert plugin.initialize() is True
    return plugin


@_name(
    PL,
    "`evaluation_engine.plugins.base_plugin`, `.code_analysis_plugin`, `.plugin_manager`",
    "`convsim.plugins`",
)
def _plugin_modules() -> None:
    import convsim.plugins as plugins

    assert {"BasePlugin", "CodeAnalysisPlugin", "PluginManager"} <= set(plugins.__all__)


@_name(
    PL,
    "`BasePlugin(config)`: `config`, `name`, `version`",
    "`convsim.plugins.BasePlugin`",
    "partly",
    '`version` defaults to "0" (the guide: "1.0.0"); a plugin sets its own',
)
def _base_plugin() -> None:
    from convsim.plugins import BasePlugin

    class Mine(BasePlugin):
        def process(self, data: Any, context: dict[str, Any]) -> Any:
            return data

    mine = Mine({"level": 2})
    assert mine.config == {"level": 2} and mine.name == "Mine" and mine.version == "0"


@_name(
    PL,
    "`initialize()`, `get_capabilities()`, `process(data, context)`, `cleanup()`, "
    "`get_config_schema()`, `validate_config(config)`",
    "methods of `convsim.plugins.BasePlugin`",
    "partly",
    "not abstract: each has a working default (the guide's three abstract ones too)",
)
def _base_plugin_methods() -> None:
    from convsim.plugins import BasePlugin

    class Mine(BasePlugin):
        pass

    plugin = Mine()
    assert plugin.initialize() is True and isinstance(plugin.get_capabilities(), list)
    assert isinstance(plugin.get_config_schema(), dict) and plugin.validate_config({}) is True
    plugin.cleanup()
    _callable_as(plugin.process, {}, {})


@_name(
    PL,
    "`CodeAnalysisPlugin`; plugin name `code_analysis`",
    "`convsim.plugins.CodeAnalysisPlugin` (the `code` extra)",
)
def _code_analysis() -> None:
    from convsim.plugins import PLUGINS, CodeAnalysisPlugin

    assert PLUGINS.get("code_analysis") is CodeAnalysisPlugin


@_name(
    PL,
    "`get_capabilities()`: `syntax_analysis`, `complexity_analysis`, `style_analysis`, "
    "`security_analysis`, `performance_analysis`",
    "`CodeAnalysisPlugin.get_capabilities()`",
    note="also `score` and `process`",
)
def _capabilities() -> None:
    capabilities = _plugin().get_capabilities()
    for five in ("syntax", "complexity", "style", "security", "performance"):
        assert f"{five}_analysis" in capabilities


@_name(
    PL,
    '`process({"code"}, {"language"})` -> `syntax` (`valid`, `errors` with `line`, `message`)',
    "`CodeAnalysisPlugin.process`",
)
def _syntax() -> None:
    plugin = _plugin()
    assert plugin.process(HELLO, {"language": "python"})["syntax"] == {"valid": True, "errors": []}
    broken = plugin.process({"code": "def f(:"}, {"language": "python"})["syntax"]
    assert broken["valid"] is False and broken["errors"][0]["line"] == 1


@_name(
    PL,
    "`complexity` (`cyclomatic_complexity`, `cognitive_complexity`)",
    '`CodeAnalysisPlugin.process(...)["complexity"]`',
    note="radon's cyclomatic, SonarSource's cognitive, per function too",
)
def _complexity() -> None:
    code = "def f(x):\n    if x:\n        for i in x:\n            pass\n"
    complexity = _plugin().process({"code": code}, {"language": "python"})["complexity"]
    assert complexity["cyclomatic_complexity"] == 3 and complexity["cognitive_complexity"] == 3


@_name(
    PL,
    "`style` (`issues` with `line`, `type`, `message`; `score`); types `line_too_long`, "
    "`indentation`",
    '`CodeAnalysisPlugin.process(...)["style"]`',
    "partly",
    "pycodestyle's checks: issue `type` is its kind (`error`/`warning`), the check is "
    "in `rule` (E501 for a long line, E111 for indentation)",
)
def _style() -> None:
    code = "x = 1\nif x:\n  y = '" + "a" * 90 + "'\n"
    style = _plugin().process({"code": code}, {"language": "python"})["style"]
    rules = {issue["rule"] for issue in style["issues"]}
    assert {"E501", "E111"} <= rules and style["score"] < 1.0
    assert {"line", "type", "message"} <= set(style["issues"][0])


@_name(
    PL,
    "`security` (`issues` with `type`, `pattern`, `message`; `score`); type `dangerous_function`",
    '`CodeAnalysisPlugin.process(...)["security"]`',
    "partly",
    "bandit's findings: `type` names the risk, `rule` the bandit test, `line` where; "
    "no `pattern` (not a text match)",
)
def _security() -> None:
    code = "import os\nos.system('ls ' + name)\n"
    security = _plugin().process({"code": code}, {"language": "python"})["security"]
    issue = security["issues"][0]
    assert {"type", "rule", "line", "message"} <= set(issue) and security["score"] < 1.0


@_name(
    PL,
    "`performance` (`issues` with `type`, `message`; `score`); types `inefficient_loop`, "
    "`string_concatenation`",
    '`CodeAnalysisPlugin.process(...)["performance"]`',
    "partly",
    "static anti-patterns with their line: `nested_loop_same_sequence`, "
    "`string_concatenation_in_loop`, `list_membership_in_loop`",
)
def _performance() -> None:
    code = "def f(xs):\n    s = ''\n    for x in xs:\n        s += str(x)\n    return s\n"
    performance = _plugin().process({"code": code}, {"language": "python"})["performance"]
    assert performance["issues"][0]["type"] == "string_concatenation_in_loop"
    assert performance["issues"][0]["line"] == 4 and performance["score"] < 1.0


@_name(
    PL,
    'unsupported language -> `{"error": "Unsupported language: ..."}`; '
    "`supported_languages` `python`, `javascript`, `java`",
    "`CodeAnalysisPlugin.process`",
    "partly",
    "only Python is analysed; javascript and java are answered as unsupported "
    "(the guide's answers for them are placeholders); no `supported_languages` "
    "attribute, the error lists them",
)
def _languages() -> None:
    plugin = _plugin()
    answer = plugin.process({"code": "var x"}, {"language": "javascript"})
    assert answer["error"] == "Unsupported language: javascript"
    assert answer["supported_languages"] == ["python"]


@_name(
    PL,
    "`analysis_tools`, `_check_external_tools` (pylint, black, mypy)",
    "not honoured",
    "no",
    "convsim analyses with kept libraries (radon, pycodestyle, bandit) in-process, "
    "so there are no external tools to look for",
)
def _tools() -> None:
    assert not hasattr(_plugin(), "analysis_tools")


@_name(
    PL,
    "`PythonComplexityAnalyzer().analyze(tree)`",
    "`convsim.plugins.PythonComplexityAnalyzer` (also `analyse(code)`)",
    "partly",
    "not an `ast.NodeVisitor`: no `visit_If`/`visit_For`/`visit_While`, and the "
    "figures are in the returned dict, not left on the analyzer",
)
def _analyzer() -> None:
    from convsim.plugins import PythonComplexityAnalyzer

    tree = ast.parse("def f(x):\n    while x:\n        x -= 1\n")
    assert PythonComplexityAnalyzer().analyze(tree)["cyclomatic_complexity"] == 2


@_name(
    PL,
    "`PluginManager()`: `register_plugin(name, cls)`, `load_plugin(name, config)` -> bool, "
    "`get_plugin`, `unload_plugin`, `list_available_plugins`, `list_loaded_plugins`, "
    "`plugin_registry`; unknown -> `ValueError`",
    "`convsim.plugins.PluginManager`",
    note="unknown: `RegistryError` (a ValueError); a plugin not ready: False, the reason "
    "in `manager.failures`",
)
def _manager() -> None:
    from convsim.plugins import CodeAnalysisPlugin, PluginManager

    manager = PluginManager()
    manager.register_plugin("mine", CodeAnalysisPlugin)
    assert manager.plugin_registry["mine"] is CodeAnalysisPlugin
    assert {"code_analysis", "mine"} <= set(manager.list_available_plugins())
    assert manager.get_plugin("mine") is None
    assert manager.load_plugin("mine", {"max_line_length": 100}) is True
    assert manager.list_loaded_plugins() == ["mine"] and manager.get_plugin("mine") is not None
    manager.unload_plugin("mine")
    assert manager.list_loaded_plugins() == []
    try:
        manager.load_plugin("nope")
    except ValueError:
        return
    raise AssertionError("an unknown plugin loaded")


@_name(
    PL,
    "`PluginManager().plugins` (a dict of name -> plugin)",
    "`PluginManager.plugins`",
    "partly",
    "a list of the loaded plugins (convsim's users read it so); by name: `get_plugin(name)`",
)
def _manager_plugins() -> None:
    from convsim.plugins import PluginManager

    manager = PluginManager()
    manager.load_plugin("code_analysis")
    assert manager.plugins == [manager.get_plugin("code_analysis")]


# -- Testing Extensions: integration tests ------------------------------------------------

IT = "Integration tests"


@_name(
    IT,
    "`evaluation_engine.EvaluationClient(base_url, api_key)`",
    "`convsim.client.EvaluationClient` (`AsyncEvaluationClient` for async code)",
)
def _client() -> None:
    from convsim.client import EvaluationClient

    with EvaluationClient(base_url="http://localhost:8000", api_key="test-key") as client:
        assert client is not None


@_name(
    IT,
    "`create_evaluation(models=[{model_id, model_type, config}], tasks=[...])` -> "
    "`evaluation.id`, `evaluation.status` (`queued`, `running`)",
    "`EvaluationClient.create_evaluation` -> `convsim.client.Evaluation`",
    note="every model on every task; also convsim's `pack=`, `model=`",
)
def _create_evaluation() -> None:
    from convsim.client import Evaluation, EvaluationClient

    _callable_as(EvaluationClient.create_evaluation, object(), models=[{}], tasks=["t"])
    assert {"id", "status", "models", "tasks", "pairs"} <= set(
        inspect.signature(Evaluation).parameters
    )


@_name(
    IT,
    "model `openai/gpt-3.5-turbo` of `model_type` `openai`",
    '`MODEL_ADAPTERS["openai"]`; the service runs it as an operator endpoint of that name '
    "(`endpoints:` in `convsim serve --config`)",
)
def _service_model() -> None:
    from convsim.adapters import MODEL_ADAPTERS
    from convsim.service import Endpoint, ServiceSettings

    assert "openai" in MODEL_ADAPTERS and "endpoints" in ServiceSettings.model_fields
    assert Endpoint


@_name(
    IT,
    "task `single_turn_scenarios_my_new_task` in `tasks=`",
    "a task class registered with `convsim.lm_eval.register_task`, installed through "
    "entry-point group `convsim.tasks`",
)
def _service_task() -> None:
    from convsim.lm_eval import TASKS

    assert TASKS.group == "convsim.tasks"
    entry_points = HERE / "installed" / "guide_extensions-0.1.dist-info" / "entry_points.txt"
    assert "[convsim.tasks]" in entry_points.read_text(encoding="utf-8")


@_name(
    IT,
    "service at `http://localhost:8000`, key `test-key`",
    "`convsim serve --port 8000`; `convsim serve keys create --key-stdin`",
    "partly",
    "`convsim serve` listens on 127.0.0.1:8600 by default: give `--port 8000`",
)
def _service_address() -> None:
    from click.testing import CliRunner

    from convsim.cli import main

    shown = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--port" in shown and "8600" in shown
    keys = CliRunner().invoke(main, ["serve", "keys", "create", "--help"]).output
    assert "--key-stdin" in keys


@_name(
    IT,
    "`@pytest.mark.integration`",
    "the marker `integration` registered in pyproject.toml",
)
def _marker() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("integration:") for marker in markers)


@_name(
    IT,
    "file `tests/test_integration.py`",
    "tests/guide/test_integration.py (the guide's block, imports changed)",
)
def _integration_file() -> None:
    assert (HERE / "test_integration.py").exists()


# -- Best Practices ------------------------------------------------------------------------

BP = "Best practices"


@_name(BP, "Lazy Loading", "lazy package roots; registries import on first use")
def _lazy() -> None:
    import convsim

    assert "Simulator" in convsim.__all__ and callable(convsim.__getattr__)


@_name(BP, "Caching", "`convsim.adapters.ResponseCache`, `CachedAdapter` (`--cache`)")
def _caching() -> None:
    from convsim.adapters import CachedAdapter, ResponseCache

    assert ResponseCache and CachedAdapter


@_name(BP, "Async Processing", "async adapters and runtime (`async with Simulator(...)`)")
def _async() -> None:
    from convsim.adapters import ModelAdapter

    assert inspect.iscoroutinefunction(ModelAdapter.generate)


@_name(
    BP, "Resource Management", "`ModelAdapter.aclose`, `BasePlugin.cleanup`, `PluginManager.unload`"
)
def _resources() -> None:
    from convsim.adapters import ModelAdapter
    from convsim.plugins import PluginManager

    assert inspect.iscoroutinefunction(ModelAdapter.aclose) and PluginManager.unload


@_name(BP, "Input Validation", 'pydantic models with `extra="forbid"`; `convsim.ConfigError`')
def _validation() -> None:
    from convsim import ConfigError, ConvsimError

    assert issubclass(ConfigError, ConvsimError)


@_name(
    BP, "Sandboxing", "`convsim.metrics.run_python` with `SandboxLimits`, only with `--allow-code`"
)
def _sandbox() -> None:
    from convsim.metrics import CODE_NOT_ALLOWED, SandboxLimits

    assert CODE_NOT_ALLOWED and SandboxLimits().memory_mb > 0


@_name(BP, "Access Control", "the service's API keys, per-key limits (`convsim serve keys`)")
def _access() -> None:
    from convsim.service import KeyLimits

    assert KeyLimits


@_name(
    BP,
    "Audit Logging",
    "structlog events (`convsim --log-format json`), never a secret",
    "partly",
    "events of runs and the service are logged; no separate audit trail of plugin activity",
)
def _audit() -> None:
    from click.testing import CliRunner

    from convsim._secrets import is_secret_key
    from convsim.cli import main

    assert "--log-format" in CliRunner().invoke(main, ["--help"]).output
    assert is_secret_key("api_key")


NAMES: tuple[GuideName, ...] = tuple(_names)
"""Every name, in the guide's order."""


def table(names: tuple[GuideName, ...] = NAMES, verdicts: dict[str, str] | None = None) -> str:
    """The markdown table of ``names``, with each check's verdict where given."""
    lines = [
        "| section | the guide | convsim | honoured | note | checked |",
        "|---|---|---|---|---|---|",
    ]
    for entry in names:
        verdict = (verdicts or {}).get(entry.guide, "")
        note = entry.note.replace("|", "\\|")
        lines.append(
            f"| {entry.section} | {entry.guide} | {entry.convsim} | {entry.status} | {note} "
            f"| {verdict} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    """Run every check; print the table; 1 when a check failed."""
    verdicts: dict[str, str] = {}
    for entry in NAMES:
        try:
            entry.check()
        except Exception as exc:  # reported in the table, and by the exit code
            verdicts[entry.guide] = f"FAILED: {type(exc).__name__}: {exc}"
        else:
            verdicts[entry.guide] = "ok"
    sys.stdout.write(table(verdicts=verdicts))
    failed = sum(v != "ok" for v in verdicts.values())
    print(f"\n{len(NAMES)} names checked, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
