"""The public surface: __all__, registries and entry points, logging hygiene."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections import OrderedDict
from importlib.metadata import EntryPoint

import pytest
import structlog
from structlog.testing import capture_logs

import convsim
from convsim import RegistryError
from convsim._registry import Registry
from convsim.cli._logging import redact_secrets

PACKAGES = [
    "convsim",
    "convsim.adapters",
    "convsim.metrics",
    "convsim.scenarios",
    "convsim.lm_eval",
    "convsim.load",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_complete_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"
    public = {a for a in vars(module) if not a.startswith("_")} - {"annotations", "TYPE_CHECKING"}
    submodules = {a for a in public if isinstance(getattr(module, a), type(sys))}
    assert public - submodules <= exported | {"__version__"}, public - submodules - exported


def test_import_has_no_side_effects_on_logging_and_loads_nothing_heavy() -> None:
    code = (
        "import sys, logging, convsim; "
        "assert not logging.getLogger().handlers; "
        "heavy = {'click', 'httpx', 'aiohttp', 'lm_eval', 'torch', 'datasets', 'sklearn', "
        "'numpy', 'bandit', 'jsonschema'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _Thing:
    def __init__(self, config=None) -> None:
        self.config = config


def test_registry_is_lazy_and_lists_names_on_a_miss() -> None:
    registry: Registry[object] = Registry("widget")
    registry.register("thing", "collections:OrderedDict")
    assert "collections" in sys.modules  # (always loaded; the point is the string form)
    assert registry.get("thing") is OrderedDict
    with pytest.raises(ValueError, match="already registered"):
        registry.register("thing", _Thing)
    registry.register("thing", _Thing, replace=True)
    with pytest.raises(RegistryError) as info:
        registry.get("other")
    assert info.value.known == ["thing"]
    assert str(info.value) == "unknown widget 'other'; known widgets: thing"


def test_registry_reads_entry_points_on_first_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_entry_points(group: str):
        calls.append(group)
        return [EntryPoint(name="plugged", value="collections:OrderedDict", group=group)]

    monkeypatch.setattr("convsim._registry.entry_points", fake_entry_points)
    registry: Registry[object] = Registry("widget", group="convsim.widgets")
    registry.register("builtin", _Thing)
    assert registry.get("builtin") is _Thing and calls == []  # no lookup while names are known
    assert registry.get("plugged") is OrderedDict
    assert "plugged" in registry.names() and calls == ["convsim.widgets"]  # read once


def test_secrets_are_redacted_from_log_events() -> None:
    event = {"event": "x", "api_key": "sk-123", "Authorization": "Bearer t", "model": "m"}
    assert redact_secrets(None, "info", event) == {
        "event": "x",
        "api_key": "***",
        "Authorization": "***",
        "model": "m",
    }


def test_runtime_logs_structured_events() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as logs:
            convsim.run_sync("single_turn_qa", "scripted", limit=2)
    finally:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    started = next(e for e in logs if e["event"] == "run_started")
    finished = next(e for e in logs if e["event"] == "run_finished")
    assert started["pack"] == "single_turn_qa" and started["conversations"] == 2
    assert finished["done"] == 2 and finished["log_level"] == "info"
    assert sum(e["event"] == "conversation_finished" for e in logs) == 2
