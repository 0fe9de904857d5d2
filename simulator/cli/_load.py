"""``convsim load``: load-test a model server with multi-turn sessions."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import click
from rich.console import Console
from rich.live import Live
from rich.text import Text

from convsim._errors import ConfigError, parse_config
from convsim.cli._console import EXIT_INTERRUPTED, EXIT_THRESHOLD_FAILED, clear_errors
from convsim.cli._console import stderr as _stderr
from convsim.cli._console import stdout as _stdout
from convsim.cli._gates import exit_on_failed_gates, gate_suite, load_checks
from convsim.cli._options import (
    OptionalValue,
    OptionalValueCommand,
    junit_option,
    with_base_url,
)
from convsim.cli._outputs import make_folder, write_junit_report
from convsim.cli._spelling import respell_distribution, respell_synthetic
from convsim.cli._tracing import otel_exported, tracing_options, with_request_id_header

from .._plural import counted
from ..load._names import ARRIVAL_PATTERNS, DEFAULT_SYNTHETIC
from ..results._fit import Cell, across_tables, print_all, row_table

if TYPE_CHECKING:
    from ..load._monitor import Progress
    from ..load._plan import LoadPlan, LoadRun
    from ..load._result import LoadResult, PointResult, SweepResult
    from ..load._stats import LatencySummary
    from ..load._stop import StopRequest

__all__ = ["load_command"]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pair(summary: LatencySummary) -> str:
    return f"{_fmt(summary.p50)} / {_fmt(summary.p99)}"


def _label(point: PointResult) -> str:
    if point.concurrency is not None:
        return f"c={point.concurrency}"
    if point.target_rate is not None:
        single = point.target_request_rate == point.target_rate
        return f"{point.target_rate:.3g} {'requests' if single else 'sessions'}/s"
    return "trace"


def _offered(point: PointResult) -> str | None:
    """What an open-loop point offered, sessions and the requests they imply."""
    if point.target_rate is None:
        return None
    sessions = f"offered {point.target_rate:.3g} sessions/s"
    if point.target_request_rate is None:
        return f"{sessions} (requests per session unknown)"
    if point.target_request_rate == point.target_rate:
        return f"{sessions} = {point.target_request_rate:.3g} requests/s (one request each)"
    per = point.target_request_rate / point.target_rate
    return f"{sessions} = {point.target_request_rate:.3g} requests/s ({per:.3g} per session)"


def _slo_cell(meets_slo: bool | None) -> Cell:
    """A point's ``meets_slo`` in the table, when SLOs were given: None is an invalid
    point, which is not judged (:meth:`~convsim.load.SLOs.judge`)."""
    if meets_slo is None:
        return Text("invalid", style="red")
    return "yes" if meets_slo else "no"


def _points_tables(points: list[PointResult], slo: bool, console: Console) -> list[Any]:
    """Figures down, points across: split into as many tables as it takes for a sweep
    to fit the console, no figure cut."""
    rows: list[tuple[str, list[Cell]]] = [
        ("valid", ["yes" if p.valid else Text("NO", style="red") for p in points]),
        ("sessions/s", [_fmt(p.achieved_rate, 2) for p in points]),
        ("requests/s", [_fmt(p.throughput.requests_per_s, 1) for p in points]),
        ("output tokens/s", [_fmt(p.throughput.output_tokens_per_s, 0) for p in points]),
    ]
    for name in ("ttft", "ttfot", "tpot", "itl", "e2e"):
        for stat in ("p50", "p99"):
            rows.append(
                (
                    f"{name.upper()} {stat}",
                    [_fmt(getattr(getattr(p.latency_ms, name), stat)) for p in points],
                )
            )
    if any(p.reasoning_tokens is not None for p in points):
        rows.append(
            (
                "reasoning tokens",
                [
                    _fmt(None if p.reasoning_tokens is None else p.reasoning_tokens.total, 0)
                    for p in points
                ],
            )
        )
        rows.append(
            (
                "reasoning tokens/req",
                [
                    _fmt(
                        None if p.reasoning_tokens is None else p.reasoning_tokens.per_request.mean,
                        1,
                    )
                    for p in points
                ],
            )
        )
    if any(p.tools is not None for p in points):
        rows.append(
            (
                "tool-call replies",
                [
                    "-" if p.tools is None else f"{p.tools.replies_with_tool_calls:,}"
                    for p in points
                ],
            )
        )
        rows.append(
            (
                "tool calls / rounds",
                [
                    "-" if p.tools is None else f"{p.tools.tool_calls:,} / {p.tools.tool_rounds:,}"
                    for p in points
                ],
            )
        )
    rows.append(("send delay p99", [_fmt(p.schedule_delay_ms.p99, 2) for p in points]))
    rows.append(
        (
            "in flight (mean)",
            ["-" if p.client is None else f"{p.client.mean_in_flight:.1f}" for p in points],
        )
    )
    if slo:
        rows.append(
            (
                "goodput req/s",
                [_fmt(p.goodput.requests_per_s if p.goodput else None, 1) for p in points],
            )
        )
        rows.append(("meets SLO", [_slo_cell(p.meets_slo) for p in points]))
    metrics = dict.fromkeys(name for p in points for name in (p.quality or {}))
    for metric in metrics:
        rows.append(
            (
                f"{metric} (mean)",
                [
                    _fmt(p.quality[metric].mean, 3) if p.quality and metric in p.quality else "-"
                    for p in points
                ],
            )
        )
    labels = _labels(points)
    items = {label: [cells[i] for _, cells in rows] for i, label in enumerate(labels)}
    heads = [name for name, _ in rows]
    return across_tables(console, "Load test (latencies in ms)", "", items, heads)


def _labels(points: list[PointResult]) -> list[str]:
    """Each point's label, made unique (two points at the same rate get #2, #3...)."""
    seen: dict[str, int] = {}
    labels = []
    for p in points:
        label = _label(p)
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return labels


