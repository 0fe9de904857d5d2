"""The conversation actor: runs one conversation through its state machine."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from anyio.streams.memory import MemoryObjectSendStream

from convsim._errors import AdapterError, ProtocolError, TemplateError, Timeout
from convsim.adapters._protocol import ModelAdapter
from convsim.adapters._types import Completion, GenerationParams, Message, Usage
from convsim.metrics._goal import goal_met
from convsim.metrics._protocol import ConversationScorer, Metric
from convsim.scenarios._pack import Conversation, PreparedTurn
from convsim.scenarios._schema import UserProfile

from ._records import (
    ConversationResult,
    ConversationTimings,
    ErrorInfo,
    Score,
    TerminationReason,
    TurnRecord,
    TurnStatus,
    TurnTimings,
)
from ._state import ConversationState, Finish, Skip, StateMachine, TurnPlanner

__all__ = ["ConversationActor", "ActorSettings", "conversation_seed"]

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

log = structlog.get_logger("convsim.actor")
_S = ConversationState


def conversation_seed(run_seed: int, conversation_id: str) -> int:
    """A stable 31-bit seed per conversation, derived from the run seed."""
    digest = hashlib.sha256(f"{run_seed}:{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class ActorSettings:
    """What every conversation of one run shares."""

    run_id: str
    pack_name: str
    pack_hash: str
    model_name: str
    seed: int = 0
    conversation_timeout: float | None = None
    """Overrides each flow's conversation_timeout when set."""
    max_turns: int | None = None
    """Overrides each flow's max_turns when set."""


@dataclass
class _InFlight:
    turn: PreparedTurn
    started_at: float
    t0: float
    prompt: str | None = None
    user_message: str | None = None
    user_attempts: int = 0
    messages: tuple[Message, ...] = ()


