"""The checker of the guide's copies (_guide_copies.py, run by hand against the guide),
on a small guide of its own; and every copy it checks is imported by a test here, so
none sits unused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from _guide_copies import COPIES, Block, code_blocks, compare, is_import, main

HERE = Path(__file__).parent
GUIDE = """\
# A guide

```
a diagram, not code
```

```python
# pkg/thing.py

from pkg.base import Base
import json

class Thing(Base):
    def size(self):
        return 1
```
"""
BLOCK = code_blocks(GUIDE)[1]


def test_code_blocks_are_read_with_their_language_and_first_line() -> None:
    blocks = code_blocks(GUIDE)
    assert [(b.language, b.line) for b in blocks] == [("", 4), ("python", 8)]
    assert blocks[1].lines[0] == "# pkg/thing.py" and blocks[1].lines[-1] == "        return 1"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("import json", True),
        ("from .base import Base", True),
        ("        from convsim.plugins import PluginManager", True),
        ("# import nothing", False),
        ("important = 1", False),
        ("x = 'from a import b'", False),
    ],
)
def test_an_import_line_is_told_from_other_lines(line: str, expected: bool) -> None:
    assert is_import(line) is expected


def test_changed_imports_are_the_only_difference_allowed() -> None:
    copy = list(BLOCK.lines)
    copy[2] = "from convsim import Base"
    differences = compare(BLOCK, copy)
    assert [(d.guide_line, d.imports_only) for d in differences] == [(10, True)]


def test_an_added_comment_or_a_changed_body_is_a_difference_beyond_imports() -> None:
    commented = ["# a note of the copy's own", *BLOCK.lines]
    reindented = [line.replace("return 1", "return 2") for line in BLOCK.lines]
    for copy in (commented, reindented):
        assert [d.imports_only for d in compare(BLOCK, copy)] == [False]
    assert compare(BLOCK, list(BLOCK.lines)) == []
    assert compare(Block("python", 1, ("x = 1  ",)), ["x = 1"])[0].imports_only is False


def test_main_passes_a_true_copy_and_fails_a_changed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(GUIDE)
    folder = tmp_path / "copies"
    folder.mkdir()
    for name in COPIES:
        (folder / name).write_text("\n".join(BLOCK.lines).replace("pkg.base", "convsim"))
    assert main([str(guide), "--folder", str(folder)]) == 0
    assert "imports only" in capsys.readouterr().out
    (folder / COPIES[0]).write_text("\n".join(BLOCK.lines).replace("return 1", "return 2"))
    assert main([str(guide), "--folder", str(folder)]) == 1
    assert "DIFFERS beyond imports" in capsys.readouterr().out
    (folder / COPIES[0]).unlink()
    assert main([str(guide), "--folder", str(folder)]) == 1
    assert f"{COPIES[0]}: MISSING" in capsys.readouterr().out


def test_every_copy_is_run_by_a_test_of_this_folder() -> None:
    """A copy is either a test module itself or imported by one."""
    imported: set[str] = set()
    for test in HERE.glob("test_*.py"):
        for node in ast.walk(ast.parse(test.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
    for name in COPIES:
        module = name.removesuffix(".py")
        assert module.startswith("test_") or module in imported, f"{name} is run by no test"
