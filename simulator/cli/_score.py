"""``convsim score``: metrics over recorded conversations, without a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import click

from .._plural import counted
from ..results._fit import column_tables, print_all, row_table
from ..results._terminal import mean_cell, score_cell
from ._console import (
    clear_errors,
)
from ._console import stdout as _stdout
from ._options import (
    OptionalValueCommand,
    cache_options,
    judge_options,
    pack_input_options,
    parse_metrics,
    response_cache,
    with_base_url,
)
from ._outputs import lock_results, print_cache_line

if TYPE_CHECKING:
    from .._records import Score


@click.command(cls=OptionalValueCommand)
@click.argument("recorded", metavar="FILE", type=click.Path(path_type=Path))
@click.option(
    "--metrics",
    "metric_names",
    callback=parse_metrics,
    required=True,
    help="Comma-separated metrics to score.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write one JSON line of scores per conversation here.",
)
@judge_options
@cache_options
@pack_input_options
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
    judge_base_url: str | None,
    judge_samples: int,
    judge_combine: str,
    judge_sees_reasoning: bool,
    cache: str | None,
    cache_expiry: str | None,
) -> None:
    """Score recorded conversations without running a model.

    FILE is a transcripts file (one conversation per line) or a results file of
    `convsim run`, whose conversations are scored again from their recorded turns.
    """
    from .._runtime._rescore import is_results_file, read_recorded_run
    from ..adapters import ModelPool, parse_model_args
    from ..metrics import METRICS, JudgeSettings, read_transcripts, score_transcripts
    from ..results._report import _summarise

    if judge_base_url is not None and judge_spec is None:
        raise click.UsageError("--judge-base-url needs --judge")
    if judge_sees_reasoning and judge_spec is None:
        raise click.UsageError("--judge-sees-reasoning needs --judge")
    judge_args = with_base_url(
        judge_args, judge_base_url, option="--judge-base-url", args_option="--judge-arg"
    )
    for name in metric_names:
        METRICS.get(name)  # unknown names fail before any work
    responses = response_cache(cache, cache_expiry)
    if responses is not None and judge_spec is None:
        raise click.UsageError("--cache keeps judge answers: it needs --judge")
    if out is not None and is_results_file(out):  # scores would replace its results
        from .._errors import ResultsError

        raise ResultsError(f"{out}: is a results file of convsim run; --out needs another file")
    if is_results_file(recorded):
        lock_results(recorded)
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
    models = ModelPool(cache=responses)  # as `convsim run`: one rate budget per provider key
    judge = None
    if judge_spec is not None:
        judge = JudgeSettings(
            models.get(judge_spec, parse_model_args(judge_args), role="judge"),
            samples=judge_samples,
            combine="majority" if judge_combine == "majority" else "mean",
            sees_reasoning=judge_sees_reasoning,
        )

    async def scoring() -> Any:
        async with models:
            return await score_transcripts(loaded, metric_names, judge=judge)

    try:
        scored = anyio.run(scoring)
    finally:
        if responses is not None:
            responses.close()
    out_console = _stdout()
    for note in notes:
        out_console.print(f"note: {note}", highlight=False)
    title = f"{recorded.name}: {counted(len(scored), 'conversation')}"
    rows = [
        [row.conversation_id, *[score_cell(row.scores[n]) for n in metric_names]] for row in scored
    ]
    print_all(out_console, column_tables(out_console, title, ["conversation", *metric_names], rows))
    summaries = _summarise([row.scores for row in scored], {})
    aggregate = []
    for name in metric_names:
        m = summaries[name]
        ci = "" if m.ci_low is None else f"{m.ci_low:.4g} - {m.ci_high:.4g}"
        aggregate.append([name, mean_cell(m), ci, str(m.n), str(m.not_applicable), str(m.failed)])
    heads = ["metric", "mean", "95% CI", "scored", "n/a", "failed"]
    title = "aggregate: mean over scored (applicable: scored + failed)"
    print_all(out_console, row_table(out_console, title, heads, aggregate))
    if responses is not None:
        print_cache_line(responses, out_console)
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
        by = []
        for group, maps in sorted(groups.items()):
            means = _summarise(maps, {})
            by.append([group, str(len(maps)), *[mean_cell(means.get(n)) for n in metric_names]])
        heads = [field, "conversations", *metric_names]
        print_all(out_console, column_tables(out_console, f"by {field} (mean)", heads, by))
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
            from .._errors import ResultsError

            raise ResultsError(f"{out}: cannot write scores: {exc.strerror}") from None
        out_console.print(f"scores: {out}", highlight=False)
