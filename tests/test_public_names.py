"""Public names: each written once, reached lazily, named by the path users import.

A package lists its public names once, as imports under ``TYPE_CHECKING``; the lazy
root reads that block. Classes and functions handed out by a package carry their public
path as ``__module__`` (``convsim.Simulator.__module__ == "convsim"``), so that pickles,
reprs and tracebacks name what users import, and reading their annotations afterwards
(pydantic, ``typing.get_type_hints``) works exactly as before.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from convsim._lazy import public_names

PACKAGES = [
    "convsim",
    "convsim.adapters",
    "convsim.adapters.mock",
    "convsim.metrics",
    "convsim.scenarios",
    "convsim.results",
    "convsim.load",
    "convsim.service",
    "convsim.client",
    "convsim.plugins",
    "convsim.distributed",
    "convsim.lm_eval",
]


def _public(package: str) -> list[tuple[str, object]]:
    module = importlib.import_module(package)
    return [(name, getattr(module, name)) for name in module.__all__]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_listed_name_resolves_and_is_listed_by_dir(package: str) -> None:
    module = importlib.import_module(package)
    names = list(module.__all__)
    assert names and len(names) == len(set(names))
    assert [n for n in names if not n.isidentifier()] == []  # a star import gets names
    for name in names:
        assert getattr(module, name) is not None
        assert name in dir(module)


@pytest.mark.parametrize("package", PACKAGES)
def test_public_classes_and_functions_name_their_public_path(package: str) -> None:
    for name, value in _public(package):
        if not (isinstance(value, type) or inspect.isfunction(value)):
            continue
        if not value.__module__.startswith("convsim"):
            continue  # a name re-exported from another library
        assert not any(part.startswith("_") for part in value.__module__.split(".")), (
            f"{package}.{name} is {value.__module__}"
        )
        home = importlib.import_module(value.__module__)
        assert getattr(home, value.__qualname__) is value
        assert pickle.loads(pickle.dumps(value)) is value


def test_the_nearest_package_that_exports_a_name_is_its_home() -> None:
    import convsim
    import convsim.adapters
    import convsim.scenarios

    assert convsim.Simulator.__module__ == "convsim"
    assert convsim.Pack.__module__ == "convsim.scenarios"  # both export it
    assert convsim.scenarios.Pack is convsim.Pack
    assert convsim.adapters.Message.__module__ == "convsim.adapters"  # kernel, via adapters
    assert repr(convsim.SimulatorConfig) == "<class 'convsim.SimulatorConfig'>"


def test_published_values_pickle_by_their_public_path() -> None:
    import convsim
    from convsim.adapters.mock import MockServerConfig

    score = convsim.Score.not_applicable("nothing to measure")
    assert b"convsim\n" in pickle.dumps(score, protocol=0) or b"convsim" in pickle.dumps(score)
    assert pickle.loads(pickle.dumps(score)) == score
    config = MockServerConfig(ttft_ms="uniform:20,80", fault_rate=0.05)
    assert pickle.loads(pickle.dumps(config)) == config


def test_pydantic_models_still_build_and_rebuild_after_publishing() -> None:
    import convsim

    class Holder(BaseModel):
        score: convsim.Score
        config: convsim.SimulatorConfig

    config = convsim.SimulatorConfig(model="scripted")
    held = Holder(score=convsim.Score.not_applicable("n/a"), config=config)
    assert Holder.model_validate(held.model_dump()).config == config
    # a forced rebuild reads the annotations again: they no longer depend on __module__
    convsim.SimulatorConfig.model_rebuild(force=True)
    convsim.Score.model_rebuild(force=True)
    assert convsim.SimulatorConfig(model="scripted") == config


def test_annotations_read_the_same_before_and_after_publishing() -> None:
    # in a fresh interpreter: read every public class's annotations from its private
    # module, then hand it out through its package, then read them again
    probe = textwrap.dedent(
        f"""
        import importlib, inspect, json, typing
        from pathlib import Path
        from convsim._lazy import public_names

        def hints(cls):
            try:
                return sorted(typing.get_type_hints(cls))
            except Exception as exc:
                return type(exc).__name__

        before, classes = {{}}, []
        for package in {PACKAGES!r}:
            module = importlib.import_module(package)
            for entry in public_names(Path(module.__file__).read_text()):
                if entry.module.startswith("."):
                    source = importlib.import_module(entry.module, package)
                else:
                    source = importlib.import_module(entry.module)
                value = getattr(source, entry.attribute)
                if inspect.isclass(value):
                    before[package + "." + entry.name] = hints(value)
                    classes.append((package, entry.name))
        after = {{}}
        for package, name in classes:
            value = getattr(importlib.import_module(package), name)
            after[package + "." + name] = hints(value)
        print(json.dumps([before, after]))
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(before) > 100
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed


def test_public_names_reads_only_the_type_checking_block(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from ._other import NotPublic

        if TYPE_CHECKING:
            from ._a import Alpha as Alpha
            from ._b import beta as gamma
            from convsim._types import Message as Message
        """
    )
    entries = public_names(source)
    assert [(e.name, e.module, e.attribute) for e in entries] == [
        ("Alpha", "._a", "Alpha"),
        ("gamma", "._b", "beta"),
        ("Message", "convsim._types", "Message"),
    ]
