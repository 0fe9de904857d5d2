"""Tests of scenario pack loading and validation (``convsim.scenarios.load_pack``)."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from convsim import ConfigError, PackError, PackProblem, load_pack
from convsim.scenarios import BUILTIN_VARIABLES, BUNDLED_PACKS_DIR, Pack, list_packs

GUIDE = Path(__file__).parent / "data" / "guide_example"

SCENARIOS = "scenarios.jsonl"
TURNS = "turn_configs.yml"
CONFIG = "config.yml"
PROBLEMS = "problems.jsonl"

BUNDLED = {
    "customer_support": "multi_turn",
    "multi_session_memory": "multi_turn",
    "coding_help": "multi_turn",
    "order_desk": "multi_turn",
    "single_turn_qa": "single_turn",
}

# -- helpers ------------------------------------------------------------------------

#: A valid two-turn flow: "greet" uses {name}; "follow_up" depends on it.
FLOW = textwrap.dedent(
    """\
    default:
      max_turns: 4
      turns:
        - turn_id: greet
          prompt_template: "Hello {name}, what brings you here?"
        - turn_id: follow_up
          depends_on: [greet]
          prompt_template: "Tell me more about that."
    """
)


def scenario(sid: str = "s1", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "scenario_id": sid,
        "scenario_description": f"scenario {sid}",
        "variables": {"name": "Ada"},
    }
    base.update(fields)
    return base


def jsonl(rows: Iterable[dict[str, Any] | str]) -> str:
    """One JSON object per line; str rows are written verbatim (for malformed lines)."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def write_multi(
    folder: Path,
    flows: str | None = FLOW,
    rows: Iterable[dict[str, Any] | str] | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if flows is not None:
        (folder / TURNS).write_text(flows, encoding="utf-8")
    (folder / SCENARIOS).write_text(
        jsonl(rows if rows is not None else [scenario()]), encoding="utf-8"
    )
    return folder


SINGLE_CONFIG = textwrap.dedent(
    """\
    task_name: tiny_qa
    description: A tiny question answering task
    metrics:
      primary: [exact_match]
    evaluation_config:
      difficulty_levels: [easy, hard]
    prompt_templates:
      default: "Q: {question}\\nA:"
      with_examples: "{examples}\\n\\nQuestion: {question}\\nAnswer:"
    """
)


def problem(i: int, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": f"p{i}",
        "question": f"What is the colour of item {i}?",
        "expected_answer": f"colour-{i}",
        "difficulty": "easy",
    }
    base.update(fields)
    return base


def write_single(
    folder: Path,
    config: str | None = SINGLE_CONFIG,
    rows: Iterable[dict[str, Any] | str] | None = None,
    *,
    with_problems: bool = True,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / CONFIG).write_text(config, encoding="utf-8")
    if with_problems:
        rows = rows if rows is not None else [problem(i) for i in range(3)]
        (folder / PROBLEMS).write_text(jsonl(rows), encoding="utf-8")
    return folder


