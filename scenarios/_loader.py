"""Load and validate scenario packs; every problem names its file, line and field."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import heapq
import json
import os
import random
import re
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel, ValidationError

from convsim._errors import ConfigError, PackError, PackProblem, ProblemLog, TemplateError
from convsim._plural import counted
from convsim._records import MetricTiers

from ._code_tests import code_tests_problems
from ._criteria import _code_problem, _schema_problem, goal_problems  # checked as goal criteria are
from ._datasets import (
    DEFAULT_SAMPLE_SEED,
    DatasetRow,
    open_hf,
    read_csv,
    read_parquet,
    sample,
)
from ._files import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    FileProblem,
    ParsedYaml,
    open_pack_file,
    parse_yaml,
    read_jsonl,
    read_pack_file,
)
from ._pack import Conversation, Pack, PackKind, PreparedFlow, PreparedTurn
from ._schema import (
    BUILTIN_VARIABLES,
    LANGUAGE_PATTERN,
    DatasetConfig,
    Flow,
    Problem,
    Scenario,
    SingleTurnConfig,
    TurnConfig,
    TurnSettings,
)
from ._sources import PACK_SOURCES, LoadOptions
from ._state_checks import PLACEHOLDER
from ._templates import Template
from ._tool_schema import ToolDefinition, ToolsFile
from ._toolset import ToolSet

__all__ = [
    "load_pack",
    "list_packs",
    "problems_pack",
    "PackInfo",
    "BUNDLED_PACKS_DIR",
    "SINGLE_TURN_VARIABLES",
]

BUNDLED_PACKS_DIR = Path(__file__).parent / "packs"
MULTI_TURN_FILES = ("scenarios.jsonl", "turn_configs.yml")
TOOLS_FILE = "tools.yml"
"""A multi-turn pack's tools, when it has any."""
TOOL_CHOICES = ("auto", "required", "none")
"""The ``tool_choice`` values that are not a tool's name."""
SINGLE_TURN_FILES = ("problems.jsonl", "config.yml")
#: The variables a single-turn prompt template may use.
SINGLE_TURN_VARIABLES = frozenset({"question", "context", "difficulty", "domain", "examples"})
SINGLE_TURN_ID = "answer"
NOTES_PER_TURN = 10
"""The most scenarios named in the notes for one optional turn that will skip; one
more note counts the rest."""


@dataclass(frozen=True)
class PackInfo:
    """What ``convsim list`` shows of a bundled pack."""

    name: str
    kind: PackKind
    description: str
    conversations: int
    path: Path


def _bundled_folders() -> list[Path]:
    return sorted(
        p
        for p in BUNDLED_PACKS_DIR.iterdir()
        if p.is_dir() and any((p / f).exists() for f in MULTI_TURN_FILES + SINGLE_TURN_FILES)
    )


def list_packs() -> list[PackInfo]:
    """The bundled packs, by name."""
    infos = []
    for folder in _bundled_folders():
        pack = load_pack(folder)
        infos.append(PackInfo(pack.name, pack.kind, pack.description, len(pack), folder))
    return infos


def load_pack(
    name_or_path: str | Path,
    *,
    num_fewshot: int = 0,
    context_mode: str | None = None,
    metric_names: Container[str] | None = None,
    include_path: str | Path | None = None,
    allow_code: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    seed: int | None = None,
) -> Pack:
    """Load and validate a bundled pack by name, or a pack folder by path, or a pack from
    a registered source (``lm-eval:TASK``, ``task:NAME``; see :data:`PACK_SOURCES`).

    Args:
        name_or_path: a bundled pack's name (see ``convsim list``), a folder, or
            ``PREFIX:NAME`` for a registered pack source.
        context_mode: single-turn packs only: ``no_context`` (drop each problem's
            context), ``minimal_context`` (its first sentence) or ``full_context``; one of
            the pack's ``evaluation_config.context_modes``. Default: full_context if the
            pack lists it, else its first mode.
        num_fewshot: single-turn packs only: use the ``with_examples`` template with
            this many other problems as examples.
        metric_names: the metric names the pack may use (e.g. a metric registry); any
            name is accepted when None, and the caller checks them.
        include_path: ``lm-eval:TASK`` only: a folder of lm-eval task YAML files; without
            it the task is looked up among lm-eval's own tasks.
        allow_code: run code the pack names (``python`` goal criteria, lm-eval
            ``!function`` tags); without it such a pack is refused. Packs with code are
            code: allow it only for packs you trust.
        max_file_bytes: the largest file the pack may hold (default 256 MB).
        max_line_bytes: the longest line of its JSONL files (default 1 MB); a longer
            line is refused before it is parsed.
        seed: single-turn packs with ``dataset.size``: the seed that samples the
            problems (a run's ``--seed``); default 0 (``DEFAULT_SAMPLE_SEED``).

    Raises:
        ConfigError: no such pack.
        PackError: the pack is invalid; ``problems`` lists the problems found (the
            first 1,000; ``more`` counts the rest).
    """
    _check_limit("max_file_bytes", max_file_bytes)
    _check_limit("max_line_bytes", max_line_bytes)
    options = LoadOptions(
        num_fewshot=num_fewshot,
        context_mode=context_mode,
        include_path=Path(include_path) if include_path is not None else None,
        metric_names=metric_names,
        allow_code=allow_code,
        max_file_bytes=max_file_bytes,
        max_line_bytes=max_line_bytes,
        seed=seed,
    )
    pack = _code_allowed(_load(name_or_path, options), allow_code)
    recorded = {**pack.load_options, **options.recorded()}
    if pack.dataset:
        recorded["dataset"] = dict(pack.dataset)
        if "seed" in pack.dataset:  # it sampled: loading again the same way takes the seed
            recorded["seed"] = pack.dataset["seed"]
    return dataclasses.replace(pack, load_options=recorded) if recorded else pack


def _code_allowed(pack: Pack, allow_code: bool) -> Pack:
    """``pack`` with each conversation saying whether its code may run."""
    if not allow_code:
        return pack
    conversations = tuple(dataclasses.replace(c, allow_code=True) for c in pack.conversations)
    return dataclasses.replace(pack, conversations=conversations)


