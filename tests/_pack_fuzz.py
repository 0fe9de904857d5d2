"""Mutated scenario packs for property-based tests: valid packs of both formats changed
one way each (a dropped field, a wrong type, a huge or deep value, odd Unicode, a YAML
oddity, template injection), and how ``convsim validate`` answered them.

Shared by tests/test_pack_fuzz.py (a few hundred cases in the suite) and
tests/bench/bench_pack_fuzz.py (long runs, counts by outcome).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from hypothesis import strategies as st

from convsim.cli import main
from convsim.scenarios import BUNDLED_PACKS_DIR

#: Stands for a value written as raw text (deep, huge, or not representable).
RAW = "RAWVALUE0ZQX"


@dataclass(frozen=True)
class Seed:
    """A valid pack: its config file (YAML) and its data file (JSONL)."""

    kind: str
    config_name: str
    data_name: str
    config: Any
    rows: tuple[dict[str, Any], ...]


def _seeds() -> tuple[Seed, ...]:
    multi = BUNDLED_PACKS_DIR / "customer_support"
    single = BUNDLED_PACKS_DIR / "single_turn_qa"

    def rows(path: Path, n: int) -> tuple[dict[str, Any], ...]:
        lines = path.read_text(encoding="utf-8").splitlines()
        return tuple(json.loads(line) for line in lines[:n])

    return (
        Seed(
            "multi_turn",
            "turn_configs.yml",
            "scenarios.jsonl",
            yaml.safe_load((multi / "turn_configs.yml").read_text(encoding="utf-8")),
            rows(multi / "scenarios.jsonl", 3),
        ),
        Seed(
            "single_turn",
            "config.yml",
            "problems.jsonl",
            yaml.safe_load((single / "config.yml").read_text(encoding="utf-8")),
            rows(single / "problems.jsonl", 4),
        ),
    )


SEEDS = _seeds()

INJECTIONS = [
    "{x.__class__.__mro__}",
    "{customer_name.__init__.__globals__}",
    "{0}",
    "{}",
    "{customer_name!r}",
    "{customer_name:{width}}",
    "{customer_name:%Y}",
    "{question:%Y}",
    "{question:,}",
    "{turn_index:%Y}",
    "{turn_index:>999}",
    "{context:d}",
    "{scenario:x}",
    "{order_id:.2f}",
    "{{unbalanced",
    "}",
    "{",
    "{" * 500,
    "{__import__}",
    "{examples[0]}",
    "{{customer_name}}",
    "${jndi:ldap://127.0.0.1/x}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
]

ODD_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec=None, categories=["Cs", "Co", "Cn", "Zl", "Zp", "Cc"]), max_size=8),
    st.sampled_from(["\ud83d", "\udc00x", "\u2028", "\x00", "\ufeff", "e\u0301", "🙂" * 50]),
)

#: Raw text for values JSON or YAML writers cannot produce, or that are huge or deep.
RAW_VALUES = st.one_of(
    st.integers(4000, 6000).map(lambda n: "9" * n),
    st.integers(300, 400).map(lambda n: "1" + "0" * n),
    st.integers(50, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(50, 3000).map(lambda n: '{"a": ' * n + "1" + "}" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", '"\\ud83d"', '"\\udc00"']),
)

#: Raw text that only YAML would read (tags, aliases, odd scalars).
RAW_YAML = st.sampled_from(
    [
        "!!python/object/apply:os.system ['true']",
        "!!python/name:os.system",
        "!!binary aGVsbG8=",
        "!!set {a, b}",
        "!!timestamp 2024-13-45",
        "2024-02-30",
        "*nowhere",
        "&a [*a]",
        ".nan",
        ".inf",
        "0x" + "f" * 5000,
        "0b" + "1" * 20000,
        "1:2:3:4:5",
        "~",
        "!custom tag",
        "? [a]\n  : b",
        "'" + "x" * 100_000 + "'",
    ]
)

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(),
    ODD_TEXT,
    st.sampled_from(INJECTIONS),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(10_000, 1_000_000).map(lambda n: "x" * n),
    st.just(RAW),
)

#: Whole-file YAML oddities: (name, text) of the config file.
BOMB = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON-like value (the empty path is the value itself)."""
    out = [prefix]
    if isinstance(value, dict):
        for key, sub in value.items():
            out.extend(_paths(sub, (*prefix, key)))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            out.extend(_paths(sub, (*prefix, i)))
    return out


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _mutated(value: Any, path: tuple[Any, ...], op: str, new: Any) -> Any:
    """``value`` with the thing at ``path`` dropped, replaced, or given an extra key."""
    value = _copy(value)
    if not path:
        return new if op == "replace" else value
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if op == "drop":
        del parent[last]
    elif op == "replace":
        parent[last] = new
    elif op == "extra" and isinstance(parent[last], dict):
        parent[last]["unexpected_field"] = new
    elif op == "duplicate" and isinstance(parent, list):
        parent.insert(last, _copy(parent[last]))
    elif op == "rename" and isinstance(parent, dict):
        parent[f"{last}_x"] = parent.pop(last)
    return value