def _turn_tables(point: PointResult, console: Console) -> list[Any]:
    rows: list[list[Cell]] = [
        [
            str(t.turn_index),
            str(t.count),
            f"{t.mean_history_messages:.1f}",
            f"{_fmt(t.ttft_ms.p50)} / {_fmt(t.ttft_ms.p99)}",
            f"{_fmt(t.ttfot_ms.p50)} / {_fmt(t.ttfot_ms.p99)}",
            f"{_fmt(t.e2e_ms.p50)} / {_fmt(t.e2e_ms.p99)}",
        ]
        for t in point.by_turn
    ]
    heads = ["turn", "requests", "messages sent", "TTFT", "TTFOT", "E2E"]
    return row_table(console, "By turn depth (ms: p50 / p99)", heads, rows)


def _say(out: Console, text: str, label: tuple[str, str] | None = None) -> None:
    """A line of the summary, whole on one line; ``label`` (its text and style) before
    it."""
    out.print(Text(text) if label is None else Text.assemble(label, " ", text))


def _print_result(result: LoadResult | SweepResult, slo: bool, out: Console) -> None:
    """The figures of a run or sweep, its lines, invalid reasons and notes, on ``out``."""
    from ..load._result import SweepResult

    points: list[PointResult] = list(result.points) if isinstance(result, SweepResult) else [result]
    print_all(out, _points_tables(points, slo, out))
    main = (
        points[-1]
        if not isinstance(result, SweepResult)
        else max(points, key=lambda p: p.throughput.requests_per_s)
    )
    if main.by_turn:
        print_all(out, _turn_tables(main, out))
    for p in points:
        c, conv = p.client, p.conversations
        completed = counted(p.requests.completed, "request", grouped=True)
        line = f"{_label(p)}: {completed} completed, {p.requests.failed:,} failed"
        offered = _offered(p)
        if offered is not None:
            line = f"{_label(p)}: {offered}; {completed} completed, {p.requests.failed:,} failed"
        if p.requests.errors_by_class:
            line += (
                " (" + ", ".join(f"{k} {v}" for k, v in p.requests.errors_by_class.items()) + ")"
            )
        if conv is not None:
            done = counted(conv.completed, "conversation", grouped=True)
            line += f"; {done} completed ({conv.per_s:.2f}/s)"
            if conv.meeting_slo_share is not None:
                line += f", {conv.meeting_slo_share:.0%} meeting every SLO"
        if c is not None:
            line += (
                f"; client CPU {c.cpu_cores:.2f} cores over {counted(c.workers, 'worker')}, "
                f"loop lag p99 {_fmt(c.event_loop_lag_ms.p99, 2)} ms, "
                f"in flight mean {c.mean_in_flight:.1f} max {c.max_in_flight}"
            )
        if p.input_tokens is not None and p.input_tokens.error_pct_max is not None:
            line += (
                f"; input length error {p.input_tokens.error_pct_p50:+.1f}% median, "
                f"{p.input_tokens.error_pct_max:.1f}% at most ({p.input_tokens.method})"
            )
        _say(out, line)
        for extra in (_prefix_cache_line(p), _server_line(p)):
            if extra is not None:
                _say(out, extra)
        for reason in p.invalid_reasons:
            _say(out, reason, ("invalid:", "bold red"))
    for note in dict.fromkeys(n for p in points for n in p.notes):
        _say(out, note, ("note:", ""))
    if result.partial:
        measured = (
            f"{counted(len(points), 'point')} measured"
            if isinstance(result, SweepResult)
            else f"{points[0].duration_s:.1f} s measured"
        )
        _say(
            out,
            f"{result.partial_reason}; the figures cover what was measured before the stop "
            f"({measured})",
            ("partial:", "bold yellow"),
        )
    if isinstance(result, SweepResult) and slo:
        best = result.max_rate_meeting_slo
        unjudged = sum(p.meets_slo is None for p in points)
        out.print(
            "highest rate meeting every SLO: "
            + ("none of the points" if best is None else f"{best:.3g} sessions/s")
            + (f" ({unjudged} invalid, not judged)" if unjudged else ""),
            highlight=False,
        )


