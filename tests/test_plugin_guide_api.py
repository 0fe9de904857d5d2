"""The guide's plugin API beside convsim's: BasePlugin built from a settings dict, its
capabilities, schema and validation; PluginManager's register, load, unload and list
calls, and its registry; guide-style plugins in a run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, Field

import convsim
from convsim import ConfigError, Simulator
from convsim.plugins import (
    PLUGINS,
    BasePlugin,
    CodeAnalysisPlugin,
    PluginManager,
    PluginScores,
)

pytestmark = pytest.mark.anyio


class Counter(BasePlugin):
    """Written to the guide's contract: no name, settings from the constructor,
    ``initialize()`` returning a bool, a sync ``cleanup``; and one of convsim's hooks."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.turns = 0
        self.cleaned = 0
        self.ready = False

    def initialize(self) -> bool:  # type: ignore[override]
        self.ready = bool(self.config.get("ready", True))
        return self.ready

    def get_capabilities(self) -> list[str]:
        return ["turn_counting"]

    def process(self, data: Any, context: Any = None) -> Any:
        return {"words": len(str(data).split()), "scale": self.config.get("scale", 1)}

    def cleanup(self) -> None:
        self.cleaned += 1

    async def on_turn(self, turn: Any) -> None:
        self.turns += 1

    def score(self, result: Any) -> PluginScores:
        return PluginScores(scores={"Counter:turns": convsim.Score(value=float(self.turns))})


class Typed(BasePlugin):
    """convsim's form: a name, a Config model."""

    name: ClassVar[str] = "typed"

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

        threshold: float = Field(default=0.5, ge=0, le=1)


class Schema(BasePlugin):
    """The guide's form of declared settings: a JSON schema of its own."""

    def initialize(self) -> bool:  # type: ignore[override]
        return True

    def get_config_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"level": {"type": "integer", "minimum": 1}},
            "required": ["level"],
            "additionalProperties": False,
        }


class Picky(BasePlugin):
    """The guide's own validation."""

    def initialize(self) -> bool:  # type: ignore[override]
        return True

    def validate_config(self, config: Any) -> bool:
        return config.get("mode") in ("fast", "slow")


# -- BasePlugin -------------------------------------------------------------------------


def test_a_plugin_is_built_from_a_settings_dict_as_the_guide_builds_it() -> None:
    plugin = Counter({"scale": 3})
    assert plugin.config == {"scale": 3}
    assert plugin.name == "Counter"  # no name given: the class's, as in the guide
    assert plugin.initialize() is True
    assert plugin.process("a b c", {}) == {"words": 3, "scale": 3}
    assert Counter().config == {}
    with pytest.raises(TypeError, match="mapping"):
        Counter(["scale", 3])  # type: ignore[arg-type]


def test_convsim_plugins_check_settings_given_at_construction() -> None:
    plugin = Typed({"threshold": 0.2})
    assert plugin.initialize() is True
    assert plugin.config.threshold == 0.2  # the Config model, once checked
    with pytest.raises(ConfigError, match="threshold"):
        Typed({"threshold": 2}).initialize()
    with pytest.raises(ConfigError, match="colour"):
        Typed({"colour": "red"}).initialize()


def test_capabilities_by_default_are_the_hooks_a_plugin_implements() -> None:
    class Hooks(BasePlugin):
        async def on_run_start(self, manifest: Any) -> None: ...

        def score(self, result: Any) -> None:
            return None

    assert Hooks().get_capabilities() == ["on_run_start", "score"]
    assert Typed().get_capabilities() == []
    assert Counter().get_capabilities() == ["turn_counting"]


def test_the_config_schema_is_the_config_models_or_the_plugins_own() -> None:
    schema = Typed().get_config_schema()
    assert schema["properties"]["threshold"]["maximum"] == 1
    assert schema["additionalProperties"] is False
    assert Counter().get_config_schema() == {}  # the guide's form: any settings
    assert Schema().get_config_schema()["required"] == ["level"]


def test_validate_config_says_whether_settings_are_accepted() -> None:
    assert Typed().validate_config({"threshold": 0.9}) is True
    assert Typed().validate_config({"threshold": -1}) is False
    assert Typed().validate_config({"other": 1}) is False
    assert Counter().validate_config({"anything": 1}) is True  # the guide's default
    assert Schema().validate_config({"level": 2}) is True
    assert Schema().validate_config({"level": 0}) is False
    assert Schema().validate_config({}) is False
    assert Picky().validate_config({"mode": "fast"}) is True
    assert Picky().validate_config({"mode": "warp"}) is False


def test_a_plugin_that_does_not_process_says_what_it_offers() -> None:
    class Quiet(BasePlugin):
        name: ClassVar[str] = "quiet"

        async def on_turn(self, turn: Any) -> None: ...

    with pytest.raises(NotImplementedError, match=r"quiet does not process.*on_turn"):
        Quiet().process({}, {})


