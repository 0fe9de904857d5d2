"""The conversation actor: runs one conversation through its state machine.

The planner (:class:`~convsim._runtime._state.TurnPlanner`) decides which turn runs next; the
actor performs it (renders the prompt, asks the simulated user, calls the model) and
hands each turn record to the conversation's :class:`~convsim.metrics.ScoringSession`,
which scores while the conversation goes on.

A scorer may ask the model under test a prompt of its own for a turn (a task's
``get_model_response``): the session hands the question to :meth:`ConversationActor.ask`,
which sends it through the run's adapter (its rate limits, retries and response cache),
with the turn's history and settings, once per turn and prompt. Each such call is kept
on its turn's record (``extra_calls``) and its tokens count in the conversation's usage
and cost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio

from convsim._errors import AdapterError, ProtocolError, TemplateError, Timeout, TranscriptTooLong
from convsim._types import Completion, GenerationParams, Message, RequestIds, Usage
from convsim.adapters import ModelAdapter
from convsim.metrics import Metric, ScoredConversation, ScoringSession
from convsim.scenarios import Conversation, PreparedTurn, ToolBox

from .._log import get_logger
from .._records import (
    ConversationResult,
    ConversationTimings,
    ErrorInfo,
    ExtraCall,
    MetricTiers,
    Score,
    TerminationReason,
    TurnRecord,
    TurnStatus,
    TurnTimings,
)
from .._telemetry import Telemetry, using_telemetry
from ._agent_loop import AgentTurn, ToolRunner, run_agent_turn
from ._call_settings import CallSettings
from ._state import ConversationState, Finish, Skip, StateMachine, TurnPlanner
from ._traced import TracedScoring, TracedTools
from ._user import SimulatedUser, ends_on_goal

__all__ = ["ConversationActor", "ActorSettings", "conversation_seed"]

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

log = get_logger("convsim.actor")
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
    assistant: CallSettings
    """Sampling settings of the model under test's calls."""
    user: CallSettings | None = None
    """Sampling settings of the simulated user's calls."""
    seed: int = 0
    conversation_timeout: float | None = None
    """Overrides each flow's conversation_timeout when set."""
    max_turns: int | None = None
    """Overrides each flow's max_turns when set."""
    on_turn: Callable[[TurnRecord], None] | None = None
    """Told of each finished turn (plugins' turn hooks); must not block."""
    max_transcript_chars: int | None = None
    """The most characters a conversation's transcript may hold; a turn that would pass
    it (its prompt, or its answer) fails with TranscriptTooLong."""
    metric_tiers: MetricTiers | None = None
    """The pack's metric tiers, recorded on every result for the summaries."""
    telemetry: Telemetry | None = None
    """Where conversations, turns, model calls, tool calls and scoring are traced;
    None (tracing off) by default."""


class _Named(NamedTuple):
    """A model as spans name it."""

    model: str
    provider: str


@dataclass
class _InFlight:
    """The turn being run, as far as it got."""

    turn: PreparedTurn
    started_at: float
    t0: float
    prompt: str | None = None
    user_message: str | None = None
    user_attempts: int = 0
    user_usage: Usage | None = None
    user_latency_s: float | None = None
    user_cached: bool = False
    messages: tuple[Message, ...] = ()
    clipped_from: int | None = None
    """The pack's max_tokens once a call of the turn asked for fewer (the user's cap)."""
    agent: AgentTurn | None = None
    """The model calls and tool calls of the turn so far."""


_ENDED_BY = {
    TerminationReason.USER_STOP: "the simulated user ended the conversation",
    TerminationReason.GOAL_REACHED: "the scenario goal was reached",
}