def lineno(text: str, needle: str) -> int:
    """The 1-based line of the only line of ``text`` containing ``needle``."""
    hits = [n for n, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def pack_problems(folder: Path, **kwargs: Any) -> list[PackProblem]:
    with pytest.raises(PackError) as info:
        load_pack(folder, **kwargs)
    assert info.value.problems, "a PackError must list its problems"
    return info.value.problems


def only_problem(folder: Path, **kwargs: Any) -> PackProblem:
    problems = pack_problems(folder, **kwargs)
    assert len(problems) == 1, "\n".join(map(str, problems))
    return problems[0]


def where(p: PackProblem) -> tuple[str, int | None, str | None]:
    return (p.file, p.line, p.field)


# -- the developer guide's example --------------------------------------------------


@pytest.fixture(scope="module")
def guide() -> Pack:
    return load_pack(GUIDE)


def test_guide_example_loads_as_multi_turn(guide: Pack) -> None:
    assert guide.kind == "multi_turn"
    assert guide.name == "guide_example"
    assert len(guide) == 3
    assert [c.conversation_id for c in guide.conversations] == [
        "budget-planning",
        "trip-planning",
        "db-migration",
    ]
    assert [c.source for c in guide.conversations] == [
        "scenarios.jsonl:1",
        "scenarios.jsonl:2",
        "scenarios.jsonl:3",
    ]


def test_guide_example_flows(guide: Pack) -> None:
    budget, trip, db = guide.conversations
    assert budget.flow.scenario_type == trip.flow.scenario_type == "default"
    assert db.flow.scenario_type == "specialized_scenario"
    assert [t.turn_id for t in budget.flow.turns] == ["introduction", "analysis", "refinement"]
    assert [t.turn_id for t in db.flow.turns] == ["deep_analysis"]
    assert budget.flow.flow.max_turns == 5
    assert budget.flow.flow.conversation_timeout == 300
    assert db.flow.flow.max_turns == 8
    assert db.flow.flow.conversation_timeout == 600
    intro, analysis, refinement = budget.flow.turns
    assert intro.config.config.temperature == 0.7
    assert intro.config.config.max_tokens == 200
    assert analysis.config.depends_on == ["introduction"]
    assert refinement.config.optional is True
    assert intro.config.evaluation_metrics == ["engagement_quality", "clarity_score"]


def test_guide_example_notes_the_optional_turn_that_will_skip(guide: Pack) -> None:
    # trip-planning (line 2) has no {topic}; budget-planning has one and db-migration's
    # flow has no refinement turn, so exactly one note.
    assert len(guide.notes) == 1
    note = guide.notes[0]
    assert note.startswith("scenarios.jsonl:2:")
    assert "'refinement'" in note
    assert "topic" in note


def test_guide_example_renders_its_templates(guide: Pack) -> None:
    budget = guide.conversations[0]
    intro = budget.flow.turns[0]
    text = budget.render(intro, [])
    assert text.startswith(
        "Welcome to personal budget planning. I'm here to help you with planning a monthly budget."
    )
    refinement = budget.flow.turns[2]
    assert budget.render(refinement, []).startswith(
        "I see you have additional questions about emergency funds."
    )


def test_guide_example_rejected_with_a_metric_registry_lacking_its_metrics() -> None:
    problems = pack_problems(GUIDE, metric_names={"accuracy"})
    assert all(p.file == TURNS and p.field.endswith("evaluation_metrics") for p in problems)
    messages = " ".join(p.message for p in problems)
    assert "'engagement_quality'" in messages
    assert "'technical_accuracy'" in messages
    assert "'accuracy'" not in messages


# -- resolving packs ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kind"), sorted(BUNDLED.items()))
def test_bundled_pack_loads_by_name(name: str, kind: str) -> None:
    pack = load_pack(name)
    assert pack.name == name
    assert pack.kind == kind
    assert len(pack) >= 10
    assert len({c.conversation_id for c in pack.conversations}) == len(pack)
    assert pack.path == BUNDLED_PACKS_DIR / name


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_pack_loads_by_folder_path_identically(name: str) -> None:
    by_name = load_pack(name)
    by_path = load_pack(BUNDLED_PACKS_DIR / name)
    by_str_path = load_pack(str(BUNDLED_PACKS_DIR / name))
    assert by_path.pack_hash == by_name.pack_hash == by_str_path.pack_hash
    assert [c.conversation_id for c in by_path.conversations] == [
        c.conversation_id for c in by_name.conversations
    ]


def test_list_packs_lists_the_bundled_packs() -> None:
    infos = {info.name: info for info in list_packs()}
    for name, kind in BUNDLED.items():
        assert infos[name].kind == kind
        assert infos[name].conversations >= 10


def test_load_pack_by_folder_path(tmp_path: Path) -> None:
    folder = write_multi(tmp_path / "my_pack", rows=[scenario("a"), scenario("b")])
    pack = load_pack(folder)
    assert pack.name == "my_pack"
    assert pack.kind == "multi_turn"
    assert [c.conversation_id for c in pack.conversations] == ["a", "b"]
    assert pack.path == folder.resolve()


def test_unknown_pack_name_is_a_config_error_listing_bundled_names() -> None:
    with pytest.raises(ConfigError) as info:
        load_pack("no_such_pack_xyz")
    message = str(info.value)
    assert "no_such_pack_xyz" in message
    for name in BUNDLED:
        assert name in message


def test_missing_folder_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a folder"):
        load_pack(tmp_path / "does_not_exist")


@pytest.mark.parametrize("files", [(), ("README.md",), ("notes.txt", "data.json")])
def test_folder_with_neither_format_is_a_config_error(
    tmp_path: Path, files: tuple[str, ...]
) -> None:
    for name in files:
        (tmp_path / name).write_text("hello\n")
    with pytest.raises(ConfigError, match="not a scenario pack") as info:
        load_pack(tmp_path)
    assert "scenarios.jsonl" in str(info.value)
    assert "problems.jsonl" in str(info.value)


def test_folder_with_both_formats_is_a_config_error(tmp_path: Path) -> None:
    write_multi(tmp_path)
    write_single(tmp_path)
    with pytest.raises(ConfigError, match="both pack formats"):
        load_pack(tmp_path)


def test_multi_turn_pack_missing_its_scenarios_file(tmp_path: Path) -> None:
    (tmp_path / TURNS).write_text(FLOW)
    p = only_problem(tmp_path)
    assert where(p) == (SCENARIOS, None, None)
    assert "missing" in p.message


# -- multi-turn: scenarios.jsonl problems ---------------------------------------------


def test_malformed_json_line(tmp_path: Path) -> None:
    folder = write_multi(
        tmp_path, rows=[scenario("a"), scenario("b"), '{"scenario_id": "c",', scenario("d")]
    )
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 3, None)
    assert "invalid JSON" in p.message


def test_blank_lines_are_skipped_but_still_counted(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), "", "   ", scenario("b", colour="red")])
    assert where(only_problem(folder)) == (SCENARIOS, 4, "colour")


