"""The ``convsim`` command line."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import anyio
import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ._console import (
    EXIT_BAD_INPUT,
    EXIT_ENDPOINT_UNREACHABLE,
    EXIT_INFRASTRUCTURE_FAILURES,
    EXIT_INTERRUPTED,
    clear_errors,
    print_error,
    run_verdict,
)
from ._console import stderr as _stderr
from ._console import stdout as _stdout
from ._errors import ConfigError, ConvsimError
from ._extras import needs_extra
from ._gc import tune_gc_for_throughput
from ._logging import configure_logging
from ._registry import Registry

if TYPE_CHECKING:
    from ._records import Score
    from ._report import MetricSummary, RunReport
    from ._runtime import RunHandle, RunStatistics, Simulator
    from ._sinks import JsonlSink

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

COMMANDS: Registry[click.Command] = Registry("command", group="convsim.commands")
"""Commands other packages add (``convsim lm-eval`` among them), imported when used."""


class _Commands(click.Group):
    """The built-in commands, and those declared in the entry-point group
    ``convsim.commands``, imported only when listed or run."""

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


def _single_turn_options(func: F) -> F:
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


class _ByteSize(click.ParamType):
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


def _pack_input_options(func: F) -> F:
    """--allow-code, --max-file-size and --max-line-size, for the commands that read packs
    or transcripts."""
    func = click.option(
        "--max-line-size",
        "max_line_bytes",
        type=_ByteSize(),
        default="1MB",
        show_default=True,
        help="Longest line of a pack's or transcript's JSONL file; a longer one is "
        "refused before it is parsed.",
    )(func)
    func = click.option(
        "--max-file-size",
        "max_file_bytes",
        type=_ByteSize(),
        default="256MB",
        show_default=True,
        help="Largest pack or transcript file read.",
    )(func)
    return click.option(
        "--allow-code",
        is_flag=True,
        help="Run code the pack names (python goal criteria, lm-eval !function tags). "
        "Packs with code are code: use only for packs you trust.",
    )(func)


def _judge_options(func: F) -> F:
    """--judge, --judge-arg, --judge-samples and --judge-combine, for run and score."""
    options = [
        click.option(
            "--judge",
            "judge_spec",
            default=None,
            help="Model that grades judge metrics (any adapter spec).",
        ),
        click.option("--judge-arg", "judge_args", multiple=True, metavar="KEY=VALUE"),
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
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
def main(log_format: str, log_level: str) -> None:
    """Simulate and evaluate multi-turn conversations with language models."""
    configure_logging(log_format, log_level)  # type: ignore[arg-type]


EXIT_GATE_FAILED = 1


def _parse_gates(_ctx: Any, _param: Any, values: tuple[str, ...]) -> dict[str, float]:
    gates: dict[str, float] = {}
    for value in values:
        metric, sep, bound = value.partition("=")
        try:
            if not sep or not metric.strip():
                raise ValueError
            gates[metric.strip()] = float(bound)
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected METRIC=VALUE") from None
    return gates


def _plugin_settings(pairs: tuple[str, ...]) -> dict[str, dict[str, str]]:
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


def _html_option(f: Any) -> Any:
    return click.option(
        "--html",
        "html_out",
        is_flag=False,
        flag_value="",
        default=None,
        metavar="[FILE]",
        help="Write a self-contained HTML report (default FILE: the results file with "
        ".html): plots and every conversation, offline.",
    )(f)


def _check_html_extra(html_out: str | None) -> None:
    """Before the work: --html without the html extra stops with exit 2."""
    if html_out is not None:
        from .results._html import check_html_extra

        check_html_extra("--html")


def _write_report_html(results: Path, html_out: str) -> None:
    from .results._html import write_html

    written = write_html(results, html_out or None)
    size = written.stat().st_size
    _stdout().print(f"html: {written} ({size / 1e6:.2f} MB)", highlight=False)


def _fail_under_option(f: Any) -> Any:
    return click.option(
        "--fail-under",
        "fail_under",
        multiple=True,
        callback=_parse_gates,
        metavar="METRIC=VALUE",
        help="Exit 1 when the run's mean of METRIC is below VALUE (or it has no value); "
        "repeatable.",
    )(f)


@main.command("list")
@clear_errors
def list_command() -> None:
    """List the bundled scenario packs."""
    from .scenarios import list_packs

    table = Table(title="bundled scenario packs")
    for column in ("name", "kind", "conversations", "description"):
        table.add_column(column, overflow="fold")
    for info in list_packs():
        table.add_row(info.name, info.kind, str(info.conversations), info.description)
    _stdout().print(table)


@main.command()
@click.argument("pack")
@_single_turn_options
@_pack_input_options
@clear_errors
def validate(
    pack: str,
    num_fewshot: int,
    context_mode: str | None,
    include_path: Path | None,
    allow_code: bool,
    max_file_bytes: int,
    max_line_bytes: int,
) -> None:
    """Validate PACK (a bundled pack's name or a folder) without running it."""
    from ._packs import load_pack

    tune_gc_for_throughput()  # a big pack is millions of objects that live on
    loaded = load_pack(
        pack,
        num_fewshot=num_fewshot,
        context_mode=context_mode,
        include_path=include_path,
        allow_code=allow_code,
        max_file_bytes=max_file_bytes,
        max_line_bytes=max_line_bytes,
    )
    flows = sorted({c.flow.scenario_type for c in loaded.conversations})
    out = _stdout()
    out.print(
        f"ok: {loaded.name} ({loaded.kind}, {len(loaded)} conversations, "
        f"flows: {', '.join(flows)}) hash {loaded.pack_hash[:12]}",
        highlight=False,
    )
    for note in loaded.notes:
        out.print(f"note: {note}", highlight=False)


def _parse_metrics(_ctx: Any, _param: Any, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise click.BadParameter("give at least one metric name")
    return names


@main.command()
@click.argument("pack")
@click.option(
    "--model",
    "model_spec",
    default="scripted",
    show_default=True,
    help="Model under test: scripted, or TYPE:MODEL.",
)
@click.option(
    "--model-arg",
    "model_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Adapter argument (repeatable), e.g. latency=0.5 for scripted.",
)
@click.option(
    "--user-model",
    "user_model_spec",
    default=None,
    help="Simulated user for turns with role 'user'.",
)
@click.option("--user-model-arg", "user_model_args", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Conversations run at once.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Results JSONL (default: runs/PACK-TIMESTAMP.jsonl).",
)
@click.option("--resume", is_flag=True, help="Continue --out: skip conversations already recorded.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out.")
@click.option(
    "--retry-failed",
    is_flag=True,
    help="With --resume: run again the conversations that failed for infrastructure "
    "reasons (their new line supersedes the old one).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--limit", type=click.IntRange(min=0), default=None, help="Run at most N conversations."
)
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: shard the conversations over Ray actors (pip install 'convsim[ray]').",
)
@click.option("--actors", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--ray-address", default=None, help="Join this Ray cluster (default: start one).")
@click.option(
    "--plugin",
    "plugin_names",
    multiple=True,
    metavar="NAME",
    help="Run this plugin (code_analysis, or any in the entry-point group convsim.plugins); "
    "repeatable.",
)
@click.option(
    "--plugin-arg",
    "plugin_args",
    multiple=True,
    metavar="NAME.KEY=VALUE",
    help="A plugin setting, e.g. code_analysis.max_complexity=8; repeatable.",
)
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run each scenario K times (its own seed each; conversations SCENARIO#1..#K); "
    "the summary gives pass@k and pass^k for goal achievement.",
)
@click.option(
    "--metrics",
    callback=_parse_metrics,
    default=None,
    help="Comma-separated conversation metrics (default: latency,response_length,"
    "context_retention,goal_achievement); packs and flows add their own.",
)
@click.option(
    "--conversation-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds per conversation (overrides the pack).",
)
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Overrides the pack.")
@_single_turn_options
@_pack_input_options
@click.option(
    "--grace-period",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds in-flight conversations get after Ctrl-C.",
)
@_judge_options
@click.option(
    "--preflight/--no-preflight",
    default=True,
    show_default=True,
    help="Check each model endpoint with one cheap call before the first conversation.",
)
@click.option(
    "--circuit-breaker",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    metavar="N",
    help="Stop starting conversations after N in a row failed for infrastructure "
    "reasons (0: never); --resume runs the rest.",
)
@click.option(
    "--max-failure-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Fraction of conversations that may fail for infrastructure reasons before "
    "the exit code is 3.",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar (default: on a terminal)."
)
@_html_option
@_fail_under_option
@clear_errors
def run(
    pack: str,
    model_spec: str,
    model_args: tuple[str, ...],
    user_model_spec: str | None,
    user_model_args: tuple[str, ...],
    concurrency: int,
    out: Path | None,
    resume: bool,
    overwrite: bool,
    retry_failed: bool,
    seed: int,
    limit: int | None,
    backend: str,
    actors: int,
    ray_address: str | None,
    plugin_names: tuple[str, ...],
    plugin_args: tuple[str, ...],
    trials: int,
    metrics: list[str] | None,
    conversation_timeout: float | None,
    max_turns: int | None,
    num_fewshot: int,
    context_mode: str | None,
    include_path: Path | None,
    allow_code: bool,
    max_file_bytes: int,
    max_line_bytes: int,
    grace_period: float,
    judge_spec: str | None,
    judge_args: tuple[str, ...],
    judge_samples: int,
    judge_combine: str,
    preflight: bool,
    circuit_breaker: int,
    max_failure_rate: float,
    progress: bool | None,
    html_out: str | None,
    fail_under: dict[str, float],
) -> None:
    """Run PACK (a bundled pack's name, a folder, or lm-eval:TASK) against a model.

    \b
    Exit codes:
      0    the run finished (conversations that failed for the model's own
           reasons, such as model_error, included)
      1    a --fail-under gate failed (one line per gate)
      2    bad input: files, options, settings, too few open files for --concurrency
      3    conversations failed for infrastructure reasons (infrastructure_error or
           timed out) beyond --max-failure-rate
      4    a model endpoint is unreachable, refused the key or has a wrong URL (checked
           before the run; the results file is not touched), or went away during the
           run (the circuit breaker stopped it; --resume runs the rest)
      130  interrupted
    Once a run has started, its results and summaries are written before any exit.
    """
    from ._config import SimulatorConfig
    from ._packs import load_pack
    from ._runtime import Simulator
    from ._sinks import JsonlSink
    from .adapters import parse_model_args

    if resume and overwrite:
        raise click.UsageError("--resume and --overwrite exclude each other")
    if resume and out is None:
        raise click.UsageError("--resume needs --out (the results file to continue)")
    if retry_failed and not resume:
        raise click.UsageError("--retry-failed needs --resume (it continues --out)")
    if user_model_args and not user_model_spec:
        raise click.UsageError("--user-model-arg needs --user-model")
    _check_html_extra(html_out)
    # Validate everything before the results file is created, so that a corrected
    # command can reuse the same --out.
    tune_gc_for_throughput()  # a big pack is millions of objects that live on
    loaded = load_pack(
        pack,
        num_fewshot=num_fewshot,
        context_mode=context_mode,
        include_path=include_path,
        allow_code=allow_code,
        max_file_bytes=max_file_bytes,
        max_line_bytes=max_line_bytes,
    ).with_trials(trials)
    config = SimulatorConfig.from_arguments(
        model_spec,
        model_args=parse_model_args(model_args),
        user_model=user_model_spec,
        user_model_args=parse_model_args(user_model_args) if user_model_spec else None,
        concurrency=concurrency,
        metrics=metrics,
        seed=seed,
        conversation_timeout=conversation_timeout,
        max_turns=max_turns,
        grace_period=grace_period,
        judge=judge_spec,
        judge_args=parse_model_args(judge_args) if judge_spec else None,
        judge_samples=judge_samples,
        judge_combine=judge_combine,
        preflight=preflight,
        circuit_breaker=circuit_breaker,
        allow_code=allow_code,
        plugins=plugin_names,
        plugin_config=_plugin_settings(plugin_args),
    )
    simulator = Simulator(config)
    simulator.check(loaded)
    if out is None:
        out = (
            Path("runs") / f"{loaded.name.replace(':', '-')}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        )
    if backend == "ray":
        try:  # the endpoint check runs here, as in one process: before any actor starts
            anyio.run(_check_endpoints, simulator)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
        _run_on_ray(
            pack, model_spec, model_args, out, actors, ray_address, metrics, seed,
            concurrency, limit, resume, fail_under, html_out, max_failure_rate,
            overwrite, retry_failed,
        )  # fmt: skip
        return
    sink = JsonlSink(out, resume=resume, overwrite=overwrite, retry_failed=retry_failed)
    tune_gc_for_throughput()
    err = _stderr()
    show_progress = err.is_terminal if progress is None else progress
    try:
        outcome = anyio.run(_run_with_progress, simulator, loaded, sink, limit, show_progress, err)
    except KeyboardInterrupt:  # before the run's own signal handling (the endpoint check)
        sys.exit(EXIT_INTERRUPTED)
    from ._report import summarize_file

    report = summarize_file(out)  # line by line: never all results in memory at once
    _print_report(report)
    written = _write_summaries(report, out)
    _stdout().print(
        f"results: {out}\nsummary: {written.json_path}, {written.markdown_path}", highlight=False
    )
    if html_out is not None:
        _write_report_html(out, html_out)
    verdict = run_verdict(
        outcome.statistics, interrupted=outcome.interrupted, max_failure_rate=max_failure_rate
    )
    if verdict.message is not None:
        print_error(verdict.message)
    if verdict.code:
        sys.exit(verdict.code)
    _check_gates(report, fail_under)


def _run_on_ray(
    pack: str,
    model_spec: str,
    model_args: tuple[str, ...],
    out: Path,
    actors: int,
    address: str | None,
    metrics: list[str] | None,
    seed: int,
    concurrency: int,
    limit: int | None,
    resume: bool,
    fail_under: dict[str, float],
    html_out: str | None,
    max_failure_rate: float,
    overwrite: bool,
    retry_failed: bool,
) -> None:
    from ._report import summarize_file
    from .adapters import parse_model_args
    from .distributed import run_on_ray

    err = _stderr()
    last = [0.0]

    def progress(done: int, total: int, busy: int) -> None:
        """The whole cluster's progress, a line every few seconds."""
        now = time.monotonic()
        if now - last[0] >= PROGRESS_LINE_S:
            last[0] = now
            err.print(f"ray: {done}/{total} finished, {busy} actor(s) busy", highlight=False)

    def interrupted(at_once: bool) -> None:
        if at_once:
            err.print("stopping at once: in-flight conversations are cancelled on every actor")
        else:
            err.print(
                "stopping: every actor starts no more conversations and its in-flight ones "
                "get the grace period (signal again to stop at once)"
            )

    outcome = run_on_ray(
        pack, model_spec, out=out, actors=actors, address=address,
        model_args=parse_model_args(model_args), metrics=metrics, seed=seed,
        concurrency=concurrency, limit=limit, resume=resume, overwrite=overwrite,
        retry_failed=retry_failed, on_progress=progress, on_interrupt=interrupted,
    )  # fmt: skip
    report = summarize_file(out)
    _print_report(report)
    written = _write_summaries(report, out)
    _stdout().print(
        f"ray: {outcome.results} conversations on {outcome.actors} actors "
        f"({outcome.restarted_actors} restarted), first result after "
        f"{outcome.first_result_s or 0:.2f} s\nresults: {out}\nsummary: {written.json_path}, "
        f"{written.markdown_path}",
        highlight=False,
    )
    if html_out is not None:
        _write_report_html(out, html_out)
    if outcome.interrupted:
        print_error(
            f"interrupted: {outcome.results} conversations recorded; run again with "
            "--resume to finish the rest"
        )
        sys.exit(EXIT_INTERRUPTED)
    if outcome.not_run:
        why = outcome.stopped_early or "an actor died too often"
        print_error(
            f"stopped early: {why}; {outcome.not_run} conversations not run — run again "
            "with --resume --retry-failed once the endpoint is back"
        )
        sys.exit(EXIT_ENDPOINT_UNREACHABLE)
    failures, attempted = outcome.infrastructure_failures, outcome.attempted
    if attempted and failures / attempted > max_failure_rate:
        print_error(
            f"{failures} of {attempted} conversations failed for infrastructure reasons "
            f"({failures / attempted:.0%}), above --max-failure-rate {max_failure_rate:g}"
        )
        sys.exit(EXIT_INFRASTRUCTURE_FAILURES)
    _check_gates(report, fail_under)


async def _check_endpoints(simulator: Simulator) -> None:
    """Enter and leave the simulator: its endpoint check, and nothing else."""
    async with simulator:
        pass


class _RunOutcome(NamedTuple):
    """How a run of the CLI ended."""

    interrupted: bool
    statistics: RunStatistics


async def _run_with_progress(
    simulator: Simulator,
    pack: Any,
    sink: JsonlSink,
    limit: int | None,
    show_progress: bool,
    err: Console,
) -> _RunOutcome:
    """Run to the end; on SIGINT/SIGTERM stop gracefully (a second signal: at once)."""
    interrupted = False
    error: ConvsimError | None = None
    async with simulator as sim:
        # entering checked the endpoints: only now is the results file created
        sink.prepare()  # after the endpoint check: a failed check leaves --out alone
        # one run per results file: prepare() locked it; held until the summary is written
        click.get_current_context().with_resource(sink.lock)
        handle = sim.run(pack, sink=sink, limit=limit)  # errors here are not wrapped

        async def watch_signals() -> None:
            nonlocal interrupted
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    if not interrupted:
                        interrupted = True
                        err.print(
                            "stopping: in-flight conversations get the grace period "
                            "(signal again to stop at once)"
                        )
                        handle.stop()
                    else:
                        err.print("stopping at once: in-flight conversations are cancelled")
                        handle.stop(grace_period=0)

        async def progress_lines() -> None:
            """Off a terminal (a CI log), a line every few seconds instead of a bar."""
            while True:
                await anyio.sleep(PROGRESS_LINE_S)
                s = handle.statistics()
                rate = s.finished / s.elapsed_s if s.elapsed_s > 0 else 0.0
                err.print(
                    f"{pack.name}: {s.finished}/{s.total} finished ({s.done} done, "
                    f"{s.failed + s.timed_out} failed), {s.in_flight} in flight, "
                    f"{rate:.1f} conv/s, {s.elapsed_s:.0f} s",
                    highlight=False,
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_signals)
            if not show_progress:
                tg.start_soon(progress_lines)
            try:
                with _progress(err, show_progress) as bar:
                    task = bar.add_task(pack.name, total=None, status="")
                    async for _ in handle:
                        _update(bar, task, handle)
                    _update(bar, task, handle)
            except ConvsimError as exc:  # kept out of the task group: no ExceptionGroup
                error = exc
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
    stats = handle.statistics()
    if not show_progress:
        err.print(
            f"{pack.name}: {stats.done} done, {stats.failed} failed, {stats.timed_out} timed out, "
            f"{stats.cancelled} cancelled, {stats.resumed} resumed in {stats.elapsed_s:.2f} s",
            highlight=False,
        )
    return _RunOutcome(interrupted, stats)


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


def _update(bar: Progress, task: Any, handle: RunHandle) -> None:
    s = handle.statistics()
    rate = s.finished / s.elapsed_s if s.elapsed_s > 0 else 0.0
    status = (
        f"done {s.done} failed {s.failed + s.timed_out} cancelled {s.cancelled} "
        f"in flight {s.in_flight} retrying {s.retrying} {rate:.1f} conv/s"
    )
    bar.update(task, total=s.total, completed=s.finished, status=status)


PROGRESS_LINE_S = 5.0
"""Seconds between progress lines when the output is not a terminal."""


class SummaryFiles(NamedTuple):
    """Where a run's summary was written."""

    json_path: Path
    markdown_path: Path


def _write_summaries(report: RunReport, results: Path) -> SummaryFiles:
    stem = results.name.removesuffix(".jsonl")
    json_path = results.with_name(stem + ".summary.json")
    md_path = results.with_name(stem + ".summary.md")
    try:
        json_path.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
        md_path.write_text(report.to_markdown(), encoding="utf-8")
    except OSError as exc:
        from ._errors import ResultsError

        raise ResultsError(f"cannot write the summary beside {results}: {exc.strerror}") from None
    return SummaryFiles(json_path, md_path)


def _mean(summary: MetricSummary | None) -> str:
    if summary is None:
        return ""
    return "n/a" if summary.mean is None else f"{summary.mean:.4g}"


def _metric_table(title: str, unit: str, summaries: dict[str, MetricSummary]) -> Table:
    table = Table(title=f"{title}; n: {unit} with a value; \u2191 higher is better")
    table.add_column("metric", no_wrap=True)
    corpus = any(m.corpus is not None for m in summaries.values())
    for col in ("mean", "95% CI", *(["corpus"] if corpus else []), "n", "n/a", "failed"):
        table.add_column(col, justify="right", no_wrap=True)  # numbers are never cut
    table.add_column("", no_wrap=True)
    for name, m in summaries.items():
        better = {True: "\u2191", False: "\u2193", None: ""}[m.higher_is_better]
        ci = "" if m.ci_low is None else f"{m.ci_low:.3g}-{m.ci_high:.3g}"
        whole = ["" if m.corpus is None else f"{m.corpus:.4g}"] if corpus else []
        row = [_mean(m), ci, *whole, str(m.n), str(m.not_applicable), str(m.failed)]
        table.add_row(name, *row, better)
    return table


def _cell_width(texts: Iterable[str]) -> int:
    """Columns a cell of the widest text needs, with padding and a border."""
    return max((len(t) for t in texts), default=0) + 3


def _group_tables(
    title: str, key: str, groups: dict[str, Any], names: list[str], width: int
) -> list[Table]:
    """A breakdown that fits ``width`` columns: groups as rows and metrics as columns
    when that fits; otherwise turned round (metrics as rows), the groups split across as
    many tables as it takes, so that no number is ever cut."""
    rows = {
        name: [
            str(g.conversations),
            str(g.statuses.get("DONE", 0)),
            str(g.statuses.get("FAILED", 0)),
            *[_mean(g.metrics.get(n)) for n in names],
        ]
        for name, g in groups.items()
    }
    heads = ["conversations", "DONE", "FAILED", *names]
    wide = _cell_width([key, *rows]) + sum(
        _cell_width([h, *(r[i] for r in rows.values())]) for i, h in enumerate(heads)
    )
    if wide <= width:
        table = Table(title=title)
        for col in (key, *heads):
            table.add_column(col, justify="left" if col == key else "right", no_wrap=True)
        for name, cells in rows.items():
            table.add_row(name, *cells)
        return [table]
    first = _cell_width(heads)
    chunks: list[list[str]] = [[]]
    used = first
    for name in rows:
        need = _cell_width([name, *rows[name]])
        if chunks[-1] and used + need > width:
            chunks.append([])
            used = first
        chunks[-1].append(name)
        used += need
    tables: list[Table] = []
    for chunk in chunks:
        part = "" if len(chunks) == 1 else f" ({len(tables) + 1}/{len(chunks)})"
        table = Table(title=title + part)
        table.add_column("", no_wrap=True)
        for name in chunk:
            table.add_column(name, justify="right", no_wrap=True)
        for i, head in enumerate(heads):
            table.add_row(head, *[rows[name][i] for name in chunk])
        tables.append(table)
    return tables


def _print_report(report: RunReport) -> None:
    out = _stdout()
    head = Table(title=f"{', '.join(report.packs) or 'no results'} · {', '.join(report.models)}")
    head.add_column("status")
    head.add_column("conversations", justify="right")
    for status, count in report.statuses.items():
        head.add_row(status, str(count))
    out.print(head)
    out.print(_metric_table("metrics (mean over conversations)", "conversations", report.metrics))
    if report.turn_metrics:
        title = "turn metrics (mean over the turns that ask for them)"
        out.print(_metric_table(title, "turns", report.turn_metrics))
    figures = [f"{report.conversations} conversations"]
    if report.duration_s is not None:
        figures.append(f"wall time {report.duration_s:.1f} s")
    usage = report.usage
    if usage.get("total_tokens"):
        figures.append(
            f"tokens {usage.get('total_tokens', 0):,} ({usage.get('prompt_tokens', 0):,} in, "
            f"{usage.get('completion_tokens', 0):,} out)"
        )
    figures.append("cost " + ("-" if report.cost_usd is None else f"${report.cost_usd:.4f}"))
    out.print("; ".join(figures), highlight=False)
    names = list(report.metrics)
    for key, groups in (
        ("scenario_type", report.by_scenario_type),
        ("difficulty", report.by_difficulty),
        ("model", report.by_model),
    ):
        if len(groups) > 1 or key == "scenario_type":
            for table in _group_tables(f"by {key}", key, groups, names, out.width):
                out.print(table)
    if report.retention_curve:
        curve = Table(title="context_retention by distance (turns between fact and probe)")
        for col in ("distance", "recalled", "95% CI", "checks"):
            curve.add_column(col, justify="right")
        for d, m in report.retention_curve.items():
            curve.add_row(str(d), _mean(m), f"{m.ci_low:.3g} - {m.ci_high:.3g}", str(m.n))
        out.print(curve)
    if report.latency_s:
        out.print(
            "latency (s): " + ", ".join(f"{k} {v:.4g}" for k, v in report.latency_s.items()),
            highlight=False,
        )
    if report.errors:
        out.print(
            "errors: " + ", ".join(f"{k} x{v}" for k, v in report.errors.items()), highlight=False
        )
    if report.trials is not None:
        line = f"trials: {report.trials} per scenario"
        if report.pass_hat_k:
            line += "; goal achieved: " + ", ".join(
                f"pass^{k} {v:.3f}" for k, v in report.pass_hat_k.items()
            )
            line += "; " + ", ".join(f"pass@{k} {v:.3f}" for k, v in report.pass_at_k.items())
        if report.trial_spread:
            line += "; spread across trials: " + ", ".join(
                f"{name} {v:.3g}" for name, v in report.trial_spread.items()
            )
        out.print(line, highlight=False)


@main.command()
@click.argument("recorded", metavar="FILE", type=click.Path(path_type=Path))
@click.option(
    "--metrics",
    "metric_names",
    callback=_parse_metrics,
    required=True,
    help="Comma-separated metrics to score.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write one JSON line of scores per conversation here.",
)
@_judge_options
@_pack_input_options
@clear_errors
def score(
    recorded: Path,
    metric_names: list[str],
    out: Path | None,
    allow_code: bool,
    max_file_bytes: int,
    max_line_bytes: int,
    judge_spec: str | None,
    judge_args: tuple[str, ...],
    judge_samples: int,
    judge_combine: str,
) -> None:
    """Score recorded conversations without running a model.

    FILE is a transcripts file (one conversation per line) or a results file of
    `convsim run`, whose conversations are scored again from their recorded turns.
    """
    from ._report import _summarise
    from ._rescore import is_results_file, read_recorded_run
    from .adapters import Budgets, create_adapter, parse_model_args
    from .metrics import METRICS, JudgeSettings, read_transcripts, score_transcripts

    for name in metric_names:
        METRICS.get(name)  # unknown names fail before any work
    if out is not None and is_results_file(out):  # scores would replace its results
        from ._errors import ResultsError

        raise ResultsError(f"{out}: is a results file of convsim run; --out needs another file")
    if is_results_file(recorded):
        _lock_results(recorded)
        run = read_recorded_run(recorded, allow_code=allow_code)
        loaded, notes = run.transcripts, run.notes
    else:
        loaded = read_transcripts(
            recorded,
            allow_code=allow_code,
            max_file_bytes=max_file_bytes,
            max_line_bytes=max_line_bytes,
        )
        notes = []
    judge = None
    if judge_spec is not None:
        adapter = create_adapter(judge_spec, parse_model_args(judge_args))
        adapter.bind_budgets(Budgets())  # as `convsim run`: one rate budget per provider key
        judge = JudgeSettings(
            adapter,
            samples=judge_samples,
            combine="majority" if judge_combine == "majority" else "mean",
        )

    async def scoring() -> Any:
        try:
            return await score_transcripts(loaded, metric_names, judge=judge)
        finally:
            if judge is not None:
                await judge.adapter.aclose()

    scored = anyio.run(scoring)
    out_console = _stdout()
    for note in notes:
        out_console.print(f"note: {note}", highlight=False)
    table = Table(title=f"{recorded.name}: {len(scored)} conversations")
    table.add_column("conversation")
    for name in metric_names:
        table.add_column(name, justify="right")
    for row in scored:
        table.add_row(row.conversation_id, *[_score_cell(row.scores[n]) for n in metric_names])
    out_console.print(table)
    summary = Table(title="aggregate")
    for col in ("metric", "mean", "95% CI", "n", "n/a", "failed"):
        summary.add_column(col, justify="left" if col == "metric" else "right")
    summaries = _summarise([row.scores for row in scored], {})
    for name in metric_names:
        m = summaries[name]
        ci = "" if m.ci_low is None else f"{m.ci_low:.4g} - {m.ci_high:.4g}"
        summary.add_row(name, _mean(m), ci, str(m.n), str(m.not_applicable), str(m.failed))
    out_console.print(summary)
    scenarios = {t.conversation_id: t.conversation.scenario for t in loaded}
    for field in ("scenario_type", "difficulty"):
        keys = {cid: getattr(sc, field) for cid, sc in scenarios.items()}
        if field == "scenario_type":  # "default" unless the file says otherwise
            keys = {cid: k if k != "default" else None for cid, k in keys.items()}
        if all(k is None for k in keys.values()):
            continue
        groups: dict[str, list[dict[str, Score]]] = {}
        for row in scored:
            groups.setdefault(keys[row.conversation_id] or "unspecified", []).append(row.scores)
        by = Table(title=f"by {field} (mean)")
        for col in (field, "conversations", *metric_names):
            by.add_column(col, justify="left" if col == field else "right")
        for group, maps in sorted(groups.items()):
            means = _summarise(maps, {})
            by.add_row(group, str(len(maps)), *[_mean(means.get(n)) for n in metric_names])
        out_console.print(by)
    if out is not None:
        try:
            with open(out, "w", encoding="utf-8") as fh:
                for row in scored:
                    line: dict[str, Any] = {"conversation_id": row.conversation_id}
                    sc = scenarios[row.conversation_id]
                    if sc.scenario_type != "default":
                        line["scenario_type"] = sc.scenario_type
                    if sc.difficulty is not None:
                        line["difficulty"] = sc.difficulty
                    line["scores"] = {n: s.model_dump() for n, s in row.scores.items()}
                    fh.write(json.dumps(line) + "\n")
        except OSError as exc:
            from ._errors import ResultsError

            raise ResultsError(f"{out}: cannot write scores: {exc.strerror}") from None
        out_console.print(f"scores: {out}", highlight=False)


def _lock_results(results: Path) -> None:
    """Refuse to read a results file (and write beside it) while a run writes it; the
    lock is held until the command ends."""
    from ._errors import ResultsError
    from ._sinks import ResultsLock

    if not results.is_file():
        raise ResultsError(f"{results}: no such results file")
    click.get_current_context().with_resource(ResultsLock(results, required=False))


def _score_cell(score: Score) -> str:
    if score.value is not None:
        return f"{score.value:.4g}"
    return "failed" if score.status == "failed" else "n/a"


@main.command()
@click.argument("results", type=click.Path(path_type=Path))
@click.option(
    "--csv",
    "csv_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write one row per conversation (ids, status, usage, cost, timing, error, "
    "score.<metric> columns) to this CSV file.",
)
@_html_option
@_fail_under_option
@clear_errors
def report(
    results: Path, csv_out: Path | None, html_out: str | None, fail_under: dict[str, float]
) -> None:
    """Summarise a results file; writes RESULTS.summary.json and .summary.md beside it.

    Exits 1 when a --fail-under gate fails (one line per gate), 2 on bad input."""
    from ._report import summarize_file

    _check_html_extra(html_out)
    _lock_results(results)
    summary = summarize_file(results)
    _print_report(summary)
    written = _write_summaries(summary, results)
    _stdout().print(f"summary: {written.json_path}, {written.markdown_path}", highlight=False)
    if csv_out is not None:
        count = _write_csv(results, csv_out)
        _stdout().print(f"csv: {csv_out} ({count} conversations)", highlight=False)
    if html_out is not None:
        _write_report_html(results, html_out)
    _check_gates(summary, fail_under)


def _check_gates(report: RunReport, gates: dict[str, float]) -> None:
    """Exit 1 with one line per failed gate."""
    failed = []
    for metric, bound in gates.items():
        summary = report.metrics.get(metric) or report.turn_metrics.get(metric)
        mean = summary.mean if summary is not None else None
        if mean is None:
            failed.append(f"gate failed: {metric} has no value in this run (needs >= {bound:g})")
        elif mean < bound:
            failed.append(f"gate failed: {metric} mean {mean:.4g} < {bound:g}")
    for line in failed:
        print_error(line)
    if failed:
        sys.exit(EXIT_GATE_FAILED)


def _write_csv(results: Path, out: Path) -> int:
    """One row per conversation of ``results``; how many were written."""
    import csv

    from ._sinks import read_results
    from .results import conversation_columns, conversation_row

    if not out.parent.exists():
        raise ConfigError(f"{out}: its folder does not exist")
    rows = [conversation_row(r, str(results)) for r in read_results(results)]
    with out.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, conversation_columns(rows))
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


@main.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option(
    "--metrics",
    callback=_parse_metrics,
    default=None,
    help="Comma-separated metrics to compare (default: every metric both runs scored).",
)
@click.option(
    "--fail-if-worse",
    default=None,
    metavar="METRIC,...",
    help="Exit 1 when CANDIDATE is significantly worse than BASE on one of these metrics "
    "(the 95% interval of the paired difference lies wholly on the worse side).",
)
@_fail_under_option
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the comparison as JSON.",
)
@clear_errors
def compare(
    base: Path,
    candidate: Path,
    metrics: list[str] | None,
    fail_if_worse: str | None,
    fail_under: dict[str, float],
    json_out: Path | None,
) -> None:
    """Compare CANDIDATE's results with BASE's, paired by conversation.

    \b
    Exit codes: 0 no gate failed; 1 a gate failed (one line per gate); 2 bad input.
    """
    from .results._compare import as_json, compare_files

    worse_gates = [m.strip() for m in (fail_if_worse or "").split(",") if m.strip()]
    wanted = None if metrics is None else list(dict.fromkeys([*metrics, *worse_gates]))
    if wanted is not None:
        wanted = list(dict.fromkeys([*wanted, *fail_under]))
    result = compare_files(base, candidate, metrics=wanted)
    _print_comparison(result)
    if json_out is not None:
        if not json_out.parent.exists():
            raise ConfigError(f"{json_out}: its folder does not exist")
        json_out.write_text(json.dumps(as_json(result), indent=2) + "\n")
        _stdout().print(f"comparison: {json_out}", highlight=False)
    by_metric = {m.metric: m for m in result.metrics}
    failed = []
    for metric in worse_gates:
        found = by_metric.get(metric)
        if found is None or found.pairs == 0:
            failed.append(f"gate failed: {metric} has no paired values to compare")
        elif found.significantly_worse:
            low, high = found.ci95 or (0.0, 0.0)
            failed.append(
                f"gate failed: {metric} is significantly worse in the candidate: "
                f"difference {found.mean_difference:+.4g} (95% CI {low:+.4g} to {high:+.4g})"
            )
    for metric, bound in fail_under.items():
        found = by_metric.get(metric)
        mean = found.candidate_mean if found is not None else None
        if mean is None:
            failed.append(f"gate failed: {metric} has no value in the candidate")
        elif mean < bound:
            failed.append(f"gate failed: {metric} candidate mean {mean:.4g} < {bound:g}")
    for line in failed:
        print_error(line)
    if failed:
        sys.exit(EXIT_GATE_FAILED)


def _print_comparison(result: Any) -> None:
    from rich import box
    from rich.table import Table

    out = _stdout()
    table = Table(
        title=f"{result.candidate} vs {result.base} ({result.paired} paired)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
    )
    # numbers are never cut; the metric's name and the interval wrap when space is short
    table.add_column("metric", overflow="fold", ratio=2)
    for name in ("n", "base", "cand.", "diff."):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("95% CI", justify="right", overflow="fold", ratio=1)
    for name in ("W/T/L", "p"):
        table.add_column(name, justify="right", no_wrap=True)
    for m in result.metrics:
        if not m.pairs:
            table.add_row(m.metric, "0", "-", "-", "-", "-", "-", "-")
            continue
        ci = f"{m.ci95[0]:+.2g}..{m.ci95[1]:+.2g}" if m.ci95 else "-"
        diff = f"{m.mean_difference:+.3g}"
        table.add_row(
            m.metric,
            str(m.pairs),
            f"{m.base_mean:.3g}",
            f"{m.candidate_mean:.3g}",
            f"[red]{diff}[/]" if m.significantly_worse else diff,
            ci,
            f"{m.wins}/{m.ties}/{m.losses}",
            "-" if m.wilcoxon_p is None else f"{m.wilcoxon_p:.2g}",
        )
    out.print(table)
    for m in result.metrics:
        if m.most_changed:
            changes = ", ".join(
                f"{c.conversation_id} {c.difference:+.3g}" for c in m.most_changed[:3]
            )
            out.print(f"{m.metric}: most changed {changes}", highlight=False)
    if result.only_in_base or result.only_in_candidate:
        out.print(
            f"unpaired: {len(result.only_in_base)} only in base "
            f"({', '.join(result.only_in_base[:5])}), {len(result.only_in_candidate)} only in "
            f"candidate ({', '.join(result.only_in_candidate[:5])})",
            highlight=False,
        )


@main.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8600, show_default=True)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("convsim-service.db"),
    show_default=True,
    help="SQLite database of keys and jobs.",
)
@click.option(
    "--results-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("service-results"),
    show_default=True,
    help="Where each job's results file goes.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML file of settings: endpoints, allow_base_url, limits, max_body_bytes, "
    "upload_retention_s, pack_sources, max_starts (the flags add to it).",
)
@click.option(
    "--endpoint",
    "endpoints",
    multiple=True,
    metavar="NAME=SPEC[,KEY=VALUE...]",
    help="A model tenants may name (repeatable), called with the server's key: "
    "gpt=openai:gpt-4o-mini,api_key_env=OPENAI_API_KEY,rpm=500",
)
@click.option(
    "--allow-base-url",
    "allow_base_url",
    multiple=True,
    metavar="PREFIX",
    help="A URL prefix tenants' own models may be at (repeatable); without one, tenants "
    "use --endpoint models only. Private and loopback addresses need a prefix naming "
    "the host.",
)
@click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="NAME=VALUE",
    help="A limit for every key without its own (repeatable): jobs, conversations, "
    "concurrency, max_tokens, response_bytes, inflight_bytes, trials, turns, "
    "transcript_chars, results_bytes, streams, uploads, upload_bytes.",
)
@click.option(
    "--pack-source",
    "pack_sources",
    multiple=True,
    type=click.Choice(["lm-eval"]),
    help="Let tenants name lm-eval:TASK packs (loading one costs seconds of a worker "
    "process); task:NAME packs are taken by default.",
)
@click.option("--max-jobs-per-key", type=click.IntRange(min=1), help="Same as --limit jobs=N.")
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    help="The largest request body, however it is sent  [default: 1048576]",
)
@click.pass_context
@clear_errors
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    db: Path,
    results_dir: Path,
    config_file: Path | None,
    endpoints: tuple[str, ...],
    allow_base_url: tuple[str, ...],
    limits: tuple[str, ...],
    pack_sources: tuple[str, ...],
    max_jobs_per_key: int | None,
    max_body_bytes: int | None,
) -> None:
    """Run the evaluation service (FastAPI on uvicorn); `serve keys` manages its API keys.

    Jobs left queued or running by a killed server are resumed at startup. See
    README's "Running the service for others" before exposing it.
    """
    if ctx.invoked_subcommand is not None:
        return
    with needs_extra("service", "convsim serve"):  # all of it, before the server starts
        import cryptography.fernet  # noqa: F401
        import uvicorn  # noqa: F401

        from .service import ServiceSettings, create_app
    from .service._settings import parse_endpoint, parse_limits

    chosen = parse_limits(limits)
    if max_jobs_per_key is not None:
        chosen["jobs"] = max_jobs_per_key
    settings = ServiceSettings.load(
        config_file,
        endpoints=dict(parse_endpoint(e) for e in endpoints),
        allow_base_url=list(allow_base_url),
        pack_sources=list(pack_sources),
        limits=chosen,
        max_body_bytes=max_body_bytes,
    )
    if "lm-eval" in settings.pack_sources:
        with needs_extra("lm-eval", "--pack-source lm-eval"):
            import lm_eval  # noqa: F401
    os.umask(0o077)  # the database, results and uploads are the server owner's alone
    app = create_app(db, results_dir, settings=settings)
    _stderr().print(f"convsim serve: http://{host}:{port} (db {db})", highlight=False)
    _serve_app(app, host, port)


