"""Packs are data, not code: code runs only on request, regexes run in linear time, data
files stay inside the pack, and odd input is refused with its file, line and field."""

from __future__ import annotations

import json
import os
import random
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import convsim
from convsim import PackError, load_pack
from convsim.cli import main
from convsim.metrics._goal import check_criterion, criterion_credit
from convsim.scenarios import Criterion

TESTS = Path(__file__).parent


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


FLOW = textwrap.dedent(
    """\
    default:
      turns:
        - turn_id: greet
          prompt_template: "Hello, I am {name}."
        - turn_id: ask
          depends_on: [greet]
          prompt_template: "What did I say my name was?"
    """
)


def scenario(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "scenario_id": "s1",
        "scenario_description": "a scenario",
        "variables": {"name": "Ada"},
    }
    base.update(fields)
    return base


def write_multi(folder: Path, *rows: dict[str, Any], flows: str = FLOW) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "turn_configs.yml").write_text(flows, encoding="utf-8")
    lines = rows or (scenario(),)
    (folder / "scenarios.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8"
    )
    return folder


SINGLE_CONFIG = textwrap.dedent(
    """\
    task_name: tiny
    dataset:
      path: {path}
    prompt_templates:
      default: "Q: {{question}}"
    """
)


def write_single(folder: Path, path: str = "problems.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yml").write_text(SINGLE_CONFIG.format(path=json.dumps(path)))
    (folder / "problems.jsonl").write_text(
        json.dumps({"id": "p1", "question": "2+2?", "expected_answer": "4"}) + "\n"
    )
    return folder


def refused(folder: Path | str, *extra: str, command: str = "validate") -> str:
    """stderr of a command that must refuse its input: exit 2, no traceback."""
    code, _, err = invoke(command, str(folder), *extra)
    assert code == 2, err
    assert "Traceback" not in err
    return err


# -- 7: code from a pack runs only with --allow-code --------------------------------


def python_goal(checker: str) -> dict[str, Any]:
    return {"description": "d", "all_of": [{"kind": "python", "value": checker}]}