def _prefix_cache_line(point: PointResult) -> str | None:
    """The prefix-cache hit rate the requests reported, overall and by turn."""
    cache = point.prefix_cache
    if cache is None or cache.hit_rate is None:
        return None
    turns = ", ".join(
        f"turn {t.turn_index} {t.hit_rate:.0%}"
        for t in cache.hit_rate_by_turn[:8]
        if t.hit_rate is not None
    )
    return (
        f"{_label(point)} prefix cache: {cache.hit_rate:.1%} of prompt tokens cached "
        f"({counted(cache.requests, 'request', grouped=True)} reporting; {turns})"
    )


def _server_line(point: PointResult) -> str | None:
    """What the server's /metrics said over the point, the figures it has."""
    s = point.server_metrics
    if s is None:
        return None
    parts = []
    if s.kv_cache_usage is not None:
        parts.append(f"KV cache {s.kv_cache_usage.mean:.1%} mean, {s.kv_cache_usage.max:.1%} max")
    for name, gauge in (("running", s.running), ("waiting", s.waiting)):
        if gauge is not None:
            parts.append(f"{name} {gauge.mean:.1f} mean, {gauge.max:.0f} max")
    if s.preemptions is not None:
        parts.append(f"{s.preemptions:.0f} preemptions")
    if s.prompt_throughput is not None:
        parts.append(f"prompt {s.prompt_throughput:,.0f} tok/s")
    if s.generation_throughput is not None:
        parts.append(f"generated {s.generation_throughput:,.0f} tok/s")
    if s.prefix_cache_hit_rate is not None:
        parts.append(f"prefix-cache hits {s.prefix_cache_hit_rate:.1%}")
    if s.ttft is not None and s.ttft.mean_ms is not None:
        parts.append(f"TTFT mean {s.ttft.mean_ms:.1f} ms")
    family = s.family or "unknown names"
    return f"{_label(point)} server ({family}, {counted(s.scrapes, 'scrape')}): " + (
        "; ".join(parts) if parts else "none of the common figures"
    )