def _serve_app(app: Any, host: str, port: int) -> None:
    """uvicorn, stopping at once on SIGTERM or SIGINT: open result streams end."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.stopping.set()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    _Server(config).run()


@serve.group()
def keys() -> None:
    """Create, list and revoke the service's API keys."""


_DB_OPTION = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("convsim-service.db"),
    show_default=True,
)


_KEY_LIMIT_OPTION = click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="NAME=VALUE",
    help="This key's own limit (repeatable), in place of the server's: jobs, "
    "conversations, concurrency, max_tokens, response_bytes, inflight_bytes, trials, "
    "turns, transcript_chars, results_bytes, streams, uploads, upload_bytes.",
)


@keys.command("create")
@_DB_OPTION
@click.option("--name", required=True, help="Whose key it is (unique).")
@_KEY_LIMIT_OPTION
@clear_errors
def keys_create(db: Path, name: str, limits: tuple[str, ...]) -> None:
    """Create a key; it is printed once, as the last line (only its hash is kept)."""
    from .service import Store
    from .service._settings import parse_limits

    own = parse_limits(limits)
    store = Store(db)
    key = store.create_key(name)
    if own:
        store.set_limits(name, own)
    click.echo(f"created key {name!r}; store it now, it is not shown again:")
    click.echo(key)


