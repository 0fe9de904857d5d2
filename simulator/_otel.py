"""Tracing and metrics through OpenTelemetry (the extra ``otel``).

The one module that imports OpenTelemetry; nothing imports it unless tracing is asked
for (``Simulator(tracing=True)``, ``convsim run/load --otel``). :class:`OpenTelemetry`
implements :class:`~convsim._telemetry.Telemetry` with the GenAI semantic conventions:

- ``convsim.conversation``: the root of one trace per conversation (linked to the span
  that was current where the run started, if any), with the run, conversation and
  scenario ids, the model, the status and the tokens;
- ``convsim.turn``: one per turn that ran, its index, id, role, status and request ids;
- ``chat {model}`` (kind CLIENT): one per model call, retries included, as the
  conventions ask of a logical operation: ``gen_ai.request.model``,
  ``gen_ai.response.id``, ``gen_ai.usage.input_tokens``/``output_tokens``, finish
  reasons, attempts and every attempt's request ids;
- ``POST`` (kind CLIENT): one per HTTP attempt under its call, with the status code,
  ``http.request.resend_count`` for retries and the attempt's request ids; it is the
  span whose context travels to the server (W3C ``traceparent``);
- ``execute_tool {name}``: one per tool call; ``convsim.score``: the conversation's
  scoring, with each metric's value;
- ``chat {model}`` of a load run: one trace per request, with its session and turn.

A failure marks its span ERROR with the cause (``error.type`` and the message; a
cancellation as ``cancelled``); every span ends however its block ends.

Metrics (the same meter): ``convsim.client.requests`` and ``convsim.client.tokens``
(counters), ``gen_ai.client.operation.duration``,
``gen_ai.client.operation.time_to_first_chunk`` and ``gen_ai.client.token.usage``
(histograms), one measurement per model call or load request.

Prompts and answers are never put on spans, nor headers other than the ids.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TextIO
from urllib.parse import urlsplit

import anyio

from ._errors import ConvsimError, MalformedResponse
from ._extras import needs_extra
from ._records import ConversationResult, Score, Status, ToolErrorKind, TurnRecord, TurnStatus
from ._secrets import redact_url
from ._telemetry import (
    AttemptSpan,
    CallSpan,
    ConversationSpan,
    ScoringSpan,
    ToolSpan,
    TurnSpan,
)
from ._types import Completion, GenerationParams, RequestIds, ToolCall
from ._version import __version__

with needs_extra("otel", "tracing (OpenTelemetry)"):
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, propagate, trace
    from opentelemetry.trace import Link, SpanKind, StatusCode

__all__ = ["OpenTelemetry", "OtelExport", "SdkSetup", "set_up_sdk"]

OtelExport = Literal["otlp", "console"]
"""Where ``--otel`` sends spans and metrics: OTLP over HTTP (configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables) or the console (standard error)."""

_SCOPE = "convsim"

_DURATION_BUCKETS: tuple[float, ...] = tuple(0.01 * 2**k for k in range(14))
"""gen_ai.client.operation.duration's buckets, as the conventions give them: 0.01 s
doubling to 81.92 s."""
_TTFT_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0),
)
"""gen_ai.client.operation.time_to_first_chunk's buckets, as the conventions give them."""
_TOKEN_BUCKETS = tuple(float(4**k) for k in range(14))
"""gen_ai.client.token.usage's buckets: 1, 4, 16, ... 67108864."""


def _ids(ids: Sequence[RequestIds]) -> list[str]:
    """Every id of ``ids`` as ``kind:value`` strings, in order (span attributes hold
    flat lists only)."""
    return [
        f"{kind}:{value}"
        for entry in ids
        for kind, value in (
            ("sent", entry.sent),
            ("server", entry.server),
            ("response", entry.response),
        )
        if value is not None
    ]


def _usage_attributes(attributes: dict[str, Any], completion: Completion) -> None:
    usage = completion.usage
    attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
    attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
    attributes["convsim.usage.source"] = usage.source


