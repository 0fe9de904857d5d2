"""Reading the files a pack names, safely: only regular files inside the pack folder, of
bounded size, parsed into bounded data.

A pack comes from someone else, so each file it names is checked before it is opened
(``os.stat`` never opens a FIFO or reads a device): it must resolve, symlinks followed,
to a regular file inside the pack folder and be at most ``max_bytes`` long. A JSONL
file is read a line at a time, and a line longer than ``max_line_bytes`` is refused
before it is parsed (or even held whole), so memory follows the longest line allowed,
not the file. Parsed data is bounded too: nesting at most :data:`MAX_DEPTH` levels,
integers within a float's range, valid Unicode text (no lone surrogates), YAML files of
at most :data:`MAX_YAML_NODES` values (counted before the document is built), whose
aliases expand to at most as many and never into themselves, and keys that are
scalars. Every refusal is a :class:`FileProblem` with the line it is on, when there is
one.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import yaml

from convsim._plural import counted

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "MAX_DEPTH",
    "MAX_YAML_NODES",
    "FileProblem",
    "JsonLine",
    "ParsedYaml",
    "open_pack_file",
    "read_pack_file",
    "read_jsonl",
    "parse_json_value",
    "parse_yaml",
    "line_of",
    "format_size",
]

DEFAULT_MAX_FILE_BYTES = 256 * 1000 * 1000
"""The largest pack file read by default (256 MB); ``max_file_bytes`` changes it."""
DEFAULT_MAX_LINE_BYTES = 1000 * 1000
"""The longest line of a JSONL file read by default (1 MB); ``max_line_bytes`` changes
it. A line's value takes many times its length in memory (50 MB of ``[1,1,...]`` took
4 GB), so the limit on a line, not on the file, bounds what parsing one can cost."""
MAX_DEPTH = 100
"""The deepest nesting of lists and mappings a pack file may hold."""
MAX_YAML_NODES = 1_000_000
"""The most values a YAML file may expand to, aliases counted as often as they are used."""
_MAX_INT_DIGITS = 308  # beyond a float's range: every numeric consumer can take it


class FileProblem(Exception):
    """A pack file that cannot be used: why, on which line (1-based) and in which field,
    where known."""

    def __init__(self, message: str, line: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.field = field

    def __str__(self) -> str:
        return self.message


def format_size(size: int) -> str:
    """A byte count as people read it: ``256 MB``, ``1.5 kB``."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return counted(size, "byte")


