"""``--config FILE``: a command's options from a YAML file.

The file maps option names, as on the command line without the dashes (``model``,
``model-arg``, ``concurrency``; ``-`` and ``_`` alike), and the command's arguments
(``pack``) to values. They become the command's defaults (click's ``default_map``), so
a flag on the command line wins, then a ``CONVSIM_…`` environment variable, then the
file, then the built-in default. A repeatable option takes a list, and one of
``KEY=VALUE`` pairs (``model-arg``) a mapping too; given on the command line, it
replaces the file's list.

Every value is checked as the command line would check it before the command starts;
each problem names the file, its line and the option (exit 2). What the file set is
echoed on stderr with secrets masked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypeVar

import click
from click.core import ParameterSource
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
)

from .._log import get_logger
from .._secrets import MASK, is_secret_key, looks_like_url, redact_url
from ._console import stderr
from ._options import OptionalValueCommand

__all__ = ["MAX_CONFIG_BYTES", "ConfigFileCommand", "config_file_option", "read_config_file"]

F = TypeVar("F", bound=Callable[..., Any])

log = get_logger("convsim.cli")

MAX_CONFIG_BYTES = 1_000_000
"""The largest config file read: options fit in a few kilobytes."""

_META_KEY = "convsim.config_file"
"""Where the context keeps what the file set, for the echo."""


class _Setting(NamedTuple):
    """One option the file sets: as written, and for which parameter."""

    key: str
    """The key as written in the file."""
    param: click.Parameter
    value: Any
    """The value, checked; what click then reads from the default map."""


class _FileSettings(NamedTuple):
    """What a config file set."""

    path: Path
    settings: list[_Setting]


def _option_name(param: click.Parameter) -> str:
    """The name a file uses for ``param``: its longest option name without dashes
    (``model`` for ``-m/--model``), or an argument's name (``pack``)."""
    if isinstance(param, click.Option):
        longest = max(param.opts, key=len)
        return longest.lstrip("-").replace("-", "_")
    return str(param.name)


def _keyed(param: click.Parameter) -> bool:
    """A repeatable option of ``KEY=VALUE`` pairs (``--model-arg``)."""
    metavar = param.metavar if isinstance(param, click.Option) else None
    return bool(metavar and "=" in metavar)


def _scalar_text(value: Any) -> Any:
    """A scalar as the text a command line would carry; other shapes as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _one_value(value: Any) -> Any:
    if value is None or isinstance(value, (list, tuple, Mapping)):
        shape = "nothing" if value is None else type(value).__name__
        raise ValueError(f"takes one value (a number or a text), not {shape}")
    return _scalar_text(value)


def _as_list(keyed: bool) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if keyed and isinstance(value, Mapping):
            return [f"{k}={_scalar_text(v)}" for k, v in value.items()]
        items = value if isinstance(value, (list, tuple)) else [value]  # one value
        return [_scalar_text(v) for v in items]

    return convert


def _pair(text: str) -> str:
    if "=" not in text:
        raise ValueError(f"{text!r} is not KEY=VALUE (or give a mapping)")
    return text


def _field(param: click.Parameter) -> Any:
    """The pydantic type of ``param``'s value in a file."""
    if isinstance(param, click.Option) and param.is_flag and not param.count:
        return bool
    if param.multiple or param.nargs != 1:
        keyed = _keyed(param)
        item = Annotated[str, AfterValidator(_pair)] if keyed else str
        return Annotated[list[item], BeforeValidator(_as_list(keyed))]  # type: ignore[valid-type]
    return Annotated[str, BeforeValidator(_one_value)]


def _settable(command: click.Command) -> dict[str, click.Parameter]:
    """The parameters a file may set, by the name it uses for them."""
    found: dict[str, click.Parameter] = {}
    for param in command.params:
        if not param.expose_value or param.is_eager or param.name is None:
            continue  # --config itself, --help, --version
        found[_option_name(param)] = param
    return found


def _model(params: Mapping[str, click.Parameter]) -> type[BaseModel]:
    fields: dict[str, Any] = {
        f"p{i}": (_field(param), Field(default=None, alias=name))
        for i, (name, param) in enumerate(params.items())
    }
    return create_model(
        "ConfigFile",
        __config__=ConfigDict(extra="forbid", hide_input_in_errors=True),
        **fields,
    )


def _where(path: Path, line: int | None, field: str | None, message: str) -> str:
    at = f"{path}:{line}" if line is not None else str(path)
    return f"{at}: {field}: {message}" if field else f"{at}: {message}"


