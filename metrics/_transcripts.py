"""Scoring recorded conversations, with no model in the loop.

A transcript is a list of messages. Each assistant message closes a turn, named ``t1``,
``t2``, ... in order; the user messages before it are that turn's prompt. A transcript
file (``convsim score``) holds one conversation per line::

    {"conversation_id": "c1", "messages": [{"role": "user", "content": "..."}, ...],
     "facts": [...], "probes": [...], "goal": {...}}

``facts``, ``probes``, ``goal``, ``reference_responses`` (by turn), ``required_keywords``,
``tags``, ``metadata``, ``scenario_type`` and ``difficulty`` are optional and take the
scenario format; a turn is named ``t3`` or given by its number, 3 (or "3" as a key).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import sniffio
from pydantic import ValidationError

from convsim._errors import ConfigError, PackError, PackProblem, ProblemLog
from convsim._records import Score, TurnRecord, TurnStatus
from convsim._registry import Registry
from convsim._types import Message
from convsim.scenarios import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    Conversation,
    Flow,
    Goal,
    PreparedFlow,
    PreparedTurn,
    Scenario,
    Template,
    TurnConfig,
    code_tests_problems,
    goal_problems,
)
from convsim.scenarios._files import FileProblem, JsonLine, open_pack_file, read_jsonl

from ._judge import JudgeSettings, judged
from ._protocol import Metric
from ._registry import METRICS
from ._session import ScoringSession

__all__ = [
    "Transcript",
    "TranscriptScores",
    "recorded_transcript",
    "score_transcript",
    "ascore_transcript",
    "read_transcripts",
    "score_transcripts",
]


@dataclass(frozen=True)
class Transcript:
    """One recorded conversation, ready to score: what it was and its turns."""

    conversation: Conversation
    turns: tuple[TurnRecord, ...]

    @property
    def conversation_id(self) -> str:
        return self.conversation.conversation_id


@dataclass(frozen=True)
class TranscriptScores:
    """What scoring one recorded conversation gave."""

    conversation_id: str
    scores: dict[str, Score]
    """Each metric's score, in the order the metrics were named."""


def _turn_id(value: Any) -> Any:
    return f"t{value}" if isinstance(value, int) and not isinstance(value, bool) else value


def _turn_key(key: Any) -> Any:
    """A turn as a mapping key: "3" (JSON keys are strings) or 3 name turn ``t3``."""
    return f"t{key}" if isinstance(key, str) and key.isdigit() else _turn_id(key)


# Scenario fields a transcript may carry, besides facts, probes and goal.
SCENARIO_FIELDS = (
    "reference_responses",
    "required_keywords",
    "tags",
    "metadata",
    "scenario_type",
    "difficulty",
)