def test_comment_lines_are_skipped_but_still_counted(tmp_path: Path) -> None:
    """The guide's problems.jsonl opens with a "# path" line: no JSON value starts with
    "#", so such a line is a comment."""
    rows = ["# lm_eval/tasks/my_new_task/problems.jsonl", problem(0), "  # another", problem(1)]
    assert [
        c.source for c in load_pack(write_single(tmp_path / "ok", rows=rows)).conversations
    ] == [
        "problems.jsonl:2",
        "problems.jsonl:4",
    ]
    bad = write_single(tmp_path / "bad", rows=["# a comment", problem(0, colour="red")])
    assert where(only_problem(bad)) == (PROBLEMS, 2, "colour")


def test_crlf_line_endings_keep_line_numbers(tmp_path: Path) -> None:
    write_multi(tmp_path)
    text = json.dumps(scenario("a")) + "\r\n" + json.dumps(scenario("b", colour="red")) + "\r\n"
    (tmp_path / SCENARIOS).write_bytes(text.encode())
    assert where(only_problem(tmp_path)) == (SCENARIOS, 2, "colour")


def test_unknown_field_in_a_scenario(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), scenario("b", colour="red")])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 2, "colour")
    assert p.message == "unknown field"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"variables": ["name", "Ada"]}, "variables"),
        ({"variables": "name=Ada"}, "variables"),
        ({"tags": "urgent"}, "tags"),
        ({"scenario_description": 42}, "scenario_description"),
    ],
)
def test_wrong_type_in_a_scenario(tmp_path: Path, fields: dict[str, Any], field: str) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), scenario("b", **fields)])
    assert where(only_problem(folder)) == (SCENARIOS, 2, field)


def test_line_that_is_not_an_object(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), "[1, 2]"])
    assert where(only_problem(folder))[:2] == (SCENARIOS, 2)


@pytest.mark.parametrize("missing", ["scenario_id", "scenario_description"])
def test_missing_required_field_in_a_scenario(tmp_path: Path, missing: str) -> None:
    row = scenario("b")
    del row[missing]
    folder = write_multi(tmp_path, rows=[scenario("a"), row])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 2, missing)
    assert "required" in p.message.lower()


def test_duplicate_scenario_id(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), scenario("b"), scenario("a")])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 3, "scenario_id")
    assert "'a'" in p.message
    assert "line 1" in p.message


def test_missing_template_variable_for_a_required_turn(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), scenario("b", variables={"other": "x"})])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 2, "variables")
    assert "{name}" in p.message
    assert "'greet'" in p.message
    assert "'b'" in p.message


def test_missing_variable_of_an_optional_turn_is_a_note_not_a_problem(tmp_path: Path) -> None:
    flows = (
        FLOW + '    - turn_id: extra\n      optional: true\n      prompt_template: "And {topic}?"\n'
    )
    folder = write_multi(
        tmp_path, flows, rows=[scenario("a", variables={"name": "A", "topic": "t"}), scenario("b")]
    )
    pack = load_pack(folder)
    assert len(pack) == 2
    assert pack.notes == ("scenarios.jsonl:2: optional turn 'extra' will be skipped (no topic)",)


@pytest.mark.parametrize("builtin", sorted(BUILTIN_VARIABLES))
def test_variable_named_like_a_builtin_is_rejected(tmp_path: Path, builtin: str) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a", variables={"name": "A", builtin: "x"})])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 1, "variables")
    assert builtin in p.message


def test_builtin_variables_need_no_definition(tmp_path: Path) -> None:
    flows = (
        "default:\n  turns:\n    - turn_id: t\n"
        '      prompt_template: "{scenario} #{turn_index}: {context}"\n'
    )
    folder = write_multi(tmp_path, flows, rows=[scenario("a", variables={})])
    conv = load_pack(folder).conversations[0]
    assert conv.render(conv.flow.turns[0], []) == "scenario a #0: "


def test_scenario_type_with_no_flow_and_no_default(tmp_path: Path) -> None:
    flows = FLOW.replace("default:", "support:")
    folder = write_multi(
        tmp_path,
        flows,
        rows=[scenario("a", scenario_type="support"), scenario("b", scenario_type="billing")],
    )
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 2, "scenario_type")
    assert "'billing'" in p.message


def test_scenario_type_without_its_own_flow_uses_default(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a", scenario_type="billing")])
    conv = load_pack(folder).conversations[0]
    assert conv.flow.scenario_type == "default"


def test_fact_introduced_in_unknown_turn(tmp_path: Path) -> None:
    facts = [
        {"key": "city", "value": "Oslo", "introduced_in": "greet"},
        {"key": "age", "value": 41, "introduced_in": "nowhere"},
    ]
    folder = write_multi(tmp_path, rows=[scenario("a"), scenario("b", facts=facts)])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 2, "facts.1.introduced_in")
    assert "'nowhere'" in p.message


