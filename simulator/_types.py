"""Typed values exchanged with model adapters."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

__all__ = [
    "Role",
    "ToolCall",
    "ToolSpec",
    "ToolChoice",
    "Message",
    "Usage",
    "UsageSource",
    "USAGE_SOURCES",
    "CallTimings",
    "RequestIds",
    "Completion",
    "GenerationParams",
    "ModelInfo",
    "RateLimits",
    "Cost",
]

Role = Literal["system", "user", "assistant", "tool"]

UsageSource = Literal["server", "tokenizer", "estimate"]
"""Where a usage figure came from: the server's own count, the server's tokenizer (or
tiktoken's) run on the text by convsim, or a client-side estimate (four characters a
token)."""

USAGE_SOURCES: tuple[UsageSource, ...] = ("server", "tokenizer", "estimate")
"""Every source, from the most to the least exact: a sum takes the least exact."""


def _is_none(value: object) -> bool:
    return value is None


# Messages and usage are created for every turn and held for a conversation's life:
# slotted pydantic dataclasses keep them validated but small (no __dict__, no field set).
_COMPACT = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True, config=_COMPACT)
class ToolCall:
    """A model's request to run one tool, as the model wrote it."""

    id: str
    """The call's id, which the tool's answer quotes (``tool_call_id``)."""
    name: str
    arguments: str
    """The arguments as the JSON text the model sent: kept as written, so arguments that
    are not valid JSON are recorded, answered with a tool error and scored as such."""

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a JSON object; ValueError when they are not one."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments are not valid JSON: {exc.msg} (at {exc.pos})") from None
        if not isinstance(value, dict):
            raise ValueError(f"arguments are a JSON {type(value).__name__}, not an object")
        return value


@dataclass(frozen=True, slots=True, config=_COMPACT)
class Message:
    """One chat message.

    Text messages have a role and content only. An assistant message may ask for tools
    (``tool_calls``; its content may then be empty) and may carry what a reasoning model
    thought (``reasoning``: recorded, never sent back to a model). A ``tool`` message
    answers one call: ``tool_call_id`` and the tool's ``name``, its result as content.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    """The tool a ``tool`` message answers for."""
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _only_what_is_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A text message as ``{role, content}``, as results files always held it; tool
        fields only where set."""
        if not (self.tool_calls or self.tool_call_id or self.name or self.reasoning):
            return {"role": self.role, "content": self.content}
        data = handler(self)
        return {k: v for k, v in data.items() if v or k in ("role", "content")}

    @property
    def plain(self) -> bool:
        """A text message: no tool call, no tool result."""
        return not self.tool_calls and self.role != "tool"


class ToolSpec(BaseModel):
    """A tool offered to the model: its name, what it does, and its arguments' JSON
    schema (sent as OpenAI ``tools[].function`` and Anthropic ``tools[]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


ToolChoice = str
"""``auto`` (the model decides), ``required`` (it must call a tool), ``none`` (it
must not) or a tool's name (it must call that one)."""


@dataclass(frozen=True, slots=True, config=_COMPACT)
class Usage:
    """Token counts of one call (or a sum of calls), and where they came from."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = False
    """True when the counts are a client-side estimate: ``source == "estimate"``, kept
    in step with it (files and callers that know only this flag still read)."""
    source: UsageSource = "server"
    """Where the counts came from. When only ``estimated`` is given (results written
    before the source was recorded), it is ``estimate`` if that is true, else
    ``server``."""

    cached_prompt_tokens: int = 0
    """Of ``prompt_tokens``, those the server read from its prompt cache (as it reports
    them), priced at the model's cached-input rate."""
    cached_tokens: int | None = Field(default=None, exclude_if=_is_none)
    """The same count as the server reported it (OpenAI
    ``usage.prompt_tokens_details.cached_tokens``, Anthropic
    ``cache_read_input_tokens``), for prefix-cache hit rates; None when the server did
    not say, which is not 0 (a miss). Left out of a dump when None, so results lines
    without it are as before."""

    @model_validator(mode="before")
    @classmethod
    def _source_and_flag_agree(cls, data: Any) -> Any:
        """Fill whichever of ``source`` and ``estimated`` was left out from the other."""
        fields = data
        if isinstance(data, ArgsKwargs):  # a call: name the positional arguments
            names = ("prompt_tokens", "completion_tokens", "total_tokens", "estimated", "source")
            fields = {**dict(zip(names, data.args, strict=False)), **(data.kwargs or {})}
        if not isinstance(fields, dict):
            return data
        source, flag = fields.get("source"), fields.get("estimated")
        if source is None and flag is None:
            return data
        if source is None:
            fields = {**fields, "source": "estimate" if flag else "server"}
        elif flag is None:
            fields = {**fields, "estimated": source == "estimate"}
        elif bool(flag) != (source == "estimate"):
            raise ValueError(f"estimated={flag!r} contradicts source={source!r}")
        return ArgsKwargs((), fields) if isinstance(data, ArgsKwargs) else fields

    def __add__(self, other: Usage) -> Usage:
        source = max(self.source, other.source, key=USAGE_SOURCES.index)
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            source=source,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
            cached_tokens=(
                None
                if self.cached_tokens is None and other.cached_tokens is None
                else (self.cached_tokens or 0) + (other.cached_tokens or 0)
            ),
        )


