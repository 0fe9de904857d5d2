"""The mock server package: its public face, pickling, and modules that import down only."""

from __future__ import annotations

import ast
import pickle
import pickletools
from pathlib import Path

import convsim.adapters.mock as mock
from convsim.adapters.mock import Delay, MockModelServer, MockServerConfig, MockServerStatistics

# Bottom up: each module may import only the ones before it.
ORDER = [
    "_delay",
    "_wire",
    "_faults",
    "_config",
    "_tokens",
    "_answer",
    "_replies",
    "_prefix_cache",
    "_metrics",
    "_server",
]


def test_public_classes_name_their_public_path() -> None:
    for cls in (MockServerConfig, MockModelServer, MockServerStatistics, Delay):
        assert cls.__module__ == "convsim.adapters.mock", cls
        assert getattr(mock, cls.__qualname__) is cls


def test_all_is_complete() -> None:
    assert set(mock.__all__) == {
        "MockServerConfig",
        "MockModelServer",
        "MockServerStatistics",
        "Delay",
        "FaultKind",
    }
    assert all(hasattr(mock, name) for name in mock.__all__)


def test_config_statistics_and_delays_pickle_by_their_public_path() -> None:
    config = MockServerConfig(
        ttft_ms="uniform:20,80",
        itl_ms="normal:5,1",
        faults={"429": 1.0, "stream_drop": 2.0},
        fault_rate=0.1,
        api_key="sk-test",
        rpm=5,
    )
    data = pickle.dumps(config)
    modules = {arg for _, arg, _ in pickletools.genops(data) if str(arg).startswith("convsim")}
    assert modules == {"convsim.adapters.mock"}  # not the private module defining them
    again = pickle.loads(data)
    assert again == config
    assert again.ttft_ms == Delay("uniform", (20.0, 80.0))
    stats = MockServerStatistics(3, {"/v1/models": 1}, {"429": 2}, 0, 1)
    assert pickle.loads(pickle.dumps(stats)) == stats


def test_config_annotations_still_resolve_after_a_rebuild() -> None:
    assert MockServerConfig.model_rebuild(force=True) is True
    config = MockServerConfig.model_validate({"ttft_ms": "exp:30", "faults": {"html": 1}})
    assert config.ttft_ms == Delay("exp", (30.0,))


def _local_imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports (``from ._x import ...``), anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module)
    return found


def test_modules_import_only_the_ones_below_them() -> None:
    folder = Path(mock.__file__).parent
    assert sorted(p.stem for p in folder.glob("_*.py") if p.stem != "__init__") == sorted(ORDER)
    for index, name in enumerate(ORDER):
        imported = _local_imports(folder / f"{name}.py")
        assert imported <= set(ORDER[:index]), (name, imported - set(ORDER[:index]))
