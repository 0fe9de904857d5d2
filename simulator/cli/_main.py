"""The ``convsim`` group: its options, and every command named once by where it lives."""

from __future__ import annotations

import errno
from typing import Any, Literal, NoReturn

import click

from .._registry import Registry
from ._console import LOG_FORMAT, print_error
from ._logging import configure_logging

__all__ = ["COMMANDS", "ENV_PREFIX", "main"]

COMMANDS: Registry[click.Command] = Registry("command", group="convsim.commands")
"""Every command, imported when listed or run: the built-in ones below, and those other
packages declare in the entry-point group ``convsim.commands`` (``convsim lm-eval``)."""

COMMANDS.register("list", "convsim.cli._packs:list_command")
COMMANDS.register("validate", "convsim.cli._packs:validate")
COMMANDS.register("run", "convsim.cli._run:run")
COMMANDS.register("score", "convsim.cli._score:score")
COMMANDS.register("report", "convsim.cli._report:report")
COMMANDS.register("compare", "convsim.cli._report:compare")
COMMANDS.register("load", "convsim.cli._load:load_command")
COMMANDS.register("metrics", "convsim.cli._metrics:metrics_command")
COMMANDS.register("serve", "convsim.cli._serve:serve")
COMMANDS.register("mock-server", "convsim.cli._mock_server:mock_server")


class _Commands(click.Group):
    """The commands of :data:`COMMANDS`, imported only when listed or run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS.names()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in COMMANDS:
            loaded = COMMANDS.get(cmd_name)
            if not isinstance(loaded, click.Command):
                raise click.ClickException(f"convsim.commands: {cmd_name} is not a click command")
            command = loaded
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command. With --log-format json a usage error is a JSON event too. An
        unexpected exception is a crash: its traceback is printed and the exit code is 70
        (``EXIT_CRASHED``), never 1, so CI can tell a crash from a failed gate (100).
        click's own exits and usage errors pass through."""
        try:
            return super().invoke(ctx)  # runs main(), which sets the log format
        except click.UsageError as exc:
            if ctx.meta.get(LOG_FORMAT) != "json":
                raise
            where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
            print_error(f"{where}{exc.format_message()}")
            raise click.exceptions.Exit(exc.exit_code) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # stdout closed by a pager or `head`: click's case
                raise
            _crash(ctx.meta.get(LOG_FORMAT) == "json")
        except Exception:
            _crash(ctx.meta.get(LOG_FORMAT) == "json")


def _crash(json_log: bool) -> NoReturn:
    """Print the exception being handled, with its traceback, and exit 70 (with
    --log-format json, the traceback is inside the one JSON error event)."""
    import sys
    import traceback

    from ._console import EXIT_CRASHED

    kind = sys.exc_info()[0]
    name = "an exception" if kind is None else kind.__name__
    message = f"convsim crashed ({name}, exit {EXIT_CRASHED}): a bug, not a verdict on the model"
    if json_log:
        print_error(f"{message}\n{traceback.format_exc()}")
    else:
        traceback.print_exc()
        print_error(f"{message}; the traceback above says where")
    sys.exit(EXIT_CRASHED)


ENV_PREFIX = "CONVSIM"
"""Every option can come from the environment (click's ``auto_envvar_prefix``):
``CONVSIM_<COMMAND>_<NAME>``, NAME being the option's parameter name in capitals
(``--concurrency`` of run: ``CONVSIM_RUN_CONCURRENCY``; ``--model``:
``CONVSIM_RUN_MODEL_SPEC``; ``convsim run --help`` lists those not named after their
option). A flag on the command line wins over it; it wins over a ``--config`` file."""


@click.group(
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": ENV_PREFIX},
)
@click.version_option(package_name="convsim")
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default="console",
    show_default=True,
    help="structlog output on stderr.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
@click.pass_context
def main(ctx: click.Context, log_format: Literal["console", "json"], log_level: str) -> None:
    """Simulate and evaluate multi-turn conversations with language models.

    \b
    Exit codes shared by every command:
      0    the work finished
      2    bad input (files, options, settings), with one line saying where
      70   convsim crashed: an unexpected exception, its traceback printed
      99   a load test's gate failed (load's --fail-on-slo, --fail-on-invalid)
      100  a quality gate failed (--fail-under, --fail-if-worse, --min-scored)
      130  interrupted
    `convsim run --help` lists the codes a run adds (3, 4, 5, 6).

    Every option can also come from an environment variable CONVSIM_<COMMAND>_<NAME>,
    NAME being the option's value name in capitals, such as CONVSIM_RUN_CONCURRENCY=8
    or CONVSIM_LOG_LEVEL=info; a flag on the command line wins over it.

    With --log-format json every line on stderr is a JSON event: the logs, and what
    the command says there (progress, warnings, errors) as "cli_message" events.
    """
    ctx.meta[LOG_FORMAT] = log_format
    configure_logging(log_format, log_level)
