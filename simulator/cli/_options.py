"""Options and arguments the commands share, and how their values are parsed."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import click

from .._errors import ConfigError
from ._gates import DEFAULT_MIN_SCORED, FailUnder

if TYPE_CHECKING:
    from ..adapters import ResponseCache
    from ..scenarios import Pack


F = TypeVar("F", bound=Callable[..., Any])


def single_turn_options(func: F) -> F:
    """--num-fewshot, --context-mode and --include-path, for the commands that load packs."""
    func = click.option(
        "--include-path",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
        help="lm-eval:TASK packs: a folder of lm-eval task YAML files.",
    )(func)
    func = click.option(
        "--context-mode",
        type=click.Choice(["no_context", "minimal_context", "full_context"]),
        default=None,
        help="Single-turn packs: how much of each problem's context the prompt gets.",
    )(func)
    return click.option(
        "--num-fewshot",
        type=click.IntRange(min=0),
        default=0,
        help="Single-turn packs: examples in the with_examples template.",
    )(func)


class ByteSize(click.ParamType):
    """A size in bytes: 5000000, 500kB, 256MB, 2GB (powers of 1000; KiB, MiB, GiB too)."""

    name = "SIZE"
    _UNITS: ClassVar[dict[str, int]] = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6}
    _UNITS |= {"mb": 10**6, "g": 10**9, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().replace(" ", "")
        number = text.rstrip("kmgib")
        unit = text[len(number) :]
        if not number.isdigit() or unit not in self._UNITS or int(number) == 0:
            self.fail(f"{value!r} is not a size such as 256MB or 1GB", param, ctx)
        return int(number) * self._UNITS[unit]


def pack_input_options(func: F) -> F:
    """--allow-code, --max-file-size and --max-line-size, for the commands that read packs
    or transcripts."""
    func = click.option(
        "--max-line-size",
        "max_line_bytes",
        type=ByteSize(),
        default="1MB",
        show_default=True,
        help="Longest line of a pack's or transcript's JSONL file; a longer one is "
        "refused before it is parsed.",
    )(func)
    func = click.option(
        "--max-file-size",
        "max_file_bytes",
        type=ByteSize(),
        default="256MB",
        show_default=True,
        help="Largest pack or transcript file read.",
    )(func)
    return click.option(
        "--allow-code",
        is_flag=True,
        help="Run code the pack names (python goal criteria, lm-eval !function tags, "
        "validate_logic's test cases against the answers' code, in a sandbox). "
        "Packs with code are code: use only for packs you trust.",
    )(func)


@dataclass(frozen=True)
class PackReading:
    """How a command reads its pack, from the options of :func:`pack_reading_options`."""

    num_fewshot: int
    context_mode: str | None
    include_path: Path | None
    allow_code: bool
    max_file_bytes: int
    max_line_bytes: int

    def load(self, pack: str, seed: int | None = None) -> Pack:
        """The pack, loaded and validated (file, line and field on bad input);
        ``seed`` samples a single-turn pack's ``dataset.size`` problems."""
        from .._runtime._packs import load_pack

        return load_pack(
            pack,
            num_fewshot=self.num_fewshot,
            context_mode=self.context_mode,
            include_path=self.include_path,
            allow_code=self.allow_code,
            max_file_bytes=self.max_file_bytes,
            max_line_bytes=self.max_line_bytes,
            seed=seed,
        )


_READING_OPTIONS = tuple(PackReading.__dataclass_fields__)