def test_probe_of_unknown_fact(tmp_path: Path) -> None:
    facts = [{"key": "city", "value": "Oslo", "introduced_in": "greet"}]
    probes = [{"turn_id": "follow_up", "facts": ["city", "salary"]}]
    folder = write_multi(tmp_path, rows=[scenario("a", facts=facts, probes=probes)])
    p = only_problem(folder)
    assert where(p) == (SCENARIOS, 1, "probes.0.facts")
    assert "'salary'" in p.message


def test_probe_of_unknown_turn(tmp_path: Path) -> None:
    facts = [{"key": "city", "value": "Oslo", "introduced_in": "greet"}]
    probes = [{"turn_id": "later", "facts": ["city"]}]
    folder = write_multi(tmp_path, rows=[scenario("a", facts=facts, probes=probes)])
    assert where(only_problem(folder)) == (SCENARIOS, 1, "probes.0.turn_id")


def test_valid_facts_and_probes_load(tmp_path: Path) -> None:
    facts = [{"key": "city", "value": "Oslo", "introduced_in": "greet"}]
    probes = [{"turn_id": "follow_up", "facts": ["city"]}]
    folder = write_multi(tmp_path, rows=[scenario("a", facts=facts, probes=probes)])
    sc = load_pack(folder).conversations[0].scenario
    assert sc.facts[0].key == "city"
    assert sc.probes[0].facts == ["city"]


# -- multi-turn: turn_configs.yml problems ---------------------------------------------


def test_malformed_yaml_reports_its_line(tmp_path: Path) -> None:
    flows = FLOW.replace(
        '      prompt_template: "Tell me more about that."', "      prompt_template: a: b"
    )
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "a: b"), None)
    assert "invalid YAML" in p.message


def test_yaml_with_a_tab_reports_its_line(tmp_path: Path) -> None:
    flows = "default:\n  turns:\n    - turn_id: a\n\t  prompt_template: x\n"
    folder = write_multi(tmp_path, flows)
    assert where(only_problem(folder)) == (TURNS, 4, None)


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, "- just\n- a list\n")
    assert where(only_problem(folder)) == (TURNS, 1, None)


def test_empty_turn_configs(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, "")
    p = only_problem(folder)
    assert (p.file, p.field) == (TURNS, None)
    assert "empty" in p.message


def test_unknown_field_in_a_turn(tmp_path: Path) -> None:
    flows = FLOW.replace(
        "      depends_on: [greet]\n", "      depends_on: [greet]\n      colour: red\n"
    )
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "colour: red"), "default.turns.1.colour")
    assert p.message == "unknown field"


def test_unknown_field_in_a_flow(tmp_path: Path) -> None:
    flows = FLOW.replace("  max_turns: 4\n", "  max_turns: 4\n  max_turn: 9\n")
    folder = write_multi(tmp_path, flows)
    assert where(only_problem(folder)) == (TURNS, lineno(flows, "max_turn: 9"), "default.max_turn")


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("  max_turns: 4", '  max_turns: "five"', "default.max_turns"),
        ("  max_turns: 4", "  max_turns: 0", "default.max_turns"),
        (
            "      depends_on: [greet]",
            "      depends_on: greet\n      optional: maybe",
            "default.turns.1.optional",
        ),
        (
            "      depends_on: [greet]",
            "      depends_on: [greet]\n      role: system",
            "default.turns.1.role",
        ),
    ],
)
def test_wrong_type_in_yaml(tmp_path: Path, old: str, new: str, field: str) -> None:
    flows = FLOW.replace(old, new)
    folder = write_multi(tmp_path, flows)
    problems = pack_problems(folder)
    key = field.rsplit(".", 1)[1] + ":"
    assert (TURNS, lineno(flows, key), field) in [where(p) for p in problems]


def test_wrong_type_in_turn_settings(tmp_path: Path) -> None:
    flows = FLOW.replace(
        "      depends_on: [greet]\n",
        "      depends_on: [greet]\n      config:\n        temperature: 7.5\n",
    )
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (
        TURNS,
        lineno(flows, "temperature: 7.5"),
        "default.turns.1.config.temperature",
    )


def test_flow_without_turns(tmp_path: Path) -> None:
    flows = "default:\n  max_turns: 3\n  turns: []\n"
    folder = write_multi(tmp_path, flows)
    assert where(only_problem(folder)) == (TURNS, 3, "default.turns")


def test_depends_on_unknown_turn(tmp_path: Path) -> None:
    flows = FLOW.replace("depends_on: [greet]", "depends_on: [greeting]")
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "depends_on"), "default.turns.1.depends_on")
    assert "'greeting'" in p.message


def test_depends_on_cycle(tmp_path: Path) -> None:
    flows = textwrap.dedent(
        """\
        default:
          turns:
            - turn_id: a
              depends_on: [b]
              prompt_template: A
            - turn_id: b
              depends_on: [a]
              prompt_template: B
        """
    )
    folder = write_multi(tmp_path, flows, rows=[scenario("s", variables={})])
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "turns:"), "default.turns")
    assert "cycle" in p.message
    assert "a" in p.message and "b" in p.message