class CallTimings(BaseModel):
    """Where the time of one model call went, in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_wait_s: float = 0.0
    """Time spent waiting for a rate budget or a concurrency slot."""
    retry_wait_s: float = 0.0
    """Time spent on failed attempts and the back-off between them."""
    ttft_s: float | None = None
    """Time to the first token of any kind (reasoning or answer); None when the call
    did not stream."""
    ttfot_s: float | None = None
    """Time to the first output token: the answer's, after any reasoning. The same as
    ``ttft_s`` for a model that does not reason aloud (and when not given); None when
    the call did not stream or no answer text came."""
    total_s: float = 0.0
    """From sending the request (after the queue) to the last byte."""
    inter_token_s: tuple[float, ...] = ()
    """Gaps between streamed chunks; empty when the call did not stream."""
    count_s: float = 0.0
    """Time spent after the answer counting its tokens with the server's tokenizer (it
    sent no usage): the client's time, not the model's."""

    @model_validator(mode="before")
    @classmethod
    def _ttfot_defaults_to_ttft(cls, data: Any) -> Any:
        """An adapter that knows nothing of reasoning gives ``ttft_s`` only: its first
        token is its first output token."""
        if isinstance(data, dict) and "ttfot_s" not in data:
            return {**data, "ttfot_s": data.get("ttft_s")}
        return data


@dataclass(frozen=True, slots=True, config=_COMPACT)
class RequestIds:
    """The ids one attempt of a model call is known by, to join it to the server's logs
    and traces. Ids only: never a header's other content, never a key."""

    sent: str | None = None
    """The id convsim sent in the request (``--request-id-header``); None when it sent
    none."""
    server: str | None = None
    """The id the server answered with in its ``x-request-id`` header (Anthropic's
    ``request-id``); None when it sent none."""
    response: str | None = None
    """The provider's own id of the answer (OpenAI ``chatcmpl-...``, Anthropic
    ``msg_...``); None when the answer carried none (a failed attempt)."""

    @model_serializer(mode="wrap")
    def _only_what_is_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Only the ids there are: a results line carries no nulls for them."""
        return {k: v for k, v in handler(self).items() if v is not None}

    @classmethod
    def of(cls, sent: str | None, server: str | None, response: str | None) -> RequestIds:
        """Ids already checked to be strings or None, without validating them again: an
        HTTP adapter makes one per call, and validation would cost it more than the
        rest of reading the ids."""
        ids = object.__new__(cls)
        _SET_SENT(ids, sent)  # the slots' own setters: frozen, so __setattr__ refuses
        _SET_SERVER(ids, server)
        _SET_RESPONSE(ids, response)
        return ids

    def as_dict(self) -> dict[str, str]:
        """The ids there are, by kind (``sent``, ``server``, ``response``)."""
        pairs = (("sent", self.sent), ("server", self.server), ("response", self.response))
        return {kind: value for kind, value in pairs if value is not None}

    @property
    def any(self) -> str | None:
        """The id to show where one is enough: the one sent, else the server's, else
        the answer's."""
        return self.sent or self.server or self.response