def test_a_python_criterion_is_refused_without_allow_code(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    pack = write_multi(tmp_path / "pack", scenario(goal=python_goal("shutil:rmtree")))
    err = refused(pack)
    assert "scenarios.jsonl:1: goal.all_of.0.value" in err
    assert "--allow-code" in err and "shutil:rmtree" in err
    err = refused(pack, "--model", "scripted", "--out", str(tmp_path / "r.jsonl"), command="run")
    assert "--allow-code" in err
    assert not (tmp_path / "r.jsonl").exists()
    with pytest.raises(PackError, match="allow_code=True"):
        load_pack(pack)
    with pytest.raises(PackError, match="allow_code=True"):
        convsim.run_sync(pack, "scripted")
    assert victim.is_dir()


def test_allow_code_loads_and_runs_the_checker(tmp_path: Path) -> None:
    sys.path.insert(0, str(TESTS))
    try:
        goal = python_goal("test_pack_safety:says_ada")
        pack = write_multi(tmp_path / "pack", scenario(goal=goal))
        code, _, err = invoke("validate", str(pack), "--allow-code")
        assert code == 0, err
        assert load_pack(pack, allow_code=True).conversations[0].scenario.goal is not None
        results = convsim.run_sync(pack, "scripted", allow_code=True, metrics=["goal_achievement"])
        assert results[0].scores["goal_achievement"].details["criteria"][0]["credit"] == 1.0
    finally:
        sys.path.remove(str(TESTS))


def says_ada(text: str, scenario: Any) -> float:
    """A goal checker named by import path in the test above."""
    return 1.0


@pytest.mark.parametrize(
    ("checker", "message"),
    [
        ("no_colon_here", "module:function"),
        ("convsim_no_such_module:f", "cannot import"),
        ("json:no_such_function", "no_such_function"),
        ("json:__doc__", "not callable"),
    ],
)
def test_allow_code_still_checks_the_checker_at_validation(
    tmp_path: Path, checker: str, message: str
) -> None:
    pack = write_multi(tmp_path / "pack", scenario(goal=python_goal(checker)))
    err = refused(pack, "--allow-code")
    assert "scenarios.jsonl:1: goal.all_of.0.value" in err and message in err


def test_a_transcript_with_a_python_criterion_needs_allow_code(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    line = {
        "conversation_id": "c1",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
        "goal": {
            "description": "d",
            "any_of": [
                {"kind": "contains", "value": "x"},
                python_goal("shutil:rmtree")["all_of"][0],
            ],
        },
    }
    transcripts = tmp_path / "t.jsonl"
    transcripts.write_text(json.dumps(line) + "\n")
    err = refused(transcripts, "--metrics", "goal_achievement", command="score")
    assert "t.jsonl:1: goal.any_of.1.value" in err and "--allow-code" in err
    assert victim.is_dir()


# -- 8: pack regexes run on RE2 -----------------------------------------------------


def test_a_catastrophic_regex_finishes() -> None:
    # minutes (and deaf to Ctrl-C) with a backtracking engine; linear on RE2
    assert check_criterion(Criterion(kind="regex", value="(a+)+$"), "a" * 40 + "b") is False
    assert check_criterion(Criterion(kind="regex", value="(a+)+b$"), "a" * 40 + "b") is True


def test_regex_criteria_stay_case_insensitive_and_accept_any_text() -> None:
    assert check_criterion(Criterion(kind="regex", value=r"HELLO\s+\w+"), "hello world") is True
    assert check_criterion(Criterion(kind="regex", value="x"), "lone \ud83d surrogate x") is True


@pytest.mark.parametrize(
    ("pattern", "hint"),
    [(r"(a)\1", "backreference"), (r"(?<=a)b", "lookaround"), (r"x\Z", r"\z"), ("[", "missing")],
)
def test_a_regex_re2_cannot_run_is_refused_at_validation(
    tmp_path: Path, pattern: str, hint: str
) -> None:
    goal = {"description": "d", "all_of": [{"kind": "regex", "value": pattern}]}
    err = refused(write_multi(tmp_path / "pack", scenario(goal=goal)))
    assert "scenarios.jsonl:1: goal.all_of.0.value" in err and hint in err


@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef", "$recursiveRef"])
def test_a_schema_reference_outside_the_schema_is_refused_at_validation(
    tmp_path: Path, keyword: str
) -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              keyword: "http://127.0.0.1:9/admin"}  # fmt: skip
    goal = {"description": "d", "all_of": [{"kind": "json_schema", "value": schema}]}
    err = refused(write_multi(tmp_path / "pack", scenario(goal=goal)))
    assert "goal.all_of.0.value" in err and keyword in err


def test_a_json_schema_criterion_never_fetches_what_it_refers_to() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from _listeners import Listener

    with Listener() as host:
        for schema in (
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$dynamicRef": host.url + "/admin",
            },
            {"$id": host.url + "/", "$ref": "#/definitions/a"},
            {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": "file:///dev/zero"},
        ):
            criterion = Criterion.model_construct(kind="json_schema", value=schema)
            assert criterion_credit(criterion, '{"a": 1}', None) == 0.0  # unresolvable
        assert host.connections == 0
    local = {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "required": ["a"]}}}
    assert criterion_credit(Criterion(kind="json_schema", value=local), '{"a": 1}', None) == 1.0


# -- 9: data files are regular files inside the pack ----------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc/passwd", "outside the pack folder"),
        ("../outside.jsonl", "outside the pack folder"),
        ("/dev/zero", "outside the pack folder"),
        ("link.jsonl", "outside the pack folder"),
        ("fifo.jsonl", "not a regular file"),
        ("device", "not a regular file"),
        ("sub", "a folder"),
        ("missing.jsonl", "missing"),
    ],
)
def test_dataset_path_must_be_a_regular_file_inside_the_pack(
    tmp_path: Path, path: str, message: str
) -> None:
    pack = write_single(tmp_path / "pack", path)
    (tmp_path / "outside.jsonl").write_text((pack / "problems.jsonl").read_text())
    (pack / "link.jsonl").symlink_to(tmp_path / "outside.jsonl")
    (pack / "device").symlink_to("/dev/zero")  # inside by name, a device in fact
    os.mkfifo(pack / "fifo.jsonl")
    (pack / "sub").mkdir()
    if path == "device":
        (pack / "device").unlink()
        (pack / "device").symlink_to(pack / "fifo.jsonl")
    err = refused(pack)
    assert "config.yml:3: dataset.path" in err and message in err