@keys.command("limits")
@_DB_OPTION
@click.option("--name", required=True)
@_KEY_LIMIT_OPTION
@clear_errors
def keys_limits(db: Path, name: str, limits: tuple[str, ...]) -> None:
    """Set a key's own limits (none given: the server's apply again); a running
    server applies them to the key's next jobs."""
    from .service import Store
    from .service._settings import parse_limits

    own = parse_limits(limits)
    Store(db).set_limits(name, own)
    shown = ", ".join(f"{k}={v}" for k, v in own.items()) or "the server's"
    click.echo(f"key {name!r}: limits {shown}")


@keys.command("list")
@_DB_OPTION
@clear_errors
def keys_list(db: Path) -> None:
    """The keys by name: when created and revoked, their own limits, what they spent."""
    from .service import Store

    for row in Store(db).list_keys():
        revoked = "" if row.revoked is None else f" revoked {time.ctime(row.revoked)}"
        own = ", ".join(f"{k}={v}" for k, v in row.limits.items())
        limits = f"\tlimits {own}" if own else ""
        click.echo(
            f"{row.name}\tcreated {time.ctime(row.created)}{revoked}\t"
            f"spent ${row.spent_usd:.4f}{limits}"
        )


@keys.command("revoke")
@_DB_OPTION
@click.option("--name", required=True)
@clear_errors
def keys_revoke(db: Path, name: str) -> None:
    """Revoke a key: every request with it is refused from now on."""
    from .service import Store

    Store(db).revoke_key(name)
    click.echo(f"revoked key {name!r}")


