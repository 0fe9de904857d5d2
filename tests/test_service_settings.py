"""What the operator sets for `convsim serve`: endpoints, allowed URLs, limits per key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from convsim import ConfigError
from convsim.cli import main
from convsim.service import KeyLimits, ServiceSettings, Store
from convsim.service._settings import parse_endpoint, parse_limits


def test_an_endpoint_is_a_name_a_spec_and_its_arguments() -> None:
    name, endpoint = parse_endpoint("gpt=openai:gpt-4o-mini,api_key_env=OPENAI_API_KEY,rpm=500")
    assert name == "gpt"
    assert endpoint.model == "openai:gpt-4o-mini"
    assert endpoint.args == {"api_key_env": "OPENAI_API_KEY", "rpm": "500"}
    for bad in ("gpt", "=openai:x", "gpt=", "gpt=openai:x,rpm", "gpt=::"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad)


def test_limits_are_checked_by_name_and_value() -> None:
    assert parse_limits(["jobs=2", "concurrency=8"]) == {"jobs": 2, "concurrency": 8}
    with pytest.raises(ConfigError, match="unknown limit"):
        parse_limits(["jobz=2"])
    with pytest.raises(ConfigError, match="jobs"):
        parse_limits(["jobs=0"])
    assert KeyLimits(jobs=3).merged({"concurrency": 2}) == KeyLimits(jobs=3, concurrency=2)


def test_a_config_file_and_flags_add_up(tmp_path: Path) -> None:
    config = tmp_path / "service.yml"
    config.write_text(
        "endpoints:\n"
        "  gpt: {model: 'openai:gpt-4o-mini', args: {api_key_env: OPENAI_API_KEY}}\n"
        "allow_base_url: ['https://api.example.com/v1']\n"
        "limits: {jobs: 2}\n"
        "max_body_bytes: 4096\n"
    )
    _, local = parse_endpoint("local=openai-compatible:m,base_url=http://10.0.0.5:8000/v1")
    settings = ServiceSettings.load(
        config,
        endpoints={"local": local},
        allow_base_url=["http://10.0.0.5:8000/v1"],
        limits={"concurrency": 4},
        max_body_bytes=None,
    )
    assert sorted(settings.endpoints) == ["gpt", "local"]
    assert settings.allow_base_url == ["https://api.example.com/v1", "http://10.0.0.5:8000/v1"]
    assert (settings.limits.jobs, settings.limits.concurrency) == (2, 4)
    assert settings.max_body_bytes == 4096
    config.write_text("limitz: {jobs: 2}\n")
    with pytest.raises(ConfigError, match="limitz"):
        ServiceSettings.load(config)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--endpoint", "nonsense"], "--endpoint"),
        (["--allow-base-url", "ftp://x"], "--allow-base-url"),
        (["--limit", "jobs=-1"], "jobs"),
        (["--limit", "nothing=1"], "unknown limit"),
    ],
)
def test_bad_serve_flags_exit_2_with_one_line(tmp_path: Path, flags: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--db", str(tmp_path / "s.db"), *flags])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output


def test_a_keys_own_limits_are_kept_and_listed(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    runner = CliRunner()
    made = runner.invoke(main, ["serve", "keys", "create", "--db", db, "--name", "a",
                                "--limit", "jobs=1"])  # fmt: skip
    assert made.exit_code == 0, made.output
    assert Store(tmp_path / "s.db").key("a").limits == {"jobs": 1}  # type: ignore[union-attr]
    changed = runner.invoke(main, ["serve", "keys", "limits", "--db", db, "--name", "a",
                                   "--limit", "concurrency=2"])  # fmt: skip
    assert changed.exit_code == 0
    listed = runner.invoke(main, ["serve", "keys", "list", "--db", db]).output
    assert "concurrency=2" in listed and "jobs=1" not in listed and "spent $0.0000" in listed
    refused = runner.invoke(main, ["serve", "keys", "limits", "--db", db, "--name", "nobody"])
    assert refused.exit_code == 2