class _Display:
    """A live line on a terminal; a plain line every few seconds otherwise (CI logs)."""

    def __init__(self) -> None:
        self.console = _stderr()
        self.live: Live | None = None
        self.last_line = 0.0

    def __enter__(self) -> _Display:
        if self.console.is_terminal:
            self.live = Live("", console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def report(self, line: str) -> None:
        self.console.print(line, highlight=False)

    def progress(self, p: Progress) -> None:
        phase = "measuring" if p.measuring else "warming up"
        text = (
            f"{p.label} {phase} {p.elapsed_s:6.1f}s  sessions {p.sessions}  "
            f"done {p.completed:,}  failed {p.failed:,}  in flight {p.in_flight}  "
            f"TTFT p50 {_fmt(p.recent_ttft_ms)} ms  E2E p50 {_fmt(p.recent_e2e_ms)} ms"
        )
        if self.live is not None:
            self.live.update(text)
        elif time.monotonic() - self.last_line >= 5.0:
            self.last_line = time.monotonic()
            self.console.print(text, highlight=False)


async def _run_stoppable(plan: LoadPlan, display: _Display, stop: StopRequest) -> LoadRun:
    """The run, stopped by SIGINT or SIGTERM: the first stops sending and gives the
    requests in flight the grace; the second cancels them at once."""
    from ..load._plan import run_load

    async def watch_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if not stop.asked:
                    display.report(
                        "stopping: no new requests; those in flight get "
                        f"{plan.interrupt_grace:g} s (signal again to stop at once)"
                    )
                    stop.ask()
                else:
                    display.report("stopping at once: requests in flight are cancelled")
                    stop.ask(at_once=True)

    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals)
        try:
            run = await run_load(
                plan, report=display.report, on_progress=display.progress, stop=stop
            )
        except Exception as exc:  # kept out of the task group: no ExceptionGroup
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return run


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM wait while the result is written (a half-written file helps
    no one): the list gets those that came."""
    heard: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: heard.append(signum)) for s in held}
    try:
        yield heard
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _model_args(pairs: tuple[str, ...]) -> dict[str, str]:
    from convsim.adapters import parse_model_args

    return parse_model_args(pairs)


_Option = Callable[[Any], Any]


def _goodput_words(args: list[str]) -> list[str]:
    """``args`` with each word that follows ``--goodput``'s value, up to the next
    option, given its own ``--goodput``: vLLM's ``--goodput ttft:500 tpot:50``. The
    command takes no arguments, so such words could mean nothing else."""
    out: list[str] = []
    taking = False  # after --goodput's first value
    words = iter(args)
    for arg in words:
        if arg == "--":
            out.append(arg)
            out.extend(words)
            break
        if taking and not arg.startswith("-"):
            out.extend(("--goodput", arg))
            continue
        out.append(arg)
        taking = arg.startswith("--goodput=")
        if arg == "--goodput":
            value = next(words, None)
            if value is not None:
                out.append(value)
                taking = True
    return out


class _LoadCommand(OptionalValueCommand):
    """``convsim load``, reading ``--goodput`` with several words as vLLM does."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _goodput_words(args))


