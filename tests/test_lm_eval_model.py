"""convsim as an lm-eval model (``--model convsim``), offline with local tasks."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from _lm_eval_cli import COMMAND_ENVIRONMENT, invoke_lm_eval
from click.testing import CliRunner

from convsim.adapters import (
    ADAPTERS,
    Completion,
    GenerationParams,
    Message,
    ModelAdapter,
    ScriptedAdapter,
)
from convsim.cli import main

pytest.importorskip("lm_eval")

QUESTIONS = ["Apples are red", "Grass is green", "Snow is white", "Night is dark"]


def _scripted_reply(question: str) -> str:
    """What ``scripted`` answers to a one-message prompt (stop sequences aside)."""
    adapter = ScriptedAdapter()
    completion = anyio.run(
        adapter.generate, [Message(role="user", content=question)], GenerationParams()
    )
    return completion.text


def _write_task(root: Path, name: str, docs: Sequence[Mapping[str, str]]) -> Path:
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / f"{name}.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: {name}
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {data}
            test_split: test
            output_type: generate_until
            doc_to_text: "{{{{question}}}}"
            doc_to_target: "{{{{answer}}}}"
            generation_kwargs:
              until: ["\\n"]
              max_gen_toks: 64
            metric_list:
              - metric: exact_match
                aggregation: mean
                higher_is_better: true
            """
        ),
        encoding="utf-8",
    )
    return root


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _evaluate(model: Any, include: Path, task: str, **kwargs: Any) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from convsim.lm_eval import register_lm_eval_model

    register_lm_eval_model()
    results = simple_evaluate(
        model=model,
        tasks=[task],
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        **kwargs,
    )
    assert results is not None
    return results


def test_scores_match_the_scripted_answers(tmp_path: Path, offline: None) -> None:
    # half the targets are what `scripted` answers, half are not
    docs = [
        {"question": q, "answer": _scripted_reply(q) if i % 2 == 0 else "something else"}
        for i, q in enumerate(QUESTIONS)
    ]
    include = _write_task(tmp_path, "tiny_echo", docs)
    results = _evaluate("convsim", include, "tiny_echo", model_args="model=scripted")
    scores = results["results"]["tiny_echo"]
    assert scores["exact_match,none"] == pytest.approx(0.5)


def test_stop_sequences_and_builtin_models_kept(tmp_path: Path, offline: None) -> None:
    from lm_eval.api.registry import get_model

    from convsim.lm_eval import ConvsimLM, register_lm_eval_model

    register_lm_eval_model()
    register_lm_eval_model()  # idempotent
    assert get_model("convsim") is ConvsimLM
    assert get_model("dummy").__name__ == "DummyLM"  # built-in models still registered
    # the scripted reply "Thanks for the details. You wrote: ..." cut at the first "."
    docs = [{"question": q, "answer": "Thanks for the details"} for q in QUESTIONS]
    include = _write_task(tmp_path, "tiny_stop", docs)
    (tmp_path / "tiny_stop.yaml").write_text(
        (tmp_path / "tiny_stop.yaml").read_text().replace('["\\n"]', '["."]')
    )
    results = _evaluate("convsim", include, "tiny_stop", model_args="model=scripted")
    assert results["results"]["tiny_stop"]["exact_match,none"] == pytest.approx(1.0)


