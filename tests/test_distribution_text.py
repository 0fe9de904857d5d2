"""One grammar for distributions: the mock server's delays and convsim load's values.

Both read every form the same way, both refuse the same bad input, and both still read
the mock server's old spelling (``uniform:LO:HI``) with a deprecation warning; on the
command line, the warning is a line on stderr naming the option and the new spelling.
"""

from __future__ import annotations

import math
import re

import pytest
from click.testing import CliRunner
from conftest import Convsim

from convsim import ConfigError
from convsim._distribution_text import DeprecatedSpelling, DistributionText, read_distribution
from convsim.adapters.mock import Delay
from convsim.cli import main
from convsim.load._distributions import (
    Exponential,
    Fixed,
    LogNormal,
    Normal,
    Uniform,
    parse_distribution,
)

GOOD = [
    ("64", DistributionText("fixed", (64.0,))),
    ("fixed:7", DistributionText("fixed", (7.0,))),
    (" uniform:20,80 ", DistributionText("uniform", (20.0, 80.0))),
    ("normal:50,10", DistributionText("normal", (50.0, 10.0))),
    ("normal:50,10,20,60", DistributionText("normal", (50.0, 10.0, 20.0, 60.0))),
    ("lognormal:200,50,10,400", DistributionText("lognormal", (200.0, 50.0, 10.0, 400.0))),
    ("exp:2.5", DistributionText("exp", (2.5,))),
]


@pytest.mark.parametrize(("text", "read"), GOOD)
def test_every_form_reads_the_same_for_the_mock_server_and_for_load(
    text: str, read: DistributionText
) -> None:
    assert read_distribution(text) == read
    assert read_distribution(str(read)) == read  # written back in the one spelling
    delay = Delay.parse(text)
    assert (delay.kind, delay.params) == (read.kind, read.numbers)
    assert parse_distribution(text).kind == read.kind


BAD = [
    ("fast", "not a number"),
    ("1,2", "a fixed value is one number"),
    ("gauss:1,2", "unknown distribution 'gauss'"),
    ("fixed:1,2", "fixed takes one number"),
    ("uniform:3,1", "MIN <= MAX"),
    ("uniform:1", "MIN <= MAX"),
    ("uniform:1,x", "not a number"),
    ("uniform:", "not a number"),
    ("normal:1,2,3", "MEAN,STD or MEAN,STD,MIN,MAX"),
    ("normal:10,2,30,20", "MIN is above MAX"),
    ("normal:-5,1", "0 or more"),
    ("lognormal:0,1", "MEAN above 0"),
    ("exp:0", "one MEAN above 0"),
    ("exp:nan", "finite"),
    ("uniform:9:2", "MIN <= MAX"),  # the old spelling is checked as strictly
]


@pytest.mark.parametrize(("text", "reason"), BAD)
def test_bad_input_is_refused_alike_saying_what_was_wrong(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        read_distribution(text)
    named = re.escape(f"delay {text!r}: ") + ".*" + re.escape(reason)
    with pytest.raises(ValueError, match=named) as delay_error:
        Delay.parse(text)
    named = re.escape(f"invalid --think-time {text!r}: ") + ".*" + re.escape(reason)
    with pytest.raises(ConfigError, match=named) as load_error:
        parse_distribution(text, what="--think-time")
    for error in (delay_error, load_error):
        assert "uniform:MIN,MAX" in str(error.value)  # the forms, listed


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("uniform:20:80", "uniform:20,80"),
        ("normal:5:1", "normal:5,1"),
        ("normal:50:10:20:60", "normal:50,10,20,60"),
        ("fixed:0.5:", None),  # not a form in either spelling
    ],
)
def test_the_old_spelling_is_read_with_a_deprecation_warning(old: str, new: str | None) -> None:
    if new is None:
        with pytest.raises(ValueError):
            read_distribution(old)
        return
    assert read_distribution(old) == read_distribution(new)._replace(respelled=new)
    with pytest.warns(DeprecatedSpelling, match=f"write '{new}'"):
        assert Delay.parse(old) == Delay.parse(new)
    with pytest.warns(DeprecationWarning, match=f"--think-time '{old}'.*write '{new}'"):
        assert parse_distribution(old, what="--think-time") == parse_distribution(new)


def test_load_builds_each_kind_from_the_one_reading() -> None:
    assert parse_distribution("fixed:64", integer=True) == Fixed(64, integer=True)
    assert parse_distribution("uniform:1,3") == Uniform(1, 3)
    assert parse_distribution("normal:5,1") == Normal(5, 1, 0.0, math.inf)
    assert parse_distribution("lognormal:5,1,2,9") == LogNormal(5, 1, 2, 9)
    assert parse_distribution("exp:2") == Exponential(2)
    with pytest.raises(ConfigError, match="whole numbers"):
        parse_distribution("uniform:1.5,3", integer=True)


@pytest.mark.parametrize(
    ("args", "option", "reason"),
    [
        (["--ttft-ms", "uniform:20,x"], "--ttft-ms", "not a number"),
        (["--itl-ms", "lognormal:0,1"], "--itl-ms", "MEAN above 0"),
        (["--itl-ms", "uniform:3:1"], "--itl-ms", "MIN <= MAX"),
    ],
)
def test_a_bad_delay_exits_2_naming_the_option_and_the_fault(
    args: list[str], option: str, reason: str
) -> None:
    result = CliRunner().invoke(main, ["mock-server", *args])
    assert result.exit_code == 2
    assert f"'{option}'" in result.stderr and reason in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "option", "reason"),
    [
        (["--think-time", "uniform:3,1"], "--think-time", "MIN <= MAX"),
        (["--think-time", "exp:0"], "--think-time", "one MEAN above 0"),
        (
            ["--synthetic", "turns=2,input_tokens=uniform:5:x,output_tokens=4"],
            "--synthetic input_tokens",
            "not a number",
        ),
    ],
)
def test_a_bad_load_distribution_exits_2_naming_the_option_and_the_fault(
    args: list[str], option: str, reason: str
) -> None:
    result = CliRunner().invoke(
        main,
        ["load", "--model", "openai-compatible:m", "--no-preflight", "--concurrency", "1",
         "--duration", "1", *args],
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"invalid {option}" in result.stderr and reason in result.stderr
    assert "Traceback" not in result.stderr


def test_the_load_command_reads_the_old_spelling_and_says_so() -> None:
    result = CliRunner().invoke(
        main,
        ["load", "--model", "openai-compatible:m", "--no-preflight", "--duration", "1",
         "--think-time", "uniform:1:3",
         "--synthetic", "turns=2,input_tokens=uniform:16:24,output_tokens=4"],
    )  # fmt: skip
    # read, then refused for want of --concurrency or --rate: not for the spelling
    assert result.exit_code == 2 and "--concurrency N" in result.stderr
    assert "warning: --think-time 'uniform:1:3'" in result.stderr
    assert "write 'uniform:1,3'" in result.stderr
    assert "warning: --synthetic input_tokens 'uniform:16:24'" in result.stderr
    assert "write 'uniform:16,24'" in result.stderr


def test_the_mock_server_serves_with_the_old_spelling_and_says_so() -> None:
    with Convsim("mock-server", "--port", "0", "--ttft-ms", "uniform:1:2") as server:
        server.wait_for_line("listening on")
        server.interrupt()
        assert server.finish() == 0
    assert "warning: --ttft-ms 'uniform:1:2'" in server.stderr
    assert "write 'uniform:1,2'" in server.stderr
