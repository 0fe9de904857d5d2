"""A feature used without its extra says, in one line, which extra to install.

The core install leaves out lm-eval, the HTML report's Jinja2 and matplotlib, the
service's FastAPI, uvicorn and cryptography, radon and pycodestyle, and the NLI
scorers' onnxruntime. Here those modules are made unimportable (``sys.modules[name] =
None``, what Python does for a module that is not there) in a fresh interpreter, and
each feature that needs them is used.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

import convsim
from convsim import ConfigError, MissingExtra
from convsim._extras import needs_extra

LM_EVAL = ("lm_eval", "datasets", "evaluate", "rouge_score", "sacrebleu")
HTML = ("jinja2", "matplotlib")
SERVICE = ("fastapi", "starlette", "uvicorn", "cryptography")
CODE = ("radon", "pycodestyle")
NLI = ("onnxruntime",)
PROMETHEUS = ("prometheus_client",)
EVERY_EXTRA = (
    *LM_EVAL, *HTML, *SERVICE, *CODE, *NLI, *PROMETHEUS, "sklearn", "pandas", "ray", "uvloop",
)  # fmt: skip


def _convsim(
    tmp_path: Path, *args: str, blocked: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    """``convsim ARGS`` in a fresh interpreter in which ``blocked`` cannot be imported."""
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        f"sys.argv = ['convsim', *{args!r}]\n"
        "from convsim.cli import main\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def _hint(feature: str, extra: str) -> str:
    return f"error: {feature} needs the {extra} extra: pip install 'convsim[{extra}]'"


def _one_line(done: subprocess.CompletedProcess[str], feature: str, extra: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [_hint(feature, extra)], done.stderr


# -- the helper ------------------------------------------------------------------------


def test_a_missing_module_becomes_one_line_naming_the_extra() -> None:
    with pytest.raises(MissingExtra) as caught, needs_extra("html", "--html"):
        import convsim_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    error = caught.value
    assert str(error) == "--html needs the html extra: pip install 'convsim[html]'"
    assert (error.extra, error.feature) == ("html", "--html")
    assert isinstance(error, ConfigError) and isinstance(error, ImportError)
    assert isinstance(error.__cause__, ModuleNotFoundError)  # the real failure, kept
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again)) == (MissingExtra, str(error))


def test_the_outer_feature_names_a_missing_module_of_the_same_extra() -> None:
    with (
        pytest.raises(MissingExtra, match=r"^convsim serve needs the service extra"),
        needs_extra("service", "convsim serve"),
        needs_extra("service", "the store"),
    ):
        import convsim_no_such_module  # type: ignore[import-not-found]  # noqa: F401


def test_another_extras_hint_passes_through_unchanged() -> None:
    with (
        pytest.raises(MissingExtra, match=r"^the HTML report needs the html extra"),
        needs_extra("lm-eval", "lm-eval:task"),
        needs_extra("html", "the HTML report"),
    ):
        import convsim_no_such_module  # type: ignore[import-not-found]  # noqa: F401


def test_a_broken_import_of_convsim_itself_is_not_called_a_missing_extra() -> None:
    with pytest.raises(ImportError) as caught, needs_extra("html", "--html"):
        from convsim import no_such_name  # type: ignore[attr-defined]  # noqa: F401
    assert not isinstance(caught.value, MissingExtra)


def test_other_errors_pass_through() -> None:
    with pytest.raises(ValueError, match="not an import"), needs_extra("html", "--html"):
        raise ValueError("not an import")


# -- the command line ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("blocked", [("fastapi",), ("uvicorn",), ("cryptography",), SERVICE])
def test_serve_without_the_service_extra(tmp_path: Path, blocked: tuple[str, ...]) -> None:
    done = _convsim(tmp_path, "serve", "--db", "s.db", blocked=blocked)
    _one_line(done, "convsim serve", "service")
    assert list(tmp_path.iterdir()) == []  # no database, no results folder


@pytest.mark.slow
def test_serve_offering_lm_eval_packs_without_the_lm_eval_extra(tmp_path: Path) -> None:
    done = _convsim(tmp_path, "serve", "--pack-source", "lm-eval", blocked=LM_EVAL)
    _one_line(done, "--pack-source lm-eval", "lm-eval")


@pytest.mark.slow
def test_run_html_without_the_html_extra_stops_before_the_run(tmp_path: Path) -> None:
    for blocked in (("jinja2",), ("matplotlib",)):
        done = _convsim(
            tmp_path, "run", "customer_support", "--model", "scripted", "--out", "r.jsonl",
            "--html", blocked=blocked,
        )  # fmt: skip
        _one_line(done, "--html", "html")
        assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
def test_report_html_without_the_html_extra(tmp_path: Path) -> None:
    convsim.run_sync("customer_support", "scripted", out=tmp_path / "r.jsonl", limit=2)
    done = _convsim(tmp_path, "report", "r.jsonl", "--html", blocked=HTML)
    _one_line(done, "--html", "html")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_load_html_without_the_html_extra_stops_before_the_load(tmp_path: Path) -> None:
    done = _convsim(
        tmp_path, "load", "--model", "scripted", "--max-requests", "5", "--out", "l.json",
        "--html", "l.html", blocked=HTML,
    )  # fmt: skip
    _one_line(done, "convsim load --html", "html")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_load_server_metrics_without_the_prometheus_extra_stops_before_the_load(
    tmp_path: Path,
) -> None:
    done = _convsim(
        tmp_path, "load", "--model", "scripted", "-c", "1", "--max-requests", "5",
        "--out", "l.json", "--server-metrics=http://127.0.0.1:9/metrics",
        blocked=PROMETHEUS,
    )  # fmt: skip
    _one_line(done, "convsim load --server-metrics", "prometheus")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_code_analysis_plugin_without_the_code_extra(tmp_path: Path) -> None:
    done = _convsim(
        tmp_path, "run", "coding_help", "--model", "scripted", "--out", "r.jsonl",
        "--plugin", "code_analysis", blocked=CODE,
    )  # fmt: skip
    _one_line(done, "the code_analysis plugin", "code")
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "feature"),
    [
        (["lm-eval", "--tasks", "x"], "convsim lm-eval"),
        (["lm-eval", "--help"], "convsim lm-eval"),
        (["run", "lm-eval:some_task", "--model", "scripted"], "lm-eval:some_task"),
        (
            ["run", "single_turn_qa", "--model", "scripted", "--metrics", "lm_eval:bleu"],
            "lm_eval:bleu",
        ),
    ],
)
def test_lm_eval_features_without_the_lm_eval_extra(
    tmp_path: Path, args: list[str], feature: str
) -> None:
    _one_line(_convsim(tmp_path, *args, blocked=LM_EVAL), feature, "lm-eval")
    assert list(tmp_path.iterdir()) == []  # no run began: no runs/ folder


@pytest.mark.slow
def test_the_ray_backend_without_the_ray_extra(tmp_path: Path) -> None:
    done = _convsim(
        tmp_path, "run", "customer_support", "--model", "scripted", "--backend", "ray",
        "--out", "r.jsonl", blocked=("ray",),
    )  # fmt: skip
    _one_line(done, "the Ray backend", "ray")
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
def test_load_on_uvloop_without_the_uvloop_extra(tmp_path: Path) -> None:
    done = _convsim(
        tmp_path, "load", "--model", "scripted", "--max-requests", "5", "--loop", "uvloop",
        blocked=("uvloop",),
    )  # fmt: skip
    _one_line(done, "--loop uvloop", "uvloop")


@pytest.mark.slow
def test_without_any_extra_the_core_commands_work(tmp_path: Path) -> None:
    help_ = _convsim(tmp_path, "--help", blocked=EVERY_EXTRA)
    assert help_.returncode == 0, help_.stderr
    for command in ("run", "serve", "lm-eval", "lm-eval-tasks", "load", "report", "compare"):
        assert command in help_.stdout
    for pack in ("customer_support", "coding_help"):  # coding_help: code_security_score
        done = _convsim(
            tmp_path, "run", pack, "--model", "scripted", "--limit", "3", "--out",
            f"{pack}.jsonl", "--no-progress", blocked=EVERY_EXTRA,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "3 done, 0 failed" in done.stderr and "Traceback" not in done.stderr
    for args in (
        ["report", "customer_support.jsonl"],
        ["compare", "customer_support.jsonl", "customer_support.jsonl"],
        ["lm-eval-tasks", "--out", "tasks"],
        ["serve", "keys", "create", "--db", "k.db", "--name", "alice"],
    ):
        done = _convsim(tmp_path, *args, blocked=EVERY_EXTRA)
        assert done.returncode == 0, (args, done.stderr)


# -- the library ----------------------------------------------------------------------


@pytest.mark.slow
def test_library_names_of_an_extra_raise_the_hint_and_an_import_error() -> None:
    code = (
        "import sys\n"
        f"for name in {(*LM_EVAL, *SERVICE, 'pandas')!r}:\n"
        "    sys.modules[name] = None\n"
        "import convsim.lm_eval, convsim.service\n"
        "import convsim.results\n"
        "for get in (lambda: convsim.lm_eval.ConvsimLM, lambda: convsim.service.create_app,\n"
        "            lambda: convsim.results.load([])):\n"
        "    try:\n"
        "        get()\n"
        "    except ImportError as exc:\n"
        "        print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "MissingExtra the lm-eval model (convsim.lm_eval.ConvsimLM) needs the lm-eval "
        "extra: pip install 'convsim[lm-eval]'",
        "MissingExtra convsim.service needs the service extra: pip install 'convsim[service]'",
        "MissingExtra convsim.results needs the pandas extra: pip install 'convsim[pandas]'",
    ]


def test_the_services_report_page_without_the_html_extra_is_a_501(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from convsim.service import Store, create_app

    app = create_app(tmp_path / "s.db", tmp_path / "results")
    headers = {"Authorization": f"Bearer {Store(tmp_path / 's.db').create_key('alice')}"}
    with TestClient(app) as client:
        job = client.post(
            "/v1/evaluations",
            json={"pack": "customer_support", "model": "scripted", "limit": 1},
            headers=headers,
        ).json()
        url = f"/v1/evaluations/{job['id']}"
        give_up = time.monotonic() + 60
        while client.get(url, headers=headers).json()["status"] != "done":
            assert time.monotonic() < give_up, "the job did not finish in 60 s"
            time.sleep(0.02)
        for name in HTML:
            monkeypatch.setitem(sys.modules, name, None)
        page = client.get(url + "/report", headers=headers)
    assert page.status_code == 501
    assert page.json()["detail"].endswith("needs the html extra: pip install 'convsim[html]'")