def build_transcript(
    conversation_id: str,
    messages: Sequence[Message | Mapping[str, Any]],
    *,
    facts: Iterable[Mapping[str, Any]] = (),
    probes: Iterable[Mapping[str, Any]] = (),
    goal: Mapping[str, Any] | Goal | None = None,
    source: str = "transcript",
    reference_responses: Mapping[Any, str] | None = None,
    required_keywords: Sequence[str] = (),
    tags: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
    scenario_type: str | None = None,
    difficulty: str | None = None,
    allow_code: bool = False,
) -> Transcript:
    """A transcript as a conversation with one completed turn per assistant message.

    ``reference_responses`` (by turn: ``"t2"``, 2 or ``"2"``), ``required_keywords``,
    ``tags``, ``metadata``, ``scenario_type`` and ``difficulty`` are the scenario's, for
    the metrics that read them (exact_match, semantic_similarity, custom_score,
    domain_expertise) and for breakdowns."""
    msgs = [m if isinstance(m, Message) else Message(**m) for m in messages]
    records: list[TurnRecord] = []
    history: list[Message] = []
    pending: list[str] = []
    for m in msgs:
        if m.role == "assistant":
            turn_id = f"t{len(records) + 1}"
            user = "\n\n".join(pending)
            records.append(
                TurnRecord(
                    conversation_id=conversation_id,
                    turn_index=len(records),
                    turn_id=turn_id,
                    role="assistant",
                    status=TurnStatus.COMPLETED,
                    prompt=user or None,
                    user_message=user or None,
                    messages=tuple(history),
                    response=m.content,
                )
            )
            pending = []
        elif m.role == "user":
            pending.append(m.content)
        history.append(m)
    if not records:
        raise ValueError("the transcript has no assistant message to score")
    facts = [{**f, "introduced_in": _turn_id(f.get("introduced_in"))} for f in facts]
    probes = [{**p, "turn_id": _turn_id(p.get("turn_id"))} for p in probes]
    if isinstance(goal, Mapping):
        goal = {
            **goal,
            **{
                group: [
                    {**c, "turn_id": _turn_id(c.get("turn_id"))} if "turn_id" in c else c
                    for c in goal.get(group, [])
                ]
                for group in ("all_of", "any_of")
            },
        }
    extra: dict[str, Any] = {
        "required_keywords": required_keywords,
        "tags": tags,
        "metadata": {} if metadata is None else metadata,
    }
    if reference_responses is not None:
        if isinstance(reference_responses, Mapping):
            reference_responses = {_turn_key(k): v for k, v in reference_responses.items()}
        extra["reference_responses"] = reference_responses
    if scenario_type is not None:
        extra["scenario_type"] = scenario_type
    if difficulty is not None:
        extra["difficulty"] = difficulty
    scenario = Scenario.model_validate(
        {
            "scenario_id": conversation_id,
            "scenario_description": "a recorded conversation",
            "facts": facts,
            "probes": probes,
            "goal": goal,
            **extra,
        }
    )
    turn_ids = {r.turn_id for r in records}
    for turn_id in scenario.reference_responses:
        if turn_id not in turn_ids:
            raise _FieldError(
                f"reference_responses.{turn_id}",
                f"unknown turn (the transcript has {len(records)} assistant turns)",
            )
    flow_name = scenario.scenario_type if scenario_type is not None else "transcript"
    return recorded_transcript(
        scenario, records, flow_name=flow_name, source=source, allow_code=allow_code
    )


def recorded_transcript(
    scenario: Scenario,
    records: Sequence[TurnRecord],
    *,
    flow_name: str | None = None,
    source: str = "transcript",
    allow_code: bool = False,
) -> Transcript:
    """Turn records that were kept (a stored run's, or a transcript's) as a conversation
    of ``scenario`` whose flow is exactly those turns, ready to score (``allow_code``:
    its test cases may run against its code)."""
    turns = [TurnConfig(turn_id=r.turn_id, prompt_template="") for r in records]
    prepared = PreparedFlow(
        flow_name or scenario.scenario_type,
        Flow(turns=turns),
        tuple(PreparedTurn(t, r.turn_index, _EMPTY) for t, r in zip(turns, records, strict=True)),
    )
    conversation = Conversation(scenario, prepared, "multi_turn", source, allow_code=allow_code)
    return Transcript(conversation, tuple(records))


_EMPTY = Template.parse("")