class _Span:
    """A handle on one OpenTelemetry span, for the hooks' ``finish``."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def fail(self, description: str, error_type: str) -> None:
        self.span.set_attribute("error.type", error_type)
        self.span.set_status(StatusCode.ERROR, description)


class _ConversationSpan(_Span):
    def finish(self, result: ConversationResult) -> None:
        span = self.span
        span.set_attribute("convsim.status", result.status.value)
        span.set_attribute("convsim.termination_reason", result.termination_reason.value)
        span.set_attribute("convsim.turns", len(result.turns))
        span.set_attribute("gen_ai.usage.input_tokens", result.usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", result.usage.completion_tokens)
        if result.cost_usd is not None:
            span.set_attribute("convsim.cost_usd", result.cost_usd)
        if result.status is not Status.DONE:
            error = result.error
            cause = f": {error.type}: {error.message}" if error is not None else ""
            self.fail(
                f"{result.status.value} ({result.termination_reason.value}){cause}",
                error.type if error is not None else result.termination_reason.value,
            )


class _TurnSpan(_Span):
    def finish(self, record: TurnRecord) -> None:
        span = self.span
        span.set_attribute("convsim.turn.status", record.status.value)
        span.set_attribute("convsim.attempts", record.attempts)
        if record.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", record.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", record.usage.completion_tokens)
        if record.request_ids:
            span.set_attribute("convsim.request_ids", _ids(record.request_ids))
        if record.status is TurnStatus.FAILED and record.error is not None:
            self.fail(f"{record.error.type}: {record.error.message}", record.error.type)


class _CallSpan(_Span):
    __slots__ = ("completion",)

    def __init__(self, span: trace.Span) -> None:
        super().__init__(span)
        self.completion: Completion | None = None

    def finish(self, completion: Completion) -> None:
        self.completion = completion
        attributes: dict[str, Any] = {
            "gen_ai.response.finish_reasons": [completion.finish_reason or ""],
            "convsim.attempts": completion.attempts,
            "convsim.cached": completion.cached,
        }
        if completion.model:
            attributes["gen_ai.response.model"] = completion.model
        _usage_attributes(attributes, completion)
        ids = completion.request_ids
        if ids:
            attributes["convsim.request_ids"] = _ids(ids)
            last = ids[-1]
            if last.response is not None:
                attributes["gen_ai.response.id"] = last.response
            if last.server is not None or last.sent is not None:
                attributes["convsim.request_id"] = last.server or last.sent
        if completion.timings.ttft_s is not None:
            attributes["convsim.ttft_s"] = completion.timings.ttft_s
        self.span.set_attributes(attributes)


class _AttemptSpan(_Span):
    def headers(self) -> Mapping[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # the current context: this attempt's span
        return carrier

    def answered(self, status: int | None, ids: RequestIds | None) -> None:
        span = self.span
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                self.fail(f"HTTP {status}", str(status))
        if ids is not None:
            if ids.server is not None:
                span.set_attribute("convsim.request_id.server", ids.server)
            if ids.response is not None:
                span.set_attribute("gen_ai.response.id", ids.response)


class _ToolSpan(_Span):
    def finish(self, error: ToolErrorKind | None) -> None:
        if error is not None:
            self.fail(f"the tool call failed: {error}", error)


class _ScoringSpan(_Span):
    def finish(self, scores: Mapping[str, Score]) -> None:
        failed = []
        for name, score in scores.items():
            if score.value is not None:
                self.span.set_attribute(f"convsim.score.{name}", score.value)
            elif score.status == "failed":
                failed.append(name)
        if failed:
            self.span.set_attribute("convsim.scores_failed", failed)
            self.fail(f"metrics failed: {', '.join(failed)}", "metric_failed")


def _cancelled(exc: BaseException) -> bool:
    try:
        return isinstance(exc, anyio.get_cancelled_exc_class())
    except Exception:  # no async library running: not a cancellation of one
        return False


class OpenTelemetry:
    """Telemetry through OpenTelemetry: spans of conversations, turns, model calls,
    HTTP attempts, tool calls, scoring and load requests, and the client metrics.

    Args:
        tracer_provider: where spans go; by default the application's global one
            (``opentelemetry.trace.set_tracer_provider``), so an application that
            embeds convsim gets its spans where its own go.
        meter_provider: where metrics go; by default the global one.

    Raises:
        MissingExtra: OpenTelemetry is not installed (``pip install 'convsim[otel]'``).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider=meter_provider)
        self._requests = meter.create_counter(
            "convsim.client.requests", "{request}", "Model calls made (retries count once)."
        )
        self._tokens = meter.create_counter(
            "convsim.client.tokens", "{token}", "Tokens of model calls, by gen_ai.token.type."
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            "s",
            "Duration of model calls, retries and queueing included.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._ttft = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            "s",
            "Time to the first chunk of streamed answers.",
            explicit_bucket_boundaries_advisory=_TTFT_BUCKETS,
        )
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            "{token}",
            "Input and output tokens of model calls.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )

    # -- spans ------------------------------------------------------------------------

    @contextmanager
    def _span(
        self,
        name: str,
        attributes: dict[str, Any],
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        root: bool = False,
    ) -> Iterator[trace.Span]:
        """A span current for the block and ended with it; an exception leaving the
        block marks it ERROR with its cause."""
        links: list[Link] = []
        parent = None
        if root:
            ambient = trace.get_current_span().get_span_context()
            if ambient.is_valid:
                links.append(Link(ambient, {"convsim.link": "started_from"}))
            parent = otel_context.Context()  # empty: a trace of its own
        with self._tracer.start_as_current_span(
            name,
            context=parent,
            kind=kind,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                if _cancelled(exc):
                    span.set_attribute("error.type", "cancelled")
                    span.set_status(StatusCode.ERROR, "cancelled")
                else:
                    error_type = type(exc).__name__
                    shown = _shown_error(exc)
                    span.set_attribute("error.type", error_type)
                    span.set_status(StatusCode.ERROR, shown)
                    # not record_exception: its stack and chained causes are not scrubbed
                    span.add_event(
                        "exception", {"exception.type": error_type, "exception.message": shown}
                    )
                    ids = getattr(exc, "request_ids", None)
                    if ids:
                        span.set_attribute("convsim.request_ids", _ids(ids))
                raise

    @contextmanager
    def conversation(
        self, *, run_id: str, conversation_id: str, scenario_id: str, model: str
    ) -> Iterator[ConversationSpan]:
        attributes = {
            "convsim.run_id": run_id,
            "convsim.conversation_id": conversation_id,
            "gen_ai.conversation.id": conversation_id,
            "convsim.scenario_id": scenario_id,
            "convsim.model": model,
        }
        with self._span("convsim.conversation", attributes, root=True) as span:
            yield _ConversationSpan(span)

    @contextmanager
    def turn(
        self, *, conversation_id: str, turn_index: int, turn_id: str, role: str
    ) -> Iterator[TurnSpan]:
        attributes = {
            "convsim.conversation_id": conversation_id,
            "convsim.turn_index": turn_index,
            "convsim.turn_id": turn_id,
            "convsim.role": role,
        }
        with self._span("convsim.turn", attributes) as span:
            yield _TurnSpan(span)

    @contextmanager
    def model_call(
        self, *, model: str, provider: str, role: str, params: GenerationParams
    ) -> Iterator[CallSpan]:
        attributes = _request_attributes(model, params)
        attributes["gen_ai.provider.name"] = provider
        attributes["convsim.role"] = role
        with self._measured(f"chat {model}", attributes, root=False) as span:
            yield span

    @contextmanager
    def load_request(
        self, *, model: str, provider: str, session_id: str, turn_index: int, tool_round: int
    ) -> Iterator[CallSpan]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": provider,
            "convsim.role": "load",
            "convsim.session_id": session_id,
            "convsim.turn_index": turn_index,
        }
        if tool_round:
            attributes["convsim.tool_round"] = tool_round
        with self._measured(f"chat {model}", attributes, root=True) as span:
            yield span

    @contextmanager
    def _measured(
        self, name: str, attributes: dict[str, Any], *, root: bool
    ) -> Iterator[_CallSpan]:
        """A model call's span, and its metrics once it ends."""
        started = time.perf_counter()
        labels = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": attributes["gen_ai.provider.name"],
            "gen_ai.request.model": attributes["gen_ai.request.model"],
            "convsim.role": attributes["convsim.role"],
        }
        handle: _CallSpan | None = None
        try:
            with self._span(name, attributes, kind=SpanKind.CLIENT, root=root) as span:
                handle = _CallSpan(span)
                yield handle
        except BaseException as exc:
            labels["error.type"] = "cancelled" if _cancelled(exc) else type(exc).__name__
            raise
        finally:
            self._record(labels, time.perf_counter() - started, handle)

    def _record(self, labels: dict[str, str], elapsed_s: float, handle: _CallSpan | None) -> None:
        self._requests.add(1, labels)
        self._duration.record(elapsed_s, labels)
        completion = handle.completion if handle is not None else None
        if completion is None or completion.cached:
            return
        usage = completion.usage
        for kind, count in (("input", usage.prompt_tokens), ("output", usage.completion_tokens)):
            typed = {**labels, "gen_ai.token.type": kind}
            self._tokens.add(count, typed)
            self._token_usage.record(count, typed)
        if completion.timings.ttft_s is not None:
            self._ttft.record(completion.timings.ttft_s, labels)

    @contextmanager
    def attempt(
        self, *, model: str, url: str, number: int, sent_id: str | None
    ) -> Iterator[AttemptSpan]:
        where = urlsplit(url)
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "url.full": url,
            "server.address": where.hostname or "",
            "gen_ai.request.model": model,
        }
        if where.port is not None:
            attributes["server.port"] = where.port
        if number > 1:
            attributes["http.request.resend_count"] = number - 1
        if sent_id is not None:
            attributes["convsim.request_id.sent"] = sent_id
        with self._span("POST", attributes, kind=SpanKind.CLIENT) as span:
            yield _AttemptSpan(span)

    @contextmanager
    def tool_call(self, *, call: ToolCall) -> Iterator[ToolSpan]:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
        }
        with self._span(f"execute_tool {call.name}", attributes) as span:
            yield _ToolSpan(span)

    @contextmanager
    def scoring(self, *, conversation_id: str) -> Iterator[ScoringSpan]:
        with self._span("convsim.score", {"convsim.conversation_id": conversation_id}) as span:
            yield _ScoringSpan(span)