def test_longer_depends_on_cycle(tmp_path: Path) -> None:
    flows = textwrap.dedent(
        """\
        default:
          turns:
            - turn_id: start
              prompt_template: S
            - turn_id: a
              depends_on: [start, c]
              prompt_template: A
            - turn_id: b
              depends_on: [a]
              prompt_template: B
            - turn_id: c
              depends_on: [b]
              prompt_template: C
        """
    )
    folder = write_multi(tmp_path, flows, rows=[scenario("s", variables={})])
    p = only_problem(folder)
    assert p.field == "default.turns"
    assert "cycle" in p.message
    assert "start" not in p.message


def test_self_dependency(tmp_path: Path) -> None:
    flows = FLOW.replace("depends_on: [greet]", "depends_on: [follow_up]")
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "depends_on"), "default.turns.1.depends_on")
    assert "itself" in p.message


def test_duplicate_turn_id(tmp_path: Path) -> None:
    flows = FLOW.replace("turn_id: follow_up", "turn_id: greet").replace(
        "depends_on: [greet]", "depends_on: []"
    )
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    second = [n for n, line in enumerate(flows.splitlines(), 1) if "turn_id: greet" in line][1]
    assert where(p) == (TURNS, second, "default.turns.1.turn_id")
    assert "'greet'" in p.message


@pytest.mark.parametrize(
    "unsafe", ["{name.__class__}", "{name[0]}", "{name!r}", "{}", "{name:{x}}"]
)
def test_unsafe_template_in_turn_configs(tmp_path: Path, unsafe: str) -> None:
    flows = FLOW.replace("{name}", unsafe)
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "Hello"), "default.turns.0.prompt_template")


def test_unsafe_block_scalar_template_reports_the_key_line(tmp_path: Path) -> None:
    flows = FLOW.replace(
        '      prompt_template: "Tell me more about that."',
        "      prompt_template: |\n        First line.\n        Then {x.__class__}.",
    )
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (
        TURNS,
        lineno(flows, "prompt_template: |"),
        "default.turns.1.prompt_template",
    )


def test_unknown_metric_in_evaluation_metrics(tmp_path: Path) -> None:
    flows = FLOW.replace(
        "      depends_on: [greet]\n",
        "      depends_on: [greet]\n      evaluation_metrics: [accuracy, no_such_metric]\n",
    )
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (
        TURNS,
        lineno(flows, "evaluation_metrics"),
        "default.turns.1.evaluation_metrics",
    )
    assert "'no_such_metric'" in p.message


def test_unknown_flow_level_metric(tmp_path: Path) -> None:
    flows = FLOW.replace("  max_turns: 4\n", "  max_turns: 4\n  metrics: [latency, made_up]\n")
    folder = write_multi(tmp_path, flows)
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "metrics:"), "default.metrics")
    assert "'made_up'" in p.message


def test_metric_names_argument_replaces_the_registry(tmp_path: Path) -> None:
    flows = FLOW.replace("  max_turns: 4\n", "  max_turns: 4\n  metrics: [my_metric]\n")
    folder = write_multi(tmp_path, flows)
    assert load_pack(folder, metric_names={"my_metric"}).metric_names() == frozenset({"my_metric"})
    assert "'my_metric'" in only_problem(folder).message


def test_the_scenario_loader_leaves_metric_names_to_its_caller(tmp_path: Path) -> None:
    """convsim.scenarios knows no metric registry: without names it accepts any, and
    convsim.load_pack (the runtime's) checks them against convsim's registry."""
    from convsim import scenarios

    flows = FLOW.replace("  max_turns: 4\n", "  max_turns: 4\n  metrics: [my_metric]\n")
    folder = write_multi(tmp_path, flows)
    assert "my_metric" in scenarios.load_pack(folder).metric_names()
    with pytest.raises(PackError, match="unknown metric 'my_metric'"):
        load_pack(folder)


# -- execution order --------------------------------------------------------------------


def test_turn_listed_before_its_dependency_runs_after_it(tmp_path: Path) -> None:
    flows = textwrap.dedent(
        """\
        default:
          turns:
            - turn_id: summary
              depends_on: [details]
              prompt_template: Summarise.
            - turn_id: details
              prompt_template: Details?
            - turn_id: unrelated
              prompt_template: Anything else?
        """
    )
    folder = write_multi(tmp_path, flows, rows=[scenario("s", variables={})])
    turns = load_pack(folder).conversations[0].flow.turns
    assert [t.turn_id for t in turns] == ["details", "summary", "unrelated"]
    # index keeps the position in the file
    assert [t.index for t in turns] == [1, 0, 2]


def test_dependency_chain_listed_backwards_runs_forwards(tmp_path: Path) -> None:
    flows = textwrap.dedent(
        """\
        default:
          turns:
            - turn_id: c
              depends_on: [b]
              prompt_template: C
            - turn_id: b
              depends_on: [a]
              prompt_template: B
            - turn_id: a
              prompt_template: A
        """
    )
    folder = write_multi(tmp_path, flows, rows=[scenario("s", variables={})])
    assert [t.turn_id for t in load_pack(folder).conversations[0].flow.turns] == ["a", "b", "c"]


