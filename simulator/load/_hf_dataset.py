"""Load-test sessions from a dataset of the ``datasets`` library: ``--dataset
hf:NAME[:SPLIT] --columns prompt=COL,output_len=COL``.

``NAME`` is a dataset on the Hugging Face hub (or in the local cache), a folder written
by ``Dataset.save_to_disk``, or a folder or file of data ``load_dataset`` reads; the
split defaults to ``train``. ``--columns`` maps convsim's fields to the dataset's
columns: ``prompt`` (the user message: one turn per row), ``output_len`` (tokens to
ask for), ``system`` (a system prompt), or instead of ``prompt``, ``conversations`` (a
column of ShareGPT or OpenAI messages: every user turn of the row). Without
``--columns``, a column named ``prompt``, ``conversations`` or ``messages`` is used.

``datasets`` honours ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``: with either set only
the local cache is read, and a dataset not in it is an error saying so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from convsim._errors import ConfigError
from convsim._extras import needs_extra

from ._workloads import _ShareGPTConversation, _turns_of

__all__ = ["HF_PREFIX", "DEFAULT_SPLIT", "Columns", "parse_columns", "read_hf_dataset"]

HF_PREFIX = "hf:"
DEFAULT_SPLIT = "train"
_FIELDS = ("prompt", "output_len", "system", "conversations")
_GUESSED = ("prompt", "conversations", "messages")


class Columns(NamedTuple):
    """convsim's fields and the dataset's column holding each (None: not used)."""

    prompt: str | None = None
    output_len: str | None = None
    system: str | None = None
    conversations: str | None = None


class _Source(NamedTuple):
    name: str
    split: str


def _source(spec: str) -> _Source:
    rest = spec[len(HF_PREFIX) :].strip()
    name, sep, split = rest.rpartition(":")
    if not sep:
        name, split = rest, DEFAULT_SPLIT
    if not name or not split:
        raise ConfigError(f"--dataset {spec!r}: expected hf:NAME or hf:NAME:SPLIT")
    return _Source(name, split)


def parse_columns(text: str) -> Columns:
    """``prompt=COL,output_len=COL`` as :class:`Columns`.

    Raises:
        ConfigError: a pair that is not ``FIELD=COLUMN``, an unknown or repeated field,
            or both ``prompt`` and ``conversations``.
    """
    fields: dict[str, str] = {}
    for pair in text.split(","):
        key, sep, column = (p.strip() for p in pair.partition("="))
        if not sep or not key or not column:
            raise ConfigError(f"invalid --columns {pair.strip()!r}: expected FIELD=COLUMN")
        if key not in _FIELDS:
            raise ConfigError(
                f"invalid --columns {pair.strip()!r}: unknown field {key!r}; fields: "
                f"{', '.join(_FIELDS)}"
            )
        if key in fields:
            raise ConfigError(f"invalid --columns {text!r}: {key} given twice")
        fields[key] = column
    if "prompt" in fields and "conversations" in fields:
        raise ConfigError(
            f"invalid --columns {text!r}: give prompt (one turn a row) or conversations "
            "(every turn of a row), not both"
        )
    return Columns(**fields)


def _offline() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in {"1", "on", "yes", "true"}
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


@contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """``datasets`` without its progress bars on stderr, as it was afterwards."""
    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def _load(spec: str, source: _Source) -> Any:
    with needs_extra("datasets", "--dataset hf:NAME"):
        import datasets
    folder = Path(source.name)
    saved = folder.is_dir() and any(
        (folder / f).exists() for f in ("dataset_dict.json", "state.json")
    )
    with _quiet(datasets):
        try:
            if not saved:
                return datasets.load_dataset(source.name, split=source.split)
            loaded = datasets.load_from_disk(str(folder))
        except Exception as exc:  # datasets raises many kinds: each a dataset that cannot load
            offline = (
                " (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set: only the local cache is read, "
                "and it does not hold this dataset)"
                if _offline()
                else ""
            )
            raise ConfigError(
                f"--dataset {spec}: cannot load {source.name!r}, split {source.split!r}: "
                f"{type(exc).__name__}: {exc}{offline}"
            ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if source.split not in loaded:
            raise ConfigError(
                f"--dataset {spec}: no split {source.split!r} in {source.name} (splits: "
                f"{', '.join(loaded)})"
            )
        loaded = loaded[source.split]
    return loaded


def _columns_for(spec: str, given: Columns | None, present: list[str]) -> Columns:
    """The columns to read: those given, each checked to exist, or a guess by name."""
    where = f"--dataset {spec}"
    if given is None:
        found = next((c for c in _GUESSED if c in present), None)
        if found is None:
            raise ConfigError(
                f"{where}: no column named prompt, conversations or messages; name the "
                f"columns with --columns prompt=COLUMN[,output_len=COLUMN] (its columns: "
                f"{', '.join(present)})"
            )
        return Columns(prompt=found) if found == "prompt" else Columns(conversations=found)
    for field, column in given._asdict().items():
        if column is not None and column not in present:
            raise ConfigError(
                f"--columns {field}={column}: no column {column!r} in {spec} (its columns: "
                f"{', '.join(present)})"
            )
    if given.prompt is None and given.conversations is None:
        raise ConfigError(
            "--columns: name the column of the user message (prompt=COLUMN) or of the "
            "messages (conversations=COLUMN)"
        )
    if given.conversations is not None and given.output_len is not None:
        raise ConfigError(
            "--columns: output_len goes with prompt; with conversations each turn asks for "
            "its recorded reply's length"
        )
    return given


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected text, got {value!r:.60}")
    return value


def _length(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ConfigError(f"{where}: expected a whole number of tokens, got {value!r:.60}")
    if value < 1:
        raise ConfigError(f"{where}: expected at least 1 token, got {value}")
    return int(value)


def read_hf_dataset(spec: str, columns: str | None) -> list[_ShareGPTConversation]:
    """The conversations of ``hf:NAME[:SPLIT]``, read through the columns ``columns``
    names (see the module docstring).

    Raises:
        MissingExtra: the ``datasets`` extra is not installed.
        ConfigError: the dataset cannot be loaded (offline and not cached, say), lacks
            the split or a column named, or a row's value is not what its field takes
            (naming the row and column).
    """
    source = _source(spec)
    given = parse_columns(columns) if columns is not None else None
    loaded = _load(spec, source)
    present = list(loaded.column_names)
    chosen = _columns_for(spec, given, present)
    used = [c for c in chosen if c is not None]
    data = loaded.select_columns(list(dict.fromkeys(used))).to_dict()
    rows = len(loaded)
    label = f"{source.name}:{source.split}"
    conversations: list[_ShareGPTConversation] = []
    for i in range(rows):
        where = f"{label} row {i}"
        system = None
        if chosen.system is not None and data[chosen.system][i] is not None:
            system = _text(data[chosen.system][i], f"{where}, column {chosen.system!r}")
        if chosen.conversations is not None:
            item = {"id": f"{label}#{i}", "conversations": data[chosen.conversations][i]}
            conv = _turns_of(item, f"{where}, column {chosen.conversations!r}")
            if conv is None:
                continue
            if system is not None:
                conv = _ShareGPTConversation(
                    conv.conversation_id, system, conv.users, conv.reply_words,
                    conv.tools, conv.tool_results,
                )  # fmt: skip
            conversations.append(conv)
            continue
        assert chosen.prompt is not None
        prompt = _text(data[chosen.prompt][i], f"{where}, column {chosen.prompt!r}")
        tokens: tuple[int | None, ...] = ()
        if chosen.output_len is not None:
            tokens = (
                _length(data[chosen.output_len][i], f"{where}, column {chosen.output_len!r}"),
            )
        conversations.append(
            _ShareGPTConversation(f"{label}#{i}", system, (prompt,), (None,), reply_tokens=tokens)
        )
    if not conversations:
        raise ConfigError(f"--dataset {spec}: the dataset holds no row with a user message")
    return conversations