# -- PluginManager: the guide's calls ---------------------------------------------------


def test_register_load_get_list_and_unload() -> None:
    manager = PluginManager()
    assert manager.list_loaded_plugins() == []
    assert "code_analysis" in manager.list_available_plugins()
    manager.register_plugin("counter", Counter)
    assert {"code_analysis", "counter"} <= set(manager.list_available_plugins())
    assert manager.load_plugin("counter", {"scale": 2}) is True
    assert manager.load_plugin("code_analysis") is True
    assert manager.list_loaded_plugins() == ["counter", "code_analysis"]
    counter = manager.get_plugin("counter")  # by the name it was loaded as
    assert isinstance(counter, Counter) and counter.ready
    assert counter.process("x", {}) == {"words": 1, "scale": 2}
    assert manager.get_plugin("nothing") is None
    assert manager.unload_plugin("counter") is True
    assert counter.cleaned == 1
    assert manager.list_loaded_plugins() == ["code_analysis"]
    assert manager.get_plugin("counter") is None
    assert manager.unload_plugin("counter") is False  # not loaded: nothing to do
    assert counter.cleaned == 1


def test_the_plugin_registry_maps_names_to_classes() -> None:
    manager = PluginManager()
    registry = manager.plugin_registry
    assert registry["code_analysis"] is CodeAnalysisPlugin
    assert "counter" not in registry
    registry["counter"] = Counter  # the guide writes to it directly too
    assert registry["counter"] is Counter and "counter" in registry
    assert set(registry) == set(manager.list_available_plugins()) and len(registry) >= 2
    with pytest.raises(KeyError):
        registry["nothing"]
    assert dict(registry.items())["counter"] is Counter


def test_each_manager_registers_for_itself() -> None:
    first, second = PluginManager(), PluginManager()
    first.register_plugin("counter", Counter)
    assert "counter" in first.list_available_plugins()
    assert "counter" not in second.list_available_plugins()
    assert "counter" not in PLUGINS  # the shared registry is untouched
    first.register_plugin("code_analysis", Counter)  # a name now means this class
    assert first.plugin_registry["code_analysis"] is Counter
    assert second.plugin_registry["code_analysis"] is CodeAnalysisPlugin


def test_register_plugin_refuses_what_is_not_a_plugin() -> None:
    manager = PluginManager()
    with pytest.raises(TypeError, match=r"not a subclass of convsim\.plugins\.BasePlugin"):
        manager.register_plugin("dict", dict)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        manager.register_plugin("instance", Counter())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        manager.register_plugin("", Counter)


def test_an_unknown_plugin_is_a_value_error_listing_the_known_ones() -> None:
    manager = PluginManager()
    with pytest.raises(ValueError, match=r"unknown plugin 'nope'.*code_analysis"):
        manager.load_plugin("nope")
    with pytest.raises(convsim.RegistryError):
        PluginManager.load(["nope"])
    assert manager.failures == []  # a wrong name is the caller's error, not a failure


def test_a_plugin_that_is_not_ready_is_not_loaded_and_says_why() -> None:
    class Explodes(BasePlugin):
        def initialize(self) -> bool:  # type: ignore[override]
            raise RuntimeError("no GPU")

    class BuildFails(BasePlugin):
        def __init__(self, config: Any = None) -> None:
            raise OSError("cannot open the model file")

    manager = PluginManager()
    for name, cls in (("counter", Counter), ("explodes", Explodes), ("build", BuildFails)):
        manager.register_plugin(name, cls)
    assert manager.load_plugin("counter", {"ready": False}) is False
    assert manager.load_plugin("explodes") is False
    assert manager.load_plugin("build") is False
    assert manager.list_loaded_plugins() == []
    why = {(f.plugin, f.hook): f.error for f in manager.failures}
    assert why[("Counter", "initialize")] == "initialize() returned False"
    assert why[("Explodes", "initialize")] == "RuntimeError: no GPU"
    assert why[("build", "__init__")] == "OSError: cannot open the model file"


def test_settings_a_plugin_refuses_are_recorded_with_the_field() -> None:
    manager = PluginManager()
    manager.register_plugin("typed", Typed)
    manager.register_plugin("schema", Schema)
    manager.register_plugin("picky", Picky)
    assert manager.load_plugin("typed", {"threshold": 7}) is False
    assert manager.load_plugin("schema", {"level": "high"}) is False
    assert manager.load_plugin("picky", {"mode": "warp"}) is False
    errors = [f.error for f in manager.failures]
    assert "threshold" in errors[0]
    assert "level: 'high' is not of type 'integer'" in errors[1]
    assert "validate_config() refused mode" in errors[2]
    assert manager.load_plugin("schema", {"level": 3}) is True
    assert manager.get_plugin("schema").config == {"level": 3}  # type: ignore[union-attr]


