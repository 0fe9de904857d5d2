"""``convsim run``: a pack against a model, in this process or on Ray actors."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .._errors import ConvsimError
from .._gc import tune_gc_for_throughput
from .._plural import counted
from ..results._terminal import print_report
from ._config_file import ConfigFileCommand, config_file_option
from ._console import (
    EXIT_ENDPOINT_UNREACHABLE,
    EXIT_INFRASTRUCTURE_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUTS,
    clear_errors,
    print_error,
    run_verdict,
    timeout_line,
)
from ._console import stderr as _stderr
from ._console import stdout as _stdout
from ._estimate import print_estimate
from ._gates import FailUnder, exit_on_failed_gates, fail_under_gates, require_primary
from ._options import (
    PackReading,
    cache_options,
    check_html_extra,
    fail_under_option,
    html_option,
    judge_options,
    junit_option,
    pack_reading_options,
    parse_metrics,
    plugin_settings,
    response_cache,
    with_base_url,
)
from ._outputs import (
    print_cache_line,
    write_report_html,
    write_results_junit,
    write_summaries,
)
from ._tracing import otel_exported, tracing_options, with_request_id_header

if TYPE_CHECKING:
    from .._runtime._handle import RunHandle, RunStatistics
    from .._runtime._simulator import Simulator
    from ..results._sinks import JsonlSink


@click.command(cls=ConfigFileCommand)
@click.argument("pack")
@config_file_option
@click.option(
    "-m",
    "--model",
    "model_spec",
    default="scripted",
    show_default=True,
    help="Model under test: scripted, TYPE:MODEL, module:AdapterClass, or an application "
    "python:package.module:function (an async function of the messages and tools).",
)
@click.option(
    "--model-arg",
    "model_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Adapter argument (repeatable), e.g. latency=0.5 for scripted.",
)
@click.option(
    "--base-url",
    default=None,
    metavar="URL",
    help="The model's base URL (as --model-arg base_url=URL), e.g. http://127.0.0.1:8000/v1.",
)
@click.option(
    "--user-model",
    "user_model_spec",
    default=None,
    help="Simulated user for turns with role 'user'.",
)
@click.option("--user-model-arg", "user_model_args", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--user-base-url",
    default=None,
    metavar="URL",
    help="The simulated user's base URL (as --user-model-arg base_url=URL).",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Conversations run at once.",
)
@click.option(
    "-o",
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
    "-n",
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    help="Run at most N conversations.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate, expand trials and print the conversations, turns, model calls by role, "
    "estimated prompt tokens and the cost range; call no model, write no file.",
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
    callback=parse_metrics,
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
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Cap every turn's model calls at N tokens: a pack's larger per-turn max_tokens "
    "is clipped to N, a smaller one kept (a max_tokens --model-arg caps the same way).",
)
@pack_reading_options
@click.option(
    "--grace-period",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds in-flight conversations get after Ctrl-C.",
)
@judge_options
@cache_options
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
    "--max-cost",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="USD",
    help="Start no conversation that could take this run's spend (model, user and judge "
    "calls) past USD, counting the ones in flight; --resume runs the rest.",
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
@html_option
@fail_under_option
@junit_option(
    "one test case per --fail-under gate and one per conversation (failed when it "
    "FAILED or TIMED_OUT, with its error)"
)
@tracing_options
@clear_errors
def run(
    pack: str,
    model_spec: str,
    model_args: tuple[str, ...],
    base_url: str | None,
    user_model_spec: str | None,
    user_model_args: tuple[str, ...],
    user_base_url: str | None,
    concurrency: int,
    out: Path | None,
    resume: bool,
    overwrite: bool,
    retry_failed: bool,
    seed: int,
    limit: int | None,
    dry_run: bool,
    backend: str,
    actors: int,
    ray_address: str | None,
    plugin_names: tuple[str, ...],
    plugin_args: tuple[str, ...],
    trials: int,
    metrics: list[str] | None,
    conversation_timeout: float | None,
    max_turns: int | None,
    max_tokens: int | None,
    reading: PackReading,
    grace_period: float,
    judge_spec: str | None,
    judge_args: tuple[str, ...],
    judge_base_url: str | None,
    judge_samples: int,
    judge_combine: str,
    judge_sees_reasoning: bool,
    cache: str | None,
    cache_expiry: str | None,
    preflight: bool,
    circuit_breaker: int,
    max_cost: float | None,
    max_failure_rate: float,
    progress: bool | None,
    html_out: str | None,
    fail_under: FailUnder,
    min_scored: int,
    junit_out: Path | None,
    otel: str | None,
    request_id_header: str | None,
) -> None:
    """Run PACK (a bundled pack's name, a folder, or lm-eval:TASK) against a model.

    \b
    Exit codes:
      0    the run finished (conversations that failed for the model's own
           reasons, such as model_error, included)
      2    bad input: files, options, settings, too few open files for --concurrency
      3    conversations failed for infrastructure reasons (infrastructure_error)
           beyond --max-failure-rate
      4    a model endpoint is unreachable, refused the key or has a wrong URL (checked
           before the run; the results file is not touched), or went away during the
           run (the circuit breaker stopped it; --resume runs the rest)
      5    conversations hit their conversation timeout beyond --max-failure-rate
           (counted apart from infrastructure failures: raise --conversation-timeout)
      6    --max-cost stopped the run before its last conversation (--resume runs
           the rest)
      70   convsim crashed: an unexpected exception (its traceback is printed)
      100  a --fail-under gate failed (one line per gate): its mean is on the wrong
           side of the bound, it has no value, or fewer than --min-scored
           conversations were scored
      130  interrupted
    When several apply, the first of 4, 3, 5 wins; gates are judged only when none
    does.
    Once a run has started, its results and summaries are written before any exit.
    """
    from .._runtime._config import SimulatorConfig
    from .._runtime._simulator import Simulator
    from ..adapters import parse_model_args
    from ..results._sinks import JsonlSink

    if resume and overwrite:
        raise click.UsageError("--resume and --overwrite exclude each other")
    if resume and out is None:
        raise click.UsageError("--resume needs --out (the results file to continue)")
    if retry_failed and not resume:
        raise click.UsageError("--retry-failed needs --resume (it continues --out)")
    if user_model_args and not user_model_spec:
        raise click.UsageError("--user-model-arg needs --user-model")
    if user_base_url is not None and not user_model_spec:
        raise click.UsageError("--user-base-url needs --user-model")
    if judge_base_url is not None and not judge_spec:
        raise click.UsageError("--judge-base-url needs --judge")
    if judge_sees_reasoning and not judge_spec:
        raise click.UsageError("--judge-sees-reasoning needs --judge")
    model_args = with_base_url(model_args, base_url, option="--base-url", args_option="--model-arg")
    model_args = with_request_id_header(model_args, request_id_header)
    user_model_args = with_base_url(
        user_model_args, user_base_url, option="--user-base-url", args_option="--user-model-arg"
    )
    judge_args = with_base_url(
        judge_args, judge_base_url, option="--judge-base-url", args_option="--judge-arg"
    )
    if backend == "ray":
        given = [
            flag
            for flag, value in (
                ("--max-cost", max_cost),
                ("--conversation-timeout", conversation_timeout),
                ("--max-turns", max_turns),
                ("--max-tokens", max_tokens),
            )
            if value is not None
        ]
        if otel is not None:
            given.append("--otel")
        if given:
            raise click.UsageError(f"{', '.join(given)}: not available with --backend ray yet")
    check_html_extra(html_out)
    responses = response_cache(cache, cache_expiry)
    if responses is not None and backend == "ray":
        raise click.UsageError("--cache works with --backend local only")
    # Validate everything before the results file is created, so that a corrected
    # command can reuse the same --out.
    tune_gc_for_throughput()  # a big pack is millions of objects that live on
    loaded = reading.load(pack, seed=seed).with_trials(trials)
    require_primary(fail_under, loaded.metric_tiers, f"pack {loaded.name!r}", scored=metrics)
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
        max_tokens=max_tokens,
        grace_period=grace_period,
        judge=judge_spec,
        judge_args=parse_model_args(judge_args) if judge_spec else None,
        judge_samples=judge_samples,
        judge_combine=judge_combine,
        judge_sees_reasoning=judge_sees_reasoning,
        preflight=preflight,
        circuit_breaker=circuit_breaker,
        max_cost=max_cost,
        allow_code=reading.allow_code,
        plugins=plugin_names,
        plugin_config=plugin_settings(plugin_args),
        cache=responses,
    )
    simulator = Simulator(config, tracing=otel is not None)
    simulator.check(loaded)
    if dry_run:
        print_estimate(loaded.name, simulator.estimate(loaded, limit=limit), _stdout())
        return
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
            concurrency, limit, resume, fail_under, min_scored, junit_out, html_out,
            max_failure_rate, overwrite, retry_failed,
        )  # fmt: skip
        return
    sink = JsonlSink(out, resume=resume, overwrite=overwrite, retry_failed=retry_failed)
    tune_gc_for_throughput()
    err = _stderr()
    if loaded.kind == "single_turn":  # what the pack keeps of its data: filters, sampling
        for note in loaded.notes:
            err.print(f"note: {loaded.name}: {note}", highlight=False)
    show_progress = err.is_terminal if progress is None else progress
    try:
        with otel_exported(otel):
            outcome = anyio.run(
                _run_with_progress, simulator, loaded, sink, limit, show_progress, err
            )
    except KeyboardInterrupt:  # before the run's own signal handling (the endpoint check)
        sys.exit(EXIT_INTERRUPTED)
    from ..results._report import summarize_file

    report = summarize_file(out)  # line by line: never all results in memory at once
    print_report(report, _stdout())
    if responses is not None:
        print_cache_line(responses, _stdout())
    written = write_summaries(report, out)
    _stdout().print(
        f"results: {out}\nsummary: {written.json_path}, {written.markdown_path}", highlight=False
    )
    if html_out is not None:
        write_report_html(out, html_out)
    gates = fail_under_gates(report, fail_under, min_scored=min_scored)
    if junit_out is not None:
        write_results_junit(junit_out, out, gates)
    stats = outcome.statistics
    users_timeout = config.conversation_timeout is not None
    verdict = run_verdict(
        stats,
        interrupted=outcome.interrupted,
        max_failure_rate=max_failure_rate,
        users_timeout=users_timeout,
    )
    timeouts = timeout_line(stats, users_timeout=users_timeout)
    if timeouts is not None and verdict.code != EXIT_TIMEOUTS and not outcome.interrupted:
        _stderr().print(f"warning: {timeouts}", highlight=False)  # within the rate
    if stats.cost_stop is not None and not outcome.interrupted:
        left = stats.total - stats.started
        _stderr().print(
            f"stopped: max_cost — {stats.cost_stop}; {counted(left, 'conversation')} not "
            "started: "
            "run again with --resume (and a higher --max-cost) to run them",
            highlight=False,
        )
    if verdict.message is not None:
        print_error(verdict.message)
    if verdict.code == EXIT_TIMEOUTS:
        _stderr().print(
            f"to run only those again: the same command with --resume --retry-failed "
            f"and a longer --conversation-timeout (results: {out})",
            highlight=False,
        )
    if verdict.code:
        sys.exit(verdict.code)
    exit_on_failed_gates(gates)


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
    fail_under: FailUnder,
    min_scored: int,
    junit_out: Path | None,
    html_out: str | None,
    max_failure_rate: float,
    overwrite: bool,
    retry_failed: bool,
) -> None:
    from ..adapters import parse_model_args
    from ..distributed import run_on_ray
    from ..results._report import summarize_file

    err = _stderr()
    last = [0.0]

    def progress(done: int, total: int, busy: int) -> None:
        """The whole cluster's progress, a line every few seconds."""
        now = time.monotonic()
        if now - last[0] >= PROGRESS_LINE_S:
            last[0] = now
            err.print(
                f"ray: {done}/{total} finished, {counted(busy, 'actor')} busy", highlight=False
            )

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
    print_report(report, _stdout())
    written = write_summaries(report, out)
    _stdout().print(
        f"ray: {counted(outcome.results, 'conversation')} on "
        f"{counted(outcome.actors, 'actor')} "
        f"({outcome.restarted_actors} restarted), first result after "
        f"{outcome.first_result_s or 0:.2f} s\nresults: {out}\nsummary: {written.json_path}, "
        f"{written.markdown_path}",
        highlight=False,
    )
    if html_out is not None:
        write_report_html(out, html_out)
    gates = fail_under_gates(report, fail_under, min_scored=min_scored)
    if junit_out is not None:
        write_results_junit(junit_out, out, gates)
    if outcome.interrupted:
        print_error(
            f"interrupted: {counted(outcome.results, 'conversation')} recorded; run again with "
            "--resume to finish the rest"
        )
        sys.exit(EXIT_INTERRUPTED)
    if outcome.not_run:
        why = outcome.stopped_early or "an actor died too often"
        print_error(
            f"stopped early: {why}; {counted(outcome.not_run, 'conversation')} not run — run "
            "again "
            "with --resume --retry-failed once the endpoint is back"
        )
        sys.exit(EXIT_ENDPOINT_UNREACHABLE)
    failures, attempted = outcome.infrastructure_failures, outcome.attempted
    if attempted and failures / attempted > max_failure_rate:
        print_error(
            f"{failures} of {counted(attempted, 'conversation')} failed for infrastructure "
            "reasons "
            f"({failures / attempted:.0%}), above --max-failure-rate {max_failure_rate:g}"
        )
        sys.exit(EXIT_INFRASTRUCTURE_FAILURES)
    if attempted and outcome.timed_out / attempted > max_failure_rate:
        print_error(
            f"{outcome.timed_out} of {counted(attempted, 'conversation')} hit the conversation "
            "timeout "
            "(the pack's)"
        )
        sys.exit(EXIT_TIMEOUTS)
    exit_on_failed_gates(gates)


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