class _SlowFlaky(ModelAdapter):
    """Answers with the prompt after a delay that shrinks with the request; fails on FAIL."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.inner = ScriptedAdapter()

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        text = messages[-1].content
        if "FAIL" in text:
            raise RuntimeError(f"boom on {text}")
        number = int(text.split()[-1])
        await anyio.sleep(0.002 * (20 - number))  # later requests finish first
        completion = await self.inner.generate(messages, params)
        return Completion(text=f"answer {number}", usage=completion.usage, model="flaky")


@pytest.fixture()
def flaky() -> Any:
    ADAPTERS.register("test-flaky", _SlowFlaky, replace=True)
    yield "test-flaky"
    ADAPTERS._factories.pop("test-flaky", None)


def test_order_kept_and_failures_recorded(tmp_path: Path, offline: None, flaky: str) -> None:
    from convsim.lm_eval import ConvsimLM

    docs = []
    for i in range(20):
        question = f"FAIL {i}" if i in (3, 11) else f"question {i}"
        docs.append({"question": question, "answer": f"answer {i}"})
    include = _write_task(tmp_path, "tiny_flaky", docs)
    lm = ConvsimLM(model=flaky, concurrency=8)
    results = _evaluate(lm, include, "tiny_flaky")
    # 18 answered in the right order, 2 failed and scored as empty answers
    assert results["results"]["tiny_flaky"]["exact_match,none"] == pytest.approx(18 / 20)
    assert len(lm.failures) == 2
    assert {f.error_type for f in lm.failures} == {"RuntimeError"}
    assert all("boom on FAIL" in f.message for f in lm.failures)


def test_generate_until_from_a_running_event_loop(flaky: str) -> None:
    from lm_eval.api.instance import Instance

    from convsim.lm_eval import ConvsimLM

    lm = ConvsimLM(model=flaky, concurrency=4)
    requests = [
        Instance("generate_until", {}, (f"q {i}", {"until": ["\n"], "do_sample": False}), 0)
        for i in range(6)
    ]

    async def app() -> list[str]:  # an application with its own loop calls via a thread
        return await anyio.to_thread.run_sync(lm.generate_until, requests)

    assert anyio.run(app) == [f"answer {i}" for i in range(6)]
    assert lm.usage.total_tokens > 0


def test_chat_template_messages_reach_the_adapter() -> None:
    from convsim.lm_eval import ConvsimLM

    lm = ConvsimLM(model="scripted")
    prompt = lm.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."}]
    )
    assert lm.tokenizer_name == "convsim-scripted"
    assert lm._messages(prompt) == [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Hi there."),
    ]


def test_loglikelihood_is_a_clear_error() -> None:
    from convsim.lm_eval import ConvsimLM

    lm = ConvsimLM(model="scripted")
    with pytest.raises(NotImplementedError, match="generate_until tasks only"):
        lm.loglikelihood([])


def test_bad_model_args_fail_early() -> None:
    from convsim._errors import ConvsimError
    from convsim.lm_eval import ConvsimLM

    with pytest.raises(ConvsimError):
        ConvsimLM()
    with pytest.raises(ConvsimError):
        ConvsimLM(model="scripted", no_such_arg=1)


def _cache_files(folder: Path) -> set[Path]:
    return set(folder.glob("*")) if folder.exists() else set()


@pytest.mark.slow
@pytest.mark.timeout(180)  # a fresh lm-eval indexes all its built-in tasks: 15-30 s
def test_cli_runs_a_local_task_end_to_end(tmp_path: Path) -> None:
    """The one ``convsim lm-eval`` run in a process of its own, as a user runs it: lm-eval
    reads where its request cache goes when it is first imported, so only a fresh
    process shows that the command sets it first."""
    import lm_eval

    docs = [{"question": q, "answer": _scripted_reply(q)} for q in QUESTIONS]
    include = _write_task(tmp_path, "tiny_cli", docs)
    installed = Path(lm_eval.__file__).parent / "caching" / ".cache"
    before = _cache_files(installed)
    env = {k: v for k, v in os.environ.items() if k not in COMMAND_ENVIRONMENT}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    args = ["--model", "convsim", "--model_args", "model=scripted,concurrency=4"]
    args += ["--tasks", "tiny_cli", "--include_path", str(include), "--cache_requests", "true"]
    result = subprocess.run(
        [sys.executable, "-m", "convsim", "lm-eval", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "exact_match" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("|tiny_cli"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[cells.index("exact_match") + 2] == "1"  # every answer matches
    cached = list((tmp_path / "cache" / "convsim" / "lm-eval").glob("*tiny_cli*"))
    assert cached, "the request cache is written under the user's cache directory"
    assert _cache_files(installed) == before


@pytest.mark.slow
def test_cli_keeps_lm_evals_request_cache_out_of_site_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without XDG_CACHE_HOME the cache goes to ~/.cache/convsim/lm-eval."""
    import lm_eval
    import lm_eval.__main__
    from lm_eval.caching import cache

    docs = [{"question": q, "answer": _scripted_reply(q)} for q in QUESTIONS]
    include = _write_task(tmp_path, "tiny_cached", docs)
    installed = Path(lm_eval.__file__).parent / "caching" / ".cache"
    before = _cache_files(installed)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # lm-eval reads LM_HARNESS_CACHE_PATH when lm_eval.caching.cache is first imported:
    # in a fresh process, after the command has set it. This process imported it long
    # ago, so it reads it again where the command hands over to lm-eval (and its old
    # values are put back after the test).
    monkeypatch.setattr(cache, "PATH", cache.PATH)
    monkeypatch.setattr(cache, "OVERRIDE_PATH", cache.OVERRIDE_PATH)
    run_lm_eval = lm_eval.__main__.cli_evaluate

    def as_if_first_imported() -> None:
        importlib.reload(cache)
        run_lm_eval()

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", as_if_first_imported)
    args = ["--model", "convsim", "--model_args", "model=scripted", "--tasks", "tiny_cached"]
    result = invoke_lm_eval(
        monkeypatch, *args, "--include_path", str(include), "--cache_requests", "true"
    )
    assert result.exit_code == 0, result.output
    cached = list((tmp_path / "home" / ".cache" / "convsim" / "lm-eval").glob("*tiny_cached*"))
    assert cached, "the request cache is written under the user's cache directory"
    assert _cache_files(installed) == before


