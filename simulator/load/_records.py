"""One measured request of a load run, as the driver records it on the hot path.

A plain frozen dataclass (no validation per request: the driver builds thousands a
second); the derived latencies are properties so the figures are computed in one place.
Times ending in ``_s`` are seconds: ``scheduled_s``, ``sent_s`` and ``end_s`` on the run's
clock (seconds since the run started), the others durations.
"""

from __future__ import annotations

from dataclasses import dataclass

from convsim._types import RequestIds, UsageSource

__all__ = ["RequestRecord"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one request of one session measured.

    Attributes:
        session_id: the session (conversation) the request belongs to.
        turn_index: the turn within the session, from 0.
        history_messages: how many messages the request sent (its context length).
        scheduled_s: when the request was due to be sent; None when nothing scheduled it.
        sent_s: when it was actually sent.
        ttfb_s: time from sending to the first byte of the answer; None if none came.
        ttft_s: time from sending to the first token of any kind (a reasoning model's
            first thought counts); None if none came or not streamed.
        inter_token_gaps_s: the gaps between consecutive streamed tokens (chunks).
        end_s: when the answer ended (or the request failed).
        input_tokens: prompt tokens, as the adapter reports them (see ``token_source``);
            None for a failed request.
        output_tokens: completion tokens, likewise; when a stream carried no usage and
            the server has no tokenizer, the streamed chunks (see ``output_from_chunks``).
        error: the error class of a failed request (``"Timeout"``); None when it succeeded.
    """

    session_id: str
    turn_index: int
    history_messages: int
    scheduled_s: float | None
    sent_s: float
    ttfb_s: float | None
    ttft_s: float | None
    inter_token_gaps_s: tuple[float, ...]
    end_s: float
    input_tokens: int | None
    output_tokens: int | None
    error: str | None = None
    output_from_chunks: bool = False
    """``output_tokens`` counts the stream's chunks (one token each on llama.cpp and
    vLLM), the server having reported no usage and offered no tokenizer."""
    token_source: UsageSource | None = None
    """Where the token counts came from: ``server``, ``tokenizer`` (the server's
    tokenize endpoint) or ``estimate``; None for a failed request."""
    ttfot_s: float | None = None
    """Time from sending to the first output (answer) token, after any reasoning: what
    a user waits for. The same as ``ttft_s`` for a model that does not reason aloud;
    None if no answer text came or not streamed."""
    reasoning_tokens: int | None = None
    """Of ``output_tokens``, those spent reasoning, as the server reported them
    (``completion_tokens_details.reasoning_tokens``); None when it reported none."""
    tool_round: int = 0
    """The model call of its turn: 0 the first; n the one sent after the n-th reply
    that asked for tools was answered with the workload's tool results."""
    tool_calls: int = 0
    """Tool calls the reply asked for (0 for a text answer or a failed request)."""
    offered_tools: bool = False
    """The request offered tools (a tool turn's)."""
    request_ids: tuple[RequestIds, ...] = ()
    """The ids of each attempt of the request (retries included, in order): the one
    sent (``--request-id-header``), the server's ``x-request-id`` and the answer's id;
    empty when the adapter learnt none."""
    cached_tokens: int | None = None
    """Of ``input_tokens``, those the server read from its prefix cache, as it reported
    them (``usage.prompt_tokens_details.cached_tokens``); None when it did not say."""

    @property
    def request_id(self) -> str | None:
        """The answering (or last) attempt's request id: the one sent, else the
        server's; None when there is neither."""
        if not self.request_ids:
            return None
        last = self.request_ids[-1]
        return last.sent or last.server

    @property
    def response_id(self) -> str | None:
        """The provider's id of the answer (``chatcmpl-...``); None without one."""
        return self.request_ids[-1].response if self.request_ids else None

    @property
    def opens_session(self) -> bool:
        """The first request of its session (a session's start)."""
        return self.turn_index == 0 and self.tool_round == 0

    @property
    def ok(self) -> bool:
        """True when the request succeeded."""
        return self.error is None

    @property
    def e2e_s(self) -> float:
        """End-to-end latency: from sending to the end of the answer."""
        return self.end_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: ``(e2e - ttft) / (output_tokens - 1)``;
        None without a first token or with fewer than two output tokens."""
        if self.ttft_s is None or self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def schedule_delay_s(self) -> float | None:
        """How late the request was sent against its schedule (actual minus scheduled)."""
        return None if self.scheduled_s is None else self.sent_s - self.scheduled_s
