"""What a run produces: turn records, scores and conversation results."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from ._errors import AdapterError, ProtocolError, RateLimited
from ._types import Message, RequestIds, Usage

__all__ = [
    "SCHEMA_VERSION",
    "Status",
    "TerminationReason",
    "TurnStatus",
    "ErrorInfo",
    "Score",
    "TurnTimings",
    "ExtraCall",
    "ToolCallRecord",
    "ToolErrorKind",
    "TurnRecord",
    "ConversationTimings",
    "ConversationResult",
    "MetricTiers",
]


SCHEMA_VERSION = 7
"""The newest format of a results line. 1: each turn's ``messages`` in full.
2: a turn stores ``messages_prefix``, how many leading ``transcript`` messages it sent,
and in ``messages`` only what follows them, so each message is stored once (a line grows
with a conversation's length, not with its square). 3: a turn may hold ``extra_calls``
(a task's own questions to the model); a line without any is still written as 2, so
an older convsim reads it, and one with them tells an older convsim to upgrade rather
than failing on an unknown field. 4: a turn may hold a reasoning model's ``reasoning``
and ``reasoning_tokens``, and its timings a ``ttfot_s`` apart from ``ttft_s``; a line
without them is written as before. 5: messages may be tool calls and tool results, and a
turn may hold its ``tool_calls``, ``tool_rounds`` and tool ``environment``; a line
without tools is written as before. 6: a turn may hold the ``request_ids`` of its
model calls; a line without them is written as before. 7: a usage may hold
``cached_tokens`` (the server's prefix-cache hits); a line without them is written as
before. Lines of every version read back to the same objects."""

_WITHOUT_EXTRA_CALLS = 2
"""The version a line without extra calls is written as."""
_WITH_EXTRA_CALLS = 3
"""The version a line with extra calls (and no reasoning) is written as."""
_WITH_REASONING = 4
"""The version a line with reasoning (and no tools) is written as."""
_WITH_TOOLS = 5
"""The version a line with tools (and no request ids) is written as."""
_WITH_REQUEST_IDS = 6
"""The version a line with request ids (and no cached-token counts) is written as."""


def _get(item: object, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _reasoned(turn: object) -> bool:
    """Whether a turn (a record or its dict) holds what only version 4 can."""
    if _get(turn, "reasoning") is not None or _get(turn, "reasoning_tokens") is not None:
        return True
    timings = _get(turn, "timings")
    if timings is None or (isinstance(timings, dict) and "ttfot_s" not in timings):
        return False
    return bool(_get(timings, "ttfot_s") != _get(timings, "ttft_s"))


def _used_tools(turn: object) -> bool:
    """Whether a turn (a record or its dict) holds what only version 5 can."""
    if _get(turn, "tool_calls") or _get(turn, "tool_rounds") or _get(turn, "environment"):
        return True
    messages = _get(turn, "messages")
    return isinstance(messages, (list, tuple)) and any(_tool_message(m) for m in messages)


def _tool_message(message: object) -> bool:
    return _get(message, "role") == "tool" or bool(_get(message, "tool_calls"))


def _counted_cache(turn: object) -> bool:
    """Whether a turn (a record or its dict) holds what only version 7 can: a usage
    with the server's ``cached_tokens``."""
    usages = [_get(turn, "usage"), _get(turn, "user_usage")]
    extra = _get(turn, "extra_calls")
    if isinstance(extra, (list, tuple)):
        usages.extend(_get(call, "usage") for call in extra)
    return any(u is not None and _get(u, "cached_tokens") is not None for u in usages)


def _written_version(turns: object, transcript: object = ()) -> int:
    """The version a results line with these turns (records or their dicts) and this
    transcript is written as."""
    if not isinstance(turns, (list, tuple)):
        return _WITHOUT_EXTRA_CALLS
    if any(_counted_cache(t) for t in turns):
        return SCHEMA_VERSION
    if any(_get(t, "request_ids") for t in turns):
        return _WITH_REQUEST_IDS
    if any(_used_tools(t) for t in turns) or (
        isinstance(transcript, (list, tuple)) and any(_tool_message(m) for m in transcript)
    ):
        return _WITH_TOOLS
    if any(_reasoned(t) for t in turns):
        return _WITH_REASONING
    if any(_get(t, "extra_calls") for t in turns):
        return _WITH_EXTRA_CALLS
    return _WITHOUT_EXTRA_CALLS


class Status(str, Enum):
    """How a conversation ended."""

    DONE = "DONE"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"


class TerminationReason(str, Enum):
    """Why a conversation ended; keeps infrastructure failures apart from model ones."""

    COMPLETED = "completed"
    """Every turn of the flow was run or deliberately skipped."""
    MAX_TURNS = "max_turns"
    """The flow's max_turns was reached with turns left."""
    USER_STOP = "user_stop"
    """The simulated user ended the conversation (its stop marker)."""
    GOAL_REACHED = "goal_reached"
    """A simulated conversation reached its scenario goal."""
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    """A model call failed for reasons outside the model: rate limits, servers, network."""
    MODEL_ERROR = "model_error"
    """The request was rejected or the model's output could not be used."""
    INTERNAL_ERROR = "internal_error"
    """convsim itself failed (a template or metric raised)."""
    CONVERSATION_TIMEOUT = "conversation_timeout"
    CANCELLED = "cancelled"


class TurnStatus(str, Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


class ErrorInfo(BaseModel):
    """A failure, as data."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    turn_id: str | None = None
    side: str | None = None
    """``assistant`` (the model under test) or ``user`` (the simulated user)."""
    attempts: int | None = None
    status_code: int | None = None
    infrastructure: bool | None = None
    retry_after: float | None = None
    snippet: str | None = None
    """The start of what a server sent that could not be understood."""

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, turn_id: str | None = None, side: str | None = None
    ) -> ErrorInfo:
        if isinstance(exc, AdapterError):
            return cls(
                type=type(exc).__name__,
                message=str(exc),
                turn_id=turn_id,
                side=side,
                attempts=exc.attempts,
                status_code=exc.status_code,
                infrastructure=exc.infrastructure,
                retry_after=exc.retry_after if isinstance(exc, RateLimited) else None,
                snippet=(exc.snippet or None) if isinstance(exc, ProtocolError) else None,
            )
        return cls(
            type=type(exc).__name__,
            message=str(exc) or type(exc).__name__,
            turn_id=turn_id,
            side=side,
        )


HIGHER_IS_BETTER_DETAIL = "higher_is_better"
"""A ``Score.details`` key: the direction the score's own source gives (a task's metric
list), which a report read back from a file prefers to the registry's."""


class Score(BaseModel):
    """A metric's value, or why there is none (never a fake 0 or 1).

    A value exists only when the metric measured something. With nothing to check, or
    with something checked but no evidence either way, the score is
    ``not_applicable`` (the reason of the latter starts "not applicable: no evidence:"
    and its details say what was checked); a scorer or judge that broke gives
    ``failed``. Summaries average values only and count the other two beside them.
    """

    model_config = ConfigDict(frozen=True)

    value: float | None
    reason: str | None = None
    """Why there is no value: not applicable, or the metric failed."""
    details: dict[str, Any] = Field(default_factory=dict)
    status: Literal["ok", "not_applicable", "failed"] = "ok"
    """``ok`` (a value), ``not_applicable`` (nothing measured) or ``failed`` (the
    scorer or its judge broke). Inferred when not given, e.g. in results written
    before it existed: a reason starting "metric failed" means ``failed``."""

    @model_validator(mode="before")
    @classmethod
    def _infer_status(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("status") is None:
            if data.get("value") is not None:
                status = "ok"
            elif str(data.get("reason") or "").startswith("metric failed"):
                status = "failed"
            else:
                status = "not_applicable"
            data = {**data, "status": status}
        return data

    @model_validator(mode="after")
    def _status_matches_value(self) -> Score:
        if (self.status == "ok") != (self.value is not None):
            raise ValueError(f"status {self.status!r} does not fit value {self.value!r}")
        return self

    @classmethod
    def not_applicable(cls, reason: str, **details: Any) -> Score:
        """The metric measured nothing: ``reason`` says why (``"no evidence: ..."``
        where it checked something and found nothing either way)."""
        return cls(
            value=None, reason=f"not applicable: {reason}", details=details, status="not_applicable"
        )

    @classmethod
    def failed(cls, reason: str, **details: Any) -> Score:
        """The metric could not be computed (a crashing scorer, a judge outage)."""
        return cls(value=None, reason=f"metric failed: {reason}", details=details, status="failed")

    @property
    def applicable(self) -> bool:
        return self.value is not None


# Turn records live as long as their conversation, thousands at once: slotted pydantic
# dataclasses keep them validated and serialisable at a fraction of a BaseModel's size.
_COMPACT = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True, config=_COMPACT)
class TurnTimings:
    """Seconds; ``started_at`` is a Unix timestamp."""

    started_at: float
    duration_s: float
    """The whole turn: rendering, the user side, the model call, bookkeeping."""
    latency_s: float | None = None
    """The model under test's call, from request to last byte."""
    queue_wait_s: float | None = None
    retry_wait_s: float | None = None
    ttft_s: float | None = None
    """To the first token of any kind: a reasoning model's first thought counts."""
    user_latency_s: float | None = None
    """The simulated user's call, for ``user`` turns."""
    ttfot_s: float | None = None
    """To the first output token, the answer's (what a user waits for). When not
    given, the same as ``ttft_s``: a model that does not reason aloud; a results line
    holds it only where it differs."""

    @model_validator(mode="before")
    @classmethod
    def _ttfot_defaults_to_ttft(cls, data: Any) -> Any:
        if isinstance(data, ArgsKwargs):
            if data.args:  # positional: ttfot_s is last, after every other field
                return data
            fields = dict(data.kwargs or {})
            if "ttfot_s" not in fields:
                fields["ttfot_s"] = fields.get("ttft_s")
            return ArgsKwargs((), fields)
        if isinstance(data, dict) and "ttfot_s" not in data:
            return {**data, "ttfot_s": data.get("ttft_s")}
        return data


@dataclass(frozen=True, slots=True, config=_COMPACT)
class ExtraCall:
    """A call a turn made to the model under test beyond its own answer: a prompt of
    its own (a task's ``get_model_response``), sent through the run's adapter with the
    turn's history and settings, after the turn had its answer."""

    prompt: str
    response: str | None = None
    """What the model answered; None when the call failed."""
    finish_reason: str | None = None
    usage: Usage | None = None
    latency_s: float | None = None
    """The call, from request to last byte; None when it came from the response cache."""
    attempts: int = 0
    """Calls made, retries included."""
    cached: bool = False
    """The answer came from the response cache: no call was made."""
    error: ErrorInfo | None = None
    """Why the call failed."""


ToolErrorKind = Literal[
    "unknown_tool", "invalid_arguments", "precondition", "tool_error", "timeout", "raised"
]
"""Why a tool call got an error for its result: the model named no such tool, its
arguments were not JSON or failed the tool's schema, a precondition of the tool's
operation did not hold, the tool answered with an error, it took longer than its
timeout, or its code raised."""


@dataclass(frozen=True, slots=True, config=_COMPACT)
class ToolCallRecord:
    """One tool call of an assistant turn, and what the model was told in answer."""

    round: int
    """The model call of the turn that asked for it (0: the turn's first)."""
    id: str
    name: str
    arguments: str
    """As the model wrote them (JSON text, perhaps malformed)."""
    result: str
    """The tool message's content: the tool's result, or the error the model was told."""
    error: ToolErrorKind | None = None
    """Why the result is an error; None when the tool ran and answered."""
    latency_s: float | None = None
    """From the start of the tool's run to its result."""


@dataclass(frozen=True, slots=True, config=_COMPACT)
class TurnRecord:
    """Everything about one turn; emitted to scorers as soon as the turn ends."""

    conversation_id: str
    turn_index: int
    """Position of the turn in its flow (0-based), as the guide's ``{turn_index}``."""
    turn_id: str
    role: str
    status: TurnStatus
    skip_reason: str | None = None
    prompt: str | None = None
    """The rendered prompt_template."""
    user_message: str | None = None
    """What the user said: the prompt itself, or the simulated user's reply to it."""
    messages: tuple[Message, ...] = ()
    """The messages sent to the model under test."""
    response: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    user_usage: Usage | None = None
    timings: TurnTimings | None = None
    attempts: int = 0
    """Calls to the model under test, retries included."""
    user_attempts: int = 0
    """Calls to the simulated user, retries included."""
    error: ErrorInfo | None = None
    evaluation_metrics: tuple[str, ...] = ()
    max_tokens_clipped_from: int | None = None
    """The pack's max_tokens for this turn when the user's cap (``--max-tokens``, a
    ``max_tokens`` model argument) made its model calls ask for fewer; None when the
    pack's value was kept."""
    cached: bool = False
    """The model under test's answer came from the response cache: no call was made,
    and the turn has no latency or time to first token of the model's."""
    user_cached: bool = False
    """The simulated user's message came from the response cache."""
    extra_calls: tuple[ExtraCall, ...] = ()
    """Calls to the model under test with prompts of their own, made for this turn
    while its conversation was scored; their tokens count in the conversation's usage."""
    reasoning: str | None = None
    """What a reasoning model thought before its ``response`` (never part of it);
    None when it sent none. Judges see it only with ``--judge-sees-reasoning``."""
    reasoning_tokens: int | None = None
    """Of the answer's completion tokens, those spent reasoning, as the server
    reported them; None when it reported none."""
    tool_calls: tuple[ToolCallRecord, ...] = ()
    """The tools the model called during this turn, in order, with their results."""
    tool_rounds: int = 0
    """Model calls of this turn that asked for tools (its calls are this plus one when
    it ended with an answer)."""
    tool_round_limit: bool = False
    """The turn stopped at its ``max_tool_rounds`` with the model still asking for tools."""
    environment: Any = None
    """The tools' environment document after this turn, when a tool call of the turn
    changed it; None otherwise (the latest one set is the conversation's final state)."""
    request_ids: tuple[RequestIds, ...] = ()
    """The ids of every attempt of the turn's model calls (retries and tool rounds
    included, in order; a failed turn's failing call too), to find the turn in the
    server's logs; empty when the adapter learnt none."""


class ConversationTimings(BaseModel):
    model_config = ConfigDict(frozen=True)

    started_at: float
    finished_at: float
    duration_s: float


class MetricTiers(BaseModel):
    """A pack's metrics in the tiers its config.yml declares (``metrics.primary`` and
    ``metrics.secondary``): what summaries show first, and what a bare
    ``--fail-under VALUE`` gates. Packs that declare no tiers have none (None), never
    an invented label."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    primary: tuple[str, ...] = ()
    secondary: tuple[str, ...] = ()

    def tier_of(self, metric: str) -> Literal["primary", "secondary"] | None:
        """The tier ``metric`` is in; None when it is in neither."""
        if metric in self.primary:
            return "primary"
        if metric in self.secondary:
            return "secondary"
        return None

    def ordered(self, names: list[str]) -> list[str]:
        """``names`` with the primary metrics first, then the secondary ones (each in the
        order the pack declares them), then the rest as they came."""
        tiered = [*self.primary, *(m for m in self.secondary if m not in self.primary)]
        present = set(names)
        first = [m for m in tiered if m in present]
        placed = set(first)
        return [*first, *(n for n in names if n not in placed)]

    def merged(self, other: MetricTiers) -> MetricTiers:
        """Both packs' tiers (results of several packs in one summary): a metric primary
        in either is primary."""
        primary = tuple(dict.fromkeys([*self.primary, *other.primary]))
        secondary = tuple(
            m for m in dict.fromkeys([*self.secondary, *other.secondary]) if m not in primary
        )
        return MetricTiers(primary=primary, secondary=secondary)


class ConversationResult(BaseModel):
    """One finished conversation: one line of the results file."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    """The format of the line this result was read from; for a result made in this
    process, the format it is written in (the oldest version that holds it)."""
    run_id: str
    conversation_id: str
    scenario_id: str
    scenario_type: str
    pack: str
    pack_hash: str
    model: str
    seed: int
    status: Status
    termination_reason: TerminationReason
    difficulty: str | None = None
    language: str | None = None
    """The scenario's language (a problem's ``language``, or ``metadata.language``);
    None when it gives none."""
    metric_tiers: MetricTiers | None = None
    """The pack's metric tiers (config.yml ``metrics``); None for a pack without."""
    transcript: tuple[Message, ...]
    turns: tuple[TurnRecord, ...]
    scores: dict[str, Score] = Field(default_factory=dict)
    turn_scores: dict[str, dict[str, Score]] = Field(default_factory=dict)
    """Scores of each turn's ``evaluation_metrics``, by turn_id."""
    usage: Usage = Field(default_factory=Usage)
    """Tokens the model under test's calls used in this run (answers from the response
    cache used none: their tokens are on their turns)."""
    user_usage: Usage | None = None
    cost_usd: float | None = None
    """The model under test's usage priced by its adapter; None without a price."""
    user_cost_usd: float | None = None
    """The simulated user's, kept apart."""
    error: ErrorInfo | None = None
    timings: ConversationTimings
    trial: int | None = None
    """Which of the scenario's repeated trials (``--trials``) this is, 1-based; None
    when each scenario ran once."""

    @model_validator(mode="before")
    @classmethod
    def _expand_messages(cls, data: Any) -> Any:
        """Rebuild each turn's ``messages`` from ``messages_prefix`` (schema_version 2)."""
        if not isinstance(data, dict):
            return data
        version = data.get("schema_version", 1)
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {version} was written by a newer convsim "
                f"(this one reads up to {SCHEMA_VERSION}); upgrade convsim"
            )
        if "schema_version" not in data:
            data = {
                **data,
                "schema_version": _written_version(data.get("turns"), data.get("transcript")),
            }
        turns, transcript = data.get("turns"), data.get("transcript")
        if not isinstance(turns, (list, tuple)) or not isinstance(transcript, (list, tuple)):
            return data
        if not any(isinstance(t, dict) and "messages_prefix" in t for t in turns):
            return data
        expanded = []
        for index, turn in enumerate(turns):
            if isinstance(turn, dict) and "messages_prefix" in turn:
                turn = dict(turn)
                shared = turn.pop("messages_prefix")
                if (
                    not isinstance(shared, int)
                    or isinstance(shared, bool)
                    or not 0 <= shared <= len(transcript)
                ):
                    raise ValueError(
                        f"turns[{index}].messages_prefix: {shared!r} is not a count of "
                        f"transcript messages (0 to {len(transcript)})"
                    )
                more = turn.get("messages", ())
                if not isinstance(more, (list, tuple)):
                    raise ValueError(f"turns[{index}].messages: not a list of messages")
                turn["messages"] = (*transcript[:shared], *more)
            expanded.append(turn)
        return {**data, "turns": expanded}

    @field_serializer("schema_version")
    def _written_version(self, _version: int) -> int:
        return _written_version(self.turns, self.transcript)

    @field_serializer("turns", mode="wrap")
    def _store_messages_once(
        self,
        turns: tuple[TurnRecord, ...],
        handler: SerializerFunctionWrapHandler,
        info: SerializationInfo,
    ) -> Any:
        """In JSON (the results file), each turn's messages as the transcript messages
        they start with (a count) and the rest, instead of the whole history again for
        every turn. A Python dump keeps every turn's messages whole."""
        if not info.mode_is_json():
            return handler(turns)
        transcript = self.transcript
        shared = [_shared_prefix(turn.messages, transcript) for turn in turns]
        trimmed = []
        for turn, count in zip(turns, shared, strict=True):
            if count:
                # a shallow copy holding only the rest: serialising the full history of
                # every turn first would cost what storing it once saves
                turn = _with_messages(turn, turn.messages[count:])
            trimmed.append(turn)
        dumped = handler(tuple(trimmed))
        if len(dumped) != len(turns):  # turns excluded by the caller: left as they are
            return dumped
        compact = []
        for count, data in zip(shared, dumped, strict=True):
            if not isinstance(data, dict) or "messages" not in data:
                compact.append(data)  # messages excluded by the caller
                continue
            item: dict[str, Any] = {}
            for key, value in data.items():
                if key == "messages":
                    item["messages_prefix"] = count
                elif key in _OMITTED_WHEN_FALSE and value is False:
                    continue  # lines stay as they were for runs without a cache
                elif key in _OMITTED_WHEN_EMPTY and not value:
                    continue  # lines stay as they were for turns without extra calls
                elif key in _OMITTED_WHEN_NONE and value is None:
                    continue  # lines stay as they were for models that do not reason
                elif key == "timings" and isinstance(value, dict):
                    value = _without_plain_ttfot(value)
                item[key] = value
            compact.append(item)
        return compact


def _with_messages(turn: TurnRecord, messages: tuple[Message, ...]) -> TurnRecord:
    """A copy of ``turn`` with other ``messages``, for serialising only: its fields are
    copied as they are, not validated again (three times faster than replace())."""
    copied = object.__new__(TurnRecord)
    for name in _TURN_FIELDS:
        object.__setattr__(copied, name, getattr(turn, name))
    object.__setattr__(copied, "messages", messages)
    return copied


_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(TurnRecord))

_OMITTED_WHEN_FALSE = frozenset({"cached", "user_cached", "tool_round_limit"})
"""Turn fields a results line carries only when true."""

_OMITTED_WHEN_EMPTY = frozenset({"extra_calls", "tool_calls", "tool_rounds", "request_ids"})
"""Turn fields a results line carries only when not empty."""


_OMITTED_WHEN_NONE = frozenset({"reasoning", "reasoning_tokens", "environment"})
"""Turn fields a results line carries only when set."""


def _without_plain_ttfot(timings: dict[str, Any]) -> dict[str, Any]:
    """``timings`` without ``ttfot_s`` where it says nothing ``ttft_s`` does not."""
    if "ttfot_s" in timings and timings["ttfot_s"] == timings.get("ttft_s"):
        return {k: v for k, v in timings.items() if k != "ttfot_s"}
    return timings


def _shared_prefix(messages: tuple[Message, ...], transcript: tuple[Message, ...]) -> int:
    """How many leading messages ``messages`` and ``transcript`` have in common."""
    count = 0
    for sent, kept in zip(messages, transcript, strict=False):
        if sent is not kept and sent != kept:
            break
        count += 1
    return count