def test_cli_help_goes_to_lm_eval() -> None:
    result = CliRunner().invoke(main, ["lm-eval", "--help"])
    assert result.exit_code == 0
    assert "lm-eval" in result.output
    assert "run" in result.output


def test_import_convsim_does_not_import_lm_eval() -> None:
    code = (
        "import sys, convsim, convsim.adapters, convsim.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lm_eval', 'datasets', 'pyarrow')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_cli_against_the_mock_server_with_chat_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyio.from_thread import start_blocking_portal

    from convsim.adapters.mock import MockModelServer, MockServerConfig

    docs = [{"question": q, "answer": "x"} for q in QUESTIONS * 5]
    include = _write_task(tmp_path, "tiny_mock", docs)
    config = MockServerConfig(fault_rate=0.2, faults={"500": 1.0}, retry_after_s=0.0)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(MockModelServer(config)) as server,
    ):
        model_args = f"model=openai-compatible:mock-model,base_url={server.base_url},concurrency=8"
        args = ["--model", "convsim", "--model_args", model_args]
        args += ["--tasks", "tiny_mock", "--include_path", str(include), "--apply_chat_template"]
        result = invoke_lm_eval(monkeypatch, *args)
    assert result.exit_code == 0, result.output
    assert "|tiny_mock" in result.output
    assert "requests failed" not in result.output  # injected 500s were retried


@pytest.mark.slow
def test_cli_keeps_secrets_in_model_args_out_of_lm_eval_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from anyio.from_thread import start_blocking_portal

    from convsim.adapters.mock import MockModelServer, MockServerConfig

    include = _write_task(
        tmp_path, "tiny_secret", [{"question": q, "answer": "x"} for q in QUESTIONS]
    )
    out = tmp_path / "out"
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            MockModelServer(MockServerConfig(api_key="sk-secret-key-1"))
        ) as server,
    ):
        base_url = (
            server.base_url.replace("http://", "http://user:pw-secret-2@") + "?key=qs-secret-3"
        )
        model_args = (
            f"model=openai-compatible:mock-model,base_url={base_url},api_key=sk-secret-key-1"
        )
        args = ["--model", "convsim", "--model_args", model_args, "--tasks", "tiny_secret"]
        args += ["--include_path", str(include), "--output_path", str(out), "--log_samples"]
        result = invoke_lm_eval(monkeypatch, *args)
    assert result.exit_code == 0, result.output
    assert "requests failed" not in result.output  # the key still reached the server
    written = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "tiny_secret" in written
    seen = result.output + written + "".join(capfd.readouterr())
    for secret in ("sk-secret-key-1", "pw-secret-2", "qs-secret-3"):
        assert secret not in seen
    assert "CONVSIM_LM_EVAL_API_KEY" in seen  # what lm-eval shows instead
