"""The HTML report: self-contained, escaped, every conversation reachable; and in a real
browser (headless Chromium) when one is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FakeAdapter

import convsim
from convsim.cli import main
from convsim.results._html import TURN_FIELDS, render_html, unpack_details, write_html

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(2)> & </script>'


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "cs.jsonl"
    convsim.run_sync("customer_support", "scripted", out=path)
    return path


def _data(page: str) -> dict[str, Any]:
    raw = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    packed = re.search(
        r'<script id="details" type="application/octet-stream">(.*?)</script>', page, re.S
    )
    assert raw is not None and packed is not None
    data: dict[str, Any] = json.loads(raw.group(1))
    details = unpack_details(packed.group(1).strip())
    for detail in details.values():
        detail["turns"] = [dict(zip(TURN_FIELDS, t, strict=True)) for t in detail["turns"]]
    data["details"] = details
    return data


@pytest.mark.slow
def test_the_page_holds_every_conversation_and_asks_for_nothing(run_file: Path) -> None:
    page = write_html(run_file).read_text()
    results = convsim.read_results(run_file)
    data = _data(page)
    assert [r["id"] for r in data["rows"]] == [r.conversation_id for r in results]
    assert set(data["details"]) == {r.conversation_id for r in results}
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # no request can leave the file: nothing loaded from anywhere
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page, re.I)
    assert "<link" not in page and "@import" not in page
    assert page.count("<svg") >= 3  # plots, inline
    assert "By scenario type" in page and "By difficulty" in page


@pytest.mark.slow
def test_model_answers_are_shown_as_text_never_as_markup(tmp_path: Path) -> None:
    fake = FakeAdapter(lambda messages, params: HOSTILE)
    results = convsim.run_sync("customer_support", fake, limit=2, metrics=["response_length"])
    page = render_html(results, title="hostile <b>run</b>")
    assert "<script>alert" not in page and "<img src=x" not in page  # never as markup
    assert "hostile &lt;b&gt;run&lt;/b&gt;" in page  # the title is escaped too
    answers = [t["response"] for d in _data(page)["details"].values() for t in d["turns"]]
    assert HOSTILE in answers  # the data still holds the exact text, for textContent


def test_beyond_the_limit_transcripts_are_a_sample_and_failures_are_kept(
    tmp_path: Path,
) -> None:
    def flaky(messages: Any, params: Any) -> str:
        if "order" in messages[-1].content.lower():
            raise convsim.ServerError("injected 503", status_code=503)
        return "fine"

    results = convsim.run_sync("customer_support", FakeAdapter(flaky), metrics=["response_length"])
    failed = {r.conversation_id for r in results if r.error is not None}
    assert failed and len(failed) < len(results)
    data = _data(render_html(results, title="t", max_transcripts=len(failed) + 1))
    assert len(data["rows"]) == len(results)  # every conversation is listed
    assert failed <= set(data["details"]) and len(data["details"]) == len(failed) + 1


@pytest.mark.slow
def test_run_and_report_write_it(run_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main, ["run", "customer_support", "--model", "scripted", "--limit", "2",
               "--out", str(out), "--html", "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out.with_suffix(".html").exists() and "html:" in result.output
    named = tmp_path / "named.html"
    result = CliRunner().invoke(main, ["report", str(run_file), f"--html={named}"])
    assert result.exit_code == 0, result.output
    assert _data(named.read_text())["rows"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed")
def test_chromium_renders_the_page_and_a_deep_link_opens_the_transcript(
    run_file: Path, tmp_path: Path
) -> None:
    page = write_html(run_file, tmp_path / "report.html")
    chosen = convsim.read_results(run_file)[3]
    answer = next(t.response for t in chosen.turns if t.response)
    assert answer is not None
    browser = [_chromium() or "", "--headless", "--no-sandbox", "--disable-gpu"]
    url = f"{page.as_uri()}#c={chosen.conversation_id}"
    dom = subprocess.run(
        [*browser, "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    detail = dom[dom.index('id="detail"') :]
    assert chosen.conversation_id in detail and answer[:40] in detail
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*browser, "--window-size=1200,900", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=60,
        check=True,
    )
    from PIL import Image

    pixels = Image.open(shot).convert("L")
    low, high = pixels.getextrema()
    assert high - low > 100  # not blank: the header, text and plots are drawn


def _section(page: str, section: str) -> str:
    found = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S)
    assert found is not None, section
    return found.group(1)


def _svg_texts(page: str, key: str) -> list[str]:
    plot = re.search(rf'<div class="plot" id="plot-{key}">(.*?)</svg>', page, re.S)
    assert plot is not None, key
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", plot.group(1))]


def _with_trials(trials: int) -> list[convsim.ConversationResult]:
    """Two scenarios, ``trials`` trials each: a reaches its goal in even trials, b in all."""
    (base,) = convsim.run_sync("customer_support", "scripted", limit=1)
    return [
        base.model_copy(
            update={
                "conversation_id": f"{scenario}#{k}",
                "scenario_id": scenario,
                "trial": k,
                "scores": {
                    "goal_achievement": convsim.Score(value=float(scenario == "b" or k % 2 == 0))
                },
            }
        )
        for scenario in ("a", "b")
        for k in range(1, trials + 1)
        for reached in [scenario == "b" or k % 2 == 0]
    ]


def test_a_run_with_trials_has_a_trials_section_and_one_without_none() -> None:
    results = _with_trials(20)
    report = convsim.summarize(results)
    page = render_html(results, title="t", report=report)
    trials = _section(page, "trials")
    assert "Trials: 20 per scenario" in trials
    cell = r'<td class="num">([\d.]+)</td>'
    rows = re.findall(rf"<tr>{cell}{cell}{cell}</tr>", trials)
    assert [int(k) for k, _, _ in rows] == [1, 2, 4, 8, 16, 20]
    for k, at, hat in rows:
        assert (at, hat) == (f"{report.pass_at_k[int(k)]:.3f}", f"{report.pass_hat_k[int(k)]:.3f}")
    assert "goal_achievement" in trials  # its spread across trials
    texts = _svg_texts(page, "trials")
    assert "pass@k" in texts and "pass^k" in texts
    plain = render_html(convsim.run_sync("customer_support", "scripted", limit=2), title="t")
    assert 'id="trials"' not in plain


def test_times_are_in_seconds_in_tables_plots_and_transcripts(run_file: Path) -> None:
    page = write_html(run_file).read_text()
    results = convsim.read_results(run_file)
    assert "latency_s" in TURN_FIELDS and "latency_ms" not in TURN_FIELDS
    for key in ("latency", "by_turn"):
        texts = _svg_texts(page, key)
        assert "s" in texts and "ms" not in texts and not any("ms" in t.split() for t in texts)
    assert not re.search(r"\bms\b", re.sub(r"<script.*?</script>", "", page, flags=re.S))
    assert 'bits.push(t.latency_s + " s")' in page
    turn = results[0].turns[0]
    shown = _data(page)["details"][results[0].conversation_id]["turns"][0]
    assert turn.timings is not None and turn.timings.latency_s is not None
    assert shown["latency_s"] == pytest.approx(turn.timings.latency_s, rel=1e-3)


def test_failures_late_in_a_run_are_drawn_without_an_offset_axis(run_file: Path) -> None:
    results = convsim.read_results(run_file)
    start = min(r.timings.started_at for r in results)
    error = convsim.ErrorInfo(type="ServerError", message="503")
    late = [
        r.model_copy(
            update={
                "status": convsim.Status.FAILED,
                "error": error,
                "timings": r.timings.model_copy(
                    update={"finished_at": start + 5000.001 + i / 1000}
                ),
            }
        )
        for i, r in enumerate(results[1:4])
    ]
    page = render_html([results[0], *late], title="late failures")
    texts = _svg_texts(page, "errors")
    numbers = [t for t in texts if re.fullmatch(r"[-+\u2212]?[\d.e+\u2212]+", t)]
    assert not [t for t in numbers if t.startswith("+") or "e" in t]  # no "+5e3" offset
    ticks = [float(t.replace("\u2212", "-")) for t in numbers]
    xs = [t for t in ticks if t > 100]
    assert xs and all(4999 < x < 5001 for x in xs)  # the seconds themselves
    counts = [t for t in ticks if t <= 100]
    assert counts and all(c == int(c) for c in counts)  # whole conversations up the side


def test_the_load_page_shows_the_notes_validity_reasons_and_a_partial_run() -> None:
    from convsim.load import LoadResult
    from convsim.load._result import Window, point_result, sweep_result
    from convsim.results._load_html import render_load_html

    empty = point_result([], Window(0.0, 1.0), target_rate=2.0)
    note = "the server's prompt counts did not grow with the text: <ignored>"
    run = LoadResult.of(empty).model_copy(
        update={"notes": [note], "partial": True, "partial_reason": "interrupted"}
    )
    page = render_load_html(run, [], title="one run")
    assert "This run is not valid" in page
    assert "no request completed in the measured window" in page
    assert "the server&#39;s prompt counts did not grow with the text: &lt;ignored&gt;" in page
    assert 'id="partial"' in page and "partial: interrupted" in page
    other = empty.model_copy(update={"target_rate": 4.0, "notes": [note, "a second note"]})
    sweep = render_load_html(sweep_result([empty, other]), [], title="sweep")
    assert "This sweep is not valid" in sweep
    for label in ("point 0 (2/s)", "point 1 (4/s)"):
        assert f"{label}: no request completed in the measured window" in sweep
    notes = re.search(r'<div id="notes">(.*?)</div>', sweep, re.S)
    assert notes is not None and notes.group(1).count("<li>") == 2  # each note once
    clean = empty.model_copy(update={"valid": True, "invalid_reasons": []})
    assert 'id="validity"' not in render_load_html(LoadResult.of(clean), [], title="ok")