class _DelayType(click.ParamType):
    """Milliseconds, or a Delay form: fixed:MS, uniform:LO:HI, exp:MEAN, normal:MEAN:SD."""

    name = "DELAY"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from .adapters.mock import Delay

        try:
            return Delay.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _parse_faults(_ctx: Any, _param: Any, value: str | None) -> dict[str, float] | None:
    if value is None:
        return None
    weights: dict[str, float] = {}
    for item in value.split(","):
        kind, sep, weight = item.strip().partition("=")
        try:
            weights[kind] = float(weight) if sep else 1.0
        except ValueError:
            raise click.BadParameter(f"{item.strip()!r}: expected KIND or KIND=WEIGHT") from None
    return weights


@main.command("mock-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: a free port."
)
@click.option(
    "--ttft-ms", type=_DelayType(), default="0", show_default=True, help="Time to first token."
)
@click.option(
    "--itl-ms", type=_DelayType(), default="0", show_default=True, help="Inter-token latency."
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Every answer has exactly N words.",
)
@click.option(
    "--fault-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Fraction of generation requests that get an injected fault.",
)
@click.option(
    "--faults",
    callback=_parse_faults,
    default=None,
    metavar="KIND[=W],...",
    help="Fault mix over: 429; 500; drop (the connection closes); malformed (a 200 of "
    "broken JSON); html (a 200 with a proxy's HTML page); truncated_sse, stream_error, "
    "stream_drop (a stream that ends, reports an error, or drops after a few words); "
    "lone_surrogate (half an emoji in the text); split_surrogate (an emoji split across two "
    "stream events). Default: all equally.",
)
@click.option(
    "--retry-after",
    "retry_after_s",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Retry-After (seconds) of an injected 429.",
)
@click.option(
    "--rpm", type=click.IntRange(min=1), default=None, help="Requests per minute, then 429."
)
@click.option(
    "--memory-turns",
    type=click.IntRange(min=1),
    default=None,
    help="The model sees only the last K user messages.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--model", "model_name", default="mock-model", show_default=True)
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY'.")
@click.option(
    "--message-overhead-tokens",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Prompt tokens a chat template would add per message.",
)
def mock_server(
    host: str,
    port: int,
    ttft_ms: Any,
    itl_ms: Any,
    output_tokens: int | None,
    fault_rate: float,
    faults: dict[str, float] | None,
    retry_after_s: float,
    rpm: int | None,
    memory_turns: int | None,
    seed: int,
    model_name: str,
    api_key: str | None,
    message_overhead_tokens: int,
) -> None:
    """Serve a mock OpenAI-compatible model until SIGINT or SIGTERM.

    Endpoints: /v1/models, /v1/chat/completions, /v1/completions, /generate and
    /tokenize; min_tokens and ignore_eos are honoured as vLLM does.
    Delays take milliseconds or fixed:MS, uniform:LO:HI, exp:MEAN, normal:MEAN:SD.
    """
    from pydantic import ValidationError

    from ._errors import describe_validation_error
    from .adapters.mock import MockServerConfig

    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "ttft_ms": ttft_ms,
        "itl_ms": itl_ms,
        "output_tokens": output_tokens,
        "fault_rate": fault_rate,
        "retry_after_s": retry_after_s,
        "rpm": rpm,
        "memory_turns": memory_turns,
        "seed": seed,
        "model": model_name,
        "api_key": api_key,
        "message_overhead_tokens": message_overhead_tokens,
    }
    if faults is not None:
        settings["faults"] = faults
    try:
        config = MockServerConfig(**settings)
    except ValidationError as exc:
        raise click.UsageError(describe_validation_error(exc, "mock server option")) from None
    tune_gc_for_throughput()
    try:
        anyio.run(_serve_mock, config, backend="asyncio")
    except OSError as exc:  # the address is taken or cannot be bound
        _stderr().print(
            f"[bold red]error:[/] cannot listen on {escape(host)}:{port}: {escape(str(exc))}",
            highlight=False,
        )
        sys.exit(EXIT_BAD_INPUT)


async def _serve_mock(config: Any) -> None:
    """Serve until SIGINT/SIGTERM (the receiver is open before the address is printed)."""
    import structlog

    from .adapters.mock import MockModelServer

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with MockModelServer(config) as server:
            click.echo(f"listening on {server.url}", err=True)
            structlog.get_logger("convsim.cli").info(
                "mock_server_listening", url=server.url, base_url=server.base_url
            )
            async for _ in signals:
                break


if __name__ == "__main__":  # pragma: no cover
    main()
