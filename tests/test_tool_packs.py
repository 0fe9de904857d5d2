"""Packs with tools: tools.yml is read, checked and set on every conversation; each
problem names its file, line and field, at load and in ``convsim validate``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from convsim._errors import PackError, PackProblem
from convsim.cli import main
from convsim.scenarios import load_pack

TOOLS = textwrap.dedent(
    """\
    environment:
      orders:
        A-1001: {status: placed}
    tools:
      - name: look_up_order
        description: Look up an order.
        parameters:
          type: object
          properties:
            order_id: {type: string, pattern: "^A-\\\\d{4}$"}
          required: [order_id]
        operations:
          - op: get
            path: "orders.{order_id}"
      - name: cancel_order
        parameters:
          type: object
          properties:
            order_id: {type: string}
        operations:
          - op: set
            path: "orders.{order_id}.status"
            value: cancelled
            preconditions:
              - {path: "orders.{order_id}.status", equals: placed}
      - name: quote
        parameters:
          type: object
          properties:
            country: {type: string}
        responses:
          - match: {country: UK}
            result: 5
    """
)

FLOW = textwrap.dedent(
    """\
    default:
      max_tool_rounds: 3
      turns:
        - turn_id: ask
          prompt_template: "{request}"
          tools: [look_up_order, cancel_order]
          tool_choice: auto
        - turn_id: confirm
          depends_on: [ask]
          prompt_template: "Thanks."
          tool_choice: look_up_order
          max_tool_rounds: 1
    """
)


def scenario(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "scenario_id": "s1",
        "scenario_description": "d",
        "variables": {"request": "cancel order A-1001"},
        "expected_tool_calls": [
            {"name": "cancel_order", "arguments": {"order_id": "A-1001"}, "turn_id": "ask"}
        ],
        "final_state": [{"path": "orders.A-1001.status", "equals": "cancelled"}],
        "goal": {
            "description": "cancelled",
            "all_of": [
                {"kind": "state", "value": {"path": "orders.A-1001.status", "exists": True}}
            ],
        },
    }
    base.update(fields)
    return base


def write(
    folder: Path,
    tools: str | None = TOOLS,
    flow: str = FLOW,
    rows: list[dict[str, Any]] | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "turn_configs.yml").write_text(flow)
    (folder / "scenarios.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in (rows or [scenario()]))
    )
    if tools is not None:
        (folder / "tools.yml").write_text(tools)
    return folder


def problems(folder: Path, **options: Any) -> list[PackProblem]:
    with pytest.raises(PackError) as info:
        load_pack(folder, **options)
    return info.value.problems


def line_of(text: str, needle: str) -> int:
    lines = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(lines) == 1, (needle, lines)
    return lines[0]


# -- loading --------------------------------------------------------------------------


def test_tools_are_set_on_every_conversation(tmp_path: Path) -> None:
    pack = load_pack(write(tmp_path / "p", rows=[scenario(), scenario(scenario_id="s2")]))
    tools = {id(c.tools) for c in pack.conversations}
    assert len(tools) == 1  # one ToolSet, shared
    toolset = pack.conversations[0].tools
    assert toolset is not None
    assert toolset.names == ("look_up_order", "cancel_order", "quote")
    assert toolset.environment == {"orders": {"A-1001": {"status": "placed"}}}
    assert [s.name for s in toolset.specs(["cancel_order"])] == ["cancel_order"]


def test_a_pack_without_tools_yml_has_no_tools(tmp_path: Path) -> None:
    flow = 'default:\n  turns:\n    - turn_id: ask\n      prompt_template: "{request}"\n'
    row = {"scenario_id": "s1", "scenario_description": "d", "variables": {"request": "hi"}}
    pack = load_pack(write(tmp_path / "p", tools=None, flow=flow, rows=[row]))
    assert pack.conversations[0].tools is None


def test_the_tools_file_goes_into_the_pack_hash(tmp_path: Path) -> None:
    folder = write(tmp_path / "p")
    first = load_pack(folder).pack_hash
    assert load_pack(folder).pack_hash == first
    (folder / "tools.yml").write_text(TOOLS.replace("status: placed", "status: shipped"))
    assert load_pack(folder).pack_hash != first


def test_a_python_tool_loads_with_allow_code(tmp_path: Path) -> None:
    tools = TOOLS + "  - name: shout\n    python: _tool_functions:shout\n"
    pack = load_pack(write(tmp_path / "p", tools=tools), allow_code=True)
    toolset = pack.conversations[0].tools
    assert toolset is not None and "shout" in toolset.names
    assert pack.conversations[0].allow_code


# -- tools.yml problems ---------------------------------------------------------------


def one_problem(folder: Path, **options: Any) -> PackProblem:
    found = problems(folder, **options)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    ("old", "new", "needle", "field", "message"),
    [
        (
            "    description: Look up an order.\n",
            "    description: Look up an order.\n    colour: red\n",
            "colour: red",
            "tools.0.colour",
            "unknown field",
        ),
        (
            "        order_id: {type: string}\n",
            "        order_id: {type: strang}\n",
            "  - name: cancel_order\n    parameters",
            "tools.1.parameters",
            "not a valid JSON schema at properties/order_id/type",
        ),
        (
            "  - name: quote\n    parameters:\n      type: object\n",
            "  - name: quote\n    parameters:\n      type: array\n",
            "  - name: quote\n    parameters",
            "tools.2.parameters",
            "must be a JSON schema of type object",
        ),
        (
            'pattern: "^A-\\\\d{4}$"',
            'pattern: "^(?=A)"',
            "    description: Look up an order.\n    parameters",
            "tools.0.parameters",
            "lookaround",
        ),
        (
            'path: "orders.{order_id}.status"\n        value',
            'path: "orders.{order}.status"\n        value',
            'path: "orders.{order}.status"',
            "tools.1.operations.0.path",
            "placeholder 'order' is not a parameter of 'cancel_order' (parameters: order_id)",
        ),
        (
            '- {path: "orders.{order_id}.status", equals: placed}',
            '- {path: "orders.{id}.status", equals: placed}',
            'path: "orders.{id}.status"',
            "tools.1.operations.0.preconditions.0.path",
            "placeholder 'id' is not a parameter",
        ),
        (
            "value: cancelled",
            'value: "cancelled by {who}"',
            "cancelled by {who}",
            "tools.1.operations.0.value",
            "placeholder 'who' is not a parameter",
        ),
        (
            "- match: {country: UK}",
            "- match: {land: UK}",
            "match: {land: UK}",
            "tools.2.responses.0.match",
            "match key 'land' is not a parameter of 'quote' (parameters: country)",
        ),
        (
            "  - name: quote\n",
            "  - name: cancel_order\n",
            "placed}\n  - name: cancel_order",
            "tools.2.name",
            "declared twice",
        ),
        (
            "        value: cancelled\n",
            "",
            "- op: set",
            "tools.1.operations.0",
            "op 'set' needs a value",
        ),
        (
            "    operations:\n      - op: get\n",
            "    python: nomodule:f\n    operations:\n      - op: get\n",
            "  - name: look_up_order",
            "tools.0",
            "give exactly one of responses, operations, python (found operations, python)",
        ),
    ],
)
def test_a_tools_yml_problem_names_its_line_and_field(
    tmp_path: Path, old: str, new: str, needle: str, field: str, message: str
) -> None:
    assert old in TOOLS
    text = TOOLS.replace(old, new, 1)
    found = one_problem(write(tmp_path / "p", tools=text))
    assert (found.file, found.field) == ("tools.yml", field)
    assert message in found.message
    assert found.line == last_line_of(text, needle)


def last_line_of(text: str, needle: str) -> int:
    """The line of ``needle``'s last line, ``needle`` occurring once in ``text``."""
    assert text.count(needle) == 1, needle
    return text[: text.index(needle)].count("\n") + needle.count("\n") + 1