def _request_attributes(model: str, params: GenerationParams) -> dict[str, Any]:
    """The conventions' request attributes of a call with ``params``."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
    for name, value in (
        ("gen_ai.request.max_tokens", params.max_tokens),
        ("gen_ai.request.temperature", params.temperature),
        ("gen_ai.request.top_p", params.top_p),
        ("gen_ai.request.seed", params.seed),
    ):
        if value is not None:
            attributes[name] = value
    return attributes


# -- the SDK, for the command line -------------------------------------------------


@dataclass(frozen=True)
class SdkSetup:
    """The providers ``--otel`` set up for this process; :meth:`shutdown` flushes them."""

    tracer_provider: Any
    meter_provider: Any

    def shutdown(self) -> None:
        """Export what is buffered and stop (spans first: they are what a run waits on)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def set_up_sdk(export: OtelExport, *, out: TextIO | None = None) -> SdkSetup:
    """Set up OpenTelemetry's SDK as this process's global providers, exporting to
    ``export``: OTLP over HTTP (endpoint, headers and the rest from the standard
    ``OTEL_EXPORTER_OTLP_*`` variables; the service name from ``OTEL_SERVICE_NAME``, else
    ``convsim``) or the console (``out``, standard error by default, so a command's own
    output stays clean).

    Raises:
        MissingExtra: the SDK or the OTLP exporter is not installed.
    """
    with needs_extra("otel", f"--otel {export}"):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            MetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )

        resource = Resource({"service.name": "convsim", "service.version": __version__}).merge(
            OTELResourceDetector().detect()
        )
        processor: SpanProcessor
        metric_exporter: MetricExporter
        if export == "console":
            stream = out if out is not None else sys.stderr
            processor = SimpleSpanProcessor(ConsoleSpanExporter(out=stream))
            metric_exporter = ConsoleMetricExporter(out=stream)
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processor = BatchSpanProcessor(OTLPSpanExporter())
            metric_exporter = OTLPMetricExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter)]
    )
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    return SdkSetup(tracer_provider, meter_provider)


def _shown_error(exc: BaseException) -> str:
    """What a span says of a failure: a convsim error's message with the secrets of
    every URL in it masked (a transport's error names the URL, keys in its query
    included, before the adapter scrubs it), else the type alone; a malformed answer's
    message may quote the answer, which spans never carry."""
    if isinstance(exc, ConvsimError) and not isinstance(exc, MalformedResponse):
        # the transport's errors come before the adapter scrubs: every URL is masked here
        return _URL_IN_TEXT.sub(lambda m: redact_url(m.group()), f"{type(exc).__name__}: {exc}")
    return type(exc).__name__


_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