def test_independent_turns_keep_file_order(tmp_path: Path) -> None:
    flows = "default:\n  turns:\n" + "".join(
        f"    - turn_id: t{i}\n      prompt_template: T{i}\n" for i in (3, 1, 2)
    )
    folder = write_multi(tmp_path, flows, rows=[scenario("s", variables={})])
    assert [t.turn_id for t in load_pack(folder).conversations[0].flow.turns] == ["t3", "t1", "t2"]


# -- all problems, and how they read ------------------------------------------------------


def test_all_problems_in_a_pack_are_reported(tmp_path: Path) -> None:
    flows = FLOW.replace("depends_on: [greet]", "depends_on: [nope]").replace(
        "  max_turns: 4\n", "  max_turns: 4\n  colour: red\n"
    )
    folder = write_multi(
        tmp_path,
        flows,
        rows=[
            scenario("a"),
            "{not json",
            scenario("c", extra=1),
            scenario("a"),
            scenario("e", variables=["x"]),
        ],
    )
    found = {where(p) for p in pack_problems(folder)}
    assert {
        (TURNS, lineno(flows, "colour: red"), "default.colour"),
        (SCENARIOS, 2, None),
        (SCENARIOS, 3, "extra"),
        (SCENARIOS, 4, "scenario_id"),
        (SCENARIOS, 5, "variables"),
    } <= found


def test_problems_in_both_files_are_reported_together(tmp_path: Path) -> None:
    flows = FLOW.replace("depends_on: [greet]", "depends_on: [greet, nope]")
    folder = write_multi(tmp_path, flows, rows=[scenario("a"), scenario("b", colour=1)])
    found = {where(p) for p in pack_problems(folder)}
    assert found == {
        (TURNS, lineno(flows, "depends_on"), "default.turns.1.depends_on"),
        (SCENARIOS, 2, "colour"),
    }


def test_pack_error_message_lists_file_line_and_field(tmp_path: Path) -> None:
    folder = write_multi(tmp_path, rows=[scenario("a"), scenario("b", colour="red"), scenario("a")])
    with pytest.raises(PackError) as info:
        load_pack(folder)
    text = str(info.value)
    assert "2 problems" in text
    assert "scenarios.jsonl:2: colour: unknown field" in text
    assert "scenarios.jsonl:3: scenario_id: duplicate 'a'" in text


def test_problem_without_line_or_field_reads_cleanly() -> None:
    assert (
        str(PackProblem("problems.jsonl", None, None, "file is missing"))
        == "problems.jsonl: file is missing"
    )
    assert str(PackProblem("a.yml", 3, None, "bad")) == "a.yml:3: bad"


# -- pack_hash ----------------------------------------------------------------------------