def test_tools_yml_that_is_not_yaml_names_its_line(tmp_path: Path) -> None:
    found = one_problem(write(tmp_path / "p", tools="tools:\n  - name: [unclosed\n"))
    assert found.file == "tools.yml"
    assert found.line is not None
    empty = one_problem(write(tmp_path / "q", tools=""))
    assert (empty.file, empty.message) == ("tools.yml", "is empty")


def test_tools_yml_obeys_the_pack_file_size_limit(tmp_path: Path) -> None:
    found = one_problem(write(tmp_path / "p"), max_file_bytes=len(TOOLS) - 1)
    assert found.file == "tools.yml"
    assert f"over the limit of {len(TOOLS) - 1} bytes" in found.message


def test_a_python_tool_is_refused_without_allow_code_as_other_pack_code_is(
    tmp_path: Path,
) -> None:
    tools = TOOLS + "  - name: shout\n    python: _tool_functions:shout\n"
    found = one_problem(write(tmp_path / "p", tools=tools))
    assert (found.file, found.line, found.field) == (
        "tools.yml",
        line_of(tools, "python: _tool_functions"),
        "tools.3.python",
    )
    assert found.message == (
        "'_tool_functions:shout' runs Python code: code from a pack runs only when "
        "allowed (--allow-code, or allow_code=True); allow it only for packs you trust"
    )