def _check_limit(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, not {value}")


def _load(name_or_path: str | Path, options: LoadOptions) -> Pack:
    if isinstance(name_or_path, str) and ":" in name_or_path and name_or_path in PACK_SOURCES:
        pack: Pack = PACK_SOURCES.get(name_or_path)(options)
        return pack
    num_fewshot, context_mode = options.num_fewshot, options.context_mode
    if options.include_path is not None:
        raise ConfigError("include_path applies to lm-eval:TASK packs only")
    folder = _resolve(name_or_path)
    has_multi = any((folder / f).exists() for f in MULTI_TURN_FILES)
    has_single = any((folder / f).exists() for f in SINGLE_TURN_FILES)
    if has_multi and has_single:
        raise ConfigError(
            f"{folder}: holds files of both pack formats; a pack is either multi-turn "
            f"({', '.join(MULTI_TURN_FILES)}) or single-turn ({', '.join(SINGLE_TURN_FILES)})"
        )
    if has_multi:
        if num_fewshot or context_mode is not None:
            raise ConfigError("--num-fewshot and --context-mode apply to single-turn packs only")
        return _MultiTurnLoader(folder, options).load()
    if has_single:
        if num_fewshot < 0:
            raise ConfigError("--num-fewshot must be >= 0")
        return _SingleTurnLoader(folder, options).load()
    raise ConfigError(
        f"{folder}: not a scenario pack: expected {' + '.join(MULTI_TURN_FILES)} (multi-turn) "
        f"or {' + '.join(SINGLE_TURN_FILES)} (single-turn)"
    )


class MultiTurnFiles(NamedTuple):
    """A multi-turn pack read from two named files, and its flows by name."""

    pack: Pack
    flows: dict[str, PreparedFlow]


def load_multi_turn_files(
    scenarios: Path,
    turn_configs: Path,
    metric_names: Container[str] | None = None,
    *,
    allow_code: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> MultiTurnFiles:
    """A multi-turn pack from two named files (a task class's DATASET_PATH and
    TURN_CONFIG_PATH), validated as a pack folder is; also its flows by name. The
    files may be in different folders; their common folder is the pack's."""
    _check_limit("max_file_bytes", max_file_bytes)
    _check_limit("max_line_bytes", max_line_bytes)
    options = LoadOptions(
        metric_names=metric_names,
        allow_code=allow_code,
        max_file_bytes=max_file_bytes,
        max_line_bytes=max_line_bytes,
    )
    root = Path(os.path.commonpath([scenarios.parent.resolve(), turn_configs.parent.resolve()]))
    loader = _MultiTurnLoader(scenarios.parent, options, root=root)
    loader.DATA = scenarios.name
    loader.CONFIG = os.path.relpath(turn_configs, scenarios.parent)
    pack = _code_allowed(loader.load(), allow_code)
    return MultiTurnFiles(pack, loader.flows)


def _resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.resolve()
    bundled = BUNDLED_PACKS_DIR / str(name_or_path)
    if isinstance(name_or_path, str) and bundled in _bundled_folders():
        return bundled
    names = sorted(p.name for p in _bundled_folders())
    sources = ", ".join(f"{p}NAME" for p in PACK_SOURCES.prefixes())
    raise ConfigError(
        f"no scenario pack {str(name_or_path)!r}: not a folder, and not a bundled pack "
        f"({', '.join(names)})" + (f" or a registered source ({sources})" if sources else "")
    )


# -- shared machinery ---------------------------------------------------------------


class Where(NamedTuple):
    """Where a pack names a file (``config.yml`` line 3, ``dataset.path``)."""

    file: str
    line: int | None
    field: str | None


class _Loader:
    def __init__(self, folder: Path, options: LoadOptions, root: Path | None = None) -> None:
        self.folder = folder
        self.root = root if root is not None else folder
        """Every file the pack reads must be inside this folder."""
        self.metric_names = options.metric_names
        self.allow_code = options.allow_code
        self.max_file_bytes = options.max_file_bytes
        self.max_line_bytes = options.max_line_bytes
        self.log = ProblemLog()
        self.digest = hashlib.sha256()

    @property
    def problems(self) -> list[PackProblem]:
        """The problems found so far (the first MAX_LISTED_PROBLEMS of them)."""
        return self.log.problems

    def problem(self, file: str, line: int | None, field: str | None, message: str) -> None:
        self.log.add(PackProblem(file, line, field, message))

    def error(self) -> PackError:
        """The pack's problems as the error to raise."""
        return self.log.error()

    def file_problem(self, name: str, named_at: Where | None, exc: OSError | FileProblem) -> None:
        """A problem with the file ``name`` as a whole, where the file is named (or on the
        file itself)."""
        where = named_at or Where(name, None, None)
        if isinstance(exc, FileNotFoundError):
            self.problem(*where, "file is missing" if named_at is None else f"{name}: missing")
        elif isinstance(exc, FileProblem):
            self.problem(*where, exc.message if named_at is None else f"{name}: {exc.message}")
        else:
            self.problem(*where, f"cannot read {name}: {exc.strerror}")

    def read_bytes(self, name: str, named_at: Where | None = None) -> bytes | None:
        """A pack file's bytes, if it is a regular file inside the pack of bounded size;
        else None and a problem where the file is named (or on the file itself)."""
        try:
            return read_pack_file(self.root, str(self.folder / name), self.max_file_bytes)
        except (OSError, FileProblem) as exc:
            self.file_problem(name, named_at, exc)
        return None

    def read(self, name: str, named_at: Where | None = None) -> str | None:
        data = self.read_bytes(name, named_at)
        if data is None:
            return None
        self.digest.update(name.encode() + b"\0" + data + b"\0")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problem(name, None, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
            return None

    def read_yaml(self, name: str) -> ParsedYaml:
        text = self.read(name)
        if text is None:
            return ParsedYaml(None, None)
        try:
            return parse_yaml(text)
        except FileProblem as exc:
            self.problem(name, exc.line, exc.field, exc.message)
            return ParsedYaml(None, None)

    def read_jsonl(self, name: str, named_at: Where | None = None) -> Iterator[tuple[int, Any]]:
        """The values of a JSONL pack file's lines with their numbers, read one line at a
        time (the file is never held whole); a problem for each line that has none."""
        try:
            fh = open_pack_file(self.root, str(self.folder / name), self.max_file_bytes)
        except (OSError, FileProblem) as exc:
            self.file_problem(name, named_at, exc)
            return
        self.digest.update(name.encode() + b"\0")
        lines = read_jsonl(
            fh,
            max_bytes=self.max_file_bytes,
            max_line_bytes=self.max_line_bytes,
            on_bytes=self.digest.update,
        )
        with fh:
            try:
                for line in lines:
                    if line.problem is None:
                        yield line.number, line.value
                    else:
                        self.problem(name, line.number, line.problem.field, line.problem.message)
            except FileProblem as exc:
                self.problem(name, exc.line, exc.field, exc.message)
            except OSError as exc:
                self.problem(name, None, None, f"cannot read {name}: {exc.strerror}")
        self.digest.update(b"\0")

    def describe(self) -> str:
        """The first paragraph of the pack's README.md (not a heading), if it has one."""
        if not (self.folder / "README.md").exists():
            return ""
        data = self.read_bytes("README.md")
        if data is None:
            return ""
        for block in data.decode("utf-8", "replace").split("\n\n"):
            block = block.strip()
            if block and not block.startswith("#"):
                return " ".join(block.split())
        return ""

    def check_render(
        self, conv: Conversation, turn: PreparedTurn, file: str, line: int | None
    ) -> None:
        """Render ``turn``'s template with the conversation's values, as a run will, so a
        format spec that does not fit its value (``{name:%Y}`` of a name) is found now."""
        try:
            conv.render(turn, ())
        except TemplateError as exc:
            field = exc.field
            if conv.kind == "multi_turn" and field in conv.scenario.variables:
                field = f"variables.{field}"
            self.problem(
                file,
                line,
                field,
                f"turn {turn.turn_id!r} of flow {conv.flow.scenario_type!r}: {exc}",
            )

    def validate(
        self, model: type[BaseModel], data: Any, file: str, line_of: Any, prefix: tuple = ()
    ) -> Any:
        """Validate ``data``; report each error at the line ``line_of(loc)`` gives."""
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            for err in exc.errors():
                loc = prefix + tuple(err["loc"])
                field = ".".join(str(p) for p in loc) or None
                message = err["msg"]
                if err["type"] == "extra_forbidden":
                    message = "unknown field"
                self.problem(file, line_of(loc), field, message)
            return None

    def check_metrics(self, names: list[str], file: str, line: int | None, field: str) -> None:
        if self.metric_names is None:
            return
        for name in names:
            if name not in self.metric_names:
                self.problem(file, line, field, f"unknown metric {name!r}")

    def parse_template(
        self, source: str, file: str, line: int | None, field: str
    ) -> Template | None:
        try:
            return Template.parse(source)
        except TemplateError as exc:
            self.problem(file, line, field, str(exc))
            return None

    def finish(self, **fields: Any) -> Pack:
        description = self.describe()
        if self.problems:
            raise self.error()
        return Pack(
            name=self.folder.name,
            path=self.folder,
            description=description,
            pack_hash=self.digest.hexdigest(),
            **fields,
        )


def _tiers(config: SingleTurnConfig) -> MetricTiers | None:
    """config.yml's metric tiers; None when it declares no metrics."""
    primary, secondary = config.metrics.primary, config.metrics.secondary
    if not primary and not secondary:
        return None
    return MetricTiers(primary=tuple(primary), secondary=tuple(secondary))


def _context(text: str, mode: str) -> str:
    """A problem's context as the context mode asks for it."""
    if mode == "no_context":
        return ""
    if mode == "minimal_context":
        return re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]
    return text


def _placeholders(value: Any) -> Iterator[str]:
    """The ``{name}`` placeholders of every string (and key) in ``value``."""
    if isinstance(value, str):
        yield from PLACEHOLDER.findall(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _placeholders(key)
            yield from _placeholders(item)
    elif isinstance(value, list):
        for item in value:
            yield from _placeholders(item)


def _yaml_line(node: Any, loc: tuple) -> int | None:
    """The line of the deepest node along ``loc`` (1-based)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(key):
                    node, line = v, k.start_mark.line + 1
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


class ExecutionOrder(NamedTuple):
    """The turns' positions in the order they run (dependencies first), and the ids of
    the turns on a dependency cycle, if there is one (then the order is partial)."""

    order: list[int]
    cycle: list[str]


def _execution_order(turns: list[TurnConfig]) -> ExecutionOrder:
    """Stable topological order of turn positions: of the turns whose dependencies have
    all run, the first in the file runs next. The turn ids left on or after a cycle, if
    any. Kahn's algorithm with a heap: O(n log n + dependencies)."""
    index = {t.turn_id: i for i, t in enumerate(turns)}
    waiting = [0] * len(turns)  # dependencies not yet placed, per turn
    dependants: list[list[int]] = [[] for _ in turns]
    for i, turn in enumerate(turns):
        for dep in set(turn.depends_on):
            if dep in index:
                waiting[i] += 1
                dependants[index[dep]].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in dependants[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    placed = set(order)
    cycle = [t.turn_id for i, t in enumerate(turns) if i not in placed]
    return ExecutionOrder(order, cycle)


# -- multi-turn ---------------------------------------------------------------------


class _MultiTurnLoader(_Loader):
    CONFIG = "turn_configs.yml"
    DATA = "scenarios.jsonl"

    def load(self) -> Pack:
        self.tools = self._tools()
        flows = self.flows = self._flows()
        conversations = []
        seen: dict[str, int] = {}
        self.skip_notes: list[str] = []
        self.skips: collections.Counter[tuple[str, str]] = collections.Counter()
        """Scenarios that skip an optional turn, by flow and turn."""
        for lineno, raw in self.read_jsonl(self.DATA):
            scenario = self.validate(Scenario, raw, self.DATA, lambda loc, n=lineno: n)
            if scenario is None:
                continue
            if scenario.scenario_id in seen:
                self.problem(
                    self.DATA,
                    lineno,
                    "scenario_id",
                    f"duplicate {scenario.scenario_id!r} "
                    f"(first on line {seen[scenario.scenario_id]})",
                )
                continue
            seen[scenario.scenario_id] = lineno
            flow_name = (
                scenario.scenario_type if scenario.scenario_type in self.flow_names else "default"
            )
            if flow_name in self.invalid_flows or (self.config_broken and not self.flow_names):
                continue  # its flow's own problems are reported already
            flow = flows.get(flow_name)
            if flow is None:
                self.problem(
                    self.DATA,
                    lineno,
                    "scenario_type",
                    f"no flow {scenario.scenario_type!r} in {self.CONFIG} and no 'default'",
                )
                continue
            conv = Conversation(
                scenario, flow, "multi_turn", f"{self.DATA}:{lineno}", tools=self.tools
            )
            self._check_scenario(conv, lineno)
            conversations.append(conv)
        if not conversations and not self.problems:
            self.problem(self.DATA, None, None, "holds no scenarios")
        return self.finish(
            kind="multi_turn",
            conversations=tuple(conversations),
            notes=(*self._flow_notes(flows), *self.skip_notes, *self._more_skips()),
        )

    def _flows(self) -> dict[str, PreparedFlow]:
        self.flow_names: set[str] = set()
        self.invalid_flows: set[str] = set()
        self.config_broken = True
        data, root = self.read_yaml(self.CONFIG)
        if data is None:
            if root is None and not self.problems:
                self.problem(self.CONFIG, None, None, "is empty")
            return {}
        if not isinstance(data, dict):
            self.problem(self.CONFIG, 1, None, "must map each scenario_type to its flow")
            return {}
        self.config_broken = False
        self.flow_names = {str(k) for k in data}
        flows = {}
        for scenario_type, raw in data.items():
            line_of = lambda loc: _yaml_line(root, loc)  # noqa: E731
            flow = self.validate(Flow, raw, self.CONFIG, line_of, prefix=(scenario_type,))
            prepared = (
                self._prepare_flow(str(scenario_type), flow, line_of) if flow is not None else None
            )
            if prepared is None:
                self.invalid_flows.add(str(scenario_type))
            else:
                flows[str(scenario_type)] = prepared
        return flows

    def _prepare_flow(self, name: str, flow: Flow, line_of: Any) -> PreparedFlow | None:
        ok = True
        ids: dict[str, int] = {}
        for i, turn in enumerate(flow.turns):
            if turn.turn_id in ids:
                self.problem(
                    self.CONFIG,
                    line_of((name, "turns", i, "turn_id")),
                    f"{name}.turns.{i}.turn_id",
                    f"duplicate turn_id {turn.turn_id!r}",
                )
                ok = False
            ids.setdefault(turn.turn_id, i)
        templates = []
        for i, turn in enumerate(flow.turns):
            where = (name, "turns", i)
            for dep in turn.depends_on:
                if dep not in ids:
                    self.problem(
                        self.CONFIG,
                        line_of((*where, "depends_on")),
                        f"{name}.turns.{i}.depends_on",
                        f"unknown turn {dep!r} (turns: {', '.join(ids)})",
                    )
                    ok = False
                elif dep == turn.turn_id:
                    self.problem(
                        self.CONFIG,
                        line_of((*where, "depends_on")),
                        f"{name}.turns.{i}.depends_on",
                        "a turn cannot depend on itself",
                    )
                    ok = False
            self.check_metrics(
                turn.evaluation_metrics,
                self.CONFIG,
                line_of((*where, "evaluation_metrics")),
                f"{name}.turns.{i}.evaluation_metrics",
            )
            self._check_turn_tools(turn, where, line_of)
            template = self.parse_template(
                turn.prompt_template,
                self.CONFIG,
                line_of((*where, "prompt_template")),
                f"{name}.turns.{i}.prompt_template",
            )
            ok = ok and template is not None
            templates.append(template)
        self.check_metrics(flow.metrics, self.CONFIG, line_of((name, "metrics")), f"{name}.metrics")
        if "max_tool_rounds" in flow.model_fields_set and self.tools_file is None:
            self.no_tools(
                self.CONFIG, line_of((name, "max_tool_rounds")), f"{name}.max_tool_rounds"
            )
        if not ok:
            return None
        order, cycle = _execution_order(flow.turns)
        if cycle:
            self.problem(
                self.CONFIG,
                line_of((name, "turns")),
                f"{name}.turns",
                f"depends_on forms a cycle through {', '.join(cycle)}",
            )
            return None
        turns: list[PreparedTurn] = []
        for i in order:
            turn, template = flow.turns[i], templates[i]
            assert template is not None
            turns.append(PreparedTurn(turn, i, template))
            previous = turn.turn_id
            for k in range(2, turn.repeat + 1):
                copy_id = f"{turn.turn_id}.{k}"
                if copy_id in ids:
                    self.problem(
                        self.CONFIG,
                        line_of((name, "turns", i, "repeat")),
                        f"{name}.turns.{i}.repeat",
                        f"repeat {k} would be named {copy_id!r}, which another turn has",
                    )
                    return None
                copy = turn.model_copy(update={"turn_id": copy_id, "depends_on": [previous]})
                turns.append(PreparedTurn(copy, i, template))
                previous = copy_id
        return PreparedFlow(name, flow, tuple(turns))

    def _check_scenario(self, conv: Conversation, lineno: int) -> None:
        sc, turn_ids = conv.scenario, {t.turn_id for t in conv.flow.turns}
        for turn in conv.flow.turns:
            missing = conv.missing_variables(turn)
            if not missing:
                self.check_render(conv, turn, self.DATA, lineno)
            elif turn.config.optional:
                self._note_skip(conv, turn, missing)
            else:
                self.problem(
                    self.DATA,
                    lineno,
                    "variables",
                    f"turn {turn.turn_id!r} of flow {conv.flow.scenario_type!r} uses "
                    f"{', '.join('{' + m + '}' for m in sorted(missing))}, which scenario "
                    f"{sc.scenario_id!r} does not define (built-ins: "
                    f"{', '.join(sorted(BUILTIN_VARIABLES))})",
                )
        for i, fact in enumerate(sc.facts):
            if fact.introduced_in not in turn_ids:
                self.problem(
                    self.DATA,
                    lineno,
                    f"facts.{i}.introduced_in",
                    f"unknown turn {fact.introduced_in!r}",
                )
        keys = {f.key for f in sc.facts}
        for i, probe in enumerate(sc.probes):
            if probe.turn_id not in turn_ids:
                self.problem(
                    self.DATA, lineno, f"probes.{i}.turn_id", f"unknown turn {probe.turn_id!r}"
                )
            for key in probe.facts:
                if key not in keys:
                    self.problem(self.DATA, lineno, f"probes.{i}.facts", f"unknown fact {key!r}")
        for turn_id in sc.reference_responses:
            if turn_id not in turn_ids:
                self.problem(self.DATA, lineno, f"reference_responses.{turn_id}", "unknown turn")
        if sc.goal is not None:
            for group in ("all_of", "any_of"):
                for i, crit in enumerate(getattr(sc.goal, group)):
                    if crit.turn_id is not None and crit.turn_id not in turn_ids:
                        self.problem(
                            self.DATA,
                            lineno,
                            f"goal.{group}.{i}.turn_id",
                            f"unknown turn {crit.turn_id!r}",
                        )
        for wrong in goal_problems(sc.goal, allow_code=self.allow_code):
            self.problem(self.DATA, lineno, wrong.field, wrong.message)
        for wrong in code_tests_problems(sc.metadata, turn_ids):
            self.problem(self.DATA, lineno, wrong.field, wrong.message)
        self._check_scenario_tools(sc, turn_ids, lineno)

    # -- tools ----------------------------------------------------------------------

    def no_tools(self, file: str, line: int | None, field: str) -> None:
        self.problem(file, line, field, f"the pack declares no tools (it has no {TOOLS_FILE})")

    def _tools(self) -> ToolSet | None:
        """The pack's tools from tools.yml, validated; None when it has none or they
        are invalid (``tools_file`` says whether it has the file)."""
        self.tools_file: str | None = None
        if not os.path.lexists(self.folder / TOOLS_FILE):
            return None
        self.tools_file = TOOLS_FILE
        data, root = self.read_yaml(TOOLS_FILE)
        if data is None:
            if root is None and not self.problems:
                self.problem(TOOLS_FILE, None, None, "is empty")
            return None
        line_of = lambda loc: _yaml_line(root, loc)  # noqa: E731
        parsed = self.validate(ToolsFile, data, TOOLS_FILE, line_of)
        if parsed is None:
            return None
        before = len(self.problems)
        seen: set[str] = set()
        for i, tool in enumerate(parsed.tools):
            if tool.name in seen:
                field = f"tools.{i}.name"
                self.problem(TOOLS_FILE, line_of(("tools", i, "name")), field, "declared twice")
            seen.add(tool.name)
            self._check_tool(tool, ("tools", i), line_of)
        if len(self.problems) > before:
            return None
        return ToolSet(tuple(parsed.tools), parsed.environment, TOOLS_FILE)

    def _check_tool(self, tool: ToolDefinition, where: tuple, line_of: Any) -> None:
        """A tool's schema, the parameters its placeholders and matches name, and its
        Python function."""

        def report(loc: tuple, message: str) -> None:
            at = (*where, *loc)
            self.problem(TOOLS_FILE, line_of(at), ".".join(str(p) for p in at), message)

        parameters = tool.parameters
        wrong = _schema_problem(parameters)
        if wrong is None and parameters.get("type") != "object":
            wrong = "must be a JSON schema of type object (the arguments are an object)"
        if wrong is not None:
            report(("parameters",), wrong)
        properties = parameters.get("properties")
        names = set(properties) if isinstance(properties, dict) else set()
        listed = ", ".join(sorted(names)) or "none"

        def check_names(loc: tuple, used: Iterable[str], what: str) -> None:
            for name in used:
                if name not in names:
                    report(loc, f"{what} {name!r} is not a parameter of {tool.name!r} "
                                f"(parameters: {listed})")  # fmt: skip

        for j, operation in enumerate(tool.operations or []):
            at = ("operations", j)
            check_names((*at, "path"), _placeholders(operation.path), "placeholder")
            check_names((*at, "value"), _placeholders(operation.value), "placeholder")
            for k, check in enumerate(operation.preconditions):
                loc = (*at, "preconditions", k, "path")
                check_names(loc, _placeholders(check.path), "placeholder")
        if "result" in tool.model_fields_set:
            check_names(("result",), _placeholders(tool.result), "placeholder")
        for j, response in enumerate(tool.responses or []):
            check_names(("responses", j, "match"), response.match, "match key")
        if tool.python is not None:
            wrong = _code_problem(tool.python, self.allow_code)
            if wrong is not None:
                report(("python",), wrong)

    def _check_turn_tools(self, turn: TurnConfig, where: tuple, line_of: Any) -> None:
        """A turn's tools and tool_choice name declared tools; none without tools.yml."""
        fields = [
            f for f in ("tools", "tool_choice", "max_tool_rounds") if getattr(turn, f) is not None
        ]
        for field in fields:
            at = (*where, field)
            if self.tools_file is None:
                self.no_tools(self.CONFIG, line_of(at), ".".join(str(p) for p in at))
        if self.tools is None:
            return
        declared = self.tools.names
        listed = ", ".join(declared)
        dotted = ".".join(str(p) for p in where)
        for name in turn.tools or ():
            if name not in declared:
                self.problem(
                    self.CONFIG,
                    line_of((*where, "tools")),
                    f"{dotted}.tools",
                    f"unknown tool {name!r} (tools: {listed})",
                )
        choice = turn.tool_choice
        at = (self.CONFIG, line_of((*where, "tool_choice")), f"{dotted}.tool_choice")
        if choice is not None and choice not in TOOL_CHOICES:
            if choice not in declared:
                self.problem(
                    *at, f"{choice!r} is not {', '.join(TOOL_CHOICES)} or a tool (tools: {listed})"
                )
            elif turn.tools is not None and choice not in turn.tools:
                self.problem(*at, f"names {choice!r}, which the turn's tools leave out")
        elif choice == "required" and turn.tools == []:
            self.problem(*at, "requires a tool, but the turn offers none (tools: [])")

    def _check_scenario_tools(self, sc: Scenario, turn_ids: set[str], lineno: int) -> None:
        """A scenario's tool fields: expected calls name the pack's tools (when it
        declares some: an application under test may call tools of its own) and the
        flow's turns; final-state checks take no placeholders."""
        names = self.tools.names if self.tools is not None else None
        for k, expected in enumerate(sc.expected_tool_calls):
            if names is not None and expected.name not in names:
                self.problem(
                    self.DATA,
                    lineno,
                    f"expected_tool_calls.{k}.name",
                    f"unknown tool {expected.name!r} (tools: {', '.join(names)})",
                )
            if expected.turn_id is not None and expected.turn_id not in turn_ids:
                self.problem(
                    self.DATA,
                    lineno,
                    f"expected_tool_calls.{k}.turn_id",
                    f"unknown turn {expected.turn_id!r} (turns: {', '.join(sorted(turn_ids))})",
                )
        for k, check in enumerate(sc.final_state):
            if PLACEHOLDER.search(check.path):
                self.problem(
                    self.DATA,
                    lineno,
                    f"final_state.{k}.path",
                    "placeholders take a call's arguments: a final state has none",
                )

    def _flow_notes(self, flows: dict[str, PreparedFlow]) -> Iterator[str]:
        for name, prepared in flows.items():
            limit, count = prepared.flow.max_turns, len(prepared.turns)
            if limit is not None and limit < count:
                yield (
                    f"{self.CONFIG}: flow {name!r} has {counted(count, 'turn')} but max_turns "
                    f"{limit}: "
                    f"the turns after the first {limit} that run are skipped"
                )

    def _note_skip(self, conv: Conversation, turn: PreparedTurn, missing: frozenset[str]) -> None:
        """Note that ``conv`` will skip the optional ``turn``, for the first
        NOTES_PER_TURN scenarios that do; the rest are counted."""
        key = (conv.flow.scenario_type, turn.turn_id)
        self.skips[key] += 1
        if self.skips[key] <= NOTES_PER_TURN:
            self.skip_notes.append(
                f"{conv.source}: optional turn {turn.turn_id!r} will be skipped "
                f"(no {', '.join(sorted(missing))})"
            )

    def _more_skips(self) -> Iterator[str]:
        for (flow, turn_id), count in self.skips.items():
            if count > NOTES_PER_TURN:
                yield (
                    f"{self.DATA}: optional turn {turn_id!r} of flow {flow!r} will be skipped "
                    f"in {count - NOTES_PER_TURN:,} more scenarios too ({count:,} in all)"
                )


# -- single-turn --------------------------------------------------------------------


class RawRow(NamedTuple):
    """A dataset row before validation: its number (1-based), where it is reported (a
    file and line, or ``FILE row N`` and no line) and its problem fields."""

    number: int
    file: str
    line: int | None
    value: Any


class ProblemRow(NamedTuple):
    """A validated problem and where it came from."""

    number: int
    file: str
    line: int | None
    problem: Problem

    @property
    def source(self) -> str:
        """``problems.csv:7``, or ``problems.parquet row 7``."""
        return self.file if self.line is None else f"{self.file}:{self.line}"

    @property
    def where(self) -> str:
        """``line 7``, or ``row 7``."""
        return f"row {self.number}" if self.line is None else f"line {self.line}"


def _renamed(raw: Any, columns: dict[str, str]) -> Any:
    """A JSONL line's object with ``dataset.columns`` applied (field <- key)."""
    if not columns or not isinstance(raw, dict):
        return raw
    moved = {field: raw[key] for field, key in columns.items() if key in raw}
    return {**{k: v for k, v in raw.items() if k not in columns.values()}, **moved}


class Shot(NamedTuple):
    """A problem as a few-shot example shows it."""

    question: str
    answer: str


class _Languages(NamedTuple):
    """The problems a pack runs after its language filter, and what the filter did."""

    problems: list[ProblemRow]
    notes: tuple[str, ...]


class _SingleTurnLoader(_Loader):
    CONFIG = "config.yml"

    def __init__(self, folder: Path, options: LoadOptions) -> None:
        super().__init__(folder, options)
        self.num_fewshot = options.num_fewshot
        self.context_mode = options.context_mode
        self.seed = DEFAULT_SAMPLE_SEED if options.seed is None else options.seed
        self.digest.update(f"num_fewshot={self.num_fewshot}\0".encode())

    def load(self) -> Pack:
        data, root = self.read_yaml(self.CONFIG)
        line_of = lambda loc: _yaml_line(root, loc)  # noqa: E731
        config = (
            self.validate(SingleTurnConfig, data, self.CONFIG, line_of)
            if data is not None
            else None
        )
        if config is None:
            if data is None and not self.problems:
                self.problem(self.CONFIG, None, None, "is empty")
            raise self.error()
        metrics = config.metrics.primary + config.metrics.secondary
        self.check_metrics(
            config.metrics.primary, self.CONFIG, line_of(("metrics", "primary")), "metrics.primary"
        )
        self.check_metrics(
            config.metrics.secondary,
            self.CONFIG,
            line_of(("metrics", "secondary")),
            "metrics.secondary",
        )
        both = [m for m in config.metrics.secondary if m in config.metrics.primary]
        if both:
            self.problem(
                self.CONFIG,
                line_of(("metrics", "secondary")),
                "metrics.secondary",
                f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} also in metrics.primary: "
                "a metric has one tier",
            )
        modes = config.evaluation_config.context_modes
        mode = self.context_mode or ("full_context" if "full_context" in modes else modes[0])
        if mode not in modes:
            raise ConfigError(
                f"{self.folder.name}: context mode {mode!r} is not one of the pack's "
                f"evaluation_config.context_modes ({', '.join(modes)})"
            )
        self.digest.update(f"context_mode={mode}\0".encode())
        template = self._template(config, line_of)
        problems = self._problems(config, data, line_of)
        problems, language_notes = self._languages(config, problems, line_of)
        if template is None or self.problems:
            raise self.error()
        problems = self._sample(config, problems)  # among the problems the filter kept
        flow = Flow(
            max_turns=1,
            conversation_timeout=300.0,
            metrics=metrics,
            turns=[
                TurnConfig(
                    turn_id=SINGLE_TURN_ID,
                    prompt_template=template.source,
                    config=TurnSettings(
                        max_tokens=config.max_tokens, temperature=config.temperature
                    ),
                )
            ],
        )
        prepared = PreparedFlow("single_turn", flow, (PreparedTurn(flow.turns[0], 0, template),))
        conversations = []
        shots = (
            [Shot(r.problem.question, r.problem.expected_answer) for r in problems]
            if self.num_fewshot
            else []
        )
        problems.reverse()  # popped from the end: each is freed once its scenario is built
        for i in range(len(problems)):
            row = problems.pop()
            problem = row.problem
            variables: dict[str, Any] = {
                "question": problem.question,
                "context": _context(problem.context, mode),
                "difficulty": problem.difficulty or "",
                "domain": problem.domain or "",
                "examples": self._examples(shots, i),
            }
            # model_construct: "context" is a built-in name in multi-turn packs only.
            scenario = Scenario.model_construct(
                scenario_id=problem.id or f"{config.task_name}-{row.number}",
                scenario_type="single_turn",
                scenario_description=config.description,
                variables=variables,
                system_prompt=config.system_prompt,
                difficulty=problem.difficulty,
                facts=[],
                probes=[],
                goal=None,
                required_keywords=problem.required_keywords,
                reference_responses={SINGLE_TURN_ID: problem.expected_answer},
                tags=problem.tags,
                metadata={
                    **problem.metadata,
                    "domain": problem.domain,
                    **({"language": problem.language} if problem.language else {}),
                },
            )
            conv = Conversation(scenario, prepared, "single_turn", row.source)
            self.check_render(conv, prepared.turns[0], row.file, row.line)
            conversations.append(conv)
        return self.finish(
            kind="single_turn",
            conversations=tuple(conversations),
            metrics=tuple(metrics),
            notes=(*language_notes, *self.notes),
            dataset=self.dataset,
            metric_tiers=_tiers(config),
        )

    def _template(self, config: SingleTurnConfig, line_of: Any) -> Template | None:
        name = "with_examples" if self.num_fewshot else "default"
        source = getattr(config.prompt_templates, name)
        for other in ("default", "with_examples"):
            text = getattr(config.prompt_templates, other)
            if text is None:
                continue
            loc = ("prompt_templates", other)
            parsed = self.parse_template(text, self.CONFIG, line_of(loc), ".".join(loc))
            if parsed is not None:
                unknown = parsed.fields - SINGLE_TURN_VARIABLES
                if unknown:
                    self.problem(
                        self.CONFIG,
                        line_of(loc),
                        ".".join(loc),
                        f"unknown variable {', '.join('{' + u + '}' for u in sorted(unknown))}; "
                        f"single-turn templates may use {', '.join(sorted(SINGLE_TURN_VARIABLES))}",
                    )
        if source is None:
            self.problem(
                self.CONFIG,
                line_of(("prompt_templates",)),
                "prompt_templates.with_examples",
                "is needed for --num-fewshot",
            )
            return None
        return Template.parse(source) if not self.problems else None

    def _problems(
        self, config: SingleTurnConfig, data: dict[str, Any], line_of: Any
    ) -> list[ProblemRow]:
        """Every problem of the dataset, validated; a problem for each that is not."""
        dataset = config.dataset
        self.dataset: dict[str, Any] = {"format": dataset.format, "path": dataset.file}
        if not self._dataset_fields_fit(dataset, data, line_of):
            return []
        levels = config.evaluation_config.difficulty_levels
        problems: list[ProblemRow] = []
        seen: dict[str, ProblemRow] = {}
        for number, file, line, raw in self._rows(dataset, data, line_of):
            problem = self.validate(Problem, raw, file, lambda loc, n=line: n)
            if problem is None:
                continue
            row = ProblemRow(number, file, line, problem)
            pid = problem.id or f"{config.task_name}-{number}"
            if pid in seen:
                first = seen[pid]
                self.problem(file, line, "id", f"duplicate {pid!r} (first on {first.where})")
                continue
            seen[pid] = row
            if levels and problem.difficulty is not None and problem.difficulty not in levels:
                self.problem(
                    file,
                    line,
                    "difficulty",
                    f"{problem.difficulty!r} is not one of evaluation_config.difficulty_levels "
                    f"({', '.join(levels)})",
                )
            for wrong in code_tests_problems(problem.metadata, {SINGLE_TURN_ID}):
                self.problem(file, line, wrong.field, wrong.message)
            problems.append(row)
        if not problems and not self.problems:
            self.problem(dataset.file, None, None, "holds no problems")
        return problems

    def _dataset_fields_fit(self, dataset: DatasetConfig, data: Any, line_of: Any) -> bool:
        """Whether the dataset's settings fit its format: ``name`` (and ``config``,
        ``split``, ``revision``) for hf, ``path`` for the others."""
        given = set(data["dataset"]) if isinstance(data.get("dataset"), dict) else set()
        hf_only = ("name", "config", "split", "revision")
        wrong = [f for f in hf_only if f in given] if dataset.format != "hf" else []
        if dataset.format == "hf":
            wrong = ["path"] if "path" in given else []
            if not dataset.name:
                self.problem(
                    self.CONFIG,
                    line_of(("dataset", "format")),
                    "dataset.name",
                    "format hf needs the dataset's name (a hub name or a folder in the pack)",
                )
                return False
        for field in wrong:
            self.problem(
                self.CONFIG,
                line_of(("dataset", field)),
                f"dataset.{field}",
                f"does not apply to format {dataset.format}"
                + (" (hf reads dataset.name)" if field == "path" else " (hf only)"),
            )
        return not wrong

    def _rows(self, dataset: DatasetConfig, data: dict[str, Any], line_of: Any) -> Iterator[RawRow]:
        """The dataset's rows, each with where a problem in it is reported."""
        named = isinstance(data.get("dataset"), dict) and "path" in data["dataset"]
        at = Where(self.CONFIG, line_of(("dataset", "path")), "dataset.path") if named else None
        file, fields = dataset.file, Problem.model_fields.keys()
        if dataset.format == "jsonl":
            for lineno, raw in self.read_jsonl(file, at):
                yield RawRow(lineno, file, lineno, _renamed(raw, dataset.columns))
            return
        if dataset.format == "hf":
            try:
                hf = open_hf(dataset, self.root, fields=fields, on_row=self.digest.update)
            except FileProblem as exc:
                self._dataset_problem(exc, line_of)
                return
            self.dataset = hf.source
            self.digest.update(json.dumps(hf.source, sort_keys=True).encode() + b"\0")
            rows: Iterator[DatasetRow] = hf.rows
            label = hf.label
        else:
            try:
                fh = open_pack_file(self.root, str(self.folder / file), self.max_file_bytes)
            except (OSError, FileProblem) as exc:
                self.file_problem(file, at, exc)
                return
            with fh:
                self.digest.update(file.encode() + b"\0")
                if dataset.format == "csv":
                    rows = read_csv(
                        fh,
                        fields=fields,
                        columns=dataset.columns,
                        max_bytes=self.max_file_bytes,
                        max_line_bytes=self.max_line_bytes,
                        on_bytes=self.digest.update,
                    )
                    yield from self._located(rows, file, by_line=True)
                    return
                content = fh.read(self.max_file_bytes + 1)
            self.digest.update(content + b"\0")
            rows = read_parquet(content, fields=fields, columns=dataset.columns)
            label = file
        yield from self._located(rows, label, by_line=False)

    def _located(self, rows: Iterator[DatasetRow], label: str, by_line: bool) -> Iterator[RawRow]:
        """The rows that parsed, with where they are; a problem for each other row, and
        for a problem that ends the reading (a CSV line too long)."""
        try:
            for row in rows:
                file = label if by_line else f"{label} row {row.number}"
                line = row.number if by_line else None
                if row.problem is not None:
                    self.problem(file, line, row.problem.field, row.problem.message)
                else:
                    yield RawRow(row.number, file, line, row.value)
        except FileProblem as exc:
            self.problem(label, exc.line, exc.field, exc.message)
        except OSError as exc:
            self.problem(label, None, None, f"cannot read {label}: {exc.strerror}")

    def _dataset_problem(self, exc: FileProblem, line_of: Any) -> None:
        """A dataset that cannot be opened, reported at the setting that names it."""
        field = f"dataset.{exc.field or 'name'}"
        if exc.field in Problem.model_fields:  # a column, not a setting
            field = f"dataset.columns.{exc.field}"
        self.problem(self.CONFIG, line_of(tuple(field.split(".")[:2])), field, exc.message)

    def _sample(self, config: SingleTurnConfig, problems: list[ProblemRow]) -> list[ProblemRow]:
        """The problems ``dataset.size`` asks for, drawn by the run's seed, with a note
        saying so (and a note when it asks for more than there are)."""
        self.notes: list[str] = []
        size = config.dataset.size
        picked = sample(len(problems), size, self.seed)
        if picked.note is not None:
            label = self.dataset.get("path") or self.dataset.get("name") or config.dataset.file
            self.notes.append(f"{label}: {picked.note}")
        if len(picked.positions) < len(problems):
            self.digest.update(f"size={size}\0seed={self.seed}\0".encode())
            self.dataset = {**self.dataset, "size": size, "rows": len(problems), "seed": self.seed}
            self.dataset["sampled"] = picked.note
            problems = [problems[i] for i in picked.positions]
        if self.num_fewshot and self.num_fewshot >= len(problems):
            self.problem(
                self.CONFIG,
                None,
                None,
                f"--num-fewshot {self.num_fewshot} needs more than "
                f"{counted(self.num_fewshot, 'problem')}",
            )
            raise self.error()
        return problems

    def _languages(
        self, config: SingleTurnConfig, problems: list[ProblemRow], line_of: Any
    ) -> _Languages:
        """Each problem with its language (its ``language``, else ``metadata.language``)
        and, when config.yml lists ``evaluation_config.languages``, only the problems
        in one of them or in none; a note counts the ones left out."""
        file = config.dataset.file
        resolved: list[ProblemRow] = []
        for row in problems:
            problem, lineno = row.problem, row.line
            given = problem.metadata.get("language")
            if given is None:
                resolved.append(row)
                continue
            if not isinstance(given, str) or not re.fullmatch(LANGUAGE_PATTERN, given):
                self.problem(
                    row.file,
                    lineno,
                    "metadata.language",
                    f"{given!r} is not a language tag (e.g. en, pt-BR)",
                )
            elif problem.language is not None and problem.language != given:
                self.problem(
                    row.file,
                    lineno,
                    "metadata.language",
                    f"{given!r} differs from language {problem.language!r}: give one",
                )
            else:
                resolved.append(
                    row._replace(problem=problem.model_copy(update={"language": given}))
                )
        evaluation = config.evaluation_config
        if "languages" not in evaluation.model_fields_set or self.problems:
            return _Languages(resolved, ())
        wanted = evaluation.languages
        folded = {w.casefold() for w in wanted}  # language tags are case-insensitive

        def keeps(language: str | None) -> bool:
            return language is None or language.casefold() in folded

        kept = [r for r in resolved if keeps(r.problem.language)]
        left_out = collections.Counter(
            r.problem.language
            for r in resolved
            if r.problem.language is not None and not keeps(r.problem.language)
        )
        where = line_of(("evaluation_config", "languages"))
        if not kept:
            self.problem(
                self.CONFIG,
                where,
                "evaluation_config.languages",
                f"{', '.join(wanted)} keeps none of the {counted(len(resolved), 'problem')} "
                f"of {file} (their languages: {', '.join(sorted(left_out))})",
            )
            return _Languages(kept, ())
        if self.num_fewshot and self.num_fewshot >= len(kept):
            self.problem(
                self.CONFIG,
                where,
                "evaluation_config.languages",
                f"--num-fewshot {self.num_fewshot} needs more than the "
                f"{counted(len(kept), 'problem')} in {', '.join(wanted)} or in no language",
            )
        if not left_out:
            return _Languages(kept, ())
        dropped = sum(left_out.values())
        by_language = ", ".join(f"{n} in {lang}" for lang, n in sorted(left_out.items()))
        at = self.CONFIG if where is None else f"{self.CONFIG}:{where}"
        note = (
            f"{at}: evaluation_config.languages ({', '.join(wanted)}) keeps "
            f"{len(kept)} of {counted(len(resolved), 'problem')}; {dropped} left out "
            f"({by_language})"
        )
        return _Languages(kept, (note,))

    def _examples(self, shots: list[Shot], i: int) -> str:
        """``num_fewshot`` other problems as examples for problem ``i``, the same ones
        each time. Samples positions among the others, as sampling a list of the others
        would, without building that list for every problem."""
        if not self.num_fewshot:
            return ""
        positions = random.Random(f"fewshot:{i}").sample(range(len(shots) - 1), self.num_fewshot)
        picked = (shots[j if j < i else j + 1] for j in positions)
        return "\n\n".join(f"Question: {p.question}\nAnswer: {p.answer}" for p in picked)


class _RowsLoader(_SingleTurnLoader):
    """A single-turn pack whose config and problems a pack source has read already."""

    def __init__(
        self,
        name: str,
        config: Mapping[str, Any],
        rows: Iterable[tuple[int, Any]],
        source: str,
        folder: Path,
        options: LoadOptions,
    ) -> None:
        super().__init__(folder, options)
        self.CONFIG = f"{name} config"
        self.name, self.config, self.rows, self.source = name, config, rows, source

    def read_yaml(self, name: str) -> ParsedYaml:
        self.digest.update(json.dumps(self.config, sort_keys=True, default=str).encode() + b"\0")
        return ParsedYaml(dict(self.config), None)

    def describe(self) -> str:
        return str(self.config.get("description", ""))

    def _rows(self, dataset: DatasetConfig, data: dict[str, Any], line_of: Any) -> Iterator[RawRow]:
        self.dataset = {"format": self.name.partition(":")[0] or "source", "path": self.source}
        given = data.get("dataset")
        given = given if isinstance(given, dict) else {}
        for field in ("format", "path", "name", "config", "split", "revision"):
            if field in given:
                self.problem(
                    self.CONFIG,
                    None,
                    f"dataset.{field}",
                    "does not apply: the pack source reads the problems",
                )
        for line, raw in self.rows:
            self.digest.update(json.dumps(raw, sort_keys=True, default=str).encode() + b"\n")
            yield RawRow(line, self.source, line, _renamed(raw, dataset.columns))


def problems_pack(
    name: str,
    config: Mapping[str, Any],
    problems: Iterable[tuple[int, Any]],
    *,
    source: str,
    options: LoadOptions,
    path: Path = Path("."),
) -> Pack:
    """A single-turn pack from problems a pack source read from a format of its own,
    validated as a pack folder's ``config.yml`` and problems are: ``dataset.size``
    samples by ``options.seed``, the prompt templates are checked, and every problem
    names where it was (``source`` and its line).

    Args:
        name: the pack's name (``PREFIX:NAME``, as it was asked for).
        config: what a ``config.yml`` would hold (``task_name``, ``prompt_templates``,
            ``metrics``, ...); ``dataset.format`` and ``dataset.path`` do not apply.
        problems: each problem's fields (``question``, ``expected_answer``, ...) with
            the line of ``source`` it came from (1-based).
        source: the file (or other place) the problems were read from, for messages.
        options: the options the source was given.
        path: the folder the pack stands for (the manifest's ``pack_path``).

    Raises:
        PackError: the config or a problem is invalid; each problem names its place.
        ConfigError: a load option the pack cannot take (a context mode it lacks).
    """
    loader = _RowsLoader(name, config, problems, source, path, options)
    pack = loader.load()
    return dataclasses.replace(pack, name=name, path=path)
