"""Credentials in arguments, URLs and lm-eval command lines never reach an output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from convsim._secrets import Redactor, redact_url, url_secrets
from convsim.cli import main
from convsim.cli._logging import redact_secrets
from convsim.lm_eval._secret_args import hide_model_arg_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:sk-1@host:8000/v1", "https://***@host:8000/v1"),
        ("https://sk-1@host/v1", "https://***@host/v1"),
        (
            "https://host/v1?api-version=2024-06&key=sk-1",
            "https://host/v1?api-version=2024-06&key=***",
        ),
        (
            "https://host/v1?sig=a%2Fb&api_key=x&token=t",
            "https://host/v1?sig=***&api_key=***&token=***",
        ),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("https://host/v1?api-version=2", "https://host/v1?api-version=2"),
        ("not a url", "not a url"),
        # a key in the path: shaped like one, or after a segment that names one
        ("https://host/v1/sk-9aB3xQ7mK2pL5wZ8/chat", "https://host/v1/***/chat"),
        ("https://host/v3/9aa3d95b3bc440fa88ea12eaa4456161", "https://host/v3/***"),
        ("https://host/key/short-one/v1", "https://host/key/***/v1"),
        ("https://host/v1;api_key=sk-1/chat", "https://host/v1;api_key=***/chat"),
        # in the fragment, and after ; in the query
        ("https://host/v1#key=sk-1", "https://host/v1#key=***"),
        ("https://host/v1#access_token=tk-2&x=1", "https://host/v1#access_token=***&x=1"),
        ("https://host/v1?x=1;key=sk-1", "https://host/v1?x=1;key=***"),
        ("https://host/v1?a=b;token=t;c=d", "https://host/v1?a=b;token=***;c=d"),
        # in a URL that does not parse (an unclosed IPv6 bracket)
        ("https://u:sk-1@[::1/v1?key=sk-2", "https://***@[::1/v1?key=***"),
        ("http://[::1/v1/sk-9aB3xQ7mK2pL5wZ8/chat", "http://[::1/v1/***/chat"),
        # names, versions, dates and ids stay readable
        (
            "https://h/openai/deployments/gpt-4o-mini-2024-07-18/chat?api-version=2024-06-01",
            "https://h/openai/deployments/gpt-4o-mini-2024-07-18/chat?api-version=2024-06-01",
        ),
        (
            "https://h/v1beta/models/gemini-1.5-pro-002:streamGenerateContent",
            "https://h/v1beta/models/gemini-1.5-pro-002:streamGenerateContent",
        ),
        (
            "https://h/v1/threads/123e4567-e89b-12d3-a456-426614174000",
            "https://h/v1/threads/123e4567-e89b-12d3-a456-426614174000",
        ),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redactor_blanks_every_form_of_a_url_secret() -> None:
    scrub = Redactor.of(keys=["sk-key"], urls=["http://bob:p%40ss@h/v1?token=t%20ok"])
    text = "http://bob:p%40ss@h/v1?token=t%20ok failed; p@ss t ok t+ok sk-key; bob is a name"
    assert scrub(text) == "http://***@h/v1?token=*** failed; *** *** *** ***; bob is a name"
    # a user name alone is the key; beside a password it is only a name
    assert "alice" in url_secrets("https://alice@h/v1")
    assert "bob" not in url_secrets("https://bob:pw@h/v1")


def test_secrets_found_anywhere_in_a_url_are_blanked_from_text() -> None:
    url = "http://[::1/v1/sk-9aB3xQ7mK2pL5wZ8/chat?x=1;key=sk-semi#token=tk-frag"
    scrub = Redactor.of(urls=[url])
    said = "failed: sk-9aB3xQ7mK2pL5wZ8 sk-semi tk-frag"
    assert scrub(said) == "failed: *** *** ***"
    assert {"sk-9aB3xQ7mK2pL5wZ8", "sk-semi", "tk-frag"} <= set(url_secrets(url))


def test_log_events_show_urls_without_credentials() -> None:
    event = {"event": "call", "base_url": "https://u:sk-9@h/v1?key=k-9", "api_key": "sk-9"}
    assert redact_secrets(None, "info", event) == {
        "event": "call",
        "base_url": "https://***@h/v1?key=***",
        "api_key": "***",
    }


def test_model_args_of_lm_eval_keep_secrets_in_the_environment() -> None:
    env: dict[str, str] = {}
    args = [
        "--model", "convsim",
        "--model_args", "model=openai:m,api_key=sk-1,base_url=https://u:pw@h/v1", "rpm=60",
        "--tasks", "t",
        "--model_args={\"api_key\": \"sk-2\", \"seed\": 1}",
        "-a", "token=tk-3",
    ]  # fmt: skip
    hidden = hide_model_arg_secrets(args, env)
    assert hidden == [
        "--model", "convsim",
        "--model_args",
        "model=openai:m,api_key_env=CONVSIM_LM_EVAL_API_KEY,base_url_env=CONVSIM_LM_EVAL_BASE_URL",
        "rpm=60",
        "--tasks", "t",
        '--model_args={"api_key_env": "CONVSIM_LM_EVAL_API_KEY", "seed": 1}',
        "-a", "token_env=CONVSIM_LM_EVAL_TOKEN",
    ]  # fmt: skip
    assert env == {
        "CONVSIM_LM_EVAL_API_KEY": "sk-2",
        "CONVSIM_LM_EVAL_BASE_URL": "https://u:pw@h/v1",
        "CONVSIM_LM_EVAL_TOKEN": "tk-3",
    }
    assert hide_model_arg_secrets(["--tasks", "t", "--model_args", "model=scripted"], {}) == [
        "--tasks", "t", "--model_args", "model=scripted",
    ]  # fmt: skip


def test_run_writes_no_credentials_from_base_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A key inside base_url (user info or query) appears in no file and no output, though
    every call fails with an error that names the URL."""
    monkeypatch.chdir(tmp_path)
    base_url = "http://user:sk-userinfo-1@127.0.0.1:9/v1?key=sk-query-2"
    args = ["--log-format", "json", "--log-level", "debug", "run", "single_turn_qa"]
    args += ["--model", "openai-compatible:m", "--model-arg", f"base_url={base_url}"]
    args += ["--model-arg", "max_retries=0", "--limit", "2", "--out", "r.jsonl"]
    checked = CliRunner().invoke(main, args)  # the check before the run stops it
    assert checked.exit_code == 4
    assert "http://***@127.0.0.1:9/v1?key=***: connection refused" in checked.output
    result = CliRunner().invoke(main, [*args, "--no-preflight", "--circuit-breaker", "0"])
    written = "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())
    seen = checked.output + result.output + written + "".join(capfd.readouterr())
    assert "127.0.0.1:9" in written  # the errors were recorded, with the URL
    assert (
        json.loads((tmp_path / "r.manifest.json").read_text())["settings"]["model_args"]["base_url"]
        == "http://***@127.0.0.1:9/v1?key=***"
    )
    assert "sk-userinfo-1" not in seen
    assert "sk-query-2" not in seen


def test_a_query_in_base_url_stays_after_the_path() -> None:
    from convsim.adapters._openai import OpenAICompatibleAdapter

    adapter = OpenAICompatibleAdapter({"model": "m", "base_url": "https://h/v1/?key=k&x=1"})
    assert adapter.url_for("/chat/completions") == "https://h/v1/chat/completions?key=k&x=1"
    plain = OpenAICompatibleAdapter({"model": "m", "base_url": "https://h/v1/"})
    assert plain.url_for("/chat/completions") == "https://h/v1/chat/completions"