def test_pack_files_over_the_size_limit_are_refused(tmp_path: Path) -> None:
    pack = write_single(tmp_path / "pack")
    with open(pack / "problems.jsonl", "a") as fh:
        fh.write((" " * 999 + "\n") * 2000)  # 2 MB of blank lines, none over the line limit
    err = refused(pack, "--max-file-size", "1MB")
    assert "problems.jsonl" in err and "1 MB" in err and "--max-file-size" in err
    with pytest.raises(PackError, match="over the limit"):
        load_pack(pack, max_file_bytes=1_000_000)
    assert load_pack(pack).name == "pack"  # the default limit is generous


def test_pack_files_are_checked_too_scenarios_and_readme(tmp_path: Path) -> None:
    pack = write_multi(tmp_path / "pack")
    (tmp_path / "secret.jsonl").write_text((pack / "scenarios.jsonl").read_text())
    (pack / "scenarios.jsonl").unlink()
    (pack / "scenarios.jsonl").symlink_to(tmp_path / "secret.jsonl")
    assert "scenarios.jsonl: outside the pack folder" in refused(pack)
    (pack / "scenarios.jsonl").unlink()
    (pack / "scenarios.jsonl").write_text(json.dumps(scenario()) + "\n")
    os.mkfifo(pack / "README.md")
    assert "README.md: not a regular file" in refused(pack)


def test_a_transcript_file_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "t.jsonl")
    err = refused(tmp_path / "t.jsonl", "--metrics", "response_length", command="score")
    assert "not a regular file" in err


# -- 11: odd input is refused with its place; validation is linear --------------------


def raw_scenarios(folder: Path, text: str) -> Path:
    write_multi(folder)
    (folder / "scenarios.jsonl").write_text(text)
    return folder


def raw_flows(folder: Path, text: str) -> Path:
    write_multi(folder)
    (folder / "turn_configs.yml").write_text(text)
    return folder


ROW = json.dumps(scenario())[:-1]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (ROW + ', "tags": [' + "9" * 5000 + "]}\n", "scenarios.jsonl:1"),
        ("\n" + ROW + ', "metadata": {"k": ' + "[" * 100_000 + "]" * 100_000 + "}}\n", ":2"),
        (ROW + ', "metadata": {"k": ' + "[" * 500 + "]" * 500 + "}}\n", "scenarios.jsonl:1"),
        (ROW + ', "metadata": {"k": NaN}}\n', "scenarios.jsonl:1"),
        (ROW + ', "tags": ["\\ud83d"]}\n', "scenarios.jsonl:1: tags.0"),
        (ROW + ', "variables": {"name": 1' + "0" * 400 + "}}\n", "scenarios.jsonl:1"),
    ],
)
def test_odd_json_is_refused_with_its_line(tmp_path: Path, text: str, where: str) -> None:
    assert where in refused(raw_scenarios(tmp_path / "pack", text))


#: A billion laughs: each list holds nine of the one before, 9**12 items in all.
BOMB = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 12)
)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("? [a, b]\n: {turns: [{turn_id: a, prompt_template: x}]}\n", "turn_configs.yml:1"),
        ("default: " + "[" * 5000 + "]" * 5000 + "\n", "turn_configs.yml:1"),
        ("default:\n  max_turns: " + "9" * 5000 + "\n", "turn_configs.yml:2"),
        ("default:\n  description: 2024-13-45\n", "turn_configs.yml:2"),
        ("default: !!python/object:os.system {}\n", "turn_configs.yml:1"),
        ('default:\n  system_prompt: "\\ud83d"\n', "turn_configs.yml:2"),
        ("a: &a [*a]\n", "turn_configs.yml:1"),
        (BOMB, "turn_configs.yml:7: aliases expand to more than"),
    ],
)
def test_odd_yaml_is_refused_with_its_line(tmp_path: Path, text: str, where: str) -> None:
    assert where in refused(raw_flows(tmp_path / "pack", text))


