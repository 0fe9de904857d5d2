"""The layers of DESIGN.md, checked on the installed package.

import-linter's contract (pyproject.toml) forbids any import from a lower layer to an
upper one, inside functions and under TYPE_CHECKING too; lazy package roots keep each
package's import cost its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import convsim

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _installed_tree(root: Path) -> Path:
    """The installed convsim as one folder tree (an editable install maps its
    subpackages from other folders, which import-linter cannot follow)."""
    target = root / "convsim"
    skip = shutil.ignore_patterns("__pycache__", "packs", "*.json")
    shutil.copytree(convsim.__path__[0], target, ignore=skip)
    for sub in ("adapters", "metrics", "scenarios"):
        spec = importlib.util.find_spec(f"convsim.{sub}")
        assert spec is not None and spec.submodule_search_locations
        source = Path(next(iter(spec.submodule_search_locations)))
        if not (target / sub).exists():  # a non-editable install has them in place
            shutil.copytree(source, target / sub, ignore=skip)
    return root


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(PYPROJECT), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _installed_tree(tmp_path_factory.mktemp("installed"))


def test_the_layers_contract_holds(tree: Path) -> None:
    lint = _lint(tree)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "1 kept, 0 broken" in lint.stdout


@pytest.mark.parametrize(
    ("module", "code", "expected"),
    [
        (
            "adapters/_recall.py",
            "\n\ndef _later():\n    from convsim._runtime._simulator import Simulator\n"
            "\n    return Simulator\n",
            "convsim.adapters is not allowed to import convsim._runtime",
        ),
        (
            "scenarios/_pack.py",
            "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            "    from convsim.metrics import Metric\n",
            "convsim.scenarios is not allowed to import convsim.metrics",
        ),
        (
            "_records.py",
            "\n\ndef _later():\n    import convsim.adapters._scripted\n",
            "convsim._records is not allowed to import convsim.adapters",
        ),
        (
            "adapters/_scripted.py",
            "\n\ndef _later():\n    from convsim.scenarios import Pack\n\n    return Pack\n",
            "convsim.adapters is not allowed to import convsim.scenarios",
        ),
        (
            "results/_html.py",
            "\n\ndef _later():\n    from convsim._runtime._simulator import Simulator\n"
            "\n    return Simulator\n",
            "convsim.results is not allowed to import convsim._runtime",
        ),
        (
            "load/_plan.py",
            "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            "    from convsim.service import ServiceSettings\n",
            "convsim.load is not allowed to import convsim.service",
        ),
        (
            "_runtime/_simulator.py",
            "\n\ndef _later():\n    import convsim.distributed._ray\n",
            "convsim._runtime is not allowed to import convsim.distributed",
        ),
        (
            "client/_client.py",
            "\n\ndef _later():\n    from convsim.results import html_report\n"
            "\n    return html_report\n",
            "convsim.client is not allowed to import convsim.results",
        ),
    ],
    ids=[
        "inside-a-function",
        "under-type-checking",
        "kernel-to-service",
        "sibling-services",
        "results-to-runtime",
        "load-to-service",
        "runtime-to-distributed",
        "client-to-results",
    ],
)
def test_an_upward_import_breaks_the_contract(
    tmp_path: Path, module: str, code: str, expected: str
) -> None:
    tree = _installed_tree(tmp_path)
    with (tree / "convsim" / module).open("a", encoding="utf-8") as fh:
        fh.write(code)
    lint = _lint(tree)
    assert lint.returncode == 1
    assert expected in lint.stdout


def test_a_module_outside_every_layer_is_refused(tmp_path: Path) -> None:
    tree = _installed_tree(tmp_path)
    (tree / "convsim" / "_stray.py").write_text('"""Placed in no layer."""\n', encoding="utf-8")
    lint = _lint(tree)
    assert lint.returncode == 1 and "_stray" in lint.stdout


_CIRCLES = """
import json, sys
from pathlib import Path
import grimp

graph = grimp.build_graph("convsim", cache_dir=None)
root = Path(sys.argv[1])
packages = {m for m in graph.modules if (root / Path(*m.split("."))).is_dir()}
edges = {
    m: {d for d in graph.find_modules_directly_imported_by(m) if d not in packages}
    for m in graph.modules
    if m not in packages
}
circles = [
    sorted({a, b}) for a in edges for b in edges[a] if a < b and a in edges.get(b, ())
]
for start in edges:  # longer circles: a path from a module back to itself
    seen, todo = set(), list(edges[start])
    while todo:
        here = todo.pop()
        if here == start:
            circles.append([start])
            break
        if here not in seen:
            seen.add(here)
            todo.extend(edges.get(here, ()))
