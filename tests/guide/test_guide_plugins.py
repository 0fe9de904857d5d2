"""The guide's "Creating Plugins" code and the plugin test of its "Testing Extensions",
run against convsim.

base_plugin.py, code_analysis_plugin.py and plugin_manager.py are the guide's code
blocks copied as they are, with only their import lines changed to convsim's modules:
the guide's BasePlugin (the interface convsim's must answer), the guide's example
plugin (a user's plugin, subclassing convsim's BasePlugin) and the guide's
PluginManager (run here over convsim's bundled CodeAnalysisPlugin).
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import base_plugin as guide_base
import pytest
from code_analysis_plugin import CodeAnalysisPlugin as GuideExamplePlugin
from plugin_manager import PluginManager as GuidePluginManager

import convsim
from convsim.plugins import PLUGINS, BasePlugin, PluginManager

HELLO = {"code": "def hello(): print('Hello, World!')"}
PYTHON = {"language": "python"}


def test_convsims_base_plugin_answers_every_call_of_the_guides() -> None:
    """Each method of the guide's BasePlugin is on convsim's, and accepts the call the
    guide's signature makes (its required arguments, then all of them)."""
    guide_methods = {
        name: member
        for name, member in vars(guide_base.BasePlugin).items()
        if inspect.isfunction(member)
    }
    assert set(guide_methods) == {
        "__init__",
        "initialize",
        "get_capabilities",
        "process",
        "cleanup",
        "get_config_schema",
        "validate_config",
    }
    for name, guide_method in guide_methods.items():
        ours = inspect.signature(getattr(BasePlugin, name))
        parameters = list(inspect.signature(guide_method).parameters.values())[1:]
        required = [p for p in parameters if p.default is inspect.Parameter.empty]
        ours.bind(object(), *(object() for _ in required))
        ours.bind(object(), *(object() for _ in parameters))
        assert not inspect.iscoroutinefunction(getattr(BasePlugin, name)), name


def test_the_guides_manager_runs_convsims_code_analysis_plugin() -> None:
    manager = GuidePluginManager()
    assert manager.list_available_plugins() == ["code_analysis"]
    assert manager.load_plugin("code_analysis") is True
    plugin = manager.get_plugin("code_analysis")
    result = plugin.process(HELLO, PYTHON)
    assert result["syntax"] == {"valid": True, "errors": []}
    assert result["complexity"]["cyclomatic_complexity"] == 1
    assert result["style"]["score"] == 1.0 and result["security"]["score"] == 1.0
    assert result["performance"]["issues"] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its sync cleanup() leaves no coroutine behind
        manager.unload_plugin("code_analysis")
    assert manager.list_loaded_plugins() == []
    with pytest.raises(ValueError, match="Unknown plugin: nope"):
        manager.load_plugin("nope")


def test_the_guides_example_plugin_loads_in_convsims_manager(
    capsys: pytest.CaptureFixture[str],
) -> None:
    manager = PluginManager()
    manager.register_plugin("guide_code", GuideExamplePlugin)
    assert manager.plugin_registry["guide_code"] is GuideExamplePlugin
    assert manager.load_plugin("guide_code", {"strict": True}) is True
    assert "pylint is" in capsys.readouterr().out  # its initialize() ran: it reports its tools
    plugin = manager.get_plugin("guide_code")
    assert isinstance(plugin, GuideExamplePlugin)
    assert plugin.config == {"strict": True} and plugin.name == "CodeAnalysisPlugin"
    assert plugin.get_capabilities()[0] == "syntax_analysis"
    result = plugin.process({"code": "x = eval('1')"}, PYTHON)
    assert result["security"]["issues"][0]["pattern"] == "eval("  # the guide's own check
    assert manager.list_loaded_plugins() == ["guide_code"]
    assert manager.unload_plugin("guide_code") is True
    assert manager.list_loaded_plugins() == []


def test_the_guides_example_plugin_runs_in_a_simulator(tmp_path: Path) -> None:
    registry = PLUGINS.copy()
    registry.register("guide_code", GuideExamplePlugin)
    out = tmp_path / "run.jsonl"
    results = convsim.run_sync(
        "coding_help", "scripted", out=out, limit=2, plugins=["guide_code"],
        plugin_registry=registry,
    )  # fmt: skip
    assert len(results) == 2 and all(r.status.value == "DONE" for r in results)
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["plugins"] == [{"name": "CodeAnalysisPlugin", "version": "0"}]


class TestIntegration:
    """The guide's ``test_plugin_loading``, its import pointed at convsim (its
    ``@pytest.mark.integration`` marker is left to the guide's integration suite, which
    registers it)."""

    def test_plugin_loading(self) -> None:
        """Test plugin loading and usage."""
        from convsim.plugins import PluginManager

        manager = PluginManager()
        success = manager.load_plugin("code_analysis")
        assert success is True

        plugin = manager.get_plugin("code_analysis")
        assert plugin is not None

        # Test plugin functionality
        result = plugin.process(
            {"code": "def hello(): print('Hello, World!')"}, {"language": "python"}
        )

        assert "syntax" in result
        assert result["syntax"]["valid"] is True