class ConversationActor:
    """Drives one conversation: renders turns, calls the models, records every turn.

    ``run()`` always leaves a result in :attr:`result`, also when it is cancelled (then
    with status CANCELLED) before re-raising the cancellation.
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
    ) -> None:
        self.conversation = conversation
        self.model = model
        self.settings = settings
        self.user = (
            SimulatedUser(user_model, conversation.scenario) if user_model is not None else None
        )
        self.machine = StateMachine(conversation.conversation_id)
        self.seed = conversation_seed(settings.seed, conversation.conversation_id)
        self.scoring = ScoringSession(conversation, metrics, turn_metrics or {}, ask=self.ask)
        self.records: list[TurnRecord] = []
        self.result: ConversationResult | None = None
        system = conversation.scenario.system_prompt or conversation.flow.flow.system_prompt
        self.transcript: list[Message] = [Message(role="system", content=system)] if system else []
        self._chars = len(system or "")
        """Characters in the transcript (checked against max_transcript_chars)."""
        self._usage = Usage()
        self._user_usage: Usage | None = None
        self._inflight: _InFlight | None = None
        self._failure: ErrorInfo | None = None
        self._reason: TerminationReason | None = None
        self._responses: dict[str, str] = {}
        self._prepared: dict[str, PreparedTurn] = {}
        """The turns that ran, by turn_id (an extra call takes its turn's settings)."""
        self._extra_calls: dict[tuple[str, str], ExtraCall] = {}
        """Extra calls made, by turn_id and prompt, in the order they were made."""
        self._named: dict[str, _Named] = {}
        """The model of each role, as spans name it (found at its first traced call)."""
        self.tools: ToolRunner | None = (
            ToolBox(conversation.tools, conversation.scenario, allow_code=conversation.allow_code)
            if conversation.tools is not None
            else None
        )
        """The conversation's tools, with an environment document of its own."""

    # -- the actor loop -------------------------------------------------------------

    async def run(self) -> ConversationResult:
        """Run the conversation to its result (traced, when the run traces)."""
        telemetry = self.settings.telemetry
        if telemetry is None:
            return await self._run()
        conversation = self.conversation
        with (
            using_telemetry(telemetry),
            telemetry.conversation(
                run_id=self.settings.run_id,
                conversation_id=conversation.conversation_id,
                scenario_id=conversation.scenario.scenario_id,
                model=self.settings.model_name,
            ) as span,
        ):
            try:
                return await self._run()
            finally:
                if self.result is not None:  # left however the run ended
                    span.finish(self.result)

    async def _run(self) -> ConversationResult:
        started_at, t0 = time.time(), time.perf_counter()
        scoring = (
            self.scoring
            if self.settings.telemetry is None
            else TracedScoring(self.scoring, self.settings.telemetry)
        )
        try:
            async with scoring:
                try:
                    reason = await self._walk_within_deadline()
                except anyio.get_cancelled_exc_class():
                    self._interrupt(None, "conversation cancelled")
                    if not self.machine.finished:
                        self.machine.advance(_S.CANCELLED)
                    raise
                except Exception as exc:  # a defect in convsim or a plugin: lose nothing
                    reason = self._crash(_single(exc))
        except anyio.get_cancelled_exc_class():
            self.result = self._build(self._reason or TerminationReason.CANCELLED, started_at, t0)
            raise
        self.result = self._build(reason, started_at, t0)
        log.debug(
            "conversation_finished",
            status=self.result.status.value,
            reason=reason.value,
            turns=len(self.records),
            duration_s=round(self.result.timings.duration_s, 4),
        )
        return self.result

    @property
    def timeout(self) -> float:
        """The conversation's deadline in seconds: the user's (``conversation_timeout``)
        when set, else its flow's."""
        flow = self.conversation.flow.flow
        return self.settings.conversation_timeout or flow.conversation_timeout

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
        self._reason = TerminationReason.INTERNAL_ERROR
        return self._reason

    async def _walk_within_deadline(self) -> TerminationReason:
        timeout = self.timeout
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
                outcome = await self._traced_turn(step.turn)
                if isinstance(outcome, TerminationReason):  # the conversation ends here
                    self._skip_rest(_ENDED_BY[outcome])
                    self.machine.advance(_S.DONE)
                    return outcome
                if outcome is None:
                    planner.record(step.turn, TurnStatus.COMPLETED)
                else:
                    planner.record(step.turn, TurnStatus.FAILED, failure=_classify(outcome))
        raise AssertionError("TurnPlanner.steps() ends with Finish")  # pragma: no cover

    async def _traced_turn(self, turn: PreparedTurn) -> Exception | TerminationReason | None:
        """:meth:`_run_turn`, in a span of its own when the run traces."""
        telemetry = self.settings.telemetry
        if telemetry is None:
            return await self._run_turn(turn)
        with telemetry.turn(
            conversation_id=self.conversation.conversation_id,
            turn_index=turn.index,
            turn_id=turn.turn_id,
            role=turn.config.role,
        ) as span:
            outcome = await self._run_turn(turn)
            if self.records and self.records[-1].turn_id == turn.turn_id:
                span.finish(self.records[-1])
            return outcome

    async def _run_turn(self, turn: PreparedTurn) -> Exception | TerminationReason | None:
        """Run one turn.

        Returns None when it completed, the error when it failed, or a termination
        reason when the simulated user ends the conversation here (its stop marker, or
        the scenario goal reached).
        """
        self.machine.advance(_S.USER_TURN)
        self._prepared[turn.turn_id] = turn
        inflight = self._inflight = _InFlight(turn, time.time(), time.perf_counter())
        limit = self.settings.max_transcript_chars
        try:
            inflight.prompt = inflight.user_message = self.conversation.render(
                turn, self.transcript, max_chars=None if limit is None else limit - self._chars
            )
            if turn.config.role == "user":
                stop = await self._user_turn(inflight)
                if stop is not None:
                    return stop
        except Exception as exc:
            side = "user" if turn.config.role == "user" else None
            return self._fail(turn, exc, side=side)
        inflight.messages = (*self.transcript, Message(role="user", content=inflight.user_message))
        self.machine.advance(_S.ASSISTANT_TURN)
        params = self._offer_tools(
            turn, self.settings.assistant.for_call(self.conversation, turn, self.seed)
        )
        inflight.clipped_from = inflight.clipped_from or self.settings.assistant.clipped_from(turn)
        agent = inflight.agent = AgentTurn()
        try:
            await run_agent_turn(
                self._generate,
                inflight.messages,
                params,
                tools=self.tools
                if self.tools is None or self.settings.telemetry is None
                else TracedTools(self.tools, self.settings.telemetry),
                max_rounds=self._max_tool_rounds(turn),
                turn=agent,
            )
        except BaseException as exc:
            self._usage = self._usage + agent.usage  # the calls before the failure were spent
            if not isinstance(exc, Exception):  # cancelled, or the deadline passed
                raise
            return self._fail(turn, exc, side="assistant")
        completion = agent.final
        self._usage = self._usage + agent.usage  # spent, whatever becomes of it
        added = (
            len(inflight.user_message or "")
            + len(completion.text)
            + sum(_chars(m) for m in agent.messages)
        )
        if limit is not None and self._chars + added > limit:
            too_long = TranscriptTooLong(
                f"the answer takes the conversation's transcript past max_transcript_chars"
                f"={limit:,}",
                limit=limit,
            )
            return self._fail(turn, too_long, side="assistant")
        self._inflight = None
        self._chars += added
        self.transcript = [
            *inflight.messages,
            *agent.messages,
            Message(role="assistant", content=completion.text),
        ]
        self.machine.advance(_S.SCORING)
        self._emit(self._completed(inflight, completion))
        self._responses[turn.turn_id] = completion.text
        environment = self.tools.environment if self.tools is not None else None
        if ends_on_goal(self.conversation.scenario, self._responses, completion.text, environment):
            return TerminationReason.GOAL_REACHED
        return None

    async def _generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        return await self._call(
            self.model, "assistant", params, lambda: self.model.generate(messages, params)
        )

    async def _call(
        self,
        adapter: ModelAdapter,
        role: str,
        params: GenerationParams,
        call: Callable[[], Awaitable[Completion]],
    ) -> Completion:
        """A model call's checked answer, in a span of its own when the run traces."""
        telemetry = self.settings.telemetry
        if telemetry is None:
            return _checked(await call())
        named = self._named.get(role)
        if named is None:
            info = adapter.model_info()
            prefix = f"{info.provider}/"
            model = info.model_id.removeprefix(prefix)
            named = self._named[role] = _Named(model, info.provider)
        with telemetry.model_call(
            model=named.model, provider=named.provider, role=role, params=params
        ) as span:
            completion = _checked(await call())
            span.finish(completion)
            return completion

    def _offer_tools(self, turn: PreparedTurn, params: GenerationParams) -> GenerationParams:
        """``params`` with the tools ``turn`` offers (every tool of the pack unless the
        turn names some) and its tool_choice."""
        tools = self.conversation.tools
        if tools is None:
            return params
        specs = tools.specs(turn.config.tools)
        if not specs:
            return params
        choice = turn.config.tool_choice
        return params.model_copy(
            update={
                "tools": specs,
                "tool_choice": choice if choice is not None else params.tool_choice,
            }
        )

    def _max_tool_rounds(self, turn: PreparedTurn) -> int:
        own = turn.config.max_tool_rounds
        return own if own is not None else self.conversation.flow.flow.max_tool_rounds

    async def _user_turn(self, inflight: _InFlight) -> TerminationReason | None:
        """The simulated user turns the rendered instruction into the user's message;
        USER_STOP when it says its stop marker instead."""
        turn = inflight.turn
        if self.user is None or self.settings.user is None:
            raise TemplateError(
                f"turn {turn.turn_id!r} has role 'user' but no user model is configured"
            )
        params = self.settings.user.for_call(self.conversation, turn, self.seed)
        inflight.clipped_from = self.settings.user.clipped_from(turn)
        assert inflight.prompt is not None
        user, prompt = self.user, inflight.prompt
        reply = await self._call(
            user.model, "user", params, lambda: user.reply(prompt, self.transcript, params)
        )
        inflight.user_message = reply.text
        inflight.user_attempts = reply.attempts
        inflight.user_usage = reply.usage
        inflight.user_cached = reply.cached
        inflight.user_latency_s = None if reply.cached else reply.timings.total_s
        spent = Usage() if reply.cached else reply.usage
        self._user_usage = spent if self._user_usage is None else self._user_usage + spent
        if not self.user.stops(reply.text):
            return None
        self._inflight = None
        ended = _ENDED_BY[TerminationReason.USER_STOP]
        self._emit(self._skipped(turn, ended, inflight=inflight))
        return TerminationReason.USER_STOP

    # -- extra calls ------------------------------------------------------------------

    async def ask(self, record: TurnRecord, prompt: str) -> ExtraCall:
        """Ask the model under test ``prompt`` in place of ``record``'s own prompt: the
        turn's history before it, the turn's settings, through the run's adapter. A
        turn asked the same prompt again gets the call already made (no second call).
        A failure is returned as the call's ``error``, never raised."""
        key = (record.turn_id, prompt)
        if key in self._extra_calls:
            return self._extra_calls[key]
        turn = self._prepared.get(record.turn_id)
        if turn is None or record.status is not TurnStatus.COMPLETED:
            return ExtraCall(
                prompt=prompt,
                error=ErrorInfo(
                    type="ConfigError",
                    message=f"turn {record.turn_id!r} did not complete in this run: "
                    "the model is asked only for turns it answered",
                    turn_id=record.turn_id,
                ),
            )
        messages = (*record.messages[:-1], Message(role="user", content=prompt))
        params = self.settings.assistant.for_call(self.conversation, turn, self.seed)
        try:
            completion = await self._call(
                self.model, "extra", params, lambda: self.model.generate(messages, params)
            )
        except Exception as exc:
            error = ErrorInfo.from_exception(exc, turn_id=record.turn_id, side="assistant")
            call = ExtraCall(prompt=prompt, attempts=error.attempts or 0, error=error)
            log.debug("extra_call_failed", turn_id=record.turn_id, error_type=error.type)
        else:
            if not completion.cached:
                self._usage = self._usage + completion.usage
            call = ExtraCall(
                prompt=prompt,
                response=completion.text,
                finish_reason=completion.finish_reason,
                usage=completion.usage,
                latency_s=None if completion.cached else completion.timings.total_s,
                attempts=completion.attempts,
                cached=completion.cached,
            )
        self._extra_calls[key] = call
        return call

    def _turns(self) -> tuple[TurnRecord, ...]:
        """The turn records, each with the extra calls made for it."""
        if not self._extra_calls:
            return tuple(self.records)
        by_turn: dict[str, list[ExtraCall]] = {}
        for (turn_id, _), call in self._extra_calls.items():
            by_turn.setdefault(turn_id, []).append(call)
        return tuple(
            dataclasses.replace(r, extra_calls=(*r.extra_calls, *by_turn[r.turn_id]))
            if r.turn_id in by_turn
            else r
            for r in self.records
        )

    # -- failures and interruptions -------------------------------------------------

    def _fail(self, turn: PreparedTurn, exc: Exception, *, side: str | None) -> Exception:
        inflight = self._inflight
        assert inflight is not None
        self._inflight = None
        error = ErrorInfo.from_exception(exc, turn_id=turn.turn_id, side=side)
        if not turn.config.optional and self._failure is None:
            self._failure = error
        log.debug("turn_failed", turn_id=turn.turn_id, error_type=error.type, error=error.message)
        self.machine.advance(_S.SCORING)
        self._emit(self._failed(inflight, error, exc))
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
            self._emit(self._failed(self._inflight, error, exc))
            self._failure = self._failure or error
            self._inflight = None
        self._skip_rest(reason)

    # -- records ------------------------------------------------------------------

    def _emit(self, record: TurnRecord) -> None:
        """Keep ``record`` and hand it to the scoring session."""
        self.records.append(record)
        self.scoring.add(record)
        if self.settings.on_turn is not None:
            self.settings.on_turn(record)

    def _record(
        self, turn: PreparedTurn, status: TurnStatus, inflight: _InFlight | None, **fields: Any
    ) -> TurnRecord:
        """A record of ``turn``: what every record carries, what the turn got as far as
        (``inflight``), and ``fields``."""
        if inflight is not None:
            fields.setdefault("prompt", inflight.prompt)
            fields.setdefault("user_message", inflight.user_message)
            fields.setdefault("user_usage", inflight.user_usage)
            fields.setdefault("max_tokens_clipped_from", inflight.clipped_from)
            fields.setdefault("user_cached", inflight.user_cached)
        return TurnRecord(
            conversation_id=self.conversation.conversation_id,
            turn_index=turn.index,
            turn_id=turn.turn_id,
            role=turn.config.role,
            status=status,
            **fields,
        )

    def _completed(self, inflight: _InFlight, completion: Completion) -> TurnRecord:
        turn, agent = inflight.turn, inflight.agent
        assert agent is not None
        first = agent.completions[0]
        measured = [c for c in agent.completions if not c.cached]
        fresh = not agent.cached  # a cached answer's timings measure nothing
        return self._record(
            turn,
            TurnStatus.COMPLETED,
            inflight,
            messages=inflight.messages,
            response=completion.text,
            finish_reason=completion.finish_reason,
            usage=_tokens(agent.completions),
            timings=TurnTimings(
                started_at=inflight.started_at,
                duration_s=time.perf_counter() - inflight.t0,
                latency_s=agent.latency_s if fresh else None,
                queue_wait_s=sum(c.timings.queue_wait_s for c in measured) if fresh else None,
                retry_wait_s=sum(c.timings.retry_wait_s for c in measured) if fresh else None,
                ttft_s=first.timings.ttft_s if not first.cached else None,
                ttfot_s=first.timings.ttfot_s if not first.cached else None,
                user_latency_s=inflight.user_latency_s,
            ),
            reasoning=completion.reasoning,
            reasoning_tokens=completion.reasoning_tokens,
            attempts=agent.attempts,
            cached=agent.cached,
            user_attempts=inflight.user_attempts,
            evaluation_metrics=tuple(turn.config.evaluation_metrics),
            request_ids=tuple(i for c in agent.completions for i in c.request_ids),
            **_tool_fields(agent, self.tools),
        )

    def _skipped(
        self, turn: PreparedTurn, reason: str, *, inflight: _InFlight | None = None
    ) -> TurnRecord:
        return self._record(turn, TurnStatus.SKIPPED, inflight, skip_reason=reason)

    def _failed(
        self, inflight: _InFlight, error: ErrorInfo, exc: BaseException | None = None
    ) -> TurnRecord:
        """The record of a turn that failed with ``error`` (raised as ``exc``): what it
        got as far as, and the ids of every call it made, the failing one's too."""
        turn = inflight.turn
        made = inflight.agent.completions if inflight.agent is not None else ()
        failing: tuple[RequestIds, ...] = getattr(exc, "request_ids", ())
        return self._record(
            turn,
            TurnStatus.FAILED,
            inflight,
            messages=inflight.messages,
            timings=TurnTimings(
                started_at=inflight.started_at, duration_s=time.perf_counter() - inflight.t0
            ),
            attempts=(error.attempts or 0) + (inflight.agent.attempts if inflight.agent else 0),
            error=error,
            evaluation_metrics=tuple(turn.config.evaluation_metrics),
            request_ids=(*(i for c in made for i in c.request_ids), *failing),
            **(_tool_fields(inflight.agent, self.tools) if inflight.agent is not None else {}),
        )

    def _build(self, reason: TerminationReason, started_at: float, t0: float) -> ConversationResult:
        scored = _scored(self.scoring)
        scenario = self.conversation.scenario
        duration = time.perf_counter() - t0
        return ConversationResult(
            run_id=self.settings.run_id,
            conversation_id=self.conversation.conversation_id,
            scenario_id=scenario.scenario_id,
            trial=self.conversation.trial,
            scenario_type=scenario.scenario_type,
            pack=self.settings.pack_name,
            pack_hash=self.settings.pack_hash,
            model=self.settings.model_name,
            seed=self.seed,
            status=self.machine.status,
            termination_reason=reason,
            difficulty=scenario.difficulty,
            language=_language(scenario.metadata),
            metric_tiers=self.settings.metric_tiers,
            transcript=tuple(self.transcript),
            turns=self._turns(),
            scores=scored.scores,
            turn_scores=scored.turn_scores,
            usage=self._usage,
            user_usage=self._user_usage,
            cost_usd=_cost(self.model, self._usage),
            user_cost_usd=_cost(self.user.model if self.user else None, self._user_usage),
            error=self._failure if self.machine.status.value != "DONE" else None,
            timings=ConversationTimings(
                started_at=started_at, finished_at=started_at + duration, duration_s=duration
            ),
        )


def _chars(message: Message) -> int:
    """Characters a message adds to the transcript: its text, its calls' arguments."""
    return len(message.content) + sum(len(c.name) + len(c.arguments) for c in message.tool_calls)


def _tokens(completions: Sequence[Completion]) -> Usage:
    """The tokens of a turn's model calls, cached ones included (the turn's own count)."""
    total = completions[0].usage
    for completion in completions[1:]:
        total = total + completion.usage
    return total


def _tool_fields(agent: AgentTurn, tools: ToolRunner | None) -> dict[str, Any]:
    """A turn record's tool fields; none for a turn that called no tool."""
    if not agent.calls and not agent.round_limit:
        return {}
    return {
        "tool_calls": tuple(agent.calls),
        "tool_rounds": agent.rounds,
        "tool_round_limit": agent.round_limit,
        "environment": agent.environment_after(tools),
    }


def _language(metadata: dict[str, Any]) -> str | None:
    """A scenario's ``metadata.language`` (single-turn packs put a problem's there)."""
    language = metadata.get("language")
    return language if isinstance(language, str) and language else None


def _scored(scoring: ScoringSession) -> ScoredConversation:
    """The session's scores; should scoring itself have broken, every score failed."""
    try:
        return scoring.scored
    except RuntimeError:
        broken = Score.failed("the scoring session broke before it finished")
        return ScoredConversation(scores={m.name: broken for m in scoring.metrics}, turn_scores={})


def _cost(adapter: ModelAdapter | None, usage: Usage | None) -> float | None:
    if adapter is None or usage is None:
        return None
    try:
        cost = adapter.usage_cost(usage)
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
