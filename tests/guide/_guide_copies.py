"""Checks that the files of tests/guide are the developer guide's code blocks with only
their import lines changed.

The guide is not part of the repository, so this runs by hand, given the guide's path::

    python tests/guide/_guide_copies.py path/to/developer-guide.md

A copy is matched to its block by the block's first line (the guide heads each block with
a comment naming its file, and a copy keeps it); the files ``COPIES`` lists are checked.
Each difference is listed with the guide's line numbers and classed as an import change
(allowed) or not. The exit code is 1 when a copy differs beyond its imports or is missing.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "COPIES",
    "Block",
    "Difference",
    "code_blocks",
    "compare",
    "is_import",
    "main",
]

HERE = Path(__file__).parent
COPIES = (
    "custom_model_adapter.py",
    "concrete_model_adapters.py",
    "custom_metrics.py",
    "metrics_engine.py",
    "base_plugin.py",
    "code_analysis_plugin.py",
    "plugin_manager.py",
    "test_integration.py",
)
"""The copies this part of the guide has (its task blocks are checked with their own)."""

_FENCE = re.compile(r"^```(\w*)\s*$")
_IMPORT = re.compile(r"^\s*(?:from\s+\S+\s+)?import\s+\S")


@dataclass(frozen=True)
class Block:
    """One fenced code block of the guide: its language, first line number, and lines."""

    language: str
    line: int
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Difference:
    """One run of differing lines between a block and its copy."""

    guide_line: int
    """The guide's line number where the run starts."""
    guide: tuple[str, ...]
    copy: tuple[str, ...]

    @property
    def imports_only(self) -> bool:
        """Whether every line on either side is an import (or blank)."""
        return all(is_import(line) or not line.strip() for line in (*self.guide, *self.copy))


def is_import(line: str) -> bool:
    """Whether ``line`` is a one-line ``import`` or ``from ... import`` statement."""
    return _IMPORT.match(line) is not None


def code_blocks(markdown: str) -> list[Block]:
    """The fenced code blocks of ``markdown``, in order."""
    blocks: list[Block] = []
    language: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(markdown.splitlines(), 1):
        fence = _FENCE.match(line)
        if language is None and fence is not None:
            language, start, body = fence.group(1), number + 1, []
        elif language is not None and line.rstrip() == "```":
            blocks.append(Block(language, start, tuple(body)))
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def compare(block: Block, copy: Sequence[str]) -> list[Difference]:
    """Every run of lines where ``copy`` differs from ``block`` (exactly, whitespace too)."""
    matcher = difflib.SequenceMatcher(a=block.lines, b=list(copy), autojunk=False)
    return [
        Difference(block.line + i1, block.lines[i1:i2], tuple(copy[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def _match(blocks: Sequence[Block], copy: Sequence[str]) -> Block | None:
    """The block whose first line (the guide's file-naming comment) the copy has."""
    for block in blocks:
        if block.lines and block.lines[0].startswith("#") and block.lines[0] in copy:
            return block
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("guide", type=Path, help="the developer guide (markdown)")
    parser.add_argument("--folder", type=Path, default=HERE, help="where the copies are")
    args = parser.parse_args(argv)
    blocks = code_blocks(args.guide.read_text(encoding="utf-8"))
    failed = False
    for name in COPIES:
        path = args.folder / name
        if not path.exists():
            print(f"{name}: MISSING")
            failed = True
            continue
        copy = path.read_text(encoding="utf-8").splitlines()
        block = _match(blocks, copy)
        if block is None:
            print(f"{name}: no guide block has its first line")
            failed = True
            continue
        differences = compare(block, copy)
        beyond = [d for d in differences if not d.imports_only]
        verdict = "identical" if not differences else "imports only"
        if beyond:
            verdict, failed = "DIFFERS beyond imports", True
        print(f"{name}: guide lines {block.line}-{block.line + len(block.lines) - 1}: {verdict}")
        for d in differences:
            kind = "import" if d.imports_only else "OTHER"
            print(f"  [{kind}] guide line {d.guide_line}")
            for line in d.guide:
                print(f"    - {line}")
            for line in d.copy:
                print(f"    + {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