def test_a_yaml_file_of_too_many_values_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from convsim.scenarios import _files

    monkeypatch.setattr(_files, "MAX_YAML_NODES", 1000)
    monkeypatch.setattr(_files.yaml, "compose", lambda *a, **k: pytest.fail("composed"))
    flows = FLOW + "other:\n  metrics:\n" + "    - m\n" * 1000
    err = refused(raw_flows(tmp_path / "pack", flows))
    assert "turn_configs.yml:" in err and "holds more than 1,000 values" in err


def test_a_template_that_cannot_format_its_value_is_refused_at_validation(
    tmp_path: Path,
) -> None:
    flows = FLOW.replace("{name}", "{name:%Y}")
    err = refused(write_multi(tmp_path / "pack", flows=flows))
    assert "scenarios.jsonl:1: variables.name" in err and "{name:%Y}" in err
    flows = FLOW.replace("{name}", "{name} at {turn_index:%Y}")
    err = refused(write_multi(tmp_path / "pack2", flows=flows))
    assert "turn_index" in err


def test_a_single_turn_template_that_cannot_format_its_value_is_refused(tmp_path: Path) -> None:
    pack = write_single(tmp_path / "pack")
    config = (pack / "config.yml").read_text().replace("{question}", "{question:,}")
    (pack / "config.yml").write_text(config)
    err = refused(pack)
    assert "problems.jsonl:1: question" in err and "{question:,}" in err


@pytest.mark.timeout(30)
def test_a_4000_turn_flow_validates_in_linear_time(tmp_path: Path) -> None:
    turns = "".join(
        f"    - turn_id: t{i}\n      prompt_template: 'turn {i}, {{name}}'\n"
        + (f"      depends_on: [t{i - 1}]\n" if i else "")
        for i in range(4000)
    )
    pack = write_multi(tmp_path / "pack", flows="default:\n  turns:\n" + turns)
    loaded = load_pack(pack)
    assert [t.turn_id for t in loaded.conversations[0].flow.turns][-2:] == ["t3998", "t3999"]