def read_config_file(ctx: click.Context, command: click.Command, path: Path) -> list[_Setting]:
    """The options ``path`` sets for ``command``, each checked as on the command line.

    Raises:
        click.BadParameter: naming the file, line and option of every problem.
    """
    # read as packs are (YAML with line numbers); imported here so that `convsim --help`
    # does not load a YAML parser
    from ..scenarios._files import FileProblem, line_of, parse_yaml, read_pack_file

    try:
        parsed = parse_yaml(read_pack_file(path.parent, path.name, MAX_CONFIG_BYTES).decode())
    except FileProblem as exc:
        raise click.BadParameter(_where(path, exc.line, exc.field, exc.message)) from None
    except UnicodeDecodeError:
        raise click.BadParameter(_where(path, None, None, "is not UTF-8 text")) from None
    except OSError as exc:
        raise click.BadParameter(_where(path, None, None, exc.strerror or str(exc))) from None
    data = parsed.data if parsed.data is not None else {}
    if not isinstance(data, dict):
        shape = "a mapping of option names to values, e.g. 'concurrency: 8'"
        raise click.BadParameter(_where(path, 1, None, f"a config file holds {shape}"))
    params = _settable(command)
    found: list[tuple[int, str]] = []  # (line, problem)

    def problem(field: str, message: str) -> None:
        line = line_of(parsed.node, field) if parsed.node is not None else None
        found.append((line or 0, _where(path, line, field, message)))

    written: dict[str, str] = {}  # the name a key stands for -> the key as written
    given: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in written:
            problem(str(key), f"repeats {written[name]!r}")
            continue
        written[name], given[name] = str(key), value
    try:  # the file's shape: known options, each value of its option's kind
        checked = _model(params).model_validate(given)
        values = {name: getattr(checked, f"p{i}") for i, name in enumerate(params)}
    except ValidationError as exc:
        misshapen = set()
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]] or [""]
            misshapen.add(loc[0])
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = f"{command.name} has no such option; see 'convsim {command.name} -h'"
            problem(".".join([written.get(loc[0], loc[0]), *loc[1:]]), message)
        # the others are still checked below, so that one pass lists every problem
        values = {
            name: TypeAdapter(_field(params[name])).validate_python(value)
            for name, value in given.items()
            if name in params and name not in misshapen
        }
    settings: list[_Setting] = []
    for name in given:  # in the file's order, for the echo
        param = params.get(name)
        if param is None or name not in values:
            continue
        try:  # as the command line would take it: ranges, choices, paths, sizes
            param.type_cast_value(ctx, values[name])
        except click.BadParameter as exc:
            problem(written[name], exc.message)
            continue
        settings.append(_Setting(written[name], param, values[name]))
    if found:
        raise click.BadParameter("\n".join(text for _, text in sorted(found)))
    return settings


def _read(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    """``--config``'s callback: the file's options become the command's defaults."""
    if value is None or ctx.resilient_parsing:
        return
    assert ctx.command is not None
    settings = read_config_file(ctx, ctx.command, value)
    ctx.default_map = {
        **(ctx.default_map or {}),
        **{str(s.param.name): s.value for s in settings},
    }
    ctx.meta[_META_KEY] = _FileSettings(value, settings)


def config_file_option(func: F) -> F:
    """``--config FILE``: the command's options from a YAML file (see the module)."""
    return click.option(
        "--config",
        "config",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        is_eager=True,
        expose_value=False,
        callback=_read,
        metavar="FILE",
        help="A YAML file of this command's options (model: ..., concurrency: 8, "
        "model-arg: {base_url: ...}); flags and CONVSIM_* variables win over it.",
    )(func)


def _shown(value: Any) -> str:
    """A value fit for the echo: a secret argument masked, a URL without credentials."""
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    text = str(value)
    name, eq, rest = text.partition("=")
    if eq and is_secret_key(name.strip()):
        return f"{name}={MASK}"
    if eq and looks_like_url(rest):
        return f"{name}={redact_url(rest)}"
    return redact_url(text) if looks_like_url(text) else text


_OVERRIDDEN = {
    ParameterSource.COMMANDLINE: "the command line",
    ParameterSource.ENVIRONMENT: "the environment",
}


def _echo(ctx: click.Context) -> None:
    """One line on stderr: what the config file set, and what overrode it."""
    read: _FileSettings | None = ctx.meta.get(_META_KEY)
    if read is None:
        return
    parts = []
    for setting in read.settings:
        value = MASK if is_secret_key(setting.key) else _shown(setting.value)
        shown = f"{setting.key}={value}"
        source = ctx.get_parameter_source(str(setting.param.name))
        if source in _OVERRIDDEN:
            shown += f" (overridden by {_OVERRIDDEN[source]})"
        parts.append(shown)
    stderr().print(
        f"config {read.path}: {', '.join(parts) or 'no options'}", highlight=False, markup=False
    )
    log.info("config_file_read", file=str(read.path), options=[s.key for s in read.settings])


def _renamed_variables(ctx: click.Context, command: click.Command) -> list[str]:
    """``--OPTION VARIABLE`` for each option whose environment variable is not named
    after the option (``--model CONVSIM_RUN_MODEL_SPEC``)."""
    prefix = ctx.auto_envvar_prefix
    if prefix is None:
        return []
    renamed = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.envvar or not param.allow_from_autoenv:
            continue
        if param.name is None or not param.expose_value:
            continue
        variable = f"{prefix}_{param.name.upper()}"
        if variable != f"{prefix}_{_option_name(param).upper()}":
            renamed.append(f"{max(param.opts, key=len)} {variable}")
    return renamed


class ConfigFileCommand(OptionalValueCommand):
    """A command with ``--config``: its help names the environment variables, and it
    echoes what the file set before it runs (its optional values as
    :class:`OptionalValueCommand` reads them)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        if ctx.auto_envvar_prefix is None:
            return
        example = f"{ctx.auto_envvar_prefix}_CONCURRENCY=8"
        renamed = ", ".join(_renamed_variables(ctx, self))
        with formatter.section("Environment"):
            formatter.write_text(
                f"Each option can come from {ctx.auto_envvar_prefix}_<OPTION> "
                f"(e.g. {example}; a flag wins over it, and it over --config); "
                f"these are named otherwise: {renamed}."
            )

    def invoke(self, ctx: click.Context) -> Any:
        _echo(ctx)
        return super().invoke(ctx)
