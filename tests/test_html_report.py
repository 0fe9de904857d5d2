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