_SET_SENT = RequestIds.__dict__["sent"].__set__
_SET_SERVER = RequestIds.__dict__["server"].__set__
_SET_RESPONSE = RequestIds.__dict__["response"].__set__


class Completion(BaseModel):
    """What a model call returned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    finish_reason: str | None = "stop"
    usage: Usage = Field(default_factory=Usage)
    timings: CallTimings = Field(default_factory=CallTimings)
    attempts: int = 1
    model: str | None = None
    replaced_chars: int = 0
    """Characters of the answer that were not valid Unicode (lone UTF-16 surrogates:
    half an emoji) and were replaced with U+FFFD; 0 for a clean answer."""
    cached: bool = False
    """Answered from the response cache: no call was made, so ``attempts`` is 0 and
    ``timings`` measure nothing."""
    reasoning: str | None = None
    """What a reasoning model thought before it answered (``reasoning_content`` or
    ``reasoning`` on OpenAI-compatible servers, Anthropic thinking blocks); None when
    the server sent none. Never part of ``text``."""
    reasoning_tokens: int | None = None
    """Of ``usage.completion_tokens``, those spent reasoning, as the server reports
    them (``completion_tokens_details.reasoning_tokens``); None when it reports none."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tools the model asked to run (``finish_reason`` is then usually ``tool_calls``);
    ``text`` may be empty or say something beside them."""
    request_ids: tuple[RequestIds, ...] = ()
    """The ids of each attempt of the call, in order (the last one answered); empty when
    the adapter learnt none (no HTTP, or a server that sends no id)."""


class GenerationParams(BaseModel):
    """Sampling settings for one call; None leaves the backend's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: tuple[str, ...] | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    """Penalise tokens by how often they already appeared (OpenAI's range, -2 to 2).
    Sent by OpenAI-compatible adapters and LiteLLM; the Anthropic API has no such
    setting and refuses a turn that sets it; the guide's ``/generate`` body has none."""
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    """Penalise tokens that already appeared at all (OpenAI's range, -2 to 2); sent
    where ``frequency_penalty`` is."""
    min_tokens: int | None = Field(default=None, gt=0)
    """At least this many tokens (vLLM, SGLang): with ``max_tokens``, an exact output
    length for load tests. Sent by OpenAI-compatible adapters; others ignore it."""
    ignore_eos: bool | None = None
    """Keep generating past the end-of-sequence token (vLLM, SGLang, llama.cpp)."""
    seed: int | None = None
    """Per-conversation seed derived from the run seed; backends that accept one get it."""
    reference: str | None = None
    """A reference answer the pack gives for this turn. Offline adapters (scripted) may
    answer with it; adapters that call a real model never send it."""
    tools: tuple[ToolSpec, ...] | None = None
    """Tools the model may call; None (or empty) offers none."""
    tool_choice: ToolChoice | None = None
    """``auto``, ``required``, ``none`` or a tool's name; None leaves the backend's
    default (``auto`` when tools are offered)."""
    parallel_tool_calls: bool | None = None
    """Whether the model may ask for several tools in one answer (OpenAI); None leaves
    the backend's default."""
    metadata: Mapping[str, str] = Field(default_factory=dict)
    """conversation_id, scenario_id, turn_id and role, for tracing; never sent as text."""

    def merged(self, overrides: GenerationParams | Mapping[str, Any]) -> GenerationParams:
        """Return a copy where every non-None field of ``overrides`` wins."""
        data = (
            {name: getattr(overrides, name) for name in type(overrides).model_fields}
            if isinstance(overrides, BaseModel)
            else dict(overrides)
        )
        update = {k: v for k, v in data.items() if v is not None and v != {}}
        return self.model_copy(update=update) if update else self


class ModelInfo(BaseModel):
    """What an adapter says about the model behind it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str
    model_type: str
    provider: str
    capabilities: tuple[str, ...] = ("text_generation",)
    context_length: int | None = None
    supports_streaming: bool = False


class RateLimits(BaseModel):
    """The budgets an adapter runs under; None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    requests_per_day: float | None = None
    concurrency: int | None = None


class Cost(BaseModel):
    """Estimated price of some usage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_cost: float = 0.0
    completion_cost: float = 0.0
    total_cost: float = 0.0
    currency: str = "USD"
