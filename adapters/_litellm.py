"""Providers beyond OpenAI-compatible APIs, through LiteLLM (``litellm:PROVIDER/MODEL``).

LiteLLM speaks Bedrock (SigV4), Vertex and Gemini (OAuth), Azure deployments, Cohere,
Mistral and the rest. It only sends the call: budgets, the concurrency cap, retries,
usage, timings, cost and key redaction are :class:`HttpModelAdapter`'s, as for every
other adapter, and LiteLLM's own retries and cache are off so that convsim's accounting
stays the one truth. ``litellm`` is an optional extra, imported when the first such
model is built (it takes seconds to import), never by ``import convsim.adapters``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar, NoReturn

import anyio

from convsim._errors import (
    AdapterError,
    AuthError,
    ConfigError,
    EndpointError,
    MalformedResponse,
    ServerError,
    Timeout,
)
from convsim._extras import needs_extra
from convsim._secrets import redact_url
from convsim._types import Cost, GenerationParams, Message, ModelInfo, ToolCall, Usage

from ._budget import Budgets
from ._egress import EgressPolicy
from ._http import SSEEvent
from ._http_adapter import (
    Delta,
    Exchange,
    HttpAdapterConfig,
    HttpModelAdapter,
    HttpRequest,
    ParsedAnswer,
    _Answer,
    _causes,
    _finish_reason,
    _Seen,
    _unreachable,
    _valid_usage,
)
from ._openai_tools import arguments_text, openai_messages, openai_tool_fields
from ._pricing import price_of
from ._protocol import LogprobsUnsupported
from ._retry import error_for_status
from ._streamed_answer import StreamedAnswer
from ._text import repair_text
from ._tool_stream import ToolCallPiece

__all__ = ["LitellmConfig", "LitellmAdapter", "import_litellm"]

FEATURE = "litellm models"


def import_litellm() -> ModuleType:
    """LiteLLM, set up for convsim: its cost table read from the package (a run never
    fetches it over the network), its telemetry and its help banners off.

    Raises:
        MissingExtra: the ``litellm`` extra is not installed.
    """
    # read before the import: LiteLLM fetches its price table from GitHub otherwise
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with needs_extra("litellm", FEATURE):
        import litellm
    litellm.telemetry = False
    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" on stdout
    return litellm


class LitellmConfig(HttpAdapterConfig):
    """``--model-arg`` values of a LiteLLM model; ``model`` is LiteLLM's route
    (``bedrock/anthropic.claude-3-haiku-20240307-v1:0``, ``azure/DEPLOYMENT``)."""

    api_version: str | None = None
    """The API version (Azure OpenAI deployments)."""
    aws_region_name: str | None = None
    """The AWS region (Bedrock); else LiteLLM reads AWS_REGION_NAME / AWS_REGION."""
    vertex_project: str | None = None
    """The Google Cloud project (Vertex AI); else LiteLLM reads VERTEXAI_PROJECT."""
    vertex_location: str | None = None
    """The Google Cloud region (Vertex AI); else LiteLLM reads VERTEXAI_LOCATION."""


_ONE_TOKEN = GenerationParams(max_tokens=1)

_PASSED_THROUGH = ("api_version", "aws_region_name", "vertex_project", "vertex_location")


class LitellmAdapter(HttpModelAdapter):
    """``litellm:PROVIDER/MODEL``: a call through :func:`litellm.acompletion`.

    Credentials are LiteLLM's: the provider's own environment variables
    (``AWS_ACCESS_KEY_ID``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_API_KEY``,
    ``COHERE_API_KEY``...) unless ``api_key`` or ``api_key_env`` names one. ``base_url``
    is LiteLLM's ``api_base`` (a proxy, an Azure resource, a local server). Cost comes
    from ``input_price``/``output_price``, else convsim's pricing file under the route's
    provider, else LiteLLM's own price table.
    """

    model_type: ClassVar[str] = "litellm"
    provider: ClassVar[str] = "litellm"
    Config: ClassVar[type[HttpAdapterConfig]] = LitellmConfig
    config: LitellmConfig

    def __init__(
        self,
        config: HttpAdapterConfig | Mapping[str, Any],
        *,
        budgets: Budgets | None = None,
        env: Mapping[str, str] | None = None,
        egress: EgressPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        if egress is not None:
            raise ConfigError(
                "litellm models cannot be held to an egress policy (LiteLLM makes its own "
                "connections)"
            )
        super().__init__(config, budgets=budgets, env=env, sleep=sleep)
        route, sep, name = self.config.model.partition("/")
        if not sep or not route or not name:
            raise ConfigError(
                f"litellm:{self.config.model}: expected litellm:PROVIDER/MODEL, e.g. "
                "'litellm:bedrock/anthropic.claude-3-haiku-20240307-v1:0' or "
                "'litellm:azure/my-deployment'"
            )
        self.route = route
        """LiteLLM's provider (``bedrock``, ``vertex_ai``, ``azure``, ``cohere``...)."""
        self._litellm = import_litellm()

    def _base_url_from(self, env: Mapping[str, str]) -> str | None:
        # without base_url LiteLLM finds the provider's endpoint itself; the route stands
        # for it in the budgets' key and in messages
        return f"litellm://{self.config.model.partition('/')[0] or 'default'}"

    # -- what the adapter says about its model ------------------------------------------

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            model_id=self.config.model,
            model_type=self.model_type,
            provider=self.route,
            capabilities=("text_generation", "chat"),
            context_length=self.config.context_length,
            supports_streaming=self.supports_streaming,
        )

    def usage_cost(self, usage: Usage) -> Cost | None:
        """The price of ``usage``: ``input_price``/``output_price`` where given, else
        convsim's pricing file (the route's provider and model), else LiteLLM's table;
        None when none of them knows the model."""
        listed = price_of(self.route, self.config.model.partition("/")[2])
        input_price = self.config.input_price
        output_price = self.config.output_price
        if listed is not None:
            input_price = listed.input_per_mtok if input_price is None else input_price
            output_price = listed.output_per_mtok if output_price is None else output_price
        if input_price is None or output_price is None:
            table = self._table_prices()
            if table is None:
                return None
            input_price = table[0] if input_price is None else input_price
            output_price = table[1] if output_price is None else output_price
        prompt = usage.prompt_tokens * input_price / 1e6
        completion = usage.completion_tokens * output_price / 1e6
        return Cost(prompt_cost=prompt, completion_cost=completion, total_cost=prompt + completion)

    def _table_prices(self) -> tuple[float, float] | None:
        """USD per million input and output tokens in LiteLLM's table; None if absent."""
        try:
            prompt, completion = self._litellm.cost_per_token(
                model=self.config.model, prompt_tokens=10**6, completion_tokens=10**6
            )
        except Exception:  # LiteLLM raises a bare Exception for a model it has no price for
            return None
        return float(prompt), float(completion)

    async def preflight(self) -> None:
        """One generation of one token, not retried (the providers LiteLLM reaches list
        their models each their own way, if at all). Raises EndpointError on a refused
        connection, an unknown host, a refused key (401/403) or an unknown model or path
        (404); any other answer passes (the run's retries and circuit breaker handle
        those)."""
        kwargs = self.arguments([Message(role="user", content="Hi")], _ONE_TOKEN, stream=False)
        try:
            await self._litellm.acompletion(**kwargs)
        except Exception as exc:
            where = f"litellm:{self.config.model}"
            if self.config.base_url is not None:
                self._raise_unreachable(exc)
            elif _unreachable(exc, self.base_url) is not None:
                raise EndpointError(f"{where}: the provider cannot be reached", url=None) from exc
            refused = _refused_before_sending(exc)
            if refused is not None:
                raise EndpointError(
                    f"{where}: nothing was sent: {refused} (give api_key or api_key_env)",
                    url=redact_url(self.base_url),
                ) from exc
            status = getattr(exc, "status_code", None)
            if status in (401, 403, 404):
                said = " ".join(self._scrub(str(exc)).split())[:200]
                advice = "check the provider's credentials" if status != 404 else "check the model"
                raise EndpointError(
                    f"{status} from {where}: {advice} ({said})",
                    url=redact_url(self.base_url),
                    status_code=status,
                ) from exc

    async def aclose(self) -> None:
        return None  # LiteLLM holds its own clients

    # -- one attempt ----------------------------------------------------------------

    def arguments(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> dict[str, Any]:
        """The keyword arguments of :func:`litellm.acompletion` for one attempt."""
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": openai_messages(messages),
            "timeout": cfg.timeout,
            # convsim retries and caches; LiteLLM (and the SDKs under it) must not
            "num_retries": 0,
            "max_retries": 0,
            "caching": False,
        }
        if cfg.base_url is not None:
            kwargs["api_base"] = self.base_url
        if self._api_key:
            kwargs["api_key"] = self._api_key
        for name in _PASSED_THROUGH:
            value = getattr(cfg, name)
            if value is not None:
                kwargs[name] = value
        for name in (
            *("temperature", "top_p", "max_tokens", "seed"),
            *("frequency_penalty", "presence_penalty"),
        ):
            value = getattr(params, name)
            if value is not None:
                kwargs[name] = value
        if params.stop:
            kwargs["stop"] = list(params.stop)
        kwargs.update(openai_tool_fields(params))  # LiteLLM maps them for each provider
        if stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    async def _send(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        stream: bool,
        on_text: Callable[[str], None] | None,
        *,
        exchange: Exchange | None = None,
        headers: Mapping[str, str] | None = None,
        seen: _Seen | None = None,
    ) -> _Answer:
        """One call through LiteLLM; of ``headers``, those beyond the adapter's own (a
        request id, the trace context) go with it as LiteLLM's ``extra_headers``."""
        if exchange is not None:
            raise LogprobsUnsupported(self.no_prompt_logprobs_reason())
        kwargs = self.arguments(messages, params, stream)
        if headers is not None and headers is not self._headers:
            extra = {k: v for k, v in headers.items() if k not in self._headers}
            if extra:
                kwargs["extra_headers"] = extra
        t0 = time.perf_counter()
        try:
            response = await self._litellm.acompletion(**kwargs)
            if stream:
                return await self._read_chunks(response, t0, on_text)
            return self._read_answer(response, t0)
        except AdapterError:
            raise
        except Exception as exc:
            self._raise_mapped(exc)

    def _read_answer(self, response: Any, t0: float) -> _Answer:
        try:
            choice = response.choices[0]
            text = repair_text(choice.message.content or "")
            finish = choice.finish_reason
            usage = _valid_usage(self._server_usage(getattr(response, "usage", None)))
            calls = tuple(
                ToolCall(
                    id=call.id or f"call_{i}",
                    name=call.function.name,
                    arguments=repair_text(arguments_text(call.function.arguments)).text,
                )
                for i, call in enumerate(getattr(choice.message, "tool_calls", None) or ())
            )
        except Exception as exc:  # any misshapen answer, whatever LiteLLM made of it
            raise MalformedResponse(
                f"unreadable response from {self.config.model}: {exc}",
                snippet=self._scrub(repr(response))[:200],
                model=self.config.model,
            ) from exc
        return _Answer(
            text.text,
            _finish_reason(finish),
            usage,  # None: the base counts or estimates it once the call is over
            time.perf_counter() - t0,
            replaced_chars=text.replaced,
            tool_calls=calls,
        )

    async def _read_chunks(
        self,
        chunks: Any,
        t0: float,
        on_text: Callable[[str], None] | None,
    ) -> _Answer:
        """Read a stream: the time to the first piece of text, the gaps between pieces,
        and the usage the provider sent with the last chunk."""
        answer = StreamedAnswer(t0, on_text)
        finish_reason: str | None = None
        usage: Usage | None = None

        async for chunk in chunks:
            usage = self._server_usage(getattr(chunk, "usage", None)) or usage
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            finish_reason = choice.finish_reason or finish_reason
            thought = getattr(choice.delta, "reasoning_content", None)
            if isinstance(thought, str) and thought:
                answer.feed_reasoning(thought)
            piece = getattr(choice.delta, "content", None)
            if piece:
                answer.feed(piece)
            for call in getattr(choice.delta, "tool_calls", None) or ():
                function = getattr(call, "function", None)
                answer.feed_tool_call(
                    ToolCallPiece(
                        getattr(call, "index", None),
                        id=getattr(call, "id", None),
                        name=getattr(function, "name", None),
                        arguments=arguments_text(getattr(function, "arguments", None)),
                    )
                )
        answer.close()
        if not _server_counted(chunks):
            usage = None  # LiteLLM's own count of the text, not the provider's
        return _Answer(
            answer.text,
            _finish_reason(finish_reason),
            _valid_usage(usage),  # None: the base estimates it from the chunks
            time.perf_counter() - t0,
            answer.ttft_s,
            tuple(answer.gaps),
            answer.replaced_chars,
            answer.reasoning,
            None,
            answer.ttfot_s,
            answer.tool_calls,
        )

    @staticmethod
    def _server_usage(data: Any) -> Usage | None:
        """The provider's token counts as LiteLLM passes them on; None when it sent none
        (LiteLLM then leaves the counts at zero)."""
        if data is None:
            return None
        prompt = int(getattr(data, "prompt_tokens", 0) or 0)
        completion = int(getattr(data, "completion_tokens", 0) or 0)
        if not prompt and not completion:
            return None
        # LiteLLM puts every provider's cache reads (Anthropic's cache_read_input_tokens
        # too) where OpenAI does; None when the provider did not say
        details = getattr(data, "prompt_tokens_details", None)
        if isinstance(details, dict):
            reported = details.get("cached_tokens")
        else:
            reported = getattr(details, "cached_tokens", None)
        cached = None if reported is None else min(max(int(reported), 0), prompt)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            cached_prompt_tokens=cached or 0,
            cached_tokens=cached,
        )

    def _raise_mapped(self, exc: Exception) -> NoReturn:
        """Raise the convsim error for a LiteLLM (or provider SDK) exception, so that
        retries, Retry-After and the circuit breaker work as for any adapter."""
        litellm = self._litellm
        model = self.config.model
        where = f"litellm:{model}"
        refused = _refused_before_sending(exc)
        if refused is not None:  # a missing key, say: the SDK sent nothing, and never will
            raise AuthError(f"not sent: {where}: {refused}", model=model) from exc
        if isinstance(exc, litellm.Timeout):
            raise Timeout(f"request timed out: {where}: {exc}", model=model) from exc
        if isinstance(exc, litellm.APIConnectionError):
            # LiteLLM reports a dropped connection, and some 5xx, without a status
            raise ServerError(f"connection failed: {where}: {exc}", model=model) from exc
        status = getattr(exc, "status_code", None)
        if isinstance(status, int) and status >= 300:
            raise error_for_status(
                status,
                _headers(exc),
                str(exc).encode(),
                model=model,
                url=where,
                secret=self._api_key,
            ) from exc
        raise MalformedResponse(f"{where}: {type(exc).__name__}: {exc}", model=model) from exc

    # -- the HTTP base's hooks: LiteLLM builds and reads the calls itself --------------

    def request(
        self, messages: Sequence[Message], params: GenerationParams, stream: bool
    ) -> HttpRequest:
        raise NotImplementedError("LiteLLM builds the request")

    def parse_response(self, data: Any) -> ParsedAnswer:
        raise NotImplementedError("LiteLLM reads the answer")

    def parse_event(self, event: SSEEvent) -> Delta:
        raise NotImplementedError("LiteLLM reads the stream")


def _server_counted(stream: Any) -> bool:
    """Whether the provider sent usage in a stream LiteLLM read.

    Asked for usage (``include_usage``), LiteLLM ends every stream with a usage chunk,
    counting the text itself when the provider sent none; the chunks it kept as received
    tell the two apart. A stream without them counts as not the provider's.
    """
    received = getattr(stream, "chunks", None)
    if not isinstance(received, list):
        return False
    return any(getattr(chunk, "usage", None) is not None for chunk in received)


def _refused_before_sending(exc: BaseException) -> BaseException | None:
    """The OpenAI SDK's own refusal to send a call (no API key, most often), which
    LiteLLM reports as a 500; None when the call went out."""
    from openai import OpenAIError  # LiteLLM's dependency, imported with it

    for cause in _causes(exc):
        if type(cause) is OpenAIError:  # its subclasses are the API's answers
            return cause
    return None


def _headers(exc: Exception) -> Mapping[str, str]:
    """The response headers an exception carries (Retry-After), lower-cased."""
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    try:
        return {str(k).lower(): str(v) for k, v in dict(headers or {}).items()}
    except (TypeError, ValueError):
        return {}
