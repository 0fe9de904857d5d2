"""The one scoring path: a conversation's turns folded into its metrics.

:class:`ScoringSession` owns scoring one conversation wherever it happens: the runtime
scoring a conversation while it runs, ``convsim score`` re-scoring recorded ones, and
task hooks asking for one of convsim's metrics. It

- feeds every turn, in order, to each conversation scorer, and scores each turn's own
  metrics (a turn's ``evaluation_metrics``) on that turn alone;
- keeps a failing scorer from touching the others: its score is ``failed`` with the
  error, and the rest go on;
- awaits the scorers that call a model (:class:`AsyncConversationScorer`) beside the
  conversation, and computes those of CPU-heavy metrics in a worker thread;
- after a cancellation or a crash, still scores everything it can without awaiting,
  and says which scores the end cut short;
- lets the scorers it runs in its worker thread ask the model under test a prompt of
  their own (:func:`~convsim.metrics.ask_model`) through the ``ask`` it was given.

Used from async code it is an async context manager (``async with session: ...
session.add(turn)``); from sync code :meth:`ScoringSession.score_now` scores recorded
turns with no event loop at all, so it also works inside a running loop (a notebook, an
lm-eval task's ``process_results`` called by convsim).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from convsim._errors import ConfigError
from convsim._records import Score, TurnRecord, TurnStatus

from ._asking import AskModel, asking
from ._protocol import AsyncConversationScorer, ConversationScorer, Metric, is_cpu_heavy

if TYPE_CHECKING:
    from convsim.scenarios import Conversation

__all__ = ["ScoringSession", "ScoredConversation", "ENDED_EARLY", "TURN_ENDED_EARLY"]

ENDED_EARLY = "the conversation ended before it was scored"
TURN_ENDED_EARLY = "the conversation ended before the turn was scored"


@dataclass(frozen=True)
class ScoredConversation:
    """What scoring a conversation gave."""

    scores: dict[str, Score]
    """Each conversation metric's score, in the order the metrics were given."""
    turn_scores: dict[str, dict[str, Score]]
    """Each turn's own metrics (its ``evaluation_metrics``), by turn_id."""


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _checked(score: object, name: str) -> Score:
    """A scorer's result, if it is a Score (an un-awaited coroutine is not)."""
    if isinstance(score, Score):
        return score
    if inspect.iscoroutine(score):
        score.close()  # never awaited: say why rather than warn about it later
        raise TypeError(
            f"{name}'s scorer returned a coroutine: a scorer that awaits must subclass "
            "convsim.metrics.AsyncConversationScorer"
        )
    raise TypeError(f"{name}'s scorer returned {type(score).__name__}, not a Score")


@dataclass(slots=True)
class _Slot:
    """One conversation metric: its scorer, and its score or error once known."""

    name: str
    heavy: bool
    scorer: ConversationScorer | AsyncConversationScorer | None = None
    awaits: bool = False
    """The scorer must be awaited (it is an AsyncConversationScorer)."""
    error: str | None = None
    score: Score | None = None

    @property
    def open(self) -> bool:
        """Still taking turns: built, not failed, not scored."""
        return self.scorer is not None and self.error is None and self.score is None

    def fail(self, exc: BaseException) -> None:
        self.error = _failure(exc)

    def final(self) -> Score:
        if self.score is not None:
            return self.score
        return Score.failed(self.error or ENDED_EARLY)


@dataclass(frozen=True)
class _FeedAsync:
    """Feed one turn to the scorers that await."""

    record: TurnRecord


@dataclass(frozen=True)
class _ScoreTurn:
    """Score one turn's own metric off the event loop (it awaits, or is CPU-heavy)."""

    name: str
    scorer: Any
    record: TurnRecord