class ConversationActor:
    """Drives one conversation: renders turns, calls the models, emits TurnRecords.

    Turn records go out on a memory object stream that a scoring task consumes while
    the conversation runs. ``run()`` always leaves a result in :attr:`result`, also when
    it is cancelled (then with status CANCELLED) before re-raising the cancellation.
    """

    def __init__(
        self,
        conversation: Conversation,
        *,
        model: ModelAdapter,
        settings: ActorSettings,
        metrics: Sequence[Metric] = (),
        turn_metrics: Mapping[str, Metric] | None = None,
        user_model: ModelAdapter | None = None,
        defaults: GenerationParams | None = None,
        params_cache: dict[tuple[int, str], GenerationParams] | None = None,
    ) -> None:
        self.conversation = conversation
        self.model = model
        self.user_model = user_model
        self.settings = settings
        self.machine = StateMachine(conversation.conversation_id)
        self.seed = conversation_seed(settings.seed, conversation.conversation_id)
        self.defaults = defaults if defaults is not None else model.default_config()
        # turn -> merged sampling settings; shared by the conversations of one run
        self._turn_params = params_cache if params_cache is not None else {}
        self.records: list[TurnRecord] = []
        self.result: ConversationResult | None = None
        scenario = conversation.scenario
        system = scenario.system_prompt or conversation.flow.flow.system_prompt
        self.transcript: list[Message] = [Message(role="system", content=system)] if system else []
        self._metric_names = [metric.name for metric in metrics]
        self._scorers: dict[str, ConversationScorer] = {}
        self._scorer_errors: dict[str, str] = {}
        for metric in metrics:
            try:
                self._scorers[metric.name] = metric.scorer(conversation)
            except Exception as exc:  # a broken metric must not sink the conversation
                self._scorer_errors[metric.name] = f"{type(exc).__name__}: {exc}"
        self._turn_metrics = dict(turn_metrics or {})
        self._async_names = {n for n, s in self._scorers.items() if _is_async(s)}
        self._async_results: dict[str, Score] = {}
        self._pending_turn_scores: list[tuple[str, Any, TurnRecord]] = []
        """Turn metrics left for _feed_async: name, its scorer, the turn."""
        self._heavy_running: str | None = None
        """The heavy conversation scorer whose result() a worker thread is computing."""
        self._heavy_names = {
            m.name for m in metrics if getattr(m, "cpu_heavy", False) and m.name in self._scorers
        }
        self._turn_scores: dict[str, dict[str, Score]] = {}
        self._scored = 0
        self._usage = Usage()
        self._user_usage: Usage | None = None
        self._inflight: _InFlight | None = None
        self._failure: ErrorInfo | None = None
        self._reason: TerminationReason | None = None
        self._responses: dict[str, str] = {}
        self._profile = conversation.scenario.user or _NO_PROFILE
        self._send: MemoryObjectSendStream[TurnRecord] | None = None
        self._inline = False

    # -- the actor loop -------------------------------------------------------------

    async def run(self) -> ConversationResult:
        started_at, t0 = time.time(), time.perf_counter()
        turns = self.conversation.flow.turns
        try:
            if self._async_names or any(t.config.evaluation_metrics for t in turns):
                # scorers that await (judges) or turn metrics: a scoring task beside the
                # conversation, fed through a stream
                send, receive = anyio.create_memory_object_stream[TurnRecord](
                    max_buffer_size=len(turns)
                )
                self._send = send
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._consume, receive)
                    with send:
                        reason = await self._walk_within_deadline()
            else:  # plain scorers only: fed inline as each turn is recorded
                self._inline = bool(self._scorers)
                reason = await self._walk_within_deadline()
                await self._finish_scoring()
        except anyio.get_cancelled_exc_class():
            self._interrupt(None, "conversation cancelled")
            if not self.machine.finished:
                self.machine.advance(_S.CANCELLED)
            self._score_remaining()
            self.result = self._build(self._reason or TerminationReason.CANCELLED, started_at, t0)
            raise
        except Exception as exc:  # a defect in convsim or a plugin: record it, lose nothing
            reason = self._crash(_single(exc))
        self.result = self._build(reason, started_at, t0)
        log.debug(
            "conversation_finished",
            status=self.result.status.value,
            reason=reason.value,
            turns=len(self.records),
            duration_s=round(self.result.timings.duration_s, 4),
        )
        return self.result

    def _crash(self, exc: BaseException) -> TerminationReason:
        """End the conversation FAILED after an unexpected error, keeping what ran."""
        log.error("conversation_crashed", error_type=type(exc).__name__, error=str(exc))
        try:
            self._interrupt(exc, "conversation ended by an internal error")
        except Exception:  # the defect is in the recording itself: keep what was recorded
            log.error("conversation_records_incomplete")
        if self._failure is None:
            self._failure = ErrorInfo.from_exception(exc)
        if not self.machine.finished:
            self.machine.advance(_S.FAILED)
        self._score_remaining()
        self._reason = TerminationReason.INTERNAL_ERROR
        return self._reason

    async def _walk_within_deadline(self) -> TerminationReason:
        timeout = (
            self.settings.conversation_timeout or self.conversation.flow.flow.conversation_timeout
        )
        with anyio.move_on_after(timeout):  # falls through only when the deadline hit
            self._reason = await self._walk()
            return self._reason
        self._interrupt(
            Timeout(f"conversation_timeout of {timeout:g}s exceeded"), "conversation timed out"
        )
        self.machine.advance(_S.TIMED_OUT)
        self._reason = TerminationReason.CONVERSATION_TIMEOUT
        return self._reason

    async def _walk(self) -> TerminationReason:
        planner = TurnPlanner(self.conversation, self.settings.max_turns)
        for step in planner.steps():
            if isinstance(step, Skip):
                self._emit(self._skipped(step.turn, step.reason))
            elif isinstance(step, Finish):
                self.machine.advance(_S.DONE if step.failed_turn is None else _S.FAILED)
                return step.reason
            else:
                outcome = await self._run_turn(step.turn)
                if isinstance(outcome, TerminationReason):  # the conversation ends here
                    self._skip_rest(_ENDED_BY[outcome])
                    self.machine.advance(_S.DONE)
                    return outcome
                if outcome is None:
                    planner.record(step.turn, TurnStatus.COMPLETED)
                else:
                    planner.record(step.turn, TurnStatus.FAILED, failure=_classify(outcome))
        raise AssertionError("TurnPlanner.steps() ends with Finish")  # pragma: no cover

    async def _run_turn(self, turn: PreparedTurn) -> Exception | TerminationReason | None:
        """Run one turn.

        Returns None when it completed, the error when it failed, or a termination
        reason when the simulated user ends the conversation here (its stop marker, or
        the scenario goal reached).
        """
        self.machine.advance(_S.USER_TURN)
        inflight = self._inflight = _InFlight(turn, time.time(), time.perf_counter())
        user_latency: float | None = None
        user_usage: Usage | None = None
        try:
            inflight.prompt = inflight.user_message = self.conversation.render(
                turn, self.transcript
            )
            if turn.config.role == "user":
                user = _checked(await self._ask_user(turn, inflight.prompt))
                inflight.user_message = user.text
                inflight.user_attempts = user.attempts
                user_latency, user_usage = user.timings.total_s, user.usage
                self._user_usage = (
                    user.usage if self._user_usage is None else self._user_usage + user.usage
                )
                if self._profile.stop_marker in user.text:
                    self._inflight = None
                    self._emit(
                        self._skipped(
                            turn,
                            _ENDED_BY[TerminationReason.USER_STOP],
                            inflight=inflight,
                            user_usage=user_usage,
                        )
                    )
                    return TerminationReason.USER_STOP
        except Exception as exc:
            side = "user" if turn.config.role == "user" else None
            return self._fail(turn, exc, side=side, user_usage=user_usage)
        inflight.messages = (*self.transcript, Message(role="user", content=inflight.user_message))
        self.machine.advance(_S.ASSISTANT_TURN)
        try:
            completion = _checked(
                await self.model.generate(inflight.messages, self._params(turn, "assistant"))
            )
        except Exception as exc:
            return self._fail(turn, exc, side="assistant", user_usage=user_usage)
        self._inflight = None
        self.transcript = [*inflight.messages, Message(role="assistant", content=completion.text)]
        self._usage = self._usage + completion.usage
        record = TurnRecord(
            conversation_id=self.conversation.conversation_id,
            turn_index=turn.index,
            turn_id=turn.turn_id,
            role=turn.config.role,
            status=TurnStatus.COMPLETED,
            prompt=inflight.prompt,
            user_message=inflight.user_message,
            messages=inflight.messages,
            response=completion.text,
            finish_reason=completion.finish_reason,
            usage=completion.usage,
            user_usage=user_usage,
            timings=TurnTimings(
                started_at=inflight.started_at,
                duration_s=time.perf_counter() - inflight.t0,
                latency_s=completion.timings.total_s,
                queue_wait_s=completion.timings.queue_wait_s,
                retry_wait_s=completion.timings.retry_wait_s,
                ttft_s=completion.timings.ttft_s,
                user_latency_s=user_latency,
            ),
            attempts=completion.attempts,
            user_attempts=inflight.user_attempts,
            evaluation_metrics=tuple(turn.config.evaluation_metrics),
        )
        self.machine.advance(_S.SCORING)
        self._emit(record)
        self._responses[turn.turn_id] = completion.text
        goal = self.conversation.scenario.goal
        simulated = self.conversation.scenario.user is not None
        if (
            simulated
            and self._profile.stop_on_goal
            and goal is not None
            and goal_met(goal, self._responses, completion.text)
        ):
            return TerminationReason.GOAL_REACHED
        return None

    async def _ask_user(self, turn: PreparedTurn, instruction: str) -> Completion:
        if self.user_model is None:
            raise TemplateError(
                f"turn {turn.turn_id!r} has role 'user' but no user model is configured"
            )
        scenario, profile = self.conversation.scenario, self._profile
        goal = profile.goal or (scenario.goal.description if scenario.goal else None)
        system = "\n".join(
            line
            for line in (
                "You are playing the user in a conversation with an AI assistant. Stay in "
                "character and never say that you are an AI.",
                f"Scenario: {scenario.scenario_description}",
                f"Who you are: {profile.persona}" if profile.persona else "",
                f"What you want: {goal}" if goal else "",
                f"How you write: {profile.style}" if profile.style else "",
                f"Your instruction for this message: {instruction}",
                "Write only the user's next message. When what you want has been done, or "
                f"there is nothing more to say, reply with exactly {profile.stop_marker}",
            )
            if line
        )
        flipped = [
            Message(role="user" if m.role == "assistant" else "assistant", content=m.content)
            for m in self.transcript
            if m.role != "system"
        ]
        if not flipped or flipped[-1].role != "user":
            flipped.append(Message(role="user", content="(Write your next message.)"))
        return await self.user_model.generate(
            [Message(role="system", content=system), *flipped], self._params(turn, "user")
        )

    def _params(self, turn: PreparedTurn, side: str) -> GenerationParams:
        """The call's settings: the side's own adapter defaults, then the turn's."""
        key = (id(turn), side)
        base = self._turn_params.get(key)
        if base is None:
            cfg = turn.config.config
            defaults = self.defaults
            if side == "user" and self.user_model is not None:
                defaults = self.user_model.default_config()
            base = self._turn_params[key] = defaults.merged(
                {
                    "temperature": cfg.temperature,
                    "max_tokens": cfg.max_tokens,
                    "top_p": cfg.top_p,
                    "stop": tuple(cfg.stop) if cfg.stop is not None else None,
                }
            )
        scenario = self.conversation.scenario
        return base.model_copy(
            update={
                "seed": self.seed,
                "reference": scenario.reference_responses.get(turn.turn_id)
                if side == "assistant"
                else None,
                "metadata": {
                    "conversation_id": self.conversation.conversation_id,
                    "scenario_id": scenario.scenario_id,
                    "turn_id": turn.turn_id,
                    "role": side,
                },
            }
        )

    # -- failures and interruptions -------------------------------------------------

    def _fail(
        self,
        turn: PreparedTurn,
        exc: Exception,
        *,
        side: str | None,
        user_usage: Usage | None = None,
    ) -> Exception:
        inflight = self._inflight
        assert inflight is not None
        self._inflight = None
        error = ErrorInfo.from_exception(exc, turn_id=turn.turn_id, side=side)
        if not turn.config.optional and self._failure is None:
            self._failure = error
        log.debug(
            "turn_failed",
            turn_id=turn.turn_id,
            error_type=error.type,
            error=error.message,
        )
        self.machine.advance(_S.SCORING)
        self._emit(self._failed(inflight, error, user_usage=user_usage))
        return exc

    def _skip_rest(self, reason: str) -> None:
        """Record every turn not recorded yet as skipped for ``reason``."""
        done = {r.turn_id for r in self.records}
        for turn in self.conversation.flow.turns:
            if turn.turn_id not in done:
                self._emit(self._skipped(turn, reason))

    def _interrupt(self, exc: BaseException | None, reason: str) -> None:
        """Record the in-flight turn as failed and every unrecorded turn as skipped."""
        if self._inflight is not None:
            turn_id = self._inflight.turn.turn_id
            error = (
                ErrorInfo.from_exception(exc, turn_id=turn_id)
                if exc is not None
                else ErrorInfo(type="Cancelled", message="the run was cancelled", turn_id=turn_id)
            )
            self._emit(self._failed(self._inflight, error))
            self._failure = self._failure or error
            self._inflight = None
        self._skip_rest(reason)

    # -- records and scoring --------------------------------------------------------

    def _emit(self, record: TurnRecord) -> None:
        """Keep ``record`` and stream it to the scorers (the buffer holds every turn).

        Once the stream is closed (the conversation was cancelled) records are only
        kept; ``_score_remaining`` scores them.
        """
        self.records.append(record)
        if self._inline:
            self._feed(record)
        elif self._send is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._send.send_nowait(record)

    async def _consume(self, receive: anyio.abc.ObjectReceiveStream[TurnRecord]) -> None:
        async with receive:
            async for record in receive:
                self._feed(record, defer=True)
                await self._feed_async(record)
        await self._finish_scoring()

    async def _finish_scoring(self) -> None:
        """The conversation ended: async scorers (judges) give their results now, and
        CPU-heavy ones compute theirs in a worker thread, so the event loop never waits
        on them."""
        for name in self._async_names - self._scorer_errors.keys():
            try:
                self._async_results[name] = await self._scorers[name].result()  # type: ignore[misc]
            except Exception as exc:
                self._scorer_errors[name] = f"{type(exc).__name__}: {exc}"
        for name in self._heavy_names - self._scorer_errors.keys():
            try:
                self._async_results[name] = await anyio.to_thread.run_sync(self._heavy_result, name)
            except Exception as exc:
                self._scorer_errors[name] = f"{type(exc).__name__}: {exc}"

    def _heavy_result(self, name: str) -> Score:
        """In a worker thread: one CPU-heavy scorer's result, marked as running."""
        self._heavy_running = name
        try:
            return self._scorers[name].result()
        finally:
            self._heavy_running = None

    async def _feed_async(self, record: TurnRecord) -> None:
        """Scorers whose update is a coroutine (they call a model): awaited in turn."""
        for name in self._async_names - self._scorer_errors.keys():
            try:
                await self._scorers[name].update(record)  # type: ignore[misc]
            except Exception as exc:
                self._scorer_errors[name] = f"{type(exc).__name__}: {exc}"
        # an entry leaves the queue only once scored: a cancellation in between leaves it
        # to _score_remaining
        while self._pending_turn_scores:
            name, scorer, turn = self._pending_turn_scores[0]
            if not _is_async(scorer):  # CPU-heavy: a worker thread keeps the loop free
                score = await anyio.to_thread.run_sync(_score_one, scorer, turn)
            else:
                try:
                    await scorer.update(turn)
                    score = await scorer.result()
                except Exception as exc:
                    score = Score.failed(f"{type(exc).__name__}: {exc}")
            del self._pending_turn_scores[0]
            self._turn_scores.setdefault(turn.turn_id, {})[name] = score

    def _score_remaining(self) -> None:
        """After a cancellation or crash: score what the scoring task did not reach."""
        pending, self._pending_turn_scores = self._pending_turn_scores, []
        for name, scorer, turn in pending:
            if _is_async(scorer):
                score = Score.failed("the conversation ended before the turn was scored")
            else:  # a fresh scorer: a worker thread may still hold the queued one
                try:
                    score = _score_one(self._turn_metrics[name].scorer(self.conversation), turn)
                except Exception as exc:
                    score = Score.failed(f"{type(exc).__name__}: {exc}")
            self._turn_scores.setdefault(turn.turn_id, {})[name] = score
        for record in self.records[self._scored :]:
            self._feed(record)

    def _feed(self, record: TurnRecord, *, defer: bool = False) -> None:
        """Feed the conversation's scorers and score the turn's own metrics. With
        ``defer`` (the actor loop), async and CPU-heavy turn metrics are left for
        :meth:`_feed_async`; without it (scoring after cancellation) heavy ones run here."""
        self._scored += 1
        for name, scorer in self._scorers.items():
            if name in self._scorer_errors or name in self._async_names:
                continue
            try:
                scorer.update(record)
            except Exception as exc:
                self._scorer_errors[name] = f"{type(exc).__name__}: {exc}"
        if record.status is TurnStatus.COMPLETED and record.evaluation_metrics:
            scores = self._turn_scores.setdefault(record.turn_id, {})
            for name in record.evaluation_metrics:
                metric = self._turn_metrics.get(name)
                if metric is None:
                    scores[name] = Score.failed(f"{name!r} was not provided")
                    continue
                try:
                    scorer = metric.scorer(self.conversation)
                except Exception as exc:
                    scores[name] = Score.failed(f"{type(exc).__name__}: {exc}")
                    continue
                if _is_async(scorer) or (defer and getattr(metric, "cpu_heavy", False)):
                    self._pending_turn_scores.append((name, scorer, record))
                else:
                    scores[name] = _score_one(scorer, record)

    def _skipped(
        self,
        turn: PreparedTurn,
        reason: str,
        *,
        inflight: _InFlight | None = None,
        user_usage: Usage | None = None,
    ) -> TurnRecord:
        return TurnRecord(
            conversation_id=self.conversation.conversation_id,
            turn_index=turn.index,
            turn_id=turn.turn_id,
            role=turn.config.role,
            status=TurnStatus.SKIPPED,
            skip_reason=reason,
            prompt=inflight.prompt if inflight else None,
            user_message=inflight.user_message if inflight else None,
            user_usage=user_usage,
        )

    def _failed(
        self, inflight: _InFlight, error: ErrorInfo, *, user_usage: Usage | None = None
    ) -> TurnRecord:
        turn = inflight.turn
        return TurnRecord(
            conversation_id=self.conversation.conversation_id,
            turn_index=turn.index,
            turn_id=turn.turn_id,
            role=turn.config.role,
            status=TurnStatus.FAILED,
            prompt=inflight.prompt,
            user_message=inflight.user_message,
            messages=inflight.messages,
            user_usage=user_usage,
            timings=TurnTimings(
                started_at=inflight.started_at, duration_s=time.perf_counter() - inflight.t0
            ),
            attempts=error.attempts or 0,
            error=error,
            evaluation_metrics=tuple(turn.config.evaluation_metrics),
        )

    def _build(self, reason: TerminationReason, started_at: float, t0: float) -> ConversationResult:
        scores: dict[str, Score] = {}
        for name in self._metric_names:
            error = self._scorer_errors.get(name)
            if error is None and name in self._async_results:
                scores[name] = self._async_results[name]
                continue
            if error is None and (name in self._async_names or name == self._heavy_running):
                # a judge cannot be awaited here, and a worker thread still holds the
                # scorer that was being computed when the conversation was cancelled
                scores[name] = Score.failed("the conversation ended before it was scored")
                continue
            if error is None:
                try:
                    scores[name] = self._scorers[name].result()
                    continue
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
            scores[name] = Score.failed(error)
        scenario = self.conversation.scenario
        duration = time.perf_counter() - t0
        return ConversationResult(
            run_id=self.settings.run_id,
            conversation_id=self.conversation.conversation_id,
            scenario_id=scenario.scenario_id,
            scenario_type=scenario.scenario_type,
            pack=self.settings.pack_name,
            pack_hash=self.settings.pack_hash,
            model=self.settings.model_name,
            seed=self.seed,
            status=self.machine.status,
            termination_reason=reason,
            difficulty=scenario.difficulty,
            transcript=tuple(self.transcript),
            turns=tuple(self.records),
            scores=scores,
            turn_scores=self._turn_scores,
            usage=self._usage,
            user_usage=self._user_usage,
            cost_usd=_cost(self.model, self._usage),
            user_cost_usd=_cost(self.user_model, self._user_usage),
            error=self._failure if self.machine.status.value != "DONE" else None,
            timings=ConversationTimings(
                started_at=started_at, finished_at=started_at + duration, duration_s=duration
            ),
        )