print(json.dumps(circles))
"""


def _circles(tree: Path) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CIRCLES, str(tree)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_module_imports_itself_through_others(tree: Path) -> None:
    # package roots are the public face (their TYPE_CHECKING block names everything);
    # between modules there is no circle, under TYPE_CHECKING and inside functions too
    assert _circles(tree) == []


def test_a_circle_between_two_modules_is_found(tmp_path: Path) -> None:
    tree = _installed_tree(tmp_path)
    with (tree / "convsim" / "_errors.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef _later():\n    from convsim._registry import Registry\n")
    circles = _circles(tree)
    assert ["convsim._errors", "convsim._registry"] in circles


def _loaded_after(code: str) -> dict[str, object]:
    """What importing ``code`` in a fresh interpreter leaves in sys.modules."""
    probe = (
        f"{code}\nimport json, sys\n"
        "mods = sorted(m for m in sys.modules if m.startswith(('convsim', 'lm_eval', "
        "'sklearn', 'numpy', 'aiohttp', 'httpx')))\n"
        "print(json.dumps(mods))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return {m: True for m in json.loads(out.stdout.strip().splitlines()[-1])}


def test_import_convsim_adapters_leaves_the_runtime_unimported() -> None:
    loaded = _loaded_after(
        "import convsim.adapters, pkgutil, importlib\n"
        "for m in pkgutil.iter_modules(convsim.adapters.__path__):\n"
        "    importlib.import_module('convsim.adapters.' + m.name)"
    )
    assert "convsim._runtime._simulator" not in loaded
    above = [m for m in loaded if m.startswith(("convsim.metrics", "convsim.scenarios"))]
    assert not above and "convsim.lm_eval" not in loaded and "lm_eval" not in loaded


def test_each_package_root_costs_only_itself() -> None:
    for package in ("convsim", "convsim.adapters", "convsim.scenarios", "convsim.metrics"):
        loaded = _loaded_after(f"import {package}")
        ours = {m for m in loaded if m.startswith("convsim")}
        assert ours <= {"convsim", "convsim._lazy", "convsim._version", package}, ours


def test_convsim_help_imports_neither_lm_eval_nor_scikit_learn_nor_the_task_api() -> None:
    loaded = _loaded_after(
        "import sys, io, contextlib\nsys.argv = ['convsim', '--help']\n"
        "from convsim.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit:\n        pass"
    )
    for heavy in (
        "lm_eval",
        "sklearn",
        "numpy",
        "convsim.lm_eval._tasks",
        "convsim._runtime._simulator",
    ):
        assert heavy not in loaded, heavy


def test_from_convsim_import_simulator_leaves_numpy_unimported() -> None:
    # an application that embeds the runtime pays for numpy only when a scorer needs it
    loaded = _loaded_after("from convsim import Simulator\nassert Simulator")
    assert "convsim._runtime._simulator" in loaded
    for heavy in ("numpy", "sklearn", "lm_eval"):
        assert heavy not in loaded, heavy


def test_names_that_moved_up_stay_reachable_where_they_were() -> None:
    import convsim.adapters
    import convsim.lm_eval
    import convsim.scenarios

    assert convsim.scenarios.AdvancedTask is convsim.lm_eval.AdvancedTask
    assert convsim.scenarios.MultiTurnTask is convsim.lm_eval.MultiTurnTask
    assert convsim.scenarios.MetricsEngine is convsim.lm_eval.MetricsEngine
    assert convsim.scenarios.register_task is convsim.lm_eval.register_task
    assert convsim.adapters.register_lm_eval_model is convsim.lm_eval.register_lm_eval_model
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = convsim.scenarios.NoSuchThing
    # and a star import still gets every name the old __all__ listed
    names: dict[str, object] = {}
    exec("from convsim.scenarios import *", names)
    assert {"AdvancedTask", "MultiTurnTask", "MetricsEngine", "register_task"} <= set(names)
    assert "register_lm_eval_model" in convsim.adapters.__all__
