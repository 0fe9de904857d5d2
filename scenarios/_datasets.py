"""Reading a single-turn pack's problems from a dataset that is not JSONL: a CSV file, a
Parquet file, or a dataset of the ``datasets`` library (config.yml ``dataset.format``).

Each reader yields the rows as problem-field dicts, numbered from 1 (a CSV row by the line
it starts on, a Parquet or ``datasets`` row by its position), or the problem that keeps a
row from having one. A dataset's column names go through ``dataset.columns`` (problem
field -> column) first; a column that is no problem field is refused once, before any row.

CSV cells are text; the list fields (``required_keywords``, ``tags``) take a JSON list
(``["a", "b"]``) or ``;``-separated items (``a; b``), ``metadata`` takes a JSON object,
and an empty cell leaves its field out. A CSV row is bounded as a JSONL line is
(``max_line_bytes``, counting every line of a row whose quoted cells span lines).

Parquet and ``datasets`` need the ``datasets`` extra (pyarrow, datasets); without it the
loader says so. ``datasets`` honours ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``: with
either set, only the local cache and local folders are read.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from convsim._extras import needs_extra
from convsim._plural import counted

from ._files import FileProblem, check_value, format_size, parse_json_value
from ._schema import HF_DEFAULT_SPLIT, DatasetConfig

__all__ = [
    "DEFAULT_SAMPLE_SEED",
    "EXTRA",
    "LIST_FIELDS",
    "DatasetRow",
    "HfDataset",
    "Sample",
    "read_csv",
    "read_parquet",
    "open_hf",
    "sample",
]

EXTRA = "datasets"
"""The extra that reads Parquet files and ``datasets`` datasets."""
LIST_FIELDS = frozenset({"required_keywords", "tags"})
"""The problem fields a CSV cell gives as a JSON list or ``;``-separated items."""
_JSON_FIELDS = frozenset({"metadata"})
DEFAULT_SAMPLE_SEED = 0
"""The seed ``dataset.size`` samples with when none is given: ``convsim run``'s default
``--seed``, so a run and ``convsim validate`` pick the same problems."""
_BATCH_ROWS = 1024


class DatasetRow(NamedTuple):
    """A row of a dataset: its number (1-based; a CSV row's first line) and its problem
    fields, or the problem that keeps it from having them (``value`` is then None)."""

    number: int
    value: dict[str, Any] | None
    problem: FileProblem | None


def _renamer(
    columns: Iterable[str], mapping: Mapping[str, str], fields: Collection[str]
) -> dict[str, str]:
    """Column -> problem field, for the dataset's ``columns``.

    Raises:
        FileProblem: a mapped column the data lacks, a column that is no problem field,
            or two columns for one field; ``field`` names the column.
    """
    present = list(columns)
    by_column = {column: field for field, column in mapping.items()}
    for field, column in mapping.items():
        if column not in present:
            raise FileProblem(
                f"no column {column!r} for dataset.columns.{field} (columns: {', '.join(present)})",
                field=field,
            )
    renamed: dict[str, str] = {}
    for column in present:
        field = by_column.get(column, column)
        if field not in fields:
            raise FileProblem(
                f"unknown column (problem fields: {', '.join(sorted(fields))}; "
                "dataset.columns maps other names)",
                field=column,
            )
        if field in renamed.values():
            raise FileProblem("two columns give this field", field=field)
        renamed[column] = field
    return renamed


# -- CSV ------------------------------------------------------------------------------


class _CsvLines:
    """The lines of a CSV file as text, each at most ``max_line_bytes`` (a row: all of
    its lines together), decoded from UTF-8 (a leading BOM dropped)."""

    def __init__(
        self,
        fh: BinaryIO,
        max_bytes: int,
        max_line_bytes: int,
        on_bytes: Callable[[bytes], object] | None,
    ) -> None:
        self.fh, self.max_bytes, self.max_line_bytes = fh, max_bytes, max_line_bytes
        self.on_bytes = on_bytes
        self.number = 0
        self.offset = 0
        self.row_bytes = 0
        self.row_start = 1

    def start_row(self) -> None:
        self.row_bytes = 0
        self.row_start = self.number + 1

    def __iter__(self) -> Iterator[str]:
        while data := self.fh.readline(self.max_line_bytes + 1):
            self.number += 1
            self.offset += len(data)
            self.row_bytes += len(data) - data.endswith(b"\n")
            if self.on_bytes is not None:
                self.on_bytes(data)
            if self.offset > self.max_bytes:  # the file grew since it was checked
                raise FileProblem(f"{format_size(self.offset)}, over the file limit")
            if self.row_bytes > self.max_line_bytes:
                raise FileProblem(
                    f"a row of more than {format_size(self.max_line_bytes)}, over the limit "
                    "per line (raise it with --max-line-size or max_line_bytes=); not read",
                    self.row_start,
                )
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FileProblem(f"not UTF-8 text ({exc.reason})", self.number) from None
            yield text.removeprefix("\ufeff") if self.number == 1 else text


def _csv_cell(field: str, cell: str) -> Any:
    """A CSV cell as the value of problem field ``field``."""
    if field in _JSON_FIELDS:
        return parse_json_value(cell)
    if field in LIST_FIELDS:
        if cell.lstrip().startswith("["):
            return parse_json_value(cell)
        return [item.strip() for item in cell.split(";") if item.strip()]
    return cell


def read_csv(
    fh: BinaryIO,
    *,
    fields: Collection[str],
    columns: Mapping[str, str],
    max_bytes: int,
    max_line_bytes: int,
    on_bytes: Callable[[bytes], object] | None = None,
) -> Iterator[DatasetRow]:
    """The rows of a CSV file open in binary, after its header row of column names.

    Raises:
        FileProblem: the header is missing or names an unknown column, a row is too
            long or not UTF-8, or the CSV cannot be parsed; with its line (the lines
            after it are not read).
    """
    lines = _CsvLines(fh, max_bytes, max_line_bytes, on_bytes)
    reader = csv.reader(lines, strict=True)
    header: list[str] | None = None
    renamed: dict[str, str] = {}
    while True:
        lines.start_row()
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise FileProblem(f"not valid CSV: {exc}", lines.row_start) from None
        if not cells or cells == [""]:
            continue  # a blank line
        if header is None:
            header = [c.strip() for c in cells]
            try:
                renamed = _renamer(header, columns, fields)
            except FileProblem as exc:
                exc.line = lines.row_start
                raise
            continue
        if len(cells) > len(header):
            yield DatasetRow(
                lines.row_start,
                None,
                FileProblem(f"{len(cells)} cells, but the header names {len(header)} columns"),
            )
            continue
        row: dict[str, Any] = {}
        problem = None
        for column, cell in zip(header, cells, strict=False):  # short rows: empty cells
            if cell == "":
                continue
            field = renamed[column]
            try:
                row[field] = _csv_cell(field, cell)
            except FileProblem as exc:
                problem = FileProblem(exc.message, field=field)
                break
        yield DatasetRow(lines.row_start, None if problem else row, problem)
    if header is None:
        raise FileProblem("no header row: the first row names the columns (question, ...)")


# -- Parquet and datasets --------------------------------------------------------------


def _table_rows(
    batches: Iterable[list[dict[str, Any]]], renamed: Mapping[str, str]
) -> Iterator[DatasetRow]:
    """Rows of typed data (Parquet, ``datasets``): nulls leave their field out, and a
    ``metadata`` given as JSON text is parsed."""
    number = 0
    for batch in batches:
        for raw in batch:
            number += 1
            row = {renamed[k]: v for k, v in raw.items() if v is not None}
            try:
                for name in _JSON_FIELDS & row.keys():
                    if isinstance(row[name], str):
                        try:
                            row[name] = parse_json_value(row[name])
                        except FileProblem as exc:
                            exc.field = name
                            raise
                check_value(row)
            except FileProblem as exc:
                yield DatasetRow(number, None, FileProblem(exc.message, field=exc.field))
                continue
            yield DatasetRow(number, row, None)


def read_parquet(
    data: bytes, *, fields: Collection[str], columns: Mapping[str, str]
) -> Iterator[DatasetRow]:
    """The rows of a Parquet file held in ``data``, a batch at a time.

    Raises:
        MissingExtra: pyarrow is not installed.
        FileProblem: not a Parquet file, or a column that is no problem field.
    """
    with needs_extra(EXTRA, "dataset.format parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise FileProblem(f"not a Parquet file: {exc}") from None
    renamed = _renamer(parquet.schema_arrow.names, columns, fields)
    try:
        batches = (b.to_pylist() for b in parquet.iter_batches(batch_size=_BATCH_ROWS))
        yield from _table_rows(batches, renamed)
    except (pa.ArrowException, OSError) as exc:
        raise FileProblem(f"cannot read the Parquet data: {exc}") from None


@dataclass(frozen=True)
class HfDataset:
    """A ``datasets`` dataset opened for reading: its rows and where they came from."""

    label: str
    """How problems name it: ``NAME:SPLIT``."""
    source: dict[str, Any]
    """What the results manifest records: format, name, config, split, revision and the
    dataset's fingerprint, where known."""
    rows: Iterator[DatasetRow]


def _offline() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in {"1", "on", "yes", "true"}
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
"""A dataset on the hub: ``name`` or ``owner/name``."""


def _check_hub_name(name: str) -> None:
    """Refuse a ``dataset.name`` that is not a folder of the pack and would be read from
    elsewhere on this machine: ``load_dataset`` reads any local path it finds (absolute,
    or relative to the working directory) before it asks the hub, so the same pack would
    read other data depending on where it runs.

    Raises:
        FileProblem: naming the setting.
    """
    if not _HUB_NAME.fullmatch(name) or os.path.exists(name):
        raise FileProblem(
            f"{name!r} is not a folder inside the pack, nor a dataset name of the hub "
            "(owner/name); a pack reads only its own folder or the hub",
            field="name",
        )


@contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """``datasets`` without its progress bars on stderr (under ``--log-format json``
    every line of a run's stderr is an event), as it was afterwards."""
    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def open_hf(
    dataset: DatasetConfig,
    root: Path,
    *,
    fields: Collection[str],
    on_row: Callable[[bytes], object],
) -> HfDataset:
    """The dataset ``dataset.name`` names: a folder inside the pack (written by
    ``save_to_disk``, or data files ``load_dataset`` reads), else a dataset on the hub
    (or in the local cache), read through ``datasets``. ``on_row`` sees each row as
    canonical JSON (the pack's hash covers the data).

    Raises:
        MissingExtra: ``datasets`` is not installed.
        FileProblem: the dataset cannot be loaded (with ``field`` naming the setting),
            lacks the split, or has a column that is no problem field.
    """
    with needs_extra(EXTRA, "dataset.format hf"):
        import datasets
    name = dataset.name or ""
    split = dataset.split or HF_DEFAULT_SPLIT
    folder = Path(os.path.realpath(root / name))
    local = folder.is_dir() and folder.is_relative_to(os.path.realpath(root))
    if not local:
        _check_hub_name(name)
    with _quiet(datasets):  # its progress bars would write on the run's stderr
        try:
            if local and any((folder / f).exists() for f in ("dataset_dict.json", "state.json")):
                loaded = datasets.load_from_disk(str(folder))
                if isinstance(loaded, datasets.DatasetDict):
                    if split not in loaded:
                        raise FileProblem(
                            f"no split {split!r} in {name} (splits: {', '.join(loaded)})",
                            field="split",
                        )
                    loaded = loaded[split]
            else:
                loaded = datasets.load_dataset(
                    str(folder) if local else name,
                    dataset.config,
                    split=split,
                    revision=dataset.revision,
                )
        except FileProblem:
            raise
        except Exception as exc:  # datasets raises many kinds; each is a dataset that cannot load
            offline = (
                " (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set: only the local cache is read)"
                if _offline()
                else ""
            )
            raise FileProblem(
                f"cannot load dataset {name!r}, split {split!r}: "
                f"{type(exc).__name__}: {exc}{offline}",
                field="name",
            ) from None
    renamed = _renamer(loaded.column_names, dataset.columns, fields)
    source = {
        "format": "hf",
        "name": name,
        "config": dataset.config,
        "split": split,
        "revision": dataset.revision,
        "fingerprint": getattr(loaded, "_fingerprint", None),
    }

    def batches() -> Iterator[list[dict[str, Any]]]:
        for start in range(0, len(loaded), _BATCH_ROWS):
            batch = loaded[start : start + _BATCH_ROWS]
            rows = [dict(zip(batch, v, strict=True)) for v in zip(*batch.values(), strict=True)]
            for row in rows:
                on_row(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
            yield rows

    return HfDataset(f"{name}:{split}", source, _table_rows(batches(), renamed))


# -- dataset.size ---------------------------------------------------------------------


class Sample(NamedTuple):
    """The positions of the problems a run uses, in dataset order, and what to say."""

    positions: list[int]
    note: str | None


def sample(total: int, size: int | None, seed: int) -> Sample:
    """``size`` of ``total`` problems, drawn by ``seed``: the same ones for the same seed
    and data, in dataset order. ``size`` None, or at least ``total``: all of them (a
    larger ``size`` is said in the note)."""
    if size is None or size == total:
        return Sample(list(range(total)), None)
    if size > total:
        return Sample(
            list(range(total)),
            f"dataset.size is {size:,}, but the dataset holds "
            f"{counted(total, 'problem', grouped=True)}: all {total:,} are used",
        )
    rng = random.Random(hashlib.sha256(f"dataset.size:{seed}".encode()).digest())
    return Sample(
        sorted(rng.sample(range(total), size)),
        f"sampled {size:,} of {counted(total, 'problem', grouped=True)} with seed {seed}",
    )
