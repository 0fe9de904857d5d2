"""config.yml ``dataset``: the formats a single-turn pack's problems come in (jsonl, csv,
parquet, hf), ``dataset.size`` sampling by seed, and what the manifest records of both."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from convsim import MissingExtra, PackError, load_pack
from convsim.cli import main

PROBLEMS = [
    {
        "id": f"p{i}",
        "question": f"What is {i} + {i}?",
        "expected_answer": str(2 * i),
        "required_keywords": [str(2 * i), "sum"],
        "tags": ["maths"],
        "metadata": {"n": i},
    }
    for i in range(1, 21)
]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def write_config(folder: Path, **dataset: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "task_name": "sums",
        "description": "adds numbers",
        "dataset": dataset,
        "metrics": {"primary": ["exact_match"]},
        "prompt_templates": {"default": "Question: {question}\nAnswer:"},
    }
    (folder / "config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def csv_text(rows: list[dict[str, Any]]) -> str:
    lines = ["id,question,expected_answer,required_keywords,tags,metadata"]
    for p in rows:
        keywords = "; ".join(p["required_keywords"])
        lines.append(
            f"{p['id']},{p['question']},{p['expected_answer']},{keywords},"
            f'{json.dumps(p["tags"])},"{json.dumps(p["metadata"]).replace(chr(34), chr(34) * 2)}"'
        )
    return "\n".join(lines) + "\n"


def csv_pack(folder: Path, rows: list[dict[str, Any]] = PROBLEMS, **dataset: Any) -> Path:
    write_config(folder, format="csv", **dataset)
    (folder / dataset.get("path", "problems.csv")).write_text(csv_text(rows))
    return folder


def parquet_pack(folder: Path, table: Any, **dataset: Any) -> Path:
    import pyarrow.parquet as pq

    write_config(folder, format="parquet", **dataset)
    pq.write_table(table, folder / "problems.parquet")
    return folder


def problems_table(rows: list[dict[str, Any]] = PROBLEMS) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(
        [{**p, "metadata": json.dumps(p["metadata"])} for p in rows],
    )


def problems_of(pack: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": c.scenario.scenario_id,
            "question": c.scenario.variables["question"],
            "expected_answer": c.scenario.reference_responses["answer"],
            "required_keywords": c.scenario.required_keywords,
            "tags": c.scenario.tags,
            "metadata": {k: v for k, v in c.scenario.metadata.items() if k != "domain"},
        }
        for c in pack.conversations
    ]


def problem_lines(exc: pytest.ExceptionInfo[PackError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any connection beyond loopback fails the test, and the Hugging Face libraries are
    told they are offline."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost") and not isinstance(address, str):
            raise AssertionError(f"a test tried to reach the network: {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "1")
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    yield


# -- csv --------------------------------------------------------------------------------


def test_csv_problems_load_as_jsonl_ones_do(tmp_path: Path) -> None:
    pack = load_pack(csv_pack(tmp_path / "p"))
    assert problems_of(pack) == PROBLEMS  # ;-separated and JSON lists, JSON metadata
    assert pack.conversations[0].source == "problems.csv:2"
    assert pack.dataset == {"format": "csv", "path": "problems.csv"}


def test_csv_pack_runs_and_the_manifest_records_the_format(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("run", str(csv_pack(tmp_path / "p")), "--out", str(out))
    assert code == 0, err
    assert len(out.read_text().splitlines()) == len(PROBLEMS)
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["pack_options"]["dataset"] == {"format": "csv", "path": "problems.csv"}


def test_csv_columns_map_other_names_and_quoted_cells_span_lines(tmp_path: Path) -> None:
    folder = write_config(
        tmp_path / "p",
        format="csv",
        path="data.csv",
        columns={"question": "prompt", "expected_answer": "answer"},
    )
    (folder / "data.csv").write_text('prompt,answer\n"two\nlines",2\n\nthree,3\n', encoding="utf-8")
    pack = load_pack(folder)
    assert [(c.source, c.scenario.variables["question"]) for c in pack.conversations] == [
        ("data.csv:2", "two\nlines"),
        ("data.csv:5", "three"),
    ]
    assert [c.scenario.scenario_id for c in pack.conversations] == ["sums-2", "sums-5"]


def test_csv_bad_rows_are_named_with_their_line_and_field(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", format="csv")
    (folder / "problems.csv").write_text(
        "question,expected_answer,metadata,tags\n"
        'ok,1,"{""a"": 1}",x\n'
        ",2,,\n"  # no question
        'q3,3,"{not json",\n'
        '"q\n4",4,"[1]",\n'  # a row over two lines; metadata not an object
        "q5,5,,,extra\n"
        'q6,6,,"[1, 2"\n'
    )
    with pytest.raises(PackError) as exc:
        load_pack(folder)
    lines = problem_lines(exc)
    assert lines[0] == "problems.csv:3: question: Field required"
    assert lines[1].startswith("problems.csv:4: metadata: invalid JSON")
    assert lines[2].startswith("problems.csv:5: metadata: ")
    assert lines[3] == "problems.csv:7: 5 cells, but the header names 4 columns"
    assert lines[4].startswith("problems.csv:8: tags: invalid JSON")
    assert len(lines) == 5


def test_csv_header_with_an_unknown_column_is_refused_on_line_one(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", format="csv")
    (folder / "problems.csv").write_text("question,answer\nq,1\n")
    code, _, err = invoke("validate", str(folder))
    assert code == 2
    assert "problems.csv:1: answer: unknown column" in err
    assert "Traceback" not in err


def test_csv_columns_naming_a_missing_column_says_so(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", format="csv", columns={"expected_answer": "gold"})
    (folder / "problems.csv").write_text("question,expected_answer\nq,1\n")
    with pytest.raises(PackError) as exc:
        load_pack(folder)
    assert problem_lines(exc) == [
        "problems.csv:1: expected_answer: no column 'gold' for "
        "dataset.columns.expected_answer (columns: question, expected_answer)"
    ]


def test_csv_rows_have_the_jsonl_size_limits(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", format="csv")
    long = "x" * 300
    (folder / "problems.csv").write_text(f'question,expected_answer\nq,1\n"{long}\n{long}",2\n')
    with pytest.raises(PackError) as exc:
        load_pack(folder, max_line_bytes=500)
    (line,) = problem_lines(exc)
    assert line.startswith("problems.csv:3: a row of more than 500 bytes, over the limit")
    with pytest.raises(PackError, match="over the limit of 40 bytes"):
        load_pack(folder, max_file_bytes=40)
    assert len(load_pack(folder, max_line_bytes=1000)) == 2


def test_csv_without_a_header_or_not_utf8(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", format="csv")
    (folder / "problems.csv").write_text("\n\n")
    with pytest.raises(PackError, match=r"problems\.csv: no header row"):
        load_pack(folder)
    (folder / "problems.csv").write_bytes(b"question,expected_answer\nq\xff,1\n")
    with pytest.raises(PackError, match=r"problems.csv:2: not UTF-8 text"):
        load_pack(folder)


# -- parquet ---------------------------------------------------------------------------


def test_parquet_problems_load_and_run(tmp_path: Path) -> None:
    folder = parquet_pack(tmp_path / "p", problems_table())
    pack = load_pack(folder)
    assert problems_of(pack) == PROBLEMS
    assert pack.conversations[0].source == "problems.parquet row 1"
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("run", str(folder), "--out", str(out))
    assert code == 0, err
    assert len(out.read_text().splitlines()) == len(PROBLEMS)
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["pack_options"]["dataset"]["format"] == "parquet"


def test_parquet_bad_rows_are_named_with_their_row_and_field(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table(
        {
            "question": ["q1", None, "q3", "q4"],
            "expected_answer": ["1", "2", "3", "4"],
            "metadata": ["{}", "{}", "{bad", "[1]"],
        }
    )
    with pytest.raises(PackError) as exc:
        load_pack(parquet_pack(tmp_path / "p", table))
    lines = problem_lines(exc)
    assert lines[0] == "problems.parquet row 2: question: Field required"
    assert lines[1].startswith("problems.parquet row 3: metadata: invalid JSON")
    assert lines[2].startswith("problems.parquet row 4: metadata: ")
    assert len(lines) == 3


def test_parquet_unknown_column_and_not_parquet(tmp_path: Path) -> None:
    import pyarrow as pa

    folder = parquet_pack(tmp_path / "p", pa.table({"question": ["q"], "gold": ["1"]}))
    with pytest.raises(PackError) as exc:
        load_pack(folder)
    assert problem_lines(exc)[0].startswith("problems.parquet: gold: unknown column")
    (folder / "problems.parquet").write_text("question,expected_answer\n")
    with pytest.raises(PackError, match=r"problems\.parquet: not a Parquet file"):
        load_pack(folder)


@pytest.mark.parametrize(("fmt", "module"), [("parquet", "pyarrow"), ("hf", "datasets")])
def test_a_format_without_its_extra_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, module: str
) -> None:
    folder = write_config(tmp_path / "p", format=fmt, **({"name": "data"} if fmt == "hf" else {}))
    (folder / "problems.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(MissingExtra) as exc:
        load_pack(folder)
    assert exc.value.extra == "datasets"
    code, _, err = invoke("validate", str(folder))
    assert code == 2
    assert f"dataset.format {fmt} needs the datasets extra" in err
    assert "pip install 'convsim[datasets]'" in err


# -- hf --------------------------------------------------------------------------------


def saved_dataset(folder: Path, rows: list[dict[str, Any]] = PROBLEMS) -> None:
    import datasets

    flat = [{**p, "metadata": json.dumps(p["metadata"])} for p in rows]
    columns = {key: [r[key] for r in flat] for key in flat[0]}
    datasets.DatasetDict(
        {"test": datasets.Dataset.from_dict(columns), "train": datasets.Dataset.from_dict(columns)}
    ).save_to_disk(str(folder))


def test_hf_dataset_saved_to_disk_loads_and_runs(tmp_path: Path, no_network: None) -> None:
    folder = write_config(tmp_path / "p", format="hf", name="data", split="test")
    saved_dataset(folder / "data")
    pack = load_pack(folder)
    assert problems_of(pack) == PROBLEMS
    assert pack.conversations[0].source == "data:test row 1"
    fingerprint = pack.dataset["fingerprint"]
    assert isinstance(fingerprint, str) and fingerprint
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("run", str(folder), "--out", str(out))
    assert code == 0, err
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["pack_options"]["dataset"] == {
        "format": "hf",
        "name": "data",
        "config": None,
        "split": "test",
        "revision": None,
        "fingerprint": fingerprint,
    }


def test_hf_data_files_folder_is_read_through_load_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
) -> None:
    import datasets

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = write_config(
        tmp_path / "p", format="hf", name="files", columns={"expected_answer": "gold"}
    )
    (folder / "files").mkdir()
    rows = [{"question": f"q{i}", "gold": str(i)} for i in range(3)]
    (folder / "files" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack = load_pack(folder)
    assert [c.scenario.reference_responses["answer"] for c in pack.conversations] == [
        "0",
        "1",
        "2",
    ]
    assert pack.dataset["split"] == "test"


def test_hf_bad_rows_missing_split_and_unknown_dataset(tmp_path: Path, no_network: None) -> None:
    folder = write_config(tmp_path / "p", format="hf", name="data")
    saved_dataset(folder / "data", [PROBLEMS[0], {**PROBLEMS[1], "question": ""}])
    (folder / "data").rename(folder / "kept")
    import datasets

    ds = datasets.load_from_disk(str(folder / "kept"))["test"]
    ds = ds.map(lambda r, i: {"id": "bad id" if i == 1 else r["id"]}, with_indices=True)
    ds.save_to_disk(str(folder / "data"))
    with pytest.raises(PackError) as exc:
        load_pack(folder)
    assert problem_lines(exc)[0].startswith("data:test row 2: id: String should match pattern")

    write_config(tmp_path / "p", format="hf", name="kept", split="validation")
    code, _, err = invoke("validate", str(folder))
    assert code == 2
    assert "config.yml:6: dataset.split: no split 'validation' in kept (splits: test, train)" in err

    write_config(tmp_path / "p", format="hf", name="nobody-here/no-such-dataset")
    code, _, err = invoke("validate", str(folder))
    assert code == 2
    assert "config.yml:5: dataset.name: cannot load dataset 'nobody-here/no-such-dataset'" in err
    assert "HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set" in err
    assert "Traceback" not in err


def test_hf_reads_only_the_packs_folder_or_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
) -> None:
    """``load_dataset`` reads any local path it finds before the hub: a name outside the
    pack (absolute, relative to the working directory, climbing out) is refused, so a pack
    reads the same data wherever it runs."""
    outside = tmp_path / "outside"
    saved_dataset(outside)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "p"
    for name in (str(outside), "outside", "../outside", "~/data"):
        write_config(folder, format="hf", name=name)
        code, _, err = invoke("validate", str(folder))
        assert code == 2, (name, err)
        assert f"dataset.name: {name!r} is not a folder inside the pack" in err, err


def test_hf_loading_prints_no_progress_bars(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], no_network: None
) -> None:
    import datasets

    folder = write_config(tmp_path / "p", format="hf", name="files")
    (folder / "files").mkdir()
    (folder / "files" / "test.jsonl").write_text(json.dumps(PROBLEMS[0]) + "\n")
    shown = not datasets.are_progress_bars_disabled()
    capfd.readouterr()
    load_pack(folder)
    assert capfd.readouterr().err == ""
    assert (not datasets.are_progress_bars_disabled()) == shown  # left as it was


def test_hf_settings_must_fit_the_format(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", format="hf")
    with pytest.raises(PackError) as exc:
        load_pack(folder)
    assert problem_lines(exc) == [
        "config.yml:4: dataset.name: format hf needs the dataset's name "
        "(a hub name or a folder in the pack)"
    ]
    csv_pack(tmp_path / "q", split="test")
    with pytest.raises(PackError) as exc:
        load_pack(tmp_path / "q")
    assert problem_lines(exc) == [
        "config.yml:5: dataset.split: does not apply to format csv (hf only)"
    ]


# -- dataset.size ------------------------------------------------------------------------


def ids(pack: Any) -> list[str]:
    return [c.scenario.scenario_id for c in pack.conversations]


def test_size_samples_by_seed_the_same_way_each_time(tmp_path: Path) -> None:
    folder = csv_pack(tmp_path / "p", size=5)
    first = load_pack(folder, seed=7)
    assert len(first) == 5
    assert ids(first) == ids(load_pack(folder, seed=7))
    assert ids(first) == sorted(ids(first), key=lambda i: int(i[1:]))  # in dataset order
    assert ids(load_pack(folder, seed=8)) != ids(first)
    assert ids(load_pack(folder)) == ids(load_pack(folder, seed=0))  # the default seed
    assert first.notes == ("problems.csv: sampled 5 of 20 problems with seed 7",)
    assert first.dataset["sampled"] == "sampled 5 of 20 problems with seed 7"
    assert first.load_options["seed"] == 7
    assert first.pack_hash != load_pack(folder, seed=8).pack_hash


def test_size_sampling_is_said_in_the_run_and_recorded_in_the_manifest(tmp_path: Path) -> None:
    folder = csv_pack(tmp_path / "p", size=4)
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("run", str(folder), "--out", str(out), "--seed", "7")
    assert code == 0, err
    assert "note: p: problems.csv: sampled 4 of 20 problems with seed 7" in err
    manifest = json.loads(out.with_name("r.manifest.json").read_text())
    assert manifest["pack_options"]["dataset"] == {
        "format": "csv",
        "path": "problems.csv",
        "size": 4,
        "rows": 20,
        "seed": 7,
        "sampled": "sampled 4 of 20 problems with seed 7",
    }
    ran = {json.loads(line)["conversation_id"] for line in out.read_text().splitlines()}
    assert ran == set(ids(load_pack(folder, seed=7)))
    code, _, _ = invoke("validate", str(folder))
    assert code == 0


def test_size_larger_than_the_data_uses_all_of_it_and_says_so(tmp_path: Path) -> None:
    pack = load_pack(csv_pack(tmp_path / "p", size=100))
    assert len(pack) == len(PROBLEMS)
    assert pack.notes == (
        "problems.csv: dataset.size is 100, but the dataset holds 20 problems: all 20 are used",
    )
    assert "seed" not in pack.load_options


def test_size_applies_to_jsonl_packs_too(tmp_path: Path) -> None:
    folder = write_config(tmp_path / "p", size=3)
    (folder / "problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    pack = load_pack(folder, seed=1)
    assert len(pack) == 3
    assert pack.notes == ("problems.jsonl: sampled 3 of 20 problems with seed 1",)


@pytest.mark.parametrize("size", ["0", "-1", "'5'", "1.5", "true", "many"])
def test_bad_size_names_file_line_and_field(tmp_path: Path, size: str) -> None:
    folder = csv_pack(tmp_path / "p")
    config = (
        (folder / "config.yml").read_text().replace("format: csv", f"format: csv\n  size: {size}")
    )
    (folder / "config.yml").write_text(config)
    code, _, err = invoke("run", str(folder), "--out", str(tmp_path / "r.jsonl"))
    assert code == 2
    assert "config.yml:5: dataset.size: " in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()


def test_fewshot_needs_more_problems_than_the_sample_holds(tmp_path: Path) -> None:
    folder = csv_pack(tmp_path / "p", size=2)
    config = yaml.safe_load((folder / "config.yml").read_text())
    config["prompt_templates"]["with_examples"] = "{examples}\nQuestion: {question}"
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    with pytest.raises(PackError, match="--num-fewshot 2 needs more than 2 problems"):
        load_pack(folder, num_fewshot=2)
    assert len(load_pack(folder, num_fewshot=1)) == 2


# -- resume ----------------------------------------------------------------------------


def test_resume_refuses_a_changed_dataset(tmp_path: Path) -> None:
    folder = csv_pack(tmp_path / "p", size=10)
    out = tmp_path / "r.jsonl"
    assert invoke("run", str(folder), "--out", str(out), "--limit", "3", "--seed", "3")[0] == 0
    code, _, err = invoke("run", str(folder), "--out", str(out), "--resume", "--seed", "4")
    assert code == 2
    assert "was written from dataset (format csv, path problems.csv, sampled 10 of 20" in err
    assert "with seed 3), but this run reads" in err and "with seed 4)" in err

    csv_pack(folder, PROBLEMS[:15], size=10)
    code, _, err = invoke("run", str(folder), "--out", str(out), "--resume", "--seed", "3")
    assert code == 2
    assert "sampled 10 of 15 problems with seed 3" in err

    csv_pack(folder, size=10)  # the data as it was: the run goes on
    code, _, err = invoke("run", str(folder), "--out", str(out), "--resume", "--seed", "3")
    assert code == 0, err
    assert len({json.loads(x)["conversation_id"] for x in out.read_text().splitlines()}) == 10


def test_resume_refuses_a_different_hf_dataset(tmp_path: Path, no_network: None) -> None:
    folder = write_config(tmp_path / "p", format="hf", name="data")
    saved_dataset(folder / "data")
    out = tmp_path / "r.jsonl"
    assert invoke("run", str(folder), "--out", str(out), "--limit", "2")[0] == 0
    write_config(folder, format="hf", name="data", split="train")
    code, _, err = invoke("run", str(folder), "--out", str(out), "--resume")
    assert code == 2
    assert "split test" in err and "split train" in err


def test_scoring_a_sampled_run_again_loads_the_same_sample(tmp_path: Path) -> None:
    folder = csv_pack(tmp_path / "p", size=4)
    out = tmp_path / "r.jsonl"
    assert invoke("run", str(folder), "--out", str(out), "--seed", "7")[0] == 0
    code, stdout, err = invoke("score", str(out), "--metrics", "exact_match")
    assert code == 0, err
    assert "has changed" not in stdout + err and "cannot be loaded" not in stdout + err