@click.command("load", cls=_LoadCommand)
@click.option(
    "-m",
    "--model",
    "model_spec",
    required=True,
    help="Target: TYPE:MODEL, e.g. openai-compatible:MODEL.",
)
@click.option(
    "--base-url",
    default=None,
    metavar="URL",
    help="The server's base URL (as --model-arg base_url=URL), e.g. http://127.0.0.1:8000/v1.",
)
@click.option(
    "--model-arg",
    "model_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Adapter argument (repeatable): base_url=..., api_key_env=..., rpm=...",
)
@click.option(
    "--synthetic",
    default=None,
    metavar="SPEC",
    callback=lambda _ctx, param, value: (
        None if value is None else respell_synthetic(value, param.opts[0])
    ),
    help=f"Synthetic sessions (default {DEFAULT_SYNTHETIC}); values may be distributions, "
    "e.g. input_tokens=uniform:128,512; prefix_tokens=N adds a shared system prompt. "
    "guidellm's spelling is read too: prompt_tokens=N with _stdev, _min, _max.",
)
@click.option("--pack", default=None, help="A scenario pack: each real answer is fed back.")
@click.option(
    "--dataset",
    default=None,
    type=click.Path(dir_okay=False),
    help="A ShareGPT-format file (JSON or JSON lines): every user turn is sent; or "
    "hf:NAME[:SPLIT], a dataset of the datasets library (hub, cache or a local folder).",
)
@click.option(
    "--columns",
    default=None,
    metavar="FIELD=COLUMN,...",
    help="With --dataset hf:NAME: prompt=COL (one turn a row), output_len=COL, system=COL, "
    "or conversations=COL (ShareGPT or OpenAI messages: every turn of a row).",
)
@click.option(
    "--dataset-turns",
    type=click.Choice(["all", "first"]),
    default="all",
    show_default=True,
    help="all: every user turn of a conversation, as one session; first: its first turn "
    "alone (single-turn, as vllm bench serve sends ShareGPT).",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=None,
    help="Go through the pack or dataset this many times, then stop.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="max_tokens of pack and dataset turns.",
)
@click.option(
    "--exact-output/--no-exact-output",
    default=True,
    show_default=True,
    help="Ask for exact output lengths (min_tokens, ignore_eos) where the server honours them.",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Closed loop: sessions at once, each holding its slot through its turns.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Open loop: session arrivals per second (sessions/s, not requests/s: each session "
    "sends all its turns; the summary shows the requests/s this offers).",
)
@click.option(
    "--request-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Open loop in requests per second, as vllm bench serve counts, for single-turn "
    "workloads (exit 2 with multi-turn sessions).",
)
@click.option(
    "--arrival", type=click.Choice(ARRIVAL_PATTERNS), default="poisson", show_default=True
)
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Gamma shape of the arrival gaps: 1 is Poisson, below 1 burstier.",
)
@click.option(
    "--trace",
    default=None,
    type=click.Path(dir_okay=False),
    help="Replay arrivals: one timestamp (s) per line, or JSON lines with timestamp, "
    "input_tokens, output_tokens; or a Mooncake trace (JSON lines with timestamp in ms, "
    "input_length, output_length, hash_ids), whose requests share the prefix blocks "
    "their hash ids declare.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per hash id of a Mooncake trace  [default: 512]",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Open loop: at most this many sessions alive (reported when it bites).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds measured (after ramp-up and warm-up).",
)
@click.option("--max-requests", type=click.IntRange(min=1), default=None)
@click.option("--max-errors", type=click.IntRange(min=1), default=None)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds of load before measuring.",
)
@click.option(
    "--ramp-up",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to reach full load (not measured).",
)
@click.option(
    "--cooldown",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds of load kept after the window (not measured).",
)
@click.option(
    "--think-time",
    default="0",
    show_default=True,
    callback=lambda _ctx, param, value: respell_distribution(value, param.opts[0]),
    help="Between a session's turns: seconds or a distribution (exp:2, uniform:1,3).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes generating load, merged exactly.",
)
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: the --workers (--actors) run as Ray tasks, on a local Ray or --ray-address.",
)
@click.option(
    "--actors",
    type=click.IntRange(min=1),
    default=None,
    help="With --backend ray: how many (the same as --workers).",
)
@click.option("--ray-address", default=None, help="Join this Ray cluster (default: start one).")
@click.option(
    "--loop",
    type=click.Choice(["auto", "asyncio", "uvloop"]),
    default="auto",
    show_default=True,
    help="Event loop: uvloop where installed (auto), or as named.",
)
@click.option(
    "--sweep",
    default=None,
    help="Rates (or with --concurrency, concurrencies) R1,R2,...; or auto[:N].",
)
@click.option(
    "--slo",
    default=None,
    help="e.g. ttft_p99<=500ms,tpot_p99<=50ms,e2e_p99<=10s (ttfot: to the first answer "
    "token, after a reasoning model's thoughts).",
)
@click.option(
    "--goodput",
    multiple=True,
    metavar="KEY:MS",
    help="vLLM's form of objectives, beside --slo: --goodput ttft:500 tpot:50 (ms; keys "
    "ttft, tpot, e2el). Goodput counts each request on its own values, as vllm bench "
    "serve does; the run is judged at p99 (ttft:500 is ttft_p99<=500ms).",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The JSON result.",
)
@click.option(
    "--format",
    "result_format",
    type=click.Choice(["convsim", "vllm"]),
    default="convsim",
    show_default=True,
    help="The form of --out: convsim's result, or vllm bench serve's keys (mean_ttft_ms, "
    "p99_ttft_ms, request_throughput, ...; a sweep: one object per point, one per line).",
)
@click.option(
    "--requests",
    "requests_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Per-request records: FILE.jsonl or FILE.csv.",
)
@click.option(
    "--calibrate/--no-calibrate",
    default=True,
    show_default=True,
    help="Size synthetic text in the server's tokens with a few probes first.",
)
@click.option("--preflight/--no-preflight", default=True, show_default=True)
@click.option(
    "--max-schedule-delay-ms",
    type=float,
    default=10.0,
    show_default=True,
    help="Send delay p99 above which the run is invalid.",
)
@click.option(
    "--html",
    "html_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a self-contained HTML page: latency CDFs, throughput and in flight "
    "over time, latency by turn depth, schedule delay, the sweep curve with the SLO lines.",
)
@click.option(
    "--metrics",
    default=None,
    help="Score each completed --pack conversation with these metrics (comma-separated), "
    "after each point has run, off the timings.",
)
@click.option(
    "--max-loop-lag-ms",
    type=float,
    default=10.0,
    show_default=True,
    help="Event-loop lag p99 above which the run is invalid.",
)
@click.option(
    "--server-metrics",
    cls=OptionalValue,
    flag_value="auto",
    default=None,
    metavar="URL",
    help="Scrape the server's Prometheus metrics during the run (KV-cache usage, running "
    "and waiting requests, preemptions, token throughput, prefix-cache hit rate, TTFT) "
    "from URL; alone: the base URL's origin + /metrics, skipped with a note when absent. "
    "vLLM, SGLang, TGI and llama.cpp names are read. Needs convsim[prometheus].",
)
@click.option(
    "--server-metrics-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between scrapes (each point is also scraped at its start and end).",
)
@junit_option("one test case for the run's validity and, with --slo, one for its SLOs")
@click.option(
    "--fail-on-slo",
    is_flag=True,
    help="Exit 99 when the run misses the --slo objectives (a sweep: when no point meets "
    "them), or is invalid and so cannot show it meets them.",
)
@click.option(
    "--fail-on-invalid",
    is_flag=True,
    help="Exit 99 when the run is marked invalid (a sweep: any point): the client, not "
    "the server, set the pace, or the run measured a rate limit.",
)
@tracing_options
@clear_errors
def load_command(
    model_spec: str,
    model_args: tuple[str, ...],
    base_url: str | None,
    requests_out: Path | None,
    html_out: Path | None,
    out: Path | None,
    actors: int | None,
    fail_on_slo: bool,
    fail_on_invalid: bool,
    junit_out: Path | None,
    request_id_header: str | None,
    goodput: tuple[str, ...],
    result_format: str,
    **options: Any,
) -> None:
    """Load-test a model server with multi-turn sessions, measured like a serving benchmark.

    SIGINT or SIGTERM stops the run: no new requests, those in flight get a few seconds
    (a second signal cancels them), and what was measured is written, marked partial;
    the exit code is then 130.

    \b
    Exit codes:
      0    the run finished (and passed the gates asked for)
      2    bad input: options, files, settings
      4    the server is unreachable, refused the key or has a wrong URL
      70   convsim crashed: an unexpected exception (its traceback is printed)
      99   a load gate failed (one line per gate): --fail-on-slo, --fail-on-invalid
      130  interrupted (what was measured is written first)
    """
    from ..load._plan import LoadPlan, event_loop_options
    from ..load._slo import parse_slos
    from ..load._stop import StopRequest

    model_args = with_base_url(model_args, base_url, option="--base-url", args_option="--model-arg")
    model_args = with_request_id_header(model_args, request_id_header)
    if fail_on_slo and not (options.get("slo") or goodput):
        raise ConfigError(
            "--fail-on-slo needs --slo or --goodput: the objectives to judge the run on"
        )
    if actors is not None:
        if options.get("backend") != "ray":
            raise ConfigError("--actors goes with --backend ray (locally: --workers)")
        options["workers"] = actors
    if goodput:
        options["goodput"] = " ".join(goodput)
    if result_format != "convsim" and out is None:
        raise ConfigError(f"--format {result_format} is the form of --out: give --out FILE")
    plan = parse_config(
        LoadPlan, {"model": model_spec, "model_args": _model_args(model_args), **options}, "load"
    )
    for path in (out, requests_out, html_out):
        if path is not None:
            make_folder(path)  # before the run: a folder that cannot be made stops it
    if html_out is not None:
        from convsim.results._html import check_html_extra

        check_html_extra("convsim load --html")
    stop = StopRequest()
    try:
        with _Display() as display, otel_exported(plan.otel):
            run: LoadRun = anyio.run(
                _run_stoppable, plan, display, stop, backend_options=event_loop_options(plan.loop)
            )
    except KeyboardInterrupt:  # before the signal handling began
        _stderr().print("interrupted", highlight=False)
        sys.exit(EXIT_INTERRUPTED)
    if run.result is None:
        _stderr().print("interrupted before anything was measured: no result", highlight=False)
        sys.exit(EXIT_INTERRUPTED)
    objectives = plan.objectives
    checks = load_checks(run.result, parse_slos(objectives) if objectives else None)
    with _signals_held() as heard:
        _write_outputs(plan, run, out, requests_out, html_out, result_format)
        if junit_out is not None:
            suite = gate_suite(checks.made(), name="load", properties={"model": plan.model})
            write_junit_report(junit_out, [suite])
    if stop.asked:
        _stderr().print(
            "interrupted: the result holds what was measured before the stop (partial)",
            highlight=False,
        )
        sys.exit(EXIT_INTERRUPTED)
    if heard:
        _stderr().print("interrupted after the run: its result was written first", highlight=False)
        sys.exit(EXIT_INTERRUPTED)
    exit_on_failed_gates(
        checks.gates(fail_on_invalid=fail_on_invalid, fail_on_slo=fail_on_slo),
        code=EXIT_THRESHOLD_FAILED,
    )