class _FieldError(ValueError):
    """A bad value of one field of a transcript."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _metrics(
    names: Sequence[str], judge: JudgeSettings | None, registry: Registry[Metric]
) -> list[Metric]:
    return [judged(registry.get(name)(), judge) for name in dict.fromkeys(names)]


def score_transcript(
    messages: Sequence[Message | Mapping[str, Any]],
    metrics: Sequence[str],
    *,
    facts: Iterable[Mapping[str, Any]] = (),
    probes: Iterable[Mapping[str, Any]] = (),
    goal: Mapping[str, Any] | None = None,
    judge: JudgeSettings | None = None,
    registry: Registry[Metric] = METRICS,
    allow_code: bool = False,
    **scenario: Any,
) -> dict[str, Score]:
    """Score one recorded conversation with the named metrics, from sync code.

    Metrics that call no model are scored on this thread with no event loop, so this
    also works inside a running loop (a notebook, a task's ``process_results``). With a
    judge the scoring must be awaited: outside a loop it runs one; inside one, use
    :func:`ascore_transcript`. ``scenario`` takes the other scenario fields:
    reference_responses, required_keywords, tags, metadata, scenario_type, difficulty.
    ``allow_code``: the test cases of ``metadata.tests`` may run against the answers'
    code (``validate_logic``).

    Raises:
        ConfigError: a metric calls a model while an event loop is running.
    """
    transcript = _transcript(messages, facts, probes, goal, scenario, allow_code)
    session = ScoringSession(transcript.conversation, _metrics(metrics, judge, registry))
    if not session.awaits:
        return session.score_now(transcript.turns).scores
    if _loop_running():
        names = ", ".join(dict.fromkeys(metrics))
        raise ConfigError(
            f"scoring {names} calls the judge model, which must be awaited inside a running "
            "event loop: use 'await convsim.metrics.ascore_transcript(...)'"
        )
    return anyio.run(partial(_ascore, session, transcript.turns))


async def ascore_transcript(
    messages: Sequence[Message | Mapping[str, Any]],
    metrics: Sequence[str],
    *,
    facts: Iterable[Mapping[str, Any]] = (),
    probes: Iterable[Mapping[str, Any]] = (),
    goal: Mapping[str, Any] | None = None,
    judge: JudgeSettings | None = None,
    registry: Registry[Metric] = METRICS,
    allow_code: bool = False,
    **scenario: Any,
) -> dict[str, Score]:
    """Score one recorded conversation with the named metrics (``scenario``: as
    :func:`score_transcript`); judges are awaited, CPU-heavy metrics run in a worker
    thread."""
    transcript = _transcript(messages, facts, probes, goal, scenario, allow_code)
    session = ScoringSession(transcript.conversation, _metrics(metrics, judge, registry))
    return await _ascore(session, transcript.turns)


def _transcript(
    messages: Sequence[Message | Mapping[str, Any]],
    facts: Iterable[Mapping[str, Any]],
    probes: Iterable[Mapping[str, Any]],
    goal: Mapping[str, Any] | None,
    scenario: Mapping[str, Any],
    allow_code: bool,
) -> Transcript:
    unknown = sorted(set(scenario) - set(SCENARIO_FIELDS))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    return build_transcript(
        "transcript",
        messages,
        facts=facts,
        probes=probes,
        goal=goal,
        allow_code=allow_code,
        **scenario,
    )


async def _ascore(session: ScoringSession, turns: Iterable[TurnRecord]) -> dict[str, Score]:
    async with session:
        for record in turns:
            session.add(record)
    return session.scored.scores


def _loop_running() -> bool:
    """Whether an event loop (asyncio's or trio's) runs in this thread."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


def read_transcripts(
    path: str | Path,
    *,
    allow_code: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[Transcript]:
    """Every conversation of a transcript file; PackError names each bad line and field
    (the first 1,000 of them, and counts the rest).

    The file must be a regular file of at most ``max_file_bytes``, read a line at a
    time; a line longer than ``max_line_bytes`` is refused before it is parsed. A goal
    criterion that runs code (``python``) is refused unless ``allow_code``: a transcript
    file, like a pack, is data unless its user trusts it.
    """
    path = Path(path)
    problems = ProblemLog()
    out: list[Transcript] = []
    seen: set[str] = set()
    with _open(path, max_file_bytes) as fh:
        try:
            for line in read_jsonl(fh, max_bytes=max_file_bytes, max_line_bytes=max_line_bytes):
                transcript = _read_transcript(path.name, line, allow_code, seen, problems)
                if transcript is not None:
                    out.append(transcript)
        except FileProblem as exc:
            problems.add(PackProblem(path.name, exc.line, exc.field, exc.message))
        except OSError as exc:
            problems.add(PackProblem(str(path), None, None, f"cannot read: {exc.strerror}"))
    if problems:
        raise problems.error()
    if not out:
        raise PackError([PackProblem(path.name, None, None, "holds no conversations")])
    return out


def _read_transcript(
    name: str,
    line: JsonLine,
    allow_code: bool,
    seen: set[str],
    problems: ProblemLog,
) -> Transcript | None:
    """The transcript on ``line``; or None, and its problems added to ``problems``.
    ``seen`` holds the conversation ids of the lines before."""
    lineno = line.number
    where = f"{name}:{lineno}"
    if line.problem is not None:
        problems.add(PackProblem(name, lineno, line.problem.field, line.problem.message))
        return None
    raw = line.value
    try:
        if not isinstance(raw, dict):
            raise ValueError("a line must be a JSON object")
        known = {"conversation_id", "messages", "facts", "probes", "goal", *SCENARIO_FIELDS}
        unknown = set(raw) - known
        if unknown:
            problems.add(PackProblem(name, lineno, sorted(unknown)[0], "unknown field"))
            return None
        cid = str(raw.get("conversation_id") or f"line-{lineno}")
        if cid in seen:
            problems.add(PackProblem(name, lineno, "conversation_id", f"duplicate {cid!r}"))
            return None
        seen.add(cid)
        if not isinstance(raw.get("messages"), list):
            problems.add(PackProblem(name, lineno, "messages", "a list of messages is required"))
            return None
        transcript = build_transcript(
            cid,
            raw["messages"],
            facts=raw.get("facts") or (),
            probes=raw.get("probes") or (),
            goal=raw.get("goal"),
            source=where,
            allow_code=allow_code,
            **{k: raw[k] for k in SCENARIO_FIELDS if raw.get(k) is not None},
        )
        scenario = transcript.conversation.scenario
        turn_ids = {t.turn_id for t in transcript.turns}
        wrong = [
            *goal_problems(scenario.goal, allow_code=allow_code),
            *code_tests_problems(scenario.metadata, turn_ids),
        ]
        for field, message in wrong:
            problems.add(PackProblem(name, lineno, field, message))
        return None if wrong else transcript
    except FileProblem as exc:
        problems.add(PackProblem(name, lineno, exc.field, exc.message))
    except ValidationError as exc:
        err = exc.errors()[0]
        field_path = ".".join(map(str, err["loc"])) or None
        problems.add(PackProblem(name, lineno, field_path, err["msg"]))
    except _FieldError as exc:
        problems.add(PackProblem(name, lineno, exc.field, exc.message))
    except (TypeError, ValueError) as exc:
        problems.add(PackProblem(name, lineno, None, str(exc)))
    return None


def _open(path: Path, max_file_bytes: int) -> BinaryIO:
    """A transcript file open for reading: a regular file (a FIFO or a device is refused
    before it is opened) of bounded size."""
    real = Path(os.path.realpath(path))
    try:
        return open_pack_file(real.parent, real.name, max_file_bytes)
    except FileProblem as exc:
        message = exc.message
    except OSError as exc:
        message = f"cannot read: {exc.strerror}"
    raise PackError([PackProblem(str(path), None, None, message)])


async def score_transcripts(
    transcripts: Sequence[Transcript],
    metrics: Sequence[str],
    *,
    judge: JudgeSettings | None = None,
    concurrency: int = 16,
    registry: Registry[Metric] = METRICS,
) -> list[TranscriptScores]:
    """Score many recorded conversations, ``concurrency`` at a time (judges call
    models); results in the order given."""
    resolved = _metrics(metrics, judge, registry)
    results: list[TranscriptScores | None] = [None] * len(transcripts)
    slots = anyio.Semaphore(concurrency)

    async def one(i: int, transcript: Transcript) -> None:
        async with slots:
            session = ScoringSession(transcript.conversation, resolved)
            scores = await _ascore(session, transcript.turns)
        results[i] = TranscriptScores(transcript.conversation_id, scores)

    async with anyio.create_task_group() as tg:
        for i, transcript in enumerate(transcripts):
            tg.start_soon(one, i, transcript)
    return [r for r in results if r is not None]