class ScoringSession:
    """Scores one conversation: its conversation metrics over every turn, and each
    turn's own metrics on that turn.

    Args:
        conversation: what the scorers are built for (scenario, facts, goal, flow).
        metrics: conversation metrics, scored over all turns.
        turn_metrics: the metrics a turn may name in its ``evaluation_metrics``.
        ask: asks the model under test a prompt of its own for a turn, for the scorers
            run in the worker thread (None: the model cannot be asked).
    """

    def __init__(
        self,
        conversation: Conversation,
        metrics: Sequence[Metric] = (),
        turn_metrics: Mapping[str, Metric] | None = None,
        *,
        ask: AskModel | None = None,
    ) -> None:
        self.conversation = conversation
        self._ask = ask
        self.metrics = tuple(metrics)
        self.turn_metrics = dict(turn_metrics or {})
        self._slots: list[_Slot] = []
        for metric in self.metrics:
            slot = _Slot(metric.name, heavy=is_cpu_heavy(metric))
            try:
                slot.scorer = metric.scorer(conversation)
            except Exception as exc:  # a broken metric must not sink the conversation
                slot.fail(exc)
            slot.awaits = isinstance(slot.scorer, AsyncConversationScorer)
            self._slots.append(slot)
        self._plain = [s for s in self._slots if s.scorer is not None and not s.awaits]
        self._awaiting = [s for s in self._slots if s.awaits]
        self._background = bool(self._awaiting) or any(
            t.config.evaluation_metrics for t in conversation.flow.turns
        )
        """Whether some work must be done beside the conversation (awaited, or in a
        worker thread), inside ``async with``."""
        self._records: list[TurnRecord] = []
        self._waiting: list[TurnRecord] = []
        """Records added before ``async with`` began, when the background is needed."""
        self._turn_scores: dict[str, dict[str, Score]] = {}
        self._entered = False
        self._inline = False
        """Scoring on the calling thread with no background (score_now)."""
        self._send: MemoryObjectSendStream[_FeedAsync | _ScoreTurn] | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._scored: ScoredConversation | None = None

    # -- feeding ----------------------------------------------------------------

    @property
    def awaits(self) -> bool:
        """Whether some conversation scorer must be awaited (it calls a model)."""
        return any(s.error is None for s in self._awaiting)

    def add(self, record: TurnRecord) -> None:
        """Fold in one turn record. Never blocks: plain scorers take it now; scorers that
        await, and turn metrics that await or are CPU-heavy, get it in the background of
        ``async with`` (a record added before the block began waits for it)."""
        if self._scored is not None:
            raise RuntimeError("the conversation has been scored already")
        self._records.append(record)
        if self._background and not self._entered and not self._inline:
            self._waiting.append(record)
        else:
            self._fold(record)

    def _fold(self, record: TurnRecord) -> None:
        for slot in self._plain:
            if slot.error is None:
                try:
                    slot.scorer.update(record)  # type: ignore[union-attr]
                except Exception as exc:
                    slot.fail(exc)
        if self.awaits:
            self._to_background(_FeedAsync(record))
        if record.status is not TurnStatus.COMPLETED or not record.evaluation_metrics:
            return
        scores = self._turn_scores.setdefault(record.turn_id, {})
        for name in record.evaluation_metrics:
            scorer = self._turn_scorer(name, scores)
            if scorer is None:
                continue
            deferred = isinstance(scorer, AsyncConversationScorer) or is_cpu_heavy(
                self.turn_metrics[name]
            )
            if deferred and self._send is not None:
                self._to_background(_ScoreTurn(name, scorer, record))
            elif isinstance(scorer, AsyncConversationScorer):
                scores[name] = Score.failed(f"{name} calls a model and must be awaited")
            else:
                scores[name] = _score_turn(scorer, record, name)

    def _to_background(self, work: _FeedAsync | _ScoreTurn) -> None:
        """Hand ``work`` to the background. Once the background has stopped (the
        conversation was cancelled), what it misses is scored when the session ends:
        from the records, not from the queue."""
        if self._send is not None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._send.send_nowait(work)

    def _turn_scorer(self, name: str, scores: dict[str, Score]) -> Any:
        """A fresh scorer of turn metric ``name``, or None with the failure recorded."""
        metric = self.turn_metrics.get(name)
        if metric is None:
            scores[name] = Score.failed(f"{name!r} was not provided")
            return None
        try:
            return metric.scorer(self.conversation)
        except Exception as exc:
            scores[name] = Score.failed(_failure(exc))
            return None

    # -- async use ----------------------------------------------------------------

    async def __aenter__(self) -> ScoringSession:
        if self._entered or self._scored is not None:
            raise RuntimeError("a scoring session is entered once")
        self._entered = True
        if self._background:
            send, receive = anyio.create_memory_object_stream[_FeedAsync | _ScoreTurn](math.inf)
            self._send = send
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            self._tg.start_soon(self._consume, receive)
        waiting, self._waiting = self._waiting, []
        for record in waiting:
            self._fold(record)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """Finish scoring. After a normal end this awaits what is left (judges' results,
        CPU-heavy results in a worker thread); after a cancellation or an error it scores
        what it can at once and lets the exception go on, as it is."""
        if self._send is not None:
            self._send.close()  # the background scores what was sent, then ends
        try:
            if self._tg is not None:
                tg, self._tg = self._tg, None
                if exc is not None:
                    tg.cancel_scope.cancel()
                # the body's exception stays the caller's: not wrapped in a group
                await tg.__aexit__(None, None, None)
            if exc is None:
                await self._complete()
                return
        except BaseException:
            self._complete_now(TURN_ENDED_EARLY, ENDED_EARLY)
            raise
        self._complete_now(TURN_ENDED_EARLY, ENDED_EARLY)

    async def _consume(self, receive: MemoryObjectReceiveStream[_FeedAsync | _ScoreTurn]) -> None:
        async with receive:
            async for work in receive:
                if isinstance(work, _FeedAsync):
                    for slot in self._awaiting:
                        if slot.open:
                            try:
                                await slot.scorer.update(work.record)  # type: ignore[union-attr,misc]
                            except Exception as exc:
                                slot.fail(exc)
                    continue
                scores = self._turn_scores.setdefault(work.record.turn_id, {})
                if isinstance(work.scorer, AsyncConversationScorer):
                    try:
                        await work.scorer.update(work.record)
                        score = _checked(await work.scorer.result(), work.name)
                    except Exception as exc:
                        score = Score.failed(_failure(exc))
                    scores[work.name] = score
                else:
                    # stored by the worker thread itself: a cancellation that lands after
                    # it finished must not lose the score
                    with asking(self._ask):
                        await anyio.to_thread.run_sync(_store_turn_score, scores, work)

    async def _complete(self) -> None:
        for slot in self._awaiting:
            if slot.open:
                try:
                    slot.score = _checked(await slot.scorer.result(), slot.name)  # type: ignore[union-attr,misc]
                except Exception as exc:
                    slot.fail(exc)
        heavy = [s for s in self._plain if s.open and s.heavy]
        if heavy:
            with asking(self._ask):
                await anyio.to_thread.run_sync(_compute_results, heavy)
        self._complete_now(TURN_ENDED_EARLY, ENDED_EARLY)

    # -- sync use -------------------------------------------------------------------

    def score_now(self, records: Iterable[TurnRecord] = ()) -> ScoredConversation:
        """Fold in ``records`` and score at once, on this thread, with no event loop.

        Raises:
            ConfigError: a conversation scorer must be awaited (it calls a model, such as
                a judge): score from async code instead.
            RuntimeError: the session is in use inside ``async with``.
        """
        if self._entered and self._scored is None:
            raise RuntimeError("the session is being scored inside 'async with'")
        if self.awaits:
            names = ", ".join(s.name for s in self._awaiting if s.error is None)
            raise ConfigError(
                f"{names} call a model and must be awaited: score from async code "
                "(async with ScoringSession(...), or ascore_transcript)"
            )
        self._inline = True
        waiting, self._waiting = self._waiting, []
        for record in waiting:
            self._fold(record)
        for record in records:
            self.add(record)
        return self._complete_now(
            "calls a model and must be awaited", "calls a model and must be awaited"
        )

    # -- results ----------------------------------------------------------------------

    @property
    def scored(self) -> ScoredConversation:
        """The scores, once the session has finished."""
        if self._scored is None:
            raise RuntimeError("the conversation has not been scored yet")
        return self._scored

    def _complete_now(self, turn_reason: str, reason: str) -> ScoredConversation:
        """Score whatever is still open, without awaiting: plain scorers on this thread;
        scorers that await get ``failed`` with ``reason`` (``turn_reason`` for turns)."""
        if self._scored is not None:
            return self._scored
        for record in self._waiting:  # never entered: the plain scorers still see them
            self._fold(record)
        self._waiting = []
        _compute_results(self._plain)
        for slot in self._awaiting:
            if slot.open:  # nothing can be awaited now
                slot.error = reason
        for record in self._records:
            if record.status is not TurnStatus.COMPLETED or not record.evaluation_metrics:
                continue
            scores = self._turn_scores.setdefault(record.turn_id, {})
            for name in record.evaluation_metrics:
                if name in scores:
                    continue
                # a fresh scorer: the one sent to the background may be half fed
                scorer = self._turn_scorer(name, scores)
                if scorer is None:
                    continue
                if isinstance(scorer, AsyncConversationScorer):
                    scores[name] = Score.failed(turn_reason)
                else:
                    scores[name] = _score_turn(scorer, record, name)
        self._scored = ScoredConversation(
            scores={slot.name: slot.final() for slot in self._slots},
            turn_scores=self._turn_scores,
        )
        return self._scored


def _compute_results(slots: Sequence[_Slot]) -> None:
    """Each plain scorer's result, kept on its slot (runs in a worker thread too)."""
    for slot in slots:
        if not slot.open:
            continue
        try:
            slot.score = _checked(slot.scorer.result(), slot.name)  # type: ignore[union-attr]
        except Exception as exc:
            slot.fail(exc)


def _score_turn(scorer: ConversationScorer, record: TurnRecord, name: str) -> Score:
    try:
        scorer.update(record)
        return _checked(scorer.result(), name)
    except Exception as exc:
        return Score.failed(_failure(exc))


def _store_turn_score(scores: dict[str, Score], work: _ScoreTurn) -> None:
    scores[work.name] = _score_turn(work.scorer, work.record, work.name)
