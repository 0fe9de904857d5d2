"""``evaluation_config.languages``: problems that carry a language (``language``, or
``metadata.language``) outside the listed ones are left out and counted in the pack's
notes; problems without one are kept (``unspecified``); results are broken down by
language in the summary JSON, summary.md, the terminal and the HTML report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

import convsim
from convsim import PackError, Summarizer, load_pack, summarize
from convsim.cli import main
from convsim.results._terminal import print_report
from convsim.scenarios import BUNDLED_PACKS_DIR

BUNDLED = BUNDLED_PACKS_DIR / "single_turn_qa"


def problem(pid: str, **more: Any) -> dict[str, Any]:
    return {"id": pid, "question": f"Say {pid}.", "expected_answer": pid, **more}


#: two in English, one in French, one in German (in its metadata), one in none
PROBLEMS = [
    problem("one", language="en"),
    problem("two", language="en", metadata={"language": "en"}),
    problem("trois", language="fr"),
    problem("vier", metadata={"language": "de"}),
    problem("none"),
]


def write_pack(
    tmp_path: Path, languages: str | None, rows: list[dict[str, Any]] = PROBLEMS
) -> Path:
    """The bundled single-turn pack with ``rows`` and ``evaluation_config.languages``
    set to ``languages`` (YAML), or left out when None."""
    folder = tmp_path / "pack"
    shutil.copytree(BUNDLED, folder)
    config = (folder / "config.yml").read_text(encoding="utf-8")
    config = config.replace('  languages: ["en"]\n', "")
    if languages is not None:
        config = config.replace(
            "evaluation_config:\n", f"evaluation_config:\n  languages: {languages}\n"
        )
    (folder / "config.yml").write_text(config, encoding="utf-8")
    (folder / "problems.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
    )
    return folder


def config_line(folder: Path, needle: str) -> int:
    lines = (folder / "config.yml").read_text(encoding="utf-8").splitlines()
    (hit,) = [n for n, line in enumerate(lines, start=1) if needle in line]
    return hit


def ids(pack: convsim.Pack) -> list[str]:
    return [c.scenario.scenario_id for c in pack.conversations]


def test_listed_languages_keep_their_problems_and_those_without_one(tmp_path: Path) -> None:
    folder = write_pack(tmp_path, '["en", "fr"]')
    pack = load_pack(folder)
    assert ids(pack) == ["one", "two", "trois", "none"]  # vier (de) is left out
    line = config_line(folder, "languages:")
    assert (
        f"config.yml:{line}: evaluation_config.languages (en, fr) keeps 4 of 5 problems; "
        "1 left out (1 in de)"
    ) in pack.notes
    languages = {
        c.scenario.scenario_id: c.scenario.metadata.get("language") for c in pack.conversations
    }
    assert languages == {"one": "en", "two": "en", "trois": "fr", "none": None}


def test_without_languages_in_config_nothing_is_filtered(tmp_path: Path) -> None:
    pack = load_pack(write_pack(tmp_path, None))
    assert ids(pack) == ["one", "two", "trois", "vier", "none"]
    assert not any("languages" in note for note in pack.notes)


def test_the_summary_breaks_results_down_by_language(tmp_path: Path) -> None:
    results = convsim.run_sync(write_pack(tmp_path, '["en", "fr"]'), "scripted")
    assert {r.scenario_id: r.language for r in results} == {
        "one": "en", "two": "en", "trois": "fr", "none": None,
    }  # fmt: skip
    report = summarize(results)
    by = {name: g.conversations for name, g in report.by_language.items()}
    assert by == {"en": 2, "fr": 1, "unspecified": 1}
    assert report.by_language["en"].metrics["exact_match"].n == 2
    data = json.loads(report.model_dump_json())
    assert set(data["by_language"]) == {"en", "fr", "unspecified"}
    md = report.to_markdown()
    assert "## By language" in md and "| en | 2 | 2 | 0 | 0 | 0 | 1 |" in md
    console = Console(width=100, record=True, force_terminal=False)
    print_report(report, console)
    assert "by language" in console.export_text()


def test_one_language_is_shown_too(tmp_path: Path) -> None:
    rows = [problem("a", language="fr"), problem("b", language="fr")]
    results = convsim.run_sync(write_pack(tmp_path, '["fr"]', rows), "scripted")
    report = summarize(results)
    assert list(report.by_language) == ["fr"] and "## By language" in report.to_markdown()
    pytest.importorskip("jinja2")
    from convsim.results._html import render_html

    assert '<h2 style="margin-top:12px">By language</h2>' in render_html(results, title="t")


def test_runs_without_languages_have_no_breakdown() -> None:
    report = summarize(convsim.run_sync("single_turn_qa", "scripted", limit=3))
    assert report.by_language == {}
    assert "by_language" not in json.loads(report.model_dump_json())
    assert "By language" not in report.to_markdown()


def test_conversations_before_the_first_language_are_unspecified(tmp_path: Path) -> None:
    results = convsim.run_sync(write_pack(tmp_path, None), "scripted")
    ordered = sorted(results, key=lambda r: r.language is not None)  # unspecified first
    fed = Summarizer()
    for result in ordered:
        fed.add(result)
    report = fed.report()
    unspecified = [r for r in ordered if r.language is None]
    group = report.by_language["unspecified"]
    assert group.conversations == len(unspecified) == 1
    assert group.metrics["exact_match"].n == summarize(unspecified).metrics["exact_match"].n
    assert sum(g.conversations for g in report.by_language.values()) == len(results)


def test_a_multi_turn_scenario_with_a_language_is_broken_down_too() -> None:
    pack = load_pack("customer_support")
    first = pack.conversations[0]
    scenario = first.scenario.model_copy(
        update={"metadata": {**first.scenario.metadata, "language": "en"}}
    )
    from dataclasses import replace

    one = replace(pack, conversations=(replace(first, scenario=scenario),))
    (result,) = convsim.run_sync(one, "scripted")
    assert result.language == "en"
    assert list(summarize([result]).by_language) == ["en"]


def test_languages_that_keep_no_problem_are_refused_with_their_line(tmp_path: Path) -> None:
    rows = [r for r in PROBLEMS if r["id"] != "none"]  # every problem has a language
    folder = write_pack(tmp_path, '["es"]', rows)
    with pytest.raises(PackError) as info:
        load_pack(folder)
    (wrong,) = info.value.problems
    line = config_line(folder, "languages:")
    assert (wrong.file, wrong.line, wrong.field) == (
        "config.yml", line, "evaluation_config.languages"
    )  # fmt: skip
    assert "es keeps none of the 4 problems of problems.jsonl (their languages: de, en, fr)" in (
        wrong.message
    )
    code = CliRunner().invoke(main, ["run", str(folder), "--model", "scripted"])
    assert code.exit_code == 2
    assert f"config.yml:{line}: evaluation_config.languages: es keeps none" in code.stderr
    assert "Traceback" not in code.stderr


PROBLEMS_AT = ("problems.jsonl", 1)
CONFIG_AT = ("config.yml", None)  # the line of languages:


@pytest.mark.parametrize(
    ("languages", "row", "where", "said"),
    [
        ('["en"]', problem("x", language="english!"), (*PROBLEMS_AT, "language"), "pattern"),
        ('["en"]', problem("x", metadata={"language": 42}), (*PROBLEMS_AT, "metadata.language"),
         "42 is not a language tag"),
        ('["en"]', problem("x", language="en", metadata={"language": "fr"}),
         (*PROBLEMS_AT, "metadata.language"), "'fr' differs from language 'en'"),
        ('["en_US"]', problem("x"), (*CONFIG_AT, "evaluation_config.languages.0"), "pattern"),
        ("[]", problem("x"), (*CONFIG_AT, "evaluation_config.languages"), "at least 1 item"),
    ],
)  # fmt: skip
def test_bad_languages_are_named_with_file_line_and_field(
    tmp_path: Path,
    languages: str,
    row: dict[str, Any],
    where: tuple[str, int | None, str],
    said: str,
) -> None:
    folder = write_pack(tmp_path, languages, [row, problem("y")])
    with pytest.raises(PackError) as info:
        load_pack(folder)
    (wrong,) = info.value.problems
    line = where[1] if where[1] is not None else config_line(folder, "languages:")
    assert (wrong.file, wrong.line, wrong.field) == (where[0], line, where[2])
    assert said in wrong.message


def test_the_language_filter_counts_for_num_fewshot(tmp_path: Path) -> None:
    folder = write_pack(
        tmp_path,
        '["fr"]',
        [problem("a", language="fr"), problem("b", language="de"), problem("c", language="de")],
    )
    with pytest.raises(PackError) as info:
        load_pack(folder, num_fewshot=1)
    (wrong,) = info.value.problems
    assert wrong.field == "evaluation_config.languages" and "--num-fewshot 1 needs more" in (
        wrong.message
    )


def test_dataset_size_samples_among_the_problems_the_languages_keep(tmp_path: Path) -> None:
    rows = [problem(f"en{i}", language="en") for i in range(6)]
    rows += [problem(f"fr{i}", language="fr") for i in range(6)]
    folder = write_pack(tmp_path, '["fr"]', rows)
    config = (folder / "config.yml").read_text(encoding="utf-8")
    config = config.replace("  size: 30\n", "  size: 4\n", 1)
    (folder / "config.yml").write_text(config, encoding="utf-8")
    for seed in (0, 1, 2):
        pack = load_pack(folder, seed=seed)
        assert len(ids(pack)) == 4 and all(i.startswith("fr") for i in ids(pack)), ids(pack)
        assert any("sampled 4 of 6 problems" in note for note in pack.notes), pack.notes


def test_a_run_says_what_the_languages_and_the_size_left_out(tmp_path: Path) -> None:
    folder = write_pack(tmp_path, '["en"]')
    out = tmp_path / "r.jsonl"
    run = CliRunner().invoke(main, ["run", str(folder), "-m", "scripted", "-o", str(out)])
    assert run.exit_code == 0, run.output
    line = config_line(folder, "languages:")
    assert (
        f"note: pack: config.yml:{line}: evaluation_config.languages (en) keeps 3 of 5 "
        "problems; 2 left out (1 in de, 1 in fr)"
    ) in run.stderr
    # the bundled config's size: 30 is more than these problems: all are used, and said
    assert "dataset.size is 30, but the dataset holds 3 problems: all 3 are used" in run.stderr


def test_language_tags_match_whatever_their_case(tmp_path: Path) -> None:
    rows = [
        problem("a", language="pt-br"),
        problem("b", language="PT-BR"),
        problem("c", language="fr"),
    ]
    folder = write_pack(tmp_path, '["pt-BR"]', rows)
    assert ids(load_pack(folder)) == ["a", "b"]


def test_a_load_test_samples_dataset_size_by_its_seed(tmp_path: Path) -> None:
    from convsim.load import LoadPlan
    from convsim.load._plan import _workload

    rows = [problem(f"p{i}") for i in range(12)]
    folder = write_pack(tmp_path, None, rows)
    config = (folder / "config.yml").read_text(encoding="utf-8")
    (folder / "config.yml").write_text(config.replace("  size: 30\n", "  size: 3\n"))
    for seed in (1, 2, 3):
        sessions = _workload(LoadPlan(pack=str(folder), seed=seed), None)
        sent = [c.scenario.scenario_id for c in sessions.conversations]  # type: ignore[attr-defined]
        assert sent == ids(load_pack(folder, seed=seed))