@dataclass(frozen=True)
class Case:
    """A pack to validate: its files, and what was changed."""

    kind: str
    files: dict[str, bytes]
    change: str


@st.composite
def cases(draw: Callable[..., Any]) -> Case:
    """A valid pack of either format, changed in one way."""
    seed: Seed = draw(st.sampled_from(SEEDS))
    target = draw(st.sampled_from(["config", "data", "config", "data", "yaml_text", "data_text"]))
    raw = draw(st.one_of(RAW_VALUES, RAW_YAML)) if target == "config" else draw(RAW_VALUES)
    config_text = yaml.safe_dump(seed.config, sort_keys=False, allow_unicode=True)
    rows = [json.dumps(r) for r in seed.rows]
    change = ""
    if target in ("config", "data"):
        op = draw(st.sampled_from(["drop", "replace", "replace", "extra", "duplicate", "rename"]))
        new = draw(VALUES)
        if target == "config":
            path = draw(st.sampled_from(_paths(seed.config)))
            if isinstance(path[-1:], tuple) and path and path[-1] == "prompt_template":
                new = draw(st.one_of(st.just(new), st.sampled_from(INJECTIONS)))
            changed = _mutated(seed.config, path, op, new)
            try:
                config_text = yaml.safe_dump(changed, sort_keys=False, allow_unicode=True)
            except (yaml.YAMLError, UnicodeEncodeError):
                config_text = yaml.safe_dump(changed, sort_keys=False)
            config_text = config_text.replace(RAW, raw)
        else:
            i = draw(st.integers(0, len(seed.rows) - 1))
            path = draw(st.sampled_from(_paths(seed.rows[i])))
            rows[i] = json.dumps(_mutated(seed.rows[i], path, op, new)).replace(f'"{RAW}"', raw)
        change = f"{target} {op} {'.'.join(map(str, path)) or '(all)'} = {_short(new, raw)}"
    elif target == "yaml_text":
        how = draw(
            st.sampled_from(["bomb", "dup", "listkey", "tab", "docs", "cut", "bytes", "tag"])
        )
        lines = config_text.splitlines(keepends=True)
        at = draw(st.integers(0, max(0, len(lines) - 1)))
        if how == "bomb":
            config_text = BOMB + config_text
        elif how == "dup":
            config_text += lines[0] if lines else ""
        elif how == "listkey":
            config_text = "? [a, b]\n: c\n" + config_text
        elif how == "tab":
            lines[at] = "\t" + lines[at]
            config_text = "".join(lines)
        elif how == "docs":
            config_text += "---\n" + config_text
        elif how == "cut":
            config_text = config_text[: draw(st.integers(0, len(config_text)))]
        elif how == "tag":
            config_text = config_text.replace(": ", f": {draw(RAW_YAML)} ", 1)
        change = f"yaml_text {how} at line {at + 1}"
        if how == "bytes":
            junk = draw(st.binary(min_size=1, max_size=8))
            data = config_text.encode("utf-8")
            cut = draw(st.integers(0, len(data)))
            return Case(
                seed.kind,
                {seed.config_name: data[:cut] + junk + data[cut:], seed.data_name: _jsonl(rows)},
                f"yaml_text bytes {junk!r} at byte {cut}",
            )
    else:
        i = draw(st.integers(0, len(rows) - 1))
        how = draw(st.sampled_from(["raw", "cut", "array", "blank", "crlf", "dup"]))
        if how == "raw":
            rows[i] = raw
        elif how == "cut":
            rows[i] = rows[i][: draw(st.integers(0, len(rows[i])))]
        elif how == "array":
            rows[i] = f"[{rows[i]}]"
        elif how == "blank":
            rows.insert(i, "   ")
        elif how == "crlf":
            rows[i] += "\r"
        elif how == "dup":
            rows.insert(i, rows[i])
        change = f"data_text {how} at line {i + 1}"
    files = {seed.config_name: config_text.encode("utf-8", "surrogatepass")}
    files[seed.data_name] = _jsonl(rows)
    return Case(seed.kind, files, change)


