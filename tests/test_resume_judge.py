"""Resuming refuses a different judge: the scores would be graded two ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from convsim import JsonlSink, ResultsError, Simulator, run_sync

PACK = "single_turn_qa"
JUDGE: dict[str, Any] = {"judge": "scripted", "metrics": ["accuracy"]}


@pytest.fixture()
def judged(tmp_path: Path) -> Path:
    out = tmp_path / "judged.jsonl"
    run_sync(PACK, "scripted", out=out, limit=2, **JUDGE)
    settings = json.loads(out.with_name("judged.manifest.json").read_text())["settings"]
    assert (settings["judge"], settings["judge_samples"], settings["judge_combine"]) == (
        "scripted",
        1,
        "mean",
    )
    return out


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"judge_samples": 3}, "was written with judge_samples 1, not 3"),
        ({"judge_combine": "majority"}, "was written with judge_combine 'mean', not 'majority'"),
        ({"judge": None, "metrics": ["accuracy"]}, "was written with judge 'scripted', not None"),
    ],
)
async def test_resume_refuses_another_judge(
    judged: Path, changed: dict[str, Any], message: str
) -> None:
    out = judged
    async with Simulator("scripted", **{**JUDGE, **changed}) as sim:
        with pytest.raises(ResultsError, match=message):
            await sim.run(PACK, sink=JsonlSink(out, resume=True), limit=3).wait()
    assert len(out.read_text().splitlines()) == 2  # nothing lost


def test_a_file_from_before_judge_settings_were_recorded_still_resumes(judged: Path) -> None:
    out = judged
    manifest_file = out.with_name("judged.manifest.json")
    manifest = json.loads(manifest_file.read_text())
    for key in ("judge_args", "judge_samples", "judge_combine"):
        del manifest["settings"][key]
    manifest_file.write_text(json.dumps(manifest))
    results = run_sync(PACK, "scripted", out=out, resume=True, limit=1, **JUDGE)
    assert len(results) == 1 and len(out.read_text().splitlines()) == 3