def test_a_python_tool_that_does_not_import_is_a_clear_error(tmp_path: Path) -> None:
    tools = TOOLS + "  - name: shout\n    python: no_such_module_xyz:shout\n"
    found = one_problem(write(tmp_path / "p", tools=tools), allow_code=True)
    assert found.field == "tools.3.python"
    assert found.message.startswith("cannot import 'no_such_module_xyz:shout': ModuleNotFound")
    tools = TOOLS + "  - name: shout\n    python: _tool_functions:nothing_here\n"
    found = one_problem(write(tmp_path / "q", tools=tools), allow_code=True)
    assert found.message == "module '_tool_functions' has no 'nothing_here'"


# -- turns ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "needle", "field", "message"),
    [
        (
            "tools: [look_up_order, cancel_order]",
            "tools: [look_up_order, refund_order]",
            "refund_order",
            "default.turns.0.tools",
            "unknown tool 'refund_order' (tools: look_up_order, cancel_order, quote)",
        ),
        (
            "tool_choice: auto",
            "tool_choice: automatic",
            "automatic",
            "default.turns.0.tool_choice",
            "'automatic' is not auto, required, none or a tool",
        ),
        (
            "tool_choice: auto",
            "tool_choice: quote",
            "tool_choice: quote",
            "default.turns.0.tool_choice",
            "names 'quote', which the turn's tools leave out",
        ),
        (
            "tools: [look_up_order, cancel_order]\n      tool_choice: auto",
            "tools: []\n      tool_choice: required",
            "tool_choice: required",
            "default.turns.0.tool_choice",
            "requires a tool, but the turn offers none",
        ),
    ],
)
def test_a_turns_tools_name_declared_tools(
    tmp_path: Path, old: str, new: str, needle: str, field: str, message: str
) -> None:
    assert old in FLOW
    flow = FLOW.replace(old, new)
    found = one_problem(write(tmp_path / "p", flow=flow))
    where = ("turn_configs.yml", line_of(flow, needle), field)
    assert (found.file, found.line, found.field) == where
    assert message in found.message