def pack_reading_options(func: F) -> F:
    """The options of :func:`single_turn_options` and :func:`pack_input_options`, given
    to the command as one ``reading`` argument (a :class:`PackReading`)."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        reading = PackReading(**{name: kwargs.pop(name) for name in _READING_OPTIONS})
        return func(*args, reading=reading, **kwargs)

    return single_turn_options(pack_input_options(command))  # type: ignore[return-value]


def judge_options(func: F) -> F:
    """--judge, --judge-arg, --judge-base-url, --judge-samples, --judge-combine and
    --judge-sees-reasoning, for run and score."""
    options = [
        click.option(
            "--judge",
            "judge_spec",
            default=None,
            help="Model that grades judge metrics (any adapter spec).",
        ),
        click.option("--judge-arg", "judge_args", multiple=True, metavar="KEY=VALUE"),
        click.option(
            "--judge-base-url",
            default=None,
            metavar="URL",
            help="The judge's base URL (as --judge-arg base_url=URL).",
        ),
        click.option(
            "--judge-samples",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Grades per turn.",
        ),
        click.option(
            "--judge-combine",
            type=click.Choice(["mean", "majority"]),
            default="mean",
            show_default=True,
            help="How several grades of a turn combine (a majority tie: the lowest).",
        ),
        click.option(
            "--judge-sees-reasoning",
            is_flag=True,
            default=False,
            help="Show the judge a reasoning model's reasoning before each answer "
            "(by default it sees the answers only, as the user did).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def with_base_url(
    pairs: tuple[str, ...], url: str | None, *, option: str, args_option: str
) -> tuple[str, ...]:
    """Model arguments (``KEY=VALUE``) with ``base_url=url`` added when ``url`` is given.

    Raises:
        click.UsageError: the arguments set a base URL too (one place says where a
            model is, so no run goes where the user did not look).
    """
    if url is None:
        return pairs
    if any(pair.partition("=")[0].strip() == "base_url" for pair in pairs):
        raise click.UsageError(f"{option} and {args_option} base_url=... both give the base URL")
    return (*pairs, f"base_url={url}")


class OptionalValue(click.Option):
    """An option whose value may be left out: ``--html`` alone stands for its
    ``flag_value`` (a default place), ``--html=FILE`` gives the value. The value is
    joined to the option by ``=`` only: the word after a bare ``--html`` is never taken
    as its value, so ``convsim report --html RESULTS`` leaves RESULTS to the command.
    Commands with such options are :class:`OptionalValueCommand`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["is_flag"] = False  # a value it may go without: not a flag
        super().__init__(*args, **kwargs)
        if self.flag_value is None:
            raise TypeError(f"{self.name}: an optional value needs flag_value")

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        """``--html[=FILE]``, the way it is written."""
        record = super().get_help_record(ctx)
        if record is None:
            return None
        names, text = record
        return names.replace(" [=", "[="), text


