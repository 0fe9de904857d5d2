"""Re-scoring a stored run: ``convsim score RESULTS.jsonl --metrics ...``.

Each conversation of a results file is scored again from its recorded turns (the
prompts, responses and timings the run kept), so any metric can be applied after the
fact without calling a model. Where the pack the run used can be loaded again and is
unchanged (its hash matches the results'), its scenarios supply the facts, probes,
goals and reference responses the metrics read; otherwise the conversations are scored
from their turns alone, and a note says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from convsim.metrics import Transcript, recorded_transcript
from convsim.scenarios import Pack, Scenario
from convsim.scenarios._criteria import CODE_REFUSED

from .._errors import ConvsimError, PackError, ResultsError
from .._plural import counted
from .._records import ConversationResult
from ..results._sinks import MAX_LINE_BYTES, RunManifest, manifest_path, read_results
from ._packs import load_pack

__all__ = ["RecordedRun", "is_results_file", "read_recorded_run"]

_RESULT_KEYS = frozenset({"run_id", "conversation_id", "turns", "status"})
_RESULTS_START = b'{"schema_version":'


class RecordedRun(NamedTuple):
    """A stored run's conversations, ready to score again."""

    transcripts: list[Transcript]
    notes: list[str]
    """What the re-scoring could not use, and why."""


def is_results_file(path: Path) -> bool:
    """Whether ``path`` holds convsim results (its first line is a ConversationResult)
    rather than transcripts. A first line that cannot be read as JSON counts as results
    when it starts as convsim writes them, so that reading it says what is wrong. A FIFO
    or a device is not opened (it is no results file)."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as fh:
            while line := fh.readline(MAX_LINE_BYTES + 1):
                if not line.strip():
                    continue
                if line.lstrip().startswith(_RESULTS_START):
                    return True
                first = json.loads(line)
                return isinstance(first, dict) and first.keys() >= _RESULT_KEYS
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return False


def read_recorded_run(path: Path, *, allow_code: bool = False) -> RecordedRun:
    """The conversations of a results file; a conversation recorded more than once (a
    retried one) counts by its last line. The run's pack is loaded again with
    ``allow_code`` (a results file cannot allow code by itself).

    Raises:
        ResultsError: the file cannot be read, or a line is not a convsim result.
    """
    latest = {result.conversation_id: result for result in read_results(path)}
    if not latest:
        raise ResultsError(f"{path}: holds no conversations")
    notes: list[str] = []
    pack = _pack_of(path, list(latest.values()), notes, allow_code)
    by_id = {c.conversation_id: c for c in pack.conversations} if pack is not None else {}
    transcripts = []
    for cid, result in latest.items():
        conversation = by_id.get(cid)
        if conversation is not None:
            transcripts.append(Transcript(conversation, result.turns))
            continue
        scenario = Scenario.model_validate(
            {
                "scenario_id": result.scenario_id,
                "scenario_type": result.scenario_type,
                "scenario_description": "a recorded conversation",
                "difficulty": result.difficulty,
            }
        )
        transcripts.append(recorded_transcript(scenario, result.turns, source=str(path)))
    missing = len(latest.keys() - by_id.keys())
    if pack is not None and missing:
        notes.append(
            f"{counted(missing, 'conversation')} not in {pack.name}: scored from the turns recorded"
        )
    return RecordedRun(transcripts, notes)


#: The load options a manifest may give again; anything else in it is ignored.
_PACK_OPTIONS = ("num_fewshot", "context_mode", "include_path", "seed")


def _pack_of(
    path: Path, results: list[ConversationResult], notes: list[str], allow_code: bool
) -> Pack | None:
    """The pack the run used, loaded again the same way, if it is unchanged; else None
    with a note."""
    hashes = {r.pack_hash for r in results}
    name = results[0].pack
    candidates: list[str] = []
    options: dict[str, Any] = {}
    manifest_file = manifest_path(path)
    if manifest_file.exists():
        try:
            manifest = RunManifest.model_validate_json(manifest_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValidationError, RecursionError):
            manifest = None
        if manifest is not None:
            name = manifest.pack
            options = {k: v for k, v in manifest.pack_options.items() if k in _PACK_OPTIONS}
            if manifest.pack_path != "." and Path(manifest.pack_path).is_dir():
                candidates.append(manifest.pack_path)
    candidates.append(name)
    without = (
        "scored from the recorded turns without the scenarios' facts, probes, goals and "
        "reference responses"
    )
    if len(hashes) > 1:
        notes.append(f"the file mixes runs of {len(hashes)} pack versions: {without}")
        return None
    changed = False
    for candidate in candidates:
        try:
            pack = load_pack(candidate, allow_code=allow_code, **options)
        except PackError as exc:
            if not allow_code and any(CODE_REFUSED in p.message for p in exc.problems):
                notes.append(
                    f"pack {name!r} runs Python code (pass --allow-code if you trust it): {without}"
                )
                return None
            continue
        except (ConvsimError, TypeError):  # TypeError: an option of the wrong type
            continue
        if pack.pack_hash in hashes:
            return pack
        changed = True
    if changed:
        notes.append(f"pack {name!r} has changed since the run: {without}")
    else:
        notes.append(f"pack {name!r} cannot be loaded here: {without}")
    return None