def test_pack_hash_is_stable_and_tracks_every_byte(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(GUIDE, copy)
    original = load_pack(GUIDE).pack_hash
    assert len(original) == 64
    assert load_pack(copy).pack_hash == original
    assert load_pack(copy).pack_hash == original

    for name, marker in ((SCENARIOS, b"personal budget"), (TURNS, b"Welcome")):
        path = copy / name
        data = path.read_bytes()
        i = data.index(marker) + 1  # change one byte of a value, keeping the pack valid
        path.write_bytes(data[:i] + b"E" + data[i + 1 :])
        changed = load_pack(copy).pack_hash
        assert changed != original
        path.write_bytes(data)
        assert load_pack(copy).pack_hash == original


def test_pack_hash_changes_with_trailing_newline(tmp_path: Path) -> None:
    folder = write_multi(tmp_path)
    before = load_pack(folder).pack_hash
    with (folder / SCENARIOS).open("ab") as f:
        f.write(b"\n")
    assert load_pack(folder).pack_hash != before


def test_single_turn_pack_hash_depends_on_num_fewshot(tmp_path: Path) -> None:
    folder = write_single(tmp_path)
    assert load_pack(folder).pack_hash == load_pack(folder, num_fewshot=0).pack_hash
    assert load_pack(folder).pack_hash != load_pack(folder, num_fewshot=1).pack_hash


# -- single-turn packs ----------------------------------------------------------------------


def test_single_turn_pack_loads(tmp_path: Path) -> None:
    pack = load_pack(write_single(tmp_path))
    assert pack.kind == "single_turn"
    assert len(pack) == 3
    assert pack.metrics == ("exact_match",)
    conv = pack.conversations[0]
    assert conv.conversation_id == "p0"
    assert conv.source == "problems.jsonl:1"
    assert [t.turn_id for t in conv.flow.turns] == ["answer"]
    assert conv.render(conv.flow.turns[0], []) == "Q: What is the colour of item 0?\nA:"
    assert conv.scenario.reference_responses == {"answer": "colour-0"}


def test_single_turn_problem_without_id_gets_one_from_its_line(tmp_path: Path) -> None:
    row = problem(9)
    del row["id"]
    pack = load_pack(write_single(tmp_path, rows=[problem(0), row]))
    assert [c.conversation_id for c in pack.conversations] == ["p0", "tiny_qa-2"]


def test_single_turn_unknown_config_field(tmp_path: Path) -> None:
    config = SINGLE_CONFIG.replace("description:", "descripton:")
    p = only_problem(write_single(tmp_path, config))
    assert where(p) == (CONFIG, lineno(config, "descripton"), "descripton")
    assert p.message == "unknown field"


def test_single_turn_wrong_type_in_config(tmp_path: Path) -> None:
    config = SINGLE_CONFIG + "max_tokens: lots\n"
    p = only_problem(write_single(tmp_path, config))
    assert where(p) == (CONFIG, lineno(config, "max_tokens"), "max_tokens")


def test_single_turn_template_with_unknown_variable(tmp_path: Path) -> None:
    config = SINGLE_CONFIG.replace('"Q: {question}\\nA:"', '"Q: {question} ({hint})\\nA:"')
    p = only_problem(write_single(tmp_path, config))
    assert where(p) == (CONFIG, lineno(config, "default:"), "prompt_templates.default")
    assert "{hint}" in p.message


def test_single_turn_unsafe_template(tmp_path: Path) -> None:
    config = SINGLE_CONFIG.replace("{examples}", "{examples.__class__}")
    p = only_problem(write_single(tmp_path, config))
    assert where(p) == (CONFIG, lineno(config, "with_examples:"), "prompt_templates.with_examples")


def test_single_turn_difficulty_not_in_levels(tmp_path: Path) -> None:
    rows = [problem(0), problem(1, difficulty="medium"), problem(2, difficulty="hard")]
    p = only_problem(write_single(tmp_path, rows=rows))
    assert where(p) == (PROBLEMS, 2, "difficulty")
    assert "'medium'" in p.message


def test_single_turn_difficulty_is_free_without_levels(tmp_path: Path) -> None:
    config = SINGLE_CONFIG.replace("  difficulty_levels: [easy, hard]\n", "  languages: [en]\n")
    pack = load_pack(write_single(tmp_path, config, rows=[problem(0, difficulty="medium")]))
    assert pack.conversations[0].scenario.difficulty == "medium"


def test_single_turn_missing_problems_file(tmp_path: Path) -> None:
    p = only_problem(write_single(tmp_path, with_problems=False))
    assert where(p) == (PROBLEMS, None, None)
    assert "missing" in p.message


def test_single_turn_missing_config(tmp_path: Path) -> None:
    p = only_problem(write_single(tmp_path, config=None))
    assert where(p) == (CONFIG, None, None)


def test_single_turn_problem_errors_name_the_dataset_path(tmp_path: Path) -> None:
    config = SINGLE_CONFIG + "dataset:\n  path: items.jsonl\n"
    folder = write_single(tmp_path, config, with_problems=False)
    (folder / "items.jsonl").write_text(jsonl([problem(0), problem(1, answer="x")]))
    assert where(only_problem(folder)) == ("items.jsonl", 2, "answer")


def test_single_turn_problem_errors(tmp_path: Path) -> None:
    no_question = problem(3)
    del no_question["question"]
    rows = [problem(0), "{oops", problem(0), no_question]
    found = {where(p) for p in pack_problems(write_single(tmp_path, rows=rows))}
    assert found == {(PROBLEMS, 2, None), (PROBLEMS, 3, "id"), (PROBLEMS, 4, "question")}


def test_single_turn_all_problems_are_reported(tmp_path: Path) -> None:
    config = SINGLE_CONFIG.replace("[exact_match]", "[exact_match, bogus]").replace(
        '"Q: {question}', '"Q: {q}'
    )
    rows = [problem(0), problem(1, difficulty="medium"), "not json"]
    found = {where(p) for p in pack_problems(write_single(tmp_path, config, rows))}
    assert found == {
        (CONFIG, lineno(config, "primary:"), "metrics.primary"),
        (CONFIG, lineno(config, "default:"), "prompt_templates.default"),
        (PROBLEMS, 2, "difficulty"),
        (PROBLEMS, 3, None),
    }


# -- few-shot -----------------------------------------------------------------------------


def test_num_fewshot_uses_other_problems_as_examples(tmp_path: Path) -> None:
    rows = [problem(i) for i in range(5)]
    pack = load_pack(write_single(tmp_path, rows=rows), num_fewshot=2)
    assert len(pack) == 5
    blocks = {f"Question: {r['question']}\nAnswer: {r['expected_answer']}" for r in rows}
    for row, conv in zip(rows, pack.conversations, strict=True):
        examples = conv.scenario.variables["examples"]
        picked = examples.split("\n\n")
        assert len(picked) == 2
        assert len(set(picked)) == 2
        assert set(picked) <= blocks
        assert row["question"] not in examples
        assert row["expected_answer"] not in examples
        text = conv.render(conv.flow.turns[0], [])
        # the with_examples template, not the default one
        assert text == f"{examples}\n\nQuestion: {row['question']}\nAnswer:"
        assert not text.startswith("Q: ")


def test_num_fewshot_examples_are_deterministic(tmp_path: Path) -> None:
    folder = write_single(tmp_path, rows=[problem(i) for i in range(6)])
    first = [
        c.scenario.variables["examples"] for c in load_pack(folder, num_fewshot=3).conversations
    ]
    second = [
        c.scenario.variables["examples"] for c in load_pack(folder, num_fewshot=3).conversations
    ]
    assert first == second


def test_without_num_fewshot_examples_are_empty_and_default_template_is_used(
    tmp_path: Path,
) -> None:
    pack = load_pack(write_single(tmp_path))
    for conv in pack.conversations:
        assert conv.scenario.variables["examples"] == ""
        assert conv.render(conv.flow.turns[0], []).startswith("Q: ")


def test_num_fewshot_needs_more_problems_than_examples(tmp_path: Path) -> None:
    folder = write_single(tmp_path, rows=[problem(0), problem(1)])
    assert load_pack(folder, num_fewshot=1)  # exactly one other problem each: fine
    p = only_problem(folder, num_fewshot=2)
    assert p.file == CONFIG
    assert "--num-fewshot 2" in p.message


def test_num_fewshot_needs_a_with_examples_template(tmp_path: Path) -> None:
    config = (
        "\n".join(line for line in SINGLE_CONFIG.splitlines() if "with_examples" not in line) + "\n"
    )
    folder = write_single(tmp_path, config)
    assert len(load_pack(folder)) == 3
    p = only_problem(folder, num_fewshot=1)
    assert (p.file, p.field) == (CONFIG, "prompt_templates.with_examples")


def test_negative_num_fewshot_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_pack(write_single(tmp_path), num_fewshot=-1)


def test_num_fewshot_on_a_multi_turn_pack_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="single-turn"):
        load_pack(write_multi(tmp_path), num_fewshot=1)
    with pytest.raises(ConfigError, match="single-turn"):
        load_pack(GUIDE, num_fewshot=2)


