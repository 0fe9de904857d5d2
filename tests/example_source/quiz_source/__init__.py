"""A third-party pack source: quizzes in a text format of their own, run as ``quiz:FILE``.

The package registers itself in its distribution's entry points (see the dist-info
folder beside it)::

    [convsim.pack_sources]
    quiz = quiz_source:quiz_pack

so ``convsim run quiz:capitals.quiz`` finds it by the prefix ``quiz:``; in one process,
``PACK_SOURCES.register_prefix("quiz:", "quiz_source:quiz_pack")`` does the same.

A quiz file holds blocks of ``Q:`` (the question), ``A:`` (the answer), optionally
``K:`` (required keywords, ``;``-separated) and ``D:`` (difficulty), separated by blank
lines; ``#`` lines are comments, and the first comment describes the quiz::

    # Capitals of Europe
    Q: What is the capital of France?
    A: Paris
    K: Paris
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from convsim import ConfigError, PackError, PackProblem
from convsim.scenarios import LoadOptions, Pack, problems_pack

__all__ = ["quiz_pack"]

PREFIX = "quiz:"
_FIELDS = {"Q": "question", "A": "expected_answer", "K": "required_keywords", "D": "difficulty"}


class QuizProblem(NamedTuple):
    """A block of the quiz: the line it starts on and its problem fields."""

    line: int
    fields: dict[str, Any]


def quiz_pack(spec: str, options: LoadOptions) -> Pack:
    """The pack ``quiz:FILE``: one single-turn problem per block of FILE."""
    if options.num_fewshot or options.include_path is not None:
        raise ConfigError("quiz: packs take neither --num-fewshot nor include_path")
    path = Path(spec.removeprefix(PREFIX)).expanduser()
    if not path.is_file():
        raise ConfigError(f"{spec}: no quiz file {path}")
    if path.stat().st_size > options.max_file_bytes:
        raise ConfigError(f"{path}: larger than --max-file-size")
    text = path.read_text(encoding="utf-8")
    description = next(
        (line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")), ""
    )
    config = {
        "task_name": re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem) or "quiz",
        "description": description,
        "metrics": {"primary": ["exact_match"]},
        "prompt_templates": {"default": "Answer in a few words.\nQuestion: {question}\nAnswer:"},
    }
    problems = [(p.line, p.fields) for p in _blocks(path.name, text)]
    return problems_pack(
        spec, config, problems, source=path.name, options=options, path=path.parent
    )


def _blocks(name: str, text: str) -> Iterator[QuizProblem]:
    """The quiz's blocks; a line that is no ``X: value`` of a known X is an error with
    its line."""
    block: QuizProblem | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            if block is not None:
                yield block
            block = None
            continue
        key, sep, value = line.partition(":")
        if not sep or key.strip() not in _FIELDS:
            raise PackError(
                [PackProblem(name, number, None, f"expected Q:, A:, K: or D:, not {line!r}")]
            )
        field = _FIELDS[key.strip()]
        if block is None:
            block = QuizProblem(number, {})
        if field == "required_keywords":
            block.fields[field] = [k.strip() for k in value.split(";") if k.strip()]
        else:
            block.fields[field] = value.strip()
    if block is not None:
        yield block