def test_an_lm_eval_task_folder_is_code_and_needs_allow_code(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    # lm-eval imports the function a !function tag names when the task loads
    (tasks / "evil.yaml").write_text(
        "task: evil\ndataset_path: json\noutput_type: generate_until\n"
        "process_docs: !function shutil.rmtree\ndoc_to_text: q\ndoc_to_target: a\n"
    )
    err = refused("lm-eval:evil", "--include-path", str(tasks))
    assert "include_path" in err and "--allow-code" in err
    with pytest.raises(PackError, match="allow_code=True"):
        load_pack("lm-eval:evil", include_path=tasks)
    assert victim.is_dir()


def test_line_numbers_print_as_numbers_not_emoji(tmp_path: Path) -> None:
    pack = write_multi(tmp_path / "pack", *[scenario(scenario_id=f"s{i}") for i in range(99)])
    with open(pack / "scenarios.jsonl", "a") as fh:
        fh.write(json.dumps(scenario(scenario_id="s100", tags=[1])) + "\n")
    assert "scenarios.jsonl:100: tags.0" in refused(pack)


def test_scoring_a_stored_run_asks_again_before_running_its_packs_code(tmp_path: Path) -> None:
    sys.path.insert(0, str(TESTS))
    try:
        goal = python_goal("test_pack_safety:says_ada")
        pack = write_multi(tmp_path / "pack", scenario(goal=goal))
        out = tmp_path / "r.jsonl"
        code, _, err = invoke("run", str(pack), "--allow-code", "--out", str(out))
        assert code == 0, err
        manifest = next(tmp_path.glob("r*.manifest.json"))
        data = json.loads(manifest.read_text())
        data["pack_options"]["allow_code"] = True  # a results file cannot allow code
        manifest.write_text(json.dumps(data))
        code, output, err = invoke("score", str(out), "--metrics", "goal_achievement")
        assert code == 0, err
        assert "runs Python code (pass --allow-code" in output
        code, output, err = invoke(
            "score", str(out), "--metrics", "goal_achievement", "--allow-code"
        )
        assert code == 0, err
        assert "note:" not in output and "1" in output
    finally:
        sys.path.remove(str(TESTS))


def test_max_file_bytes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(convsim.ConfigError, match="max_file_bytes"):
        load_pack(write_multi(tmp_path / "pack"), max_file_bytes=0)
    err = refused(write_multi(tmp_path / "pack"), "--max-file-size", "lots")
    assert "256MB" in err


def test_a_template_cannot_pad_its_prompt_to_megabytes(tmp_path: Path) -> None:
    flows = FLOW.replace("{name}", "{name:>999}" * 200)
    err = refused(write_multi(tmp_path / "pack", flows=flows))
    assert "turn_configs.yml:4: default.turns.0.prompt_template" in err and "pad" in err
    assert load_pack(write_multi(tmp_path / "ok", flows=FLOW.replace("{name}", "{name:>99}")))


# -- 17: pack files are read a line at a time; a long line is refused unparsed ----------

BUNDLED_ROWS = (
    (Path(convsim.scenarios.BUNDLED_PACKS_DIR) / "customer_support" / "scenarios.jsonl")
    .read_text()
    .splitlines()
)


def realistic_pack(folder: Path, scenarios: int) -> Path:
    """customer_support's flows and ``scenarios`` of its scenarios (2.4 kB a line)."""
    bundled = Path(convsim.scenarios.BUNDLED_PACKS_DIR) / "customer_support"
    folder.mkdir(parents=True)
    (folder / "turn_configs.yml").write_text((bundled / "turn_configs.yml").read_text())
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(scenarios):
            row = json.loads(BUNDLED_ROWS[i % len(BUNDLED_ROWS)])
            row["scenario_id"] = f"{row['scenario_id']}_{i}"
            fh.write(json.dumps(row) + "\n")
    return folder


def test_a_line_over_the_limit_is_refused_without_being_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = "[" + ",".join(["1"] * 1_000_000) + "]"  # 2 MB: a value of a million numbers
    pack = write_multi(tmp_path / "pack")
    with open(pack / "scenarios.jsonl", "a") as fh:
        fh.write(huge + "\n" + json.dumps(scenario(scenario_id="s3", tags=[1])) + "\n")
    parsed: list[int] = []
    loads = json.loads
    monkeypatch.setattr(
        json, "loads", lambda text, **kw: parsed.append(len(text)) or loads(text, **kw)
    )
    with pytest.raises(PackError) as caught:
        load_pack(pack)
    assert max(parsed) < 1000  # lines 1 and 3 were parsed, line 2 was not
    assert [str(p) for p in caught.value.problems] == [
        "scenarios.jsonl:2: a line of 2 MB, over the limit of 1 MB per line (raise it with "
        "--max-line-size or max_line_bytes=); not parsed",
        "scenarios.jsonl:3: tags.0: Input should be a valid string",  # the lines after count
    ]
    with pytest.raises(PackError, match=r"scenarios\.jsonl:2: Input should be a valid dictionary"):
        load_pack(pack, max_line_bytes=3_000_000)  # a higher limit parses it


@pytest.mark.slow
def test_convsim_validate_refuses_a_long_line_in_one_line(tmp_path: Path) -> None:
    pack = raw_scenarios(
        tmp_path / "pack", "{" + ",".join(f'"k{i}":1' for i in range(200_000)) + "}\n"
    )
    err = refused(pack)
    assert err.strip().count("\n") == 0, err
    assert "scenarios.jsonl:1: a line of 2.289 MB, over the limit of 1 MB per line" in err
    assert "--max-line-size" in err
    err = refused(pack, "--max-line-size", "3MB")  # parsed now: a problem per unknown key
    assert "(200,002 problems, the first 1,000 listed)" in err
    assert err.strip().endswith("... and 199,002 more")
    code, _, err = invoke("validate", str(write_multi(tmp_path / "ok")), "--max-line-size", "1kB")
    assert code == 0, err


def test_a_transcript_line_over_the_limit_is_refused(tmp_path: Path) -> None:
    transcripts = tmp_path / "t.jsonl"
    transcripts.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 3000}]}))
    err = refused(
        transcripts, "--metrics", "response_length", "--max-line-size", "2kB", command="score"
    )
    assert "t.jsonl:1: a line of 3.047 kB, over the limit of 2 kB per line" in err


