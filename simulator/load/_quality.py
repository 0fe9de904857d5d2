"""Quality scores of a load run's conversations (``--metrics``), scored after it ran.

A load test measures timings; scoring a conversation while others are being timed would
put the scorers' CPU into the very latencies being measured. So sessions keep their turns
(only when metrics are asked for), and once a point has run, its completed conversations
go through the same scoring path as ``convsim run`` (:class:`~convsim.metrics.ScoringSession`),
in a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from convsim._errors import ConfigError
from convsim._records import Score, TurnRecord, TurnStatus, TurnTimings
from convsim._types import Message, Usage
from convsim.metrics import Metric, ScoringSession, percentile, resolve_metrics

from ._driver import SessionTranscript
from ._result import QualitySummary

__all__ = ["check_metrics", "score_transcripts"]


def check_metrics(names: Sequence[str], conversations: Sequence[Any]) -> list[Metric]:
    """The metrics ``names`` give, checked before the run.

    Raises:
        ConfigError: an unknown metric, or one that calls a model (a judge), which a load
            run does not score.
    """
    metrics = resolve_metrics(names)
    if conversations:
        session = ScoringSession(conversations[0], metrics)
        if session.awaits:
            raise ConfigError(
                "--metrics: judge metrics call a model and are not scored in load runs; "
                "score the pack with convsim run instead"
            )
    return metrics


def _records(conversation_id: str, transcript: SessionTranscript) -> list[TurnRecord]:
    records: list[TurnRecord] = []
    history: list[Message] = (
        [Message(role="system", content=transcript.system)] if transcript.system else []
    )
    for index, turn in enumerate(transcript.turns):
        history.append(Message(role="user", content=turn.user))
        usage = (
            Usage(
                prompt_tokens=turn.input_tokens or 0,
                completion_tokens=turn.output_tokens or 0,
                total_tokens=(turn.input_tokens or 0) + (turn.output_tokens or 0),
            )
            if turn.input_tokens is not None or turn.output_tokens is not None
            else None
        )
        records.append(
            TurnRecord(
                conversation_id=conversation_id,
                turn_index=index,
                turn_id=turn.turn_id or f"turn_{index}",
                role="assistant",
                status=TurnStatus.COMPLETED,
                prompt=turn.user,
                user_message=turn.user,
                messages=tuple(history),
                response=turn.answer,
                usage=usage,
                timings=TurnTimings(
                    started_at=time.time(),
                    duration_s=turn.latency_s,
                    latency_s=turn.latency_s,
                    ttft_s=turn.ttft_s,
                ),
                attempts=1,
            )
        )
        history.append(Message(role="assistant", content=turn.answer))
    return records


def _summary(scores: Iterable[Score]) -> QualitySummary:
    values: list[float] = []
    not_applicable = failed = 0
    for score in scores:
        if score.status == "failed":
            failed += 1
        elif score.value is None:
            not_applicable += 1
        else:
            values.append(score.value)
    arr = np.asarray(values, dtype=np.float64)
    q = (lambda p: percentile(arr, p)) if values else (lambda p: None)
    return QualitySummary(
        scored=len(values),
        not_applicable=not_applicable,
        failed=failed,
        mean=float(arr.mean()) if values else None,
        p10=q(10),
        p50=q(50),
        p90=q(90),
    )


def score_transcripts(
    transcripts: Iterable[SessionTranscript],
    conversations: Mapping[str, Any],
    metrics: Sequence[Metric],
) -> dict[str, QualitySummary]:
    """Each metric over the completed conversations (sessions ``CONVERSATION_ID#ROUND``
    of a pack), computed on this thread with no event loop."""
    scores: dict[str, list[Score]] = {m.name: [] for m in metrics}
    for transcript in transcripts:
        conversation_id = transcript.session_id.rsplit("#", 1)[0]
        conversation = conversations[conversation_id]
        session = ScoringSession(conversation, metrics)
        scored = session.score_now(_records(conversation_id, transcript))
        for name, score in scored.scores.items():
            scores[name].append(score)
    return {name: _summary(values) for name, values in scores.items()}