def test_tool_settings_in_a_pack_without_tools_yml_are_errors(tmp_path: Path) -> None:
    row = {"scenario_id": "s1", "scenario_description": "d", "variables": {"request": "x"}}
    found = problems(write(tmp_path / "p", tools=None, rows=[row]))
    assert [(p.file, p.line, p.field) for p in found] == [
        ("turn_configs.yml", line_of(FLOW, "tools: ["), "default.turns.0.tools"),
        ("turn_configs.yml", line_of(FLOW, "tool_choice: auto"), "default.turns.0.tool_choice"),
        ("turn_configs.yml", line_of(FLOW, "tool_choice: look"), "default.turns.1.tool_choice"),
        (
            "turn_configs.yml",
            line_of(FLOW, "  max_tool_rounds: 1"),
            "default.turns.1.max_tool_rounds",
        ),
        ("turn_configs.yml", line_of(FLOW, "  max_tool_rounds: 3"), "default.max_tool_rounds"),
    ]
    assert {p.message for p in found} == {"the pack declares no tools (it has no tools.yml)"}


# -- scenarios ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"expected_tool_calls": [{"name": "refund_order"}]},
            "expected_tool_calls.0.name",
            "unknown tool 'refund_order' (tools: look_up_order, cancel_order, quote)",
        ),
        (
            {"expected_tool_calls": [{"name": "quote", "turn_id": "later"}]},
            "expected_tool_calls.0.turn_id",
            "unknown turn 'later' (turns: ask, confirm)",
        ),
        (
            {"final_state": [{"path": "orders.A-1001.status", "equals": "x", "exists": True}]},
            "final_state.0",
            "give exactly one of",
        ),
        (
            {"final_state": [{"path": "orders.{order_id}.status", "equals": "x"}]},
            "final_state.0.path",
            "placeholders take a call's arguments",
        ),
        (
            {"goal": {"description": "g", "all_of": [{"kind": "state", "value": {"path": "a"}}]}},
            "goal.all_of.0.value",
            "give exactly one of",
        ),
        (
            {"goal": {"description": "g", "any_of": [{"kind": "state", "value": "a=b"}]}},
            "goal.any_of.0.value",
            "a state criterion needs",
        ),
        ({"environment": ["not", "an", "object"]}, "environment", "valid dictionary"),
    ],
)
def test_a_scenarios_tool_fields_are_checked(
    tmp_path: Path, fields: dict[str, Any], field: str, message: str
) -> None:
    rows = [scenario(scenario_id="ok"), scenario(scenario_id="bad", **fields)]
    found = one_problem(write(tmp_path / "p", rows=rows))
    assert (found.file, found.line, found.field) == ("scenarios.jsonl", 2, field)
    assert message in found.message


def test_a_pack_without_tools_may_expect_calls_and_a_final_state(tmp_path: Path) -> None:
    # an application under test may call tools of its own; the calls are still checked
    flow = 'default:\n  turns:\n    - turn_id: ask\n      prompt_template: "{request}"\n'
    row = scenario(environment={"orders": {}})
    row["expected_tool_calls"][0].pop("turn_id")
    pack = load_pack(write(tmp_path / "p", tools=None, flow=flow, rows=[row]))
    assert pack.conversations[0].tools is None
    assert pack.conversations[0].scenario.expected_tool_calls[0].name == "cancel_order"
    row["expected_tool_calls"][0]["turn_id"] = "later"
    found = one_problem(write(tmp_path / "q", tools=None, flow=flow, rows=[row]))
    assert (found.line, found.field) == (1, "expected_tool_calls.0.turn_id")


# -- the command ----------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_validate_lists_the_tools_and_exits_2_on_a_problem(tmp_path: Path) -> None:
    good = write(tmp_path / "good")
    code, out, _ = invoke("validate", str(good))
    assert code == 0, out
    assert "tools: look_up_order, cancel_order, quote)" in out
    text = TOOLS.replace("- match: {country: UK}", "- match: {land: UK}")
    code, _, err = invoke("validate", str(write(tmp_path / "bad", tools=text)))
    assert code == 2
    assert f"tools.yml:{line_of(text, 'land: UK')}: tools.2.responses.0.match: match key" in err
    assert "Traceback" not in err
