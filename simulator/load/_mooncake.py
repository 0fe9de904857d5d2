"""Mooncake-format traces: requests replayed at their times, with prompts that share
exactly the prefix blocks the trace declares.

Each JSON line is one request: ``timestamp`` (ms), ``input_length`` and
``output_length`` (tokens) and ``hash_ids``, one id per block of ``block_size`` tokens
(512 by default, as in the Mooncake paper) of the prompt, the last block holding the
rest. Two requests whose ``hash_ids`` start alike share that many blocks of prompt: the
prefix a server's cache can reuse.

A block's text is drawn from its id (and the run's seed): the same words wherever the
id appears, different words for another id, so requests sharing ids share exactly those
blocks of text, and differ after them. Words are counted in the server's tokens with the
calibrated tokens per word (:class:`~convsim.load.TokenText`), so a block of 512 tokens
is about 512 of the server's tokens. Requests arrive at their timestamps (counted from
the first); with ``--rate`` they arrive at that rate instead.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convsim._errors import ConfigError

from .._plural import counted
from ._arrivals import Schedule
from ._workloads import VOCABULARY_SIZE, SessionScript, TokenText, TurnScript, vocabulary_words

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MooncakeRequest",
    "MooncakeTrace",
    "MooncakeSessions",
    "is_mooncake",
    "read_mooncake",
]

DEFAULT_BLOCK_SIZE = 512
"""Tokens per hash id (the Mooncake paper's block)."""
_BLOCKS_KEPT = 4096
"""Block texts kept once drawn (a hot prefix is drawn once, not per request)."""


class MooncakeRequest(NamedTuple):
    """One line of the trace."""

    offset_s: float
    """Seconds after the trace's first request."""
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class _Line(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timestamp: Annotated[float, Field(strict=False, allow_inf_nan=False)]
    input_length: Annotated[int, Field(ge=1, strict=True)]
    output_length: Annotated[int, Field(ge=1, strict=True)]
    hash_ids: list[Annotated[int, Field(ge=0, strict=True)]] = Field(min_length=1)


@dataclass(frozen=True)
class MooncakeTrace:
    """The requests of a Mooncake trace, in time order."""

    path: str
    requests: tuple[MooncakeRequest, ...]
    block_size: int = DEFAULT_BLOCK_SIZE

    def schedule(self) -> Schedule:
        """When each request arrives (the schedule's token counts are the trace's)."""
        return Schedule(
            np.asarray([r.offset_s for r in self.requests], dtype=np.float64),
            tuple(r.input_length for r in self.requests),
            tuple(r.output_length for r in self.requests),
        )


def _first_record(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                text = line.strip()
                if text and not text.startswith("#"):
                    return text
    except (OSError, UnicodeDecodeError):
        return None  # read_trace says what is wrong with the file
    return None


def is_mooncake(path: str | Path) -> bool:
    """Whether the trace at ``path`` is in Mooncake's form: its first record is a JSON
    object with ``hash_ids``."""
    first = _first_record(Path(path))
    if first is None or not first.startswith("{"):
        return False
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "hash_ids" in record


def read_mooncake(path: str | Path, block_size: int = DEFAULT_BLOCK_SIZE) -> MooncakeTrace:
    """The requests of the Mooncake trace at ``path``.

    Raises:
        ConfigError: naming ``file:line`` and the field: a line that is not a request, a
            timestamp earlier than the one before, or ``hash_ids`` whose blocks of
            ``block_size`` tokens do not hold ``input_length``.
    """
    if block_size < 1:
        raise ConfigError(f"--block-size must be at least 1, got {block_size}")
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the trace: {exc}") from exc
    requests: list[MooncakeRequest] = []
    first: float | None = None
    last: float | None = None
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            line = _Line.model_validate_json(text)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"]) or "line"
            if err["type"] == "json_invalid":
                name = "line"
            raise ConfigError(f"{where}: {name}: {err['msg']}") from None
        if last is not None and line.timestamp < last:
            raise ConfigError(
                f"{where}: timestamp: {line.timestamp:g} is earlier than the line before "
                f"({last:g}); a trace must be in time order"
            )
        blocks = math.ceil(line.input_length / block_size)
        if blocks != len(line.hash_ids):
            raise ConfigError(
                f"{where}: hash_ids: {counted(len(line.hash_ids), 'block')}, but input_length "
                f"{line.input_length} takes {counted(blocks, 'block')} of "
                f"{counted(block_size, 'token')} (is --block-size the trace's?)"
            )
        first = line.timestamp if first is None else first
        last = line.timestamp
        requests.append(
            MooncakeRequest(
                (line.timestamp - first) / 1000.0,
                line.input_length,
                line.output_length,
                tuple(line.hash_ids),
            )
        )
    if not requests:
        raise ConfigError(f"{path}: the trace holds no requests")
    return MooncakeTrace(str(path), tuple(requests), block_size)


@dataclass(frozen=True)
class MooncakeSessions:
    """One single-turn session per request of a Mooncake trace, in order: its prompt
    built from its blocks, asking for exactly ``output_length`` tokens."""

    trace: MooncakeTrace
    text: TokenText = field(default_factory=TokenText)
    seed: int = 0
    exact_output: bool = True
    _blocks: dict[int, list[int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def size(self) -> int | None:
        return len(self.trace.requests)

    def block_words(self, hash_id: int) -> list[int]:
        """The words (vocabulary indices) of block ``hash_id``: drawn from the id and
        the seed alone."""
        words = self._blocks.get(hash_id)
        if words is None:
            rng = np.random.default_rng([self.seed, hash_id, 0xB10C5])
            count = max(1, self.text.words_for(self.trace.block_size))
            words = rng.integers(0, VOCABULARY_SIZE, count).tolist()
            while len(self._blocks) >= _BLOCKS_KEPT:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[hash_id] = words
        return words

    def prompt(self, request: MooncakeRequest) -> str:
        """The request's prompt: its blocks' words in order, the last block cut to the
        tokens left of ``input_length``."""
        size = self.trace.block_size
        words: list[int] = []
        for k, hash_id in enumerate(request.hash_ids):
            block = self.block_words(hash_id)
            tokens = min(size, request.input_length - k * size)
            words.extend(block if tokens == size else block[: max(1, self.text.words_for(tokens))])
        return vocabulary_words(words)

    def session(self, index: int) -> SessionScript:
        request = self.trace.requests[index]
        turn = TurnScript(
            user=self.prompt(request),
            max_tokens=request.output_length,
            exact_output=self.exact_output,
            input_tokens=request.input_length,
        )
        return SessionScript(f"r{index}", None, (turn,))
