"""A run killed (SIGKILL) in the middle of a tool round, then resumed: every
conversation is in the results once, and the killed one's tool call, run again from a
fresh environment, is recorded once."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from conftest import Convsim, write_pack

TOOLS_MODULE = '''
import os
import threading
from pathlib import Path


def note_order(order_id, environment):
    """Notes the order; blocks for ever on BLOCK_ORDER while BLOCK_ORDER is set."""
    log = Path(os.environ["TOOL_LOG"])
    with log.open("a") as fh:
        fh.write(order_id + "\\n")
    if order_id == os.environ.get("BLOCK_ORDER"):
        threading.Event().wait()
    environment.setdefault("noted", []).append(order_id)
    return {"noted": len(environment["noted"])}
'''


@pytest.mark.slow
def test_a_run_killed_mid_tool_round_resumes_without_a_call_recorded_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "killtools").mkdir()
    (tmp_path / "killtools" / "note_tools.py").write_text(TOOLS_MODULE)
    pack = write_pack(
        tmp_path / "pack",
        {
            "default": {
                "turns": [{"turn_id": "ask", "prompt_template": "Please note order {order}."}]
            }
        },
        [
            {
                "scenario_id": f"s{i}",
                "scenario_description": "note",
                "variables": {"order": f"A-{i}"},
            }
            for i in range(4)
        ],
    )
    tool = {
        "name": "note_order",
        "python": "note_tools:note_order",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^A-[0-9]+$"}},
            "required": ["order_id"],
        },
    }
    (pack / "tools.yml").write_text(yaml.safe_dump({"tools": [tool]}))
    log, out = tmp_path / "tool.log", tmp_path / "r.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "killtools"))
    monkeypatch.setenv("TOOL_LOG", str(log))
    monkeypatch.setenv("BLOCK_ORDER", "A-2")
    args = ("run", str(pack), "--model", "scripted", "--allow-code", "--concurrency", "1")
    with Convsim(*args, "--out", str(out)) as run:
        run.wait_for(lambda: log.exists() and "A-2" in log.read_text(), "the blocked tool call")
        run.interrupt(signal.SIGKILL)
        run.finish()
    done = [json.loads(line)["scenario_id"] for line in out.read_text().splitlines()]
    assert done == ["s0", "s1"]  # the killed conversation left nothing half-written
    monkeypatch.delenv("BLOCK_ORDER")
    with Convsim(*args, "--out", str(out), "--resume") as resumed:
        assert resumed.finish() == 0, resumed.stderr
    results = {r["scenario_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(results) == ["s0", "s1", "s2", "s3"]
    assert len(out.read_text().splitlines()) == 4  # nothing written twice
    killed = results["s2"]["turns"][0]
    assert [c["name"] for c in killed["tool_calls"]] == ["note_order"]  # once, not twice
    assert killed["environment"] == {"noted": ["A-2"]}  # a fresh document, one note
    # the tool ran again only for the conversations that had not finished
    assert log.read_text().split() == ["A-0", "A-1", "A-2", "A-2", "A-3"]