def _jsonl(rows: list[str]) -> bytes:
    return ("\n".join(rows) + "\n").encode("utf-8", "surrogatepass")


def _short(value: Any, raw: str) -> str:
    text = raw if value == RAW else repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} chars)"


class Outcome(Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused with a located message"
    OTHER = "other (traceback, wrong exit code, or unlocated message)"


#: A located refusal: a pack file named, with its line when the problem has one.
_LOCATED = re.compile(r"(turn_configs\.yml|scenarios\.jsonl|config\.yml|problems\.jsonl)\S*: ")


@dataclass(frozen=True)
class Answer:
    outcome: Outcome
    exit_code: int
    output: str


def validate(case: Case) -> Answer:
    """``convsim validate`` on the case's pack folder, classified."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "pack"
        folder.mkdir()
        for name, data in case.files.items():
            (folder / name).write_bytes(data)
        result = CliRunner().invoke(main, ["validate", str(folder)])
    output = result.stdout + result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        trace = "".join(traceback.format_exception(result.exception))
        return Answer(Outcome.OTHER, result.exit_code, output + trace)
    if result.exit_code == 0 and output.startswith("ok: "):
        return Answer(Outcome.ACCEPTED, 0, output)
    if result.exit_code == 2 and "Traceback" not in output and _LOCATED.search(output):
        return Answer(Outcome.REFUSED, 2, output)
    return Answer(Outcome.OTHER, result.exit_code, output)


class RunOutcome(Enum):
    RAN = "ran, no internal error"
    BROKE = "failed at run time (exit code, internal error, or a metric that raised)"


def run(case: Case) -> tuple[RunOutcome, str]:
    """``convsim run`` of an accepted case with the scripted model (3 conversations):
    what passed validation must not fail at run time because of the pack."""
    from convsim import read_results

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "pack"
        folder.mkdir()
        for name, data in case.files.items():
            (folder / name).write_bytes(data)
        out = Path(tmp) / "r.jsonl"
        args = ["run", str(folder), "--out", str(out), "--limit", "3", "--no-progress"]
        result = CliRunner().invoke(main, [*args, "--user-model", "scripted"])
        output = result.stdout + result.stderr
        if result.exit_code != 0 or not out.exists():
            return RunOutcome.BROKE, f"exit {result.exit_code}\n{output}"
        for r in read_results(out):
            if r.termination_reason is not None and r.termination_reason.value == "internal_error":
                return RunOutcome.BROKE, f"{r.conversation_id}: {r.error}"
            for name, score in r.scores.items():
                if score.status == "failed" and "judge" not in (score.reason or ""):
                    return RunOutcome.BROKE, f"{r.conversation_id}: {name}: {score.reason}"
    return RunOutcome.RAN, output