def _write_outputs(
    plan: LoadPlan,
    run: LoadRun,
    out: Path | None,
    requests_out: Path | None,
    html_out: Path | None,
    result_format: str = "convsim",
) -> None:
    """The summary on stdout, and the files asked for."""
    from ..load._requests_file import write_requests

    assert run.result is not None
    objectives = plan.objectives
    _print_result(run.result, objectives is not None, _stdout())
    if out is not None and result_format == "vllm":
        from ..load._vllm_format import write_vllm_result

        write_vllm_result(out, run.result, plan)
        _stdout().print(f"result: {out} (vllm bench serve's keys)", highlight=False)
    elif out is not None:
        out.write_text(json.dumps(run.result.model_dump(mode="json"), indent=2) + "\n")
        _stdout().print(f"result: {out}", highlight=False)
    if requests_out is not None:
        count = write_requests(requests_out, run.requests)
        _stdout().print(f"requests: {requests_out} ({count:,})", highlight=False)
    if html_out is not None:
        from convsim.results._load_html import write_load_html

        from ..load._slo import parse_slos

        slos = parse_slos(objectives) if objectives else None
        written = write_load_html(html_out, run.result, run.requests, slos=slos)
        _stdout().print(f"html: {written} ({written.stat().st_size / 1e6:.2f} MB)", highlight=False)