_NO_PROFILE = UserProfile()

_ENDED_BY = {
    TerminationReason.USER_STOP: "the simulated user ended the conversation",
    TerminationReason.GOAL_REACHED: "the scenario goal was reached",
}


def _cost(adapter: ModelAdapter | None, usage: Usage | None) -> float | None:
    if adapter is None or usage is None:
        return None
    try:
        cost = adapter.estimate_cost(usage)
    except Exception:  # pricing is advisory; never fail a conversation over it
        return None
    return None if cost is None else cost.total_cost


def _checked(completion: object) -> Completion:
    """The adapter's answer, if it is a Completion; ProtocolError otherwise."""
    if not isinstance(completion, Completion):
        raise ProtocolError(
            f"the adapter returned {type(completion).__name__}, not a Completion",
            snippet=repr(completion),
        )
    return completion


def _single(exc: BaseException) -> BaseException:
    """The one error inside nested exception groups, if there is exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _is_async(scorer: object) -> bool:
    return inspect.iscoroutinefunction(getattr(scorer, "update", None))


def _score_one(scorer: ConversationScorer, record: TurnRecord) -> Score:
    try:
        scorer.update(record)
        return scorer.result()
    except Exception as exc:
        return Score.failed(f"{type(exc).__name__}: {exc}")


def _classify(exc: BaseException) -> TerminationReason:
    if isinstance(exc, AdapterError):
        return (
            TerminationReason.INFRASTRUCTURE_ERROR
            if exc.infrastructure
            else TerminationReason.MODEL_ERROR
        )
    if isinstance(exc, (OSError, TimeoutError)):
        return TerminationReason.INFRASTRUCTURE_ERROR
    return TerminationReason.INTERNAL_ERROR