def test_loading_twice_keeps_one_plugin_and_other_settings_are_refused() -> None:
    manager = PluginManager()
    manager.register_plugin("counter", Counter)
    assert manager.load_plugin("counter", {"scale": 2}) is True
    first = manager.get_plugin("counter")
    assert manager.load_plugin("counter", {"scale": 2}) is True
    assert manager.get_plugin("counter") is first and len(manager.plugins) == 1
    with pytest.raises(ConfigError, match="already loaded with other settings"):
        manager.load_plugin("counter", {"scale": 5})
    manager.unload_plugin("counter")
    assert manager.load_plugin("counter", {"scale": 5}) is True  # once unloaded


async def test_unload_plugin_inside_an_event_loop_says_to_await_unload() -> None:
    manager = PluginManager()
    manager.register_plugin("counter", Counter)
    manager.load_plugin("counter")
    counter = manager.get_plugin("counter")
    with pytest.raises(ConfigError, match=r"await manager\.unload\('counter'\)"):
        manager.unload_plugin("counter")
    assert await manager.unload("counter") is True
    assert isinstance(counter, Counter) and counter.cleaned == 1


async def test_an_async_cleanup_is_awaited_on_unload() -> None:
    closed: list[str] = []

    class Pool(BasePlugin):
        name: ClassVar[str] = "pool"

        async def cleanup(self) -> None:  # type: ignore[override]  # convsim's form
            closed.append("pool")

    manager = PluginManager()
    manager.register_plugin("pool", Pool)
    manager.load_plugin("pool")
    assert await manager.unload("pool") is True
    assert closed == ["pool"]


def test_a_cleanup_that_fails_or_hangs_still_unloads_and_is_recorded() -> None:
    release = threading.Event()

    class Fails(BasePlugin):
        def initialize(self) -> bool:  # type: ignore[override]
            return True

        def cleanup(self) -> None:
            raise RuntimeError("socket already closed")

    class Hangs(BasePlugin):
        hook_timeout: ClassVar[float] = 0.2

        def initialize(self) -> bool:  # type: ignore[override]
            return True

        def cleanup(self) -> None:
            release.wait()  # blocked until the test lets it go

    manager = PluginManager()
    manager.register_plugin("fails", Fails)
    manager.register_plugin("hangs", Hangs)
    assert manager.load_plugin("fails") and manager.load_plugin("hangs")
    try:
        assert manager.unload_plugin("fails") is True
        assert manager.unload_plugin("hangs") is True  # given up on after 0.2 s
    finally:
        release.set()
    assert manager.list_loaded_plugins() == []
    errors = {f.plugin: f.error for f in manager.failures}
    assert errors["Fails"] == "RuntimeError: socket already closed"
    assert errors["Hangs"].startswith("timed out after 0.2 s")
    assert manager.stalled == {}  # gone, and a reload would start afresh


# -- guide-style plugins in a run -------------------------------------------------------


def test_a_guide_style_plugin_runs_with_convsims_hooks(tmp_path: Path) -> None:
    registry = PLUGINS.copy()
    registry.register("counter", Counter)
    out = tmp_path / "run.jsonl"
    results = convsim.run_sync(
        "customer_support",
        "scripted",
        out=out,
        limit=2,
        plugins=["counter"],
        plugin_config={"counter": {"scale": 2}},
        plugin_registry=registry,
    )
    assert len(results) == 2
    assert all(r.scores["Counter:turns"].value >= len(r.turns) for r in results)
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["plugins"] == [{"name": "Counter", "version": "0"}]


async def test_a_guide_style_plugin_that_is_not_ready_is_left_out_of_the_run() -> None:
    registry = PLUGINS.copy()
    registry.register("counter", Counter)
    async with Simulator(
        "scripted",
        plugins=["counter"],
        plugin_config={"counter": {"ready": False}},
        plugin_registry=registry,
    ) as sim:
        results = [r async for r in sim.run("customer_support", limit=1)]
    assert "Counter:turns" not in results[0].scores
    assert [(f.plugin, f.hook) for f in sim.plugins.failures] == [("Counter", "initialize")]


async def test_a_plugin_unloaded_between_runs_is_called_no_more() -> None:
    registry = PLUGINS.copy()
    registry.register("counter", Counter)
    async with Simulator("scripted", plugins=["counter"], plugin_registry=registry) as sim:
        first = [r async for r in sim.run("customer_support", limit=1)]
        counter = sim.plugins.get_plugin("counter")
        assert await sim.plugins.unload("counter") is True
        second = [r async for r in sim.run("customer_support", limit=1)]
    assert "Counter:turns" in first[0].scores and "Counter:turns" not in second[0].scores
    assert isinstance(counter, Counter) and counter.cleaned == 1  # not again at close