# -- regressions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_unicode_line_separator_inside_a_json_string(tmp_path: Path, char: str) -> None:
    write_multi(tmp_path)
    first = json.dumps(scenario("a", scenario_description=f"one{char}two"), ensure_ascii=False)
    second = json.dumps(scenario("b", colour="red"))
    (tmp_path / SCENARIOS).write_text(first + "\n" + second + "\n", encoding="utf-8")
    assert where(only_problem(tmp_path)) == (SCENARIOS, 2, "colour")


@pytest.mark.parametrize("with_default", [True, False], ids=["with-default", "without-default"])
def test_invalid_flow_causes_no_spurious_scenario_problems(
    tmp_path: Path, with_default: bool
) -> None:
    special = textwrap.dedent(
        """\
        special:
          turns:
            - turn_id: z
              depends_on: [nope]
              prompt_template: Z
        """
    )
    other = FLOW if with_default else FLOW.replace("default:", "other:")
    flows = other + special
    folder = write_multi(
        tmp_path, flows, rows=[scenario("s", scenario_type="special", variables={})]
    )
    p = only_problem(folder)
    assert where(p) == (TURNS, lineno(flows, "depends_on: [nope]"), "special.turns.0.depends_on")


def test_duplicate_flow_name_in_yaml_is_reported(tmp_path: Path) -> None:
    flows = FLOW + FLOW.replace("Hello {name}", "Bye {name}")
    folder = write_multi(tmp_path, flows)
    problems = pack_problems(folder)
    assert [(p.file, p.line) for p in problems] == [(TURNS, len(FLOW.splitlines()) + 1)]


# -- single-turn context modes --------------------------------------------------------


def _with_long_context(pack: Pack) -> Any:
    return next(c for c in pack.conversations if ". " in c.scenario.variables["context"])


def test_context_modes_shape_the_problem_context() -> None:
    full = load_pack("single_turn_qa")
    conv = _with_long_context(full)  # more than one sentence, so the modes differ
    text = conv.scenario.variables["context"]
    minimal = load_pack("single_turn_qa", context_mode="minimal_context")
    none = load_pack("single_turn_qa", context_mode="no_context")
    by_id = lambda p: {c.conversation_id: c for c in p.conversations}  # noqa: E731
    short = by_id(minimal)[conv.conversation_id].scenario.variables["context"]
    assert text.startswith(short) and len(short) < len(text)
    assert by_id(none)[conv.conversation_id].scenario.variables["context"] == ""
    rendered = none.conversations[0].render(none.conversations[0].flow.turns[0], [])
    assert "Question:" in rendered
    assert len({full.pack_hash, minimal.pack_hash, none.pack_hash}) == 3


def test_context_mode_must_be_one_the_pack_supports(tmp_path: Path) -> None:
    folder = write_single(tmp_path)
    with pytest.raises(ConfigError, match="not one of the pack's"):
        load_pack(folder, context_mode="no_context")
    with pytest.raises(ConfigError, match="single-turn packs only"):
        load_pack(GUIDE, context_mode="no_context")
