"""One self-contained HTML report of a run: figures, plots and every conversation.

The page works offline and asks for nothing: styles, script, data and plots (SVG) are
inline, and a Content-Security-Policy forbids any request. Model answers are untrusted
text: the template is rendered by a sandboxed, autoescaping Jinja2 environment, the data
travels as JSON with ``<``, ``>`` and ``&`` escaped, and the page's script only ever sets
``textContent``.

Beyond ``max_transcripts`` conversations, the table lists every conversation and the
transcripts are a sample (every failed one first, then evenly spaced), so the file stays
small.
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._records import ConversationResult, TurnRecord
from convsim._version import __version__
from convsim.results._report import RunReport, shown_ks, summarize
from convsim.results._sinks import read_results

from ._plots import run_plots, trials_plot

__all__ = ["render_html", "write_html", "MAX_TRANSCRIPTS", "TURN_FIELDS", "unpack_details"]

MAX_TRANSCRIPTS = 2000


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _significant(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits: a 30 microsecond latency stays one."""
    return None if value is None else float(f"{value:.{digits}g}")


TURN_FIELDS = (
    "id",
    "role",
    "status",
    "skip",
    "user",
    "response",
    "latency_s",
    "ttft_s",
    "tokens",
    "attempts",
    "error",
    "scores",
    "ttfot_s",
    "reasoning",
    "reasoning_tokens",
    "tools",
    "tool_round_limit",
)
"""A turn travels as a list in this order (names once, not per turn: a smaller file).
Times are in seconds, as everywhere in the report. ``tools`` lists the turn's tool
calls, each as ``[round, name, arguments, result, error kind, latency_s]``."""


def _turn(turn: TurnRecord, scores: dict[str, Any]) -> list[Any]:
    t = turn.timings
    return [
        turn.turn_id,
        turn.role,
        turn.status.value,
        turn.skip_reason,
        turn.user_message,
        turn.response,
        _significant(t.latency_s) if t else None,
        _significant(t.ttft_s) if t else None,
        [turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.source]
        if turn.usage
        else None,
        turn.attempts,
        f"{turn.error.type}: {turn.error.message}" if turn.error else None,
        {k: _round(v.value) for k, v in scores.items()},
        _significant(t.ttfot_s) if t else None,
        turn.reasoning,
        turn.reasoning_tokens,
        [
            [c.round, c.name, c.arguments, c.result, c.error, _significant(c.latency_s)]
            for c in turn.tool_calls
        ],
        turn.tool_round_limit,
    ]


def _row(r: ConversationResult) -> dict[str, Any]:
    return {
        "id": r.conversation_id,
        "type": r.scenario_type,
        "difficulty": r.difficulty,
        "model": r.model,
        "status": r.status.value,
        "reason": r.termination_reason.value,
        "turns": len(r.turns),
        "seconds": _round(r.timings.duration_s, 2),
        "scores": {k: _round(v.value) for k, v in r.scores.items()},
        "error": f"{r.error.type}: {r.error.message}" if r.error else None,
    }


def _detail(r: ConversationResult) -> dict[str, Any]:
    system = next((m.content for m in r.transcript if m.role == "system"), None)
    return {
        "system": system,
        "turns": [_turn(t, dict(r.turn_scores.get(t.turn_id, {}))) for t in r.turns],
        "reasons": {k: v.reason for k, v in r.scores.items() if v.reason},
    }


def _sample(results: Sequence[ConversationResult], limit: int) -> list[ConversationResult]:
    if len(results) <= limit:
        return list(results)
    failed = [r for r in results if r.error is not None][:limit]
    rest = [r for r in results if r.error is None]
    room = limit - len(failed)
    step = len(rest) / room if room else 0
    return failed + [rest[int(i * step)] for i in range(room)]


def packed_details(details: dict[str, Any]) -> str:
    """The transcripts as gzip in base64: text compresses several times over, so 2,000
    ten-turn conversations fit in a few megabytes; the page unpacks them with the
    browser's own DecompressionStream. Deterministic (no timestamp in the gzip header)."""
    raw = json.dumps(details, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def unpack_details(packed: str) -> dict[str, Any]:
    """The inverse of :func:`packed_details` (for tests and tools reading a report)."""
    data: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(packed)))
    return data


def _json_for_script(data: Any) -> str:
    """JSON that cannot end the <script> element it sits in."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def check_html_extra(feature: str) -> None:
    """Whether the report can be drawn, asked before the work whose report it is.

    Raises:
        MissingExtra: Jinja2 or matplotlib is not installed (the ``html`` extra).
    """
    with needs_extra("html", feature):
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401


def _environment() -> Any:
    with needs_extra("html", "the HTML report"):
        from jinja2 import FileSystemLoader, select_autoescape
        from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_html(
    results: Sequence[ConversationResult],
    *,
    title: str,
    report: RunReport | None = None,
    max_transcripts: int = MAX_TRANSCRIPTS,
) -> str:
    """The report page for ``results``."""
    report = report or summarize(results)
    shown = _sample(results, max_transcripts)
    data = {
        "rows": [_row(r) for r in results],
        "metrics": sorted(report.metrics),
        "turn_fields": TURN_FIELDS,
    }
    details = packed_details({r.conversation_id: _detail(r) for r in shown})
    trials = trials_plot(report.pass_at_k, report.pass_hat_k)
    ks = shown_ks(max(report.pass_hat_k)) if report.pass_hat_k else []
    template = _environment().get_template("report.html.j2")
    return str(
        template.render(
            title=title,
            report=report,
            plots=run_plots(
                results,
                report.retention_curve,
                {name: m.higher_is_better for name, m in report.metrics.items()},
            ),
            trials_plot=trials,
            trial_ks=ks,
            data_json=_json_for_script(data),
            details=details,
            sampled=len(shown) < len(results),
            shown=len(shown),
            total=len(results),
            version=__version__,
            generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
    )


def write_html(results_path: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a results file (default: beside it, ``.html``); its path.

    Raises:
        ConfigError: the output folder does not exist.
        ResultsError: the results file is missing or has a bad line.
        MissingExtra: Jinja2 or matplotlib is not installed (the ``html`` extra).
    """
    results_path = Path(results_path)
    target = Path(out) if out else results_path.with_suffix(".html")
    if not target.parent.exists():
        raise ConfigError(f"{target}: its folder does not exist")
    results = read_results(results_path)
    page = render_html(results, title=results_path.name)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target