def test_refusing_a_long_line_takes_memory_of_the_limit_not_of_the_line(tmp_path: Path) -> None:
    pack = raw_scenarios(tmp_path / "pack", "[" + "1," * 10_000_000 + "1]\n")  # 20 MB
    tracemalloc.start()
    try:
        with pytest.raises(PackError, match="a line of 20 MB"):
            load_pack(pack)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak  # reading the file whole took 40 MB, parsing it 1 GB


@pytest.mark.slow
def test_loading_keeps_the_scenarios_not_the_text_they_came_from(tmp_path: Path) -> None:
    pack = realistic_pack(tmp_path / "pack", 1000)  # 2.4 MB
    tracemalloc.start()
    try:
        loaded = load_pack(pack)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(loaded) == 1000
    # what loading needs besides the pack it returns: a line at a time (64 kB measured),
    # not the file's bytes, its text and its lines at once (7 MB here)
    assert peak - held < 1_000_000, (peak, held)


@pytest.mark.slow
def test_a_single_turn_pack_keeps_its_scenarios_not_its_problems(tmp_path: Path) -> None:
    pack = write_single(tmp_path / "pack")
    config = (pack / "config.yml").read_text() + '  with_examples: "{examples} Q: {question}"\n'
    (pack / "config.yml").write_text(config)
    problem = {"question": "2+2?", "expected_answer": "4", "tags": ["a", "b"], "domain": "m"}
    with open(pack / "problems.jsonl", "w") as fh:
        for i in range(3000):
            fh.write(json.dumps({"id": f"p{i}", **problem, "metadata": {"n": i}}) + "\n")
    tracemalloc.start()
    try:
        loaded = load_pack(pack, num_fewshot=1)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(loaded) == 3000
    # every validated Problem, kept until the last scenario was built: 4 MB here
    assert peak - held < 500_000, (peak, held)  # measured: 0.26 MB


def test_a_line_at_the_limit_is_read_one_byte_more_is_not(tmp_path: Path) -> None:
    row = json.dumps(scenario())
    pack = raw_scenarios(tmp_path / "pack", row + "\r\n\n   \n" + row.replace("s1", "s2"))
    assert len(load_pack(pack, max_line_bytes=len(row) + 1)) == 2  # "\r" counts, "\n" not
    with pytest.raises(PackError) as caught:
        load_pack(pack, max_line_bytes=len(row))
    assert [p.line for p in caught.value.problems] == [1]  # the last line has no "\r"
    with pytest.raises(convsim.ConfigError, match="max_line_bytes"):
        load_pack(pack, max_line_bytes=0)


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    row = json.dumps(scenario()).encode()
    pack = write_multi(tmp_path / "pack")
    (pack / "scenarios.jsonl").write_bytes(row + b"\n" + row.replace(b"Ada", b"Ad\xff") + b"\n")
    err = refused(pack)
    offset = len(row) + 1 + row.index(b"Ada") + 2
    assert f"scenarios.jsonl:2: not UTF-8 text (invalid start byte at byte {offset})" in err


def test_a_pack_with_a_mistake_on_every_line_lists_the_first_thousand(tmp_path: Path) -> None:
    pack = write_multi(
        tmp_path / "pack", *[scenario(scenario_id=f"s{i}", tags=[1]) for i in range(2500)]
    )
    with pytest.raises(PackError) as caught:
        load_pack(pack)
    assert len(caught.value.problems) == 1000 and caught.value.more == 1500
    assert (
        str(caught.value.problems[-1])
        == "scenarios.jsonl:1000: tags.0: Input should be a valid string"
    )
    assert "(2,500 problems, the first 1,000 listed)" in str(caught.value)


def test_notes_name_ten_scenarios_per_skipped_turn_and_count_the_rest(tmp_path: Path) -> None:
    flows = FLOW + "    - turn_id: extra\n      optional: true\n      prompt_template: '{topic}'\n"
    rows = [scenario(scenario_id=f"s{i}") for i in range(25)]
    notes = load_pack(write_multi(tmp_path / "pack", *rows, flows=flows)).notes
    assert notes[0] == "scenarios.jsonl:1: optional turn 'extra' will be skipped (no topic)"
    assert len(notes) == 11
    assert notes[-1] == (
        "scenarios.jsonl: optional turn 'extra' of flow 'default' will be skipped in 15 more "
        "scenarios too (25 in all)"
    )