def open_pack_file(root: Path, name: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> BinaryIO:
    """The file ``name`` (relative to ``root``, or absolute) open for reading in binary,
    after checking that it is a regular file inside ``root`` of at most ``max_bytes``.

    Raises:
        FileNotFoundError: there is no such file.
        FileProblem: the file is outside ``root``, not a regular file, or too large.
        OSError: it cannot be opened.
    """
    base = Path(os.path.realpath(root))
    path = Path(os.path.realpath(base / name))  # symlinks and ".." resolved
    if not path.is_relative_to(base):
        raise FileProblem(f"outside the pack folder ({path}); pack files must be inside {base}")
    _check_kind(os.stat(path), max_bytes)
    # O_NONBLOCK: if the file became a FIFO since the stat, opening it does not wait
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    fh = os.fdopen(fd, "rb")
    try:
        _check_kind(os.fstat(fd), max_bytes)
    except BaseException:
        fh.close()
        raise
    return fh


def read_pack_file(root: Path, name: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
    """The bytes of the file ``name``, checked as :func:`open_pack_file` does.

    Raises:
        FileNotFoundError: there is no such file.
        FileProblem: the file is outside ``root``, not a regular file, or too large.
        OSError: it cannot be read.
    """
    with open_pack_file(root, name, max_bytes) as fh:
        # read(n) allocates n bytes first: ask for the size checked, not the limit
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(size + 1)
        if len(data) > size:  # it grew since
            data += fh.read(max_bytes + 1 - len(data))
    if len(data) > max_bytes:
        raise FileProblem(_too_large(len(data), max_bytes))
    return data


def _check_kind(info: os.stat_result, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise FileProblem("is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise FileProblem("not a regular file (a device, FIFO or socket); give a file")
    if info.st_size > max_bytes:
        raise FileProblem(_too_large(info.st_size, max_bytes))


def _too_large(size: int, max_bytes: int) -> str:
    return (
        f"{format_size(size)}, over the limit of {format_size(max_bytes)} "
        "(raise it with --max-file-size or max_file_bytes=)"
    )


# -- JSON -----------------------------------------------------------------------------

_SKIP_CHUNK = 1 << 16  # the rest of a line over the limit is read past this much at a time


class JsonLine(NamedTuple):
    """A line of a JSONL file that is neither blank nor a ``#`` comment: its number
    (1-based) and its value, or the problem that keeps it from having one (``value`` is
    then None)."""

    number: int
    value: Any
    problem: FileProblem | None


def read_jsonl(
    fh: BinaryIO,
    *,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    on_bytes: Callable[[bytes], object] | None = None,
) -> Iterator[JsonLine]:
    """The lines of a JSONL file open in binary that are neither blank nor a ``#``
    comment, one at a time, parsed with :func:`parse_json_value`. Lines end at "\\n"
    only: JSON strings may hold U+2028 and friends, which other line breaks would split.

    A line longer than ``max_line_bytes`` (its newline not counted) is never held whole
    nor parsed: the rest of it is read past, and it comes back with its problem.
    ``on_bytes`` sees every byte read, in order (a pack's hash covers its files).

    Raises:
        FileProblem: a line is not UTF-8 (with its line; the lines after it are not
            read), or the file has grown past ``max_bytes``.
        OSError: the file cannot be read.
    """
    offset = number = 0
    while data := fh.readline(max_line_bytes + 1):
        number += 1
        start = offset
        while True:  # once, or until the end of a line over the limit
            offset += len(data)
            if on_bytes is not None:
                on_bytes(data)
            if offset > max_bytes:  # the file grew since it was checked
                raise FileProblem(_too_large(offset, max_bytes))
            if data.endswith(b"\n") or offset - start <= max_line_bytes:
                break
            data = fh.readline(_SKIP_CHUNK)
            if not data:
                break
        length = offset - start - data.endswith(b"\n")
        if length > max_line_bytes:
            yield JsonLine(number, None, FileProblem(_line_too_long(length, max_line_bytes)))
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FileProblem(
                f"not UTF-8 text ({exc.reason} at byte {start + exc.start})", number
            ) from None
        if not text.strip() or text.lstrip().startswith("#"):
            continue  # a comment: no JSON value starts with "#" (the guide's files have one)
        try:
            value = parse_json_value(text)
        except FileProblem as exc:
            yield JsonLine(number, None, exc)
            continue
        yield JsonLine(number, value, None)


def _line_too_long(length: int, max_line_bytes: int) -> str:
    return (
        f"a line of {format_size(length)}, over the limit of {format_size(max_line_bytes)} "
        "per line (raise it with --max-line-size or max_line_bytes=); not parsed"
    )


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise FileProblem(f"a number with {len(text.lstrip('-'))} digits is too large")
    return int(text)


def _no_constant(name: str) -> Any:
    raise FileProblem(f"{name} is not a JSON number")


def parse_json_value(text: str) -> Any:
    """One JSON value, bounded like every pack value.

    Raises:
        FileProblem: invalid JSON, too deep, a number too large, or invalid text.
    """
    try:
        value = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FileProblem(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise FileProblem(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. a float literal with thousands of digits
        raise FileProblem(f"invalid JSON: {exc}") from None
    if _may_be_unfit(text):
        check_value(value)
    return value


#: A JSON escape of a UTF-16 surrogate (\ud800 to \udfff): the one way JSON in valid
#: text can spell a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _may_be_unfit(text: str) -> bool:
    """False when the JSON ``text`` cannot hold a value :func:`check_value` refuses, so
    the walk over every value can be skipped: fewer brackets than the depth limit (each
    level opens one), no escaped surrogate and no raw one."""
    brackets = text.count("[") + text.count("{")
    return brackets > MAX_DEPTH or bool(_SURROGATE_ESCAPE.search(text)) or not _valid_text(text)


def check_value(value: Any) -> None:
    """Refuse a parsed value unfit for a pack: nested too deep, or text with a lone
    surrogate. Walks the value without recursion; the problem names the field.

    Raises:
        FileProblem: with ``field`` set (``tags.0``).
    """
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, loc = stack.pop()
        if len(loc) > MAX_DEPTH:
            raise FileProblem(f"nested deeper than {MAX_DEPTH} levels", field=_dotted(loc[:3]))
        if isinstance(item, str):
            if not _valid_text(item):
                raise FileProblem(
                    "holds a lone surrogate (text must be valid Unicode)", field=_dotted(loc)
                )
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and not _valid_text(key):
                    raise FileProblem("a key holds a lone surrogate", field=_dotted(loc))
                stack.append((sub, (*loc, key)))
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((sub, (*loc, i)) for i, sub in enumerate(item))


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _dotted(loc: tuple[Any, ...]) -> str | None:
    return ".".join(str(p) for p in loc) or None


# -- YAML -----------------------------------------------------------------------------

_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when installed


class ParsedYaml(NamedTuple):
    """A YAML file's data, and its node tree (where each value is, for error lines)."""

    data: Any
    node: yaml.Node | None


def parse_yaml(text: str) -> ParsedYaml:
    """A YAML document, with the safe tags only and bounded as a pack value must be.

    Raises:
        FileProblem: invalid YAML, a tag that is not plain data, a duplicate, list or
            mapping key, too deep, an alias bomb or loop, a number too large, or a lone
            surrogate; with the line where it is.
    """
    try:
        _check_events(text)
        node = yaml.compose(text, Loader=_Parser)
        if node is None:
            return ParsedYaml(None, None)
        _check_expansion(node)
        data = _StrictConstructor().construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = exc.problem or exc.context or str(exc)
        raise FileProblem(f"invalid YAML: {reason}", mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise FileProblem(f"invalid YAML: {exc}") from None
    try:
        check_value(data)
    except FileProblem as exc:
        exc.line = line_of(node, exc.field)
        raise
    return ParsedYaml(data, node)


def _check_events(text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH, and more than MAX_YAML_NODES values, from
    the event stream: before composing, which recurses and builds every node (a 12 MB
    file of short items took 1.3 GB and 46 s), and as soon as a limit is passed."""
    depth = values = 0
    for event in yaml.parse(text, Loader=_Parser):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise FileProblem(
                    f"nested deeper than {MAX_DEPTH} levels", event.start_mark.line + 1
                )
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
            continue
        elif not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            continue
        values += 1
        if values > MAX_YAML_NODES:
            raise FileProblem(
                f"holds more than {counted(MAX_YAML_NODES, 'value', grouped=True)}",
                event.start_mark.line + 1,
            )


def _check_expansion(root: yaml.Node) -> None:
    """Refuse aliases that would expand past MAX_YAML_NODES values, or into themselves."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            active.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_NODES:
                raise FileProblem(
                    f"aliases expand to more than {counted(MAX_YAML_NODES, 'value', grouped=True)}",
                    node.start_mark.line + 1,
                )
            continue
        if key in sizes:
            continue
        if key in active:
            raise FileProblem("an alias refers to a value that contains it", _line(node))
        active.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in active:
                raise FileProblem("an alias refers to a value that contains it", _line(node))
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def line_of(root: yaml.Node, field: str | None) -> int:
    """The line of the node a dotted field names (``a.0.b``), as deep as it goes."""
    node, line = root, _line(root)
    for key in field.split(".") if field else []:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == key:
                    node, line = v, _line(k)
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
            line = _line(node)
        else:
            break
    return line


class _StrictConstructor(yaml.constructor.SafeConstructor):
    """SafeLoader's constructor that refuses duplicate and unhashable keys, and says
    where a scalar cannot be read (an integer too long, a date that does not exist)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {kind} cannot be a key", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = _line(key_node)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # a scalar its tag's constructor cannot read, whatever it raises
            text = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {_cut(str(text))} as {node.tag}: {exc}", node.start_mark
            ) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = str(node.value).lstrip("+-").replace("_", "")
        if len(digits) > _MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"a number with {len(digits)} digits is too large", node.start_mark
            )
        return super().construct_yaml_int(node)


_StrictConstructor.add_constructor(
    "tag:yaml.org,2002:int",
    _StrictConstructor.construct_yaml_int,
)


def _cut(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")
