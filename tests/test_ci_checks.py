"""The static checks of CI (.ci/checks.py): mypy and import-linter see the package tree.

The folders map to import names, so the checks link them into the tree they are
installed as; a message names the source file, not the link.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_checks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("convsim_ci_checks", ROOT / ".ci" / "checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checks = _load_checks()


def test_a_package_maps_to_the_folder_of_its_longest_mapped_prefix() -> None:
    layout = checks.Layout(
        packages=(),
        package_dir={"": ".", "convsim": "simulator", "convsim.adapters": "adapters"},
    )
    assert layout.folder("convsim") == Path("simulator")
    assert layout.folder("convsim._runtime") == Path("simulator/_runtime")
    assert layout.folder("convsim.adapters") == Path("adapters")
    assert layout.folder("convsim.adapters.mock") == Path("adapters/mock")
    assert layout.folder("elsewhere.sub") == Path("elsewhere/sub")


def test_the_tree_holds_the_modules_the_installed_package_has(tmp_path: Path) -> None:
    layout = checks.read_layout(ROOT / "pyproject.toml")
    sources = checks.assemble(layout, ROOT, tmp_path)
    assert sources["convsim/_records.py"] == "simulator/_records.py"
    assert sources["convsim/adapters/mock/__init__.py"] == "adapters/mock/__init__.py"
    assert sources["convsim/py.typed"] == "simulator/py.typed"
    linked = tmp_path / "convsim" / "adapters" / "_retry.py"
    assert linked.resolve() == ROOT / "adapters" / "_retry.py"
    in_tree = {path.removesuffix(".py").replace("/", ".") for path in sources}
    installed = set()
    for package in layout.packages:  # wherever this environment installed them
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations is not None
        installed.add(f"{package}.__init__")
        for module in pkgutil.iter_modules(list(spec.submodule_search_locations)):
            if not module.ispkg:
                installed.add(f"{package}.{module.name}")
    assert in_tree - {"convsim.py.typed"} == installed


def test_a_listed_package_without_a_folder_is_named(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("", encoding="utf-8")
    layout = checks.Layout(packages=("pkg", "pkg.gone"), package_dir={"": ".", "pkg": "core"})
    with pytest.raises(SystemExit, match=r"package 'pkg.gone' maps to core/gone/, which has no"):
        checks.assemble(layout, tmp_path, tmp_path / "tree")


def test_a_package_folder_missing_from_the_list_is_named(tmp_path: Path) -> None:
    for folder in ("core", "core/inner"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("", encoding="utf-8")
    layout = checks.Layout(packages=("pkg",), package_dir={"": ".", "pkg": "core"})
    with pytest.raises(SystemExit, match=r"core/inner/ is a package, .* does not list 'pkg.inner'"):
        checks.assemble(layout, tmp_path, tmp_path / "tree")


def test_tree_paths_that_start_a_line_become_source_paths() -> None:
    out = (
        "convsim/adapters/_retry.py:3: error: wrong  [assignment]\n"
        "convsim/_records.py:9: note: see convsim/adapters/_retry.py\n"
        "Found 1 error in 1 file (checked 2 source files)\n"
    )
    sources = {
        "convsim/adapters/_retry.py": "adapters/_retry.py",
        "convsim/_records.py": "simulator/_records.py",
    }
    assert checks.to_source_paths(out, sources) == (
        "adapters/_retry.py:3: error: wrong  [assignment]\n"
        "simulator/_records.py:9: note: see convsim/adapters/_retry.py\n"
        "Found 1 error in 1 file (checked 2 source files)\n"
    )


PROJECT = {
    "pyproject.toml": """
        [tool.setuptools]
        packages = ["pkg", "pkg.ext"]

        [tool.setuptools.package-dir]
        "pkg" = "core"
        "pkg.ext" = "ext"

        [tool.mypy]
        ignore_missing_imports = true

        [tool.importlinter]
        root_package = "pkg"

        [[tool.importlinter.contracts]]
        name = "ext above records"
        type = "layers"
        containers = ["pkg"]
        layers = ["ext", "_records"]
        """,
    "core/__init__.py": '"""The package."""\n',
    "core/_records.py": '"""Records."""\n\n\nclass Score:\n    """A score."""\n',
    "ext/__init__.py": '"""Above the records."""\n',
    "ext/_use.py": (
        '"""Uses a record."""\n\nfrom pkg._records import Score\n\n\n'
        "def keep(score: Score) -> Score:\n"
        '    """The score, kept."""\n'
        "    return score\n"
    ),
}


@pytest.mark.slow
def test_the_checks_pass_a_clean_project_and_name_the_source_of_each_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, text in PROJECT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    assert checks.main(tmp_path) == 0, capsys.readouterr().out
    capsys.readouterr()

    use = tmp_path / "ext" / "_use.py"
    use.write_text(
        use.read_text(encoding="utf-8") + '\n\nWRONG: Score = "not a score"\n', encoding="utf-8"
    )
    wrong_line = len(use.read_text(encoding="utf-8").splitlines())
    with (tmp_path / "core" / "_records.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef _later() -> None:\n    import pkg.ext._use  # noqa: F401\n")
    assert checks.main(tmp_path) == 1
    out = capsys.readouterr().out
    assert f"\next/_use.py:{wrong_line}: error: Incompatible types in assignment" in out
    assert "pkg._records is not allowed to import pkg.ext" in out
    table = {line[:14].strip(): line[14:].split()[0] for line in out.splitlines()[-4:]}
    assert table == {
        "ruff check": "ok",
        "ruff format": "ok",
        "mypy": "FAILED",
        "lint-imports": "FAILED",
    }, out
