#!/usr/bin/env python3
"""The static checks of CI: ruff, ruff format, mypy and import-linter.

The source folders map to import names (pyproject's ``package-dir``: ``simulator/`` is
``convsim``, ``adapters/`` is ``convsim.adapters``, ...). Checked folder by folder, mypy
would see each module twice, once per name (``simulator._records.Score`` is not
``convsim._records.Score``), and import-linter would not find the subpackages. So both
run on the package tree the folders assemble into, built from pyproject's ``packages``
and ``package-dir`` as a temporary tree of symlinks, and mypy's paths are given back as
the source paths.

Run it from the project's virtual environment (``pip install -e '.[dev]'``)::

    python .ci/checks.py

Every check runs; the exit code is 1 when any failed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with tomli (a dependency of mypy)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TREE_FILES = ("*.py", "*.pyi", "py.typed")


@dataclass(frozen=True)
class Layout:
    """Which packages the distribution ships and the folder each import name comes from."""

    packages: tuple[str, ...]
    package_dir: Mapping[str, str]

    def folder(self, package: str) -> Path:
        """The source folder of ``package``, relative to the project root."""
        parts = package.split(".")
        for cut in range(len(parts), -1, -1):
            base = ".".join(parts[:cut])
            if base in self.package_dir:
                return Path(self.package_dir[base], *parts[cut:])
        raise AssertionError("unreachable: the empty prefix always matches")


@dataclass(frozen=True)
class Step:
    """One finished check: its name, whether it passed and how long it took."""

    name: str
    ok: bool
    seconds: float


def read_layout(pyproject: Path) -> Layout:
    """The package layout declared in ``[tool.setuptools]`` of ``pyproject``."""
    setuptools = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]
    return Layout(
        packages=tuple(setuptools["packages"]),
        package_dir={"": ".", **setuptools.get("package-dir", {})},
    )


def assemble(layout: Layout, root: Path, tree: Path) -> dict[str, str]:
    """Link each package's modules into ``tree`` under their import path.

    Returns:
        Each linked file's path in ``tree`` mapped to its path in ``root`` (both
        relative, with ``/``), to name the source in messages.

    Raises:
        SystemExit: a listed package has no folder or no ``__init__.py``, or a package
            folder inside a listed one is not listed (it would not be installed).
    """
    sources: dict[str, str] = {}
    for package in layout.packages:
        folder = layout.folder(package)
        if not (root / folder / "__init__.py").is_file():
            raise SystemExit(
                f"pyproject.toml: package {package!r} maps to {folder.as_posix()}/, "
                "which has no __init__.py"
            )
        for inner in sorted((root / folder).glob("*/__init__.py")):
            name = f"{package}.{inner.parent.name}"
            if name not in layout.packages:
                raise SystemExit(
                    f"pyproject.toml: {(folder / inner.parent.name).as_posix()}/ is a package, "
                    f"but [tool.setuptools] packages does not list {name!r}"
                )
        target = tree.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for pattern in TREE_FILES:
            for source in sorted((root / folder).glob(pattern)):
                (target / source.name).symlink_to(source)
                linked = (target / source.name).relative_to(tree).as_posix()
                sources[linked] = (folder / source.name).as_posix()
    return sources


_PATH_AT_LINE_START = re.compile(r"^(?P<path>[^\s:]+\.pyi?)(?=:)", re.MULTILINE)


def to_source_paths(output: str, sources: Mapping[str, str]) -> str:
    """``output`` with each line-leading path of the tree replaced by its source path."""
    return _PATH_AT_LINE_START.sub(lambda m: sources.get(m["path"], m["path"]), output)


def tool(name: str) -> str:
    """The executable ``name`` of this interpreter's environment (else on PATH)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: pip install -e '.[dev]'")
    return found


def run(
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    rewrite: Callable[[str], str] = str,
) -> Step:
    """Run one check, print what it said (through ``rewrite``) and time it."""
    print(f"== {name}: {' '.join(argv)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    said = rewrite(done.stdout + done.stderr).rstrip()
    if said:
        print(said, flush=True)
    return Step(name, done.returncode == 0, seconds)


def main(root: Path = ROOT) -> int:
    """Run every check on the project at ``root``; 0 when all are clean, else 1."""
    pyproject = root / "pyproject.toml"
    layout = read_layout(pyproject)
    steps = [
        run("ruff check", [tool("ruff"), "check", "."], cwd=root),
        run("ruff format", [tool("ruff"), "format", "--check", "."], cwd=root),
    ]
    with tempfile.TemporaryDirectory(prefix="convsim-tree-") as scratch:
        tree = Path(scratch)
        sources = assemble(layout, root, tree)
        packages = [arg for name in layout.packages if "." not in name for arg in ("-p", name)]
        steps.append(
            run(
                "mypy",
                [
                    tool("mypy"),
                    "--config-file",
                    str(pyproject),
                    "--cache-dir",
                    str(root / ".mypy_cache"),
                    *packages,
                ],
                cwd=tree,
                rewrite=lambda out: to_source_paths(out, sources),
            )
        )
        steps.append(
            run(
                "lint-imports",
                [tool("lint-imports"), str(pyproject), "--no-cache", "--no-logo"],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
            )
        )
    print()
    for step in steps:
        print(f"{step.name:<14} {'ok' if step.ok else 'FAILED':<7} {step.seconds:6.1f} s")
    return 0 if all(step.ok for step in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