@pytest.mark.parametrize(
    "text",
    [
        ROW + ', "tags": ["\\uD83D"]}\n',  # an upper-case escape
        ROW + ', "metadata": {"\\udfff": 1}}\n',  # in a key
        ROW + ', "metadata": {"k": ' + "[" * 101 + "]" * 101 + "}}\n",
    ],
)
def test_values_are_still_checked_where_they_could_be_unfit(tmp_path: Path, text: str) -> None:
    assert "scenarios.jsonl:1" in refused(raw_scenarios(tmp_path / "pack", text))


def test_values_that_look_unfit_but_are_not_load(tmp_path: Path) -> None:
    rows = [
        ROW + ', "tags": ["\\ud83d\\ude00", "\\\\ud800"]}',  # a surrogate pair; an escaped "\"
        ROW.replace("s1", "s2") + ', "metadata": {"k": ' + "[" * 99 + "]" * 99 + "}}",
        ROW.replace("s1", "s3") + ', "tags": ["' + "[" * 500 + '"]}',  # brackets in text
    ]
    loaded = load_pack(raw_scenarios(tmp_path / "pack", "\n".join(rows)))
    assert loaded.conversations[0].scenario.tags == ["\U0001f600", "\\ud800"]


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_few_shot_examples_take_linear_time(tmp_path: Path) -> None:
    pack = write_single(tmp_path / "pack")
    config = (pack / "config.yml").read_text() + '  with_examples: "{examples} Q: {question}"\n'
    (pack / "config.yml").write_text(config)
    with open(pack / "problems.jsonl", "w") as fh:
        for i in range(30_000):
            fh.write(
                json.dumps({"id": f"p{i}", "question": f"{i}+1?", "expected_answer": f"{i + 1}"})
                + "\n"
            )
    # built a list of the 29,999 other problems for each problem
    loaded = load_pack(pack, num_fewshot=2)
    questions = [f"{i}+1?" for i in range(30_000)]
    for i in (0, 12_345, 29_999):  # the examples runs had before, so resumed runs match
        others = questions[:i] + questions[i + 1 :]
        picked = random.Random(f"fewshot:{i}").sample(others, 2)
        examples = loaded.conversations[i].scenario.variables["examples"]
        assert [e.split("\n")[0] for e in examples.split("\n\n")] == [
            f"Question: {q}" for q in picked
        ]


def test_values_that_cannot_be_unfit_are_not_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from convsim.scenarios import _files

    walked: list[str] = []  # the scenarios walked (the YAML file is walked too)
    check = _files.check_value

    def counting(value: Any) -> None:
        if isinstance(value, dict) and "scenario_id" in value:
            walked.append(value["scenario_id"])
        check(value)

    monkeypatch.setattr(_files, "check_value", counting)
    assert len(load_pack(realistic_pack(tmp_path / "pack", 50))) == 50
    assert walked == []  # walking every value was 45% of the time to load 10,000
    deep = ROW + ', "metadata": {"k": ' + "[" * 101 + "]" * 101 + "}}\n"
    refused(raw_scenarios(tmp_path / "deep", deep))
    assert walked == ["s1"]


def test_validate_and_run_tune_the_collector_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the collector traversing the loaded scenarios again and again was 70% of loading
    # 100,000 of them
    from convsim._runtime import _packs
    from convsim.cli import _packs as packs_command
    from convsim.cli import _run as run_command

    calls: list[str] = []
    load = _packs.load_pack
    for command in (packs_command, run_command):
        monkeypatch.setattr(command, "tune_gc_for_throughput", lambda: calls.append("tune"))
    monkeypatch.setattr(_packs, "load_pack", lambda *a, **k: calls.append("load") or load(*a, **k))
    pack = write_multi(tmp_path / "pack")
    assert invoke("validate", str(pack))[0] == 0
    assert calls == ["tune", "load"]
    calls.clear()
    assert invoke("run", str(pack), "--out", str(tmp_path / "r.jsonl"))[0] == 0
    assert calls == ["tune", "load", "tune"]  # then once more, to freeze the loaded pack