class OptionalValueCommand(click.Command):
    """A command whose :class:`OptionalValue` options take a value by ``=`` only.

    Before click parses the command line, a bare ``--html`` becomes
    ``--html=<its flag_value>``; the word after it stays an argument. When the command
    line then has an argument too many, the error says how to give the value.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        bare = {
            name: str(param.flag_value)
            for param in self.get_params(ctx)
            if isinstance(param, OptionalValue)
            for name in param.opts
        }
        given: list[str] = []
        followed: list[tuple[str, str]] = []
        for i, arg in enumerate(args):
            if arg == "--":  # what follows is arguments only
                given.extend(args[i:])
                break
            if arg in bare:
                given.append(f"{arg}={bare[arg]}")
                after = args[i + 1] if i + 1 < len(args) else None
                if after is not None and not after.startswith("-"):
                    followed.append((arg, after))
            else:
                given.append(arg)
        try:
            return super().parse_args(ctx, given)
        except click.UsageError as exc:
            if not followed or "unexpected extra argument" not in exc.message:
                raise
            hints = ", ".join(f"{name}={word}" for name, word in followed)
            raise click.UsageError(
                f"{exc.message} (to give an option its value, join them with '=': {hints})",
                exc.ctx,
            ) from None


DEFAULT_CACHE = ":default:"
"""What ``--cache`` given without a folder stands for: the default cache folder."""


def cache_options(func: F) -> F:
    """--cache [DIR] and --cache-expiry, for run and score."""
    options = [
        click.option(
            "--cache",
            cls=OptionalValue,
            flag_value=DEFAULT_CACHE,
            default=None,
            metavar="[=DIR]",
            help="Answer model, simulated-user and judge calls made before from a response "
            "cache: --cache=DIR in DIR, --cache alone in ~/.cache/convsim/responses (under "
            "$XDG_CACHE_HOME when set); errors are never cached.",
        ),
        click.option(
            "--cache-expiry",
            default=None,
            metavar="DURATION",
            help="Cached answers older than this are asked again (3600s, 90m, 12h, 7d; "
            "default: never).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def response_cache(cache_dir: str | None, expiry: str | None) -> ResponseCache | None:
    """The response cache ``--cache`` and ``--cache-expiry`` ask for, if any."""
    from ..adapters import ResponseCache, parse_duration

    if cache_dir is None:
        if expiry is not None:
            raise click.UsageError("--cache-expiry needs --cache")
        return None
    try:
        seconds = None if expiry is None else parse_duration(expiry)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--cache-expiry") from None
    if not cache_dir:
        raise click.BadParameter("give a folder, or --cache alone", param_hint="--cache")
    return ResponseCache(None if cache_dir == DEFAULT_CACHE else cache_dir, expiry=seconds)


def parse_gates(_ctx: Any, _param: Any, values: tuple[str, ...]) -> FailUnder:
    """``--fail-under METRIC=VALUE`` (repeatable) and ``--fail-under VALUE`` (once: the
    bound of every primary metric)."""
    named: dict[str, float] = {}
    primary: float | None = None
    for value in values:
        metric, sep, bound = value.partition("=")
        if not sep:
            try:
                bare = float(value)
            except ValueError:
                raise click.BadParameter(
                    f"{value!r}: expected METRIC=VALUE, or a number for the primary metrics"
                ) from None
            if not math.isfinite(bare):
                raise click.BadParameter(f"{value!r}: the bound must be a finite number")
            if primary is not None:
                raise click.BadParameter(
                    f"{value!r}: one bare bound only (the primary metrics already have "
                    f"{primary:g}); name a metric for another: METRIC=VALUE"
                )
            primary = bare
            continue
        try:
            if not metric.strip():
                raise ValueError
            named[metric.strip()] = float(bound)
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected METRIC=VALUE") from None
        if not math.isfinite(named[metric.strip()]):
            raise click.BadParameter(f"{value!r}: the bound must be a finite number")
    return FailUnder(named, primary)


def plugin_settings(pairs: tuple[str, ...]) -> dict[str, dict[str, str]]:
    settings: dict[str, dict[str, str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        plugin, dot, name = key.partition(".")
        if not sep or not dot or not plugin or not name:
            raise click.BadParameter(
                f"{pair!r}: expected NAME.KEY=VALUE", param_hint="--plugin-arg"
            )
        settings.setdefault(plugin, {})[name] = value
    return settings


def html_option(f: Any) -> Any:
    return click.option(
        "--html",
        "html_out",
        cls=OptionalValue,
        flag_value="",
        default=None,
        metavar="[=FILE]",
        help="Write a self-contained HTML report, plots and every conversation, offline: "
        "--html=FILE to FILE, --html alone beside the results file (with .html).",
    )(f)


def check_html_extra(html_out: str | None) -> None:
    """Before the work: --html without the html extra stops with exit 2."""
    if html_out is not None:
        from ..results._html import check_html_extra

        check_html_extra("--html")


def fail_under_option(f: Any) -> Any:
    """--fail-under METRIC=VALUE and --min-scored N, the metric gates."""
    f = click.option(
        "--min-scored",
        type=click.IntRange(min=1),
        default=DEFAULT_MIN_SCORED,
        show_default=True,
        metavar="N",
        help="A metric gate fails when fewer than N conversations have a value for its "
        "metric (not applicable and failed scores have none; compare counts the pairs "
        "scored in both runs); with fewer conversations than N, all of them.",
    )(f)
    return click.option(
        "--fail-under",
        "fail_under",
        multiple=True,
        callback=parse_gates,
        metavar="METRIC=VALUE|VALUE",
        help="Exit 100 when the run's mean of METRIC is below VALUE, it has no value (not "
        "applicable is no value), or fewer than --min-scored conversations were scored; "
        "repeatable. A bare VALUE gates each primary metric of the pack (config.yml "
        "metrics.primary) in its direction: at least VALUE where higher is better, at "
        "most VALUE where lower is; a pack without primary metrics refuses it (exit 2). "
        "METRIC=VALUE on a primary metric overrides the bare VALUE for it.",
    )(f)


def _junit_path(_ctx: Any, _param: Any, value: Path | None) -> Path | None:
    """Before the work: a --junit path whose folder could never be made is bad input
    (the folders missing are created when the file is written)."""
    if value is None:
        return None
    existing = value.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is not a folder", param_hint="--junit")
    return value


def junit_option(what: str) -> Callable[[F], F]:
    """--junit FILE: a JUnit XML report of ``what`` (test cases named in the help)."""

    def decorate(func: F) -> F:
        return click.option(
            "--junit",
            "junit_out",
            type=click.Path(dir_okay=False, path_type=Path),
            callback=_junit_path,
            default=None,
            metavar="FILE",
            help=f"Also write a JUnit XML report for GitLab or Jenkins: {what}; a missing "
            "folder is created.",
        )(func)

    return decorate


def parse_metrics(_ctx: Any, _param: Any, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise click.BadParameter("give at least one metric name")
    return names
