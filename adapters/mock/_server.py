"""The mock model server: an aiohttp application with controllable latency, limits and
faults, answering with the deterministic model of :mod:`convsim.adapters._recall`.

It runs inside the caller's asyncio event loop, so tests and benchmarks can point real
HTTP clients at it. Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /generate`` (the developer guide's backend), and vLLM's
``POST /tokenize``. Per request, in this order: the API key (401), the ``rpm`` window
(429), the body (400), an injected fault (``fault_rate``), then the answer after the
configured time to first token and inter-token latency. A request's ``x-request-id``
header comes back on its answer, as vLLM and most proxies send it.

Replies are cached per conversation (validated ``Message`` objects are built only on a
cache miss), and a zero delay never reaches the sleep function. One core answers well
over 10,000 small chat completions per second (``tests/bench/bench_mock_server.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import math
import random
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

from aiohttp import web

from convsim._errors import parse_config
from convsim._log import get_logger
from convsim._plural import counted
from convsim._types import ToolCall

from .._tool_policy import next_tool_step
from ._answer import answer, cut
from ._config import MockServerConfig, MockServerStatistics
from ._delay import Delay
from ._faults import (
    FAULT_KINDS,
    HALF_EMOJI,
    MALFORMED_BODY,
    NOT_STREAMED,
    FaultKind,
    fault_response,
)
from ._metrics import CONTENT_TYPE, MockMetrics
from ._prefix_cache import PrefixCache
from ._replies import (
    Reply,
    chat_body,
    completion_body,
    echo_body,
    generate_body,
    reasoning_words,
    stream_events,
    usage_json,
)
from ._wire import (
    NO_ECHO,
    BadRequest,
    Echo,
    Turn,
    bad_request,
    chat_messages,
    echo_options,
    error,
    parse_params,
    prompt_text,
    read_json,
    tool_request,
)

__all__ = ["MockModelServer", "ENDPOINTS", "Sleep", "Clock"]

log = get_logger("convsim.mock_server")

CHAT, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
ENDPOINTS = ("/v1/models", CHAT, COMPLETIONS, GENERATE, "/tokenize", "/metrics")

Sleep = Callable[[float], Awaitable[Any]]
Clock = Callable[[], float]

_SSE_HEADERS = {"Cache-Control": "no-cache"}

REQUEST_ID_HEADER = "x-request-id"
"""A request's id header, which the mock answers with as it came (as vLLM and most
proxies do), so that a client's ids can be seen to reach the server."""


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Answer every request that sent an ``x-request-id`` with the same header."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is not None:
        response.headers[REQUEST_ID_HEADER] = given


class MockModelServer:
    """An OpenAI-compatible HTTP server answering with a deterministic model.

    ``async with MockModelServer(config) as server:`` listens in the running asyncio
    loop until the block ends; point clients at ``server.base_url``.

    Args:
        config: A :class:`MockServerConfig` or a mapping of its fields.
        clock: Monotonic seconds for the ``rpm`` window (injectable for tests).
        sleep: Awaited with seconds for every non-zero delay (injectable for tests).
        shutdown_timeout: Seconds in-flight requests get when the server stops.

    Raises:
        ConfigError: ``config`` is a mapping with invalid fields.
    """

    def __init__(
        self,
        config: MockServerConfig | Mapping[str, Any] | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        shutdown_timeout: float = 1.0,
    ) -> None:
        cfg = self.config = parse_config(MockServerConfig, config, "mock server config")
        self._clock = clock
        self._sleep = sleep
        self._shutdown_timeout = shutdown_timeout
        self._delay_rng = random.Random(f"{cfg.seed}:delays")
        self._fault_rng = random.Random(f"{cfg.seed}:faults")
        self._fault_kinds = [k for k, w in cfg.faults.items() if w > 0]
        self._fault_weights = [cfg.faults[k] for k in self._fault_kinds]
        self._auth = None if cfg.api_key is None else f"Bearer {cfg.api_key}".encode()
        self._window: deque[float] = deque()
        self._ids = itertools.count(1)
        self._model_json = json.dumps(cfg.model)
        self._models_body = json.dumps(
            {
                "object": "list",
                "data": [{"id": cfg.model, "object": "model", "created": 0, "owned_by": "convsim"}],
            }
        ).encode()
        self._requests = 0
        self._by_endpoint: dict[str, int] = dict.fromkeys(ENDPOINTS, 0)
        self._faults: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        self._rate_limited = 0
        self._unauthorized = 0
        self._prefix_cache = PrefixCache(cfg.prefix_cache_entries)
        self._metrics = MockMetrics(cfg.model, cfg.kv_cache_tokens)
        self._slots = asyncio.Semaphore(cfg.max_running) if cfg.max_running else None
        self._runner: web.AppRunner | None = None
        self.url = ""
        """``http://HOST:PORT`` once started."""
        self.base_url = ""
        """``url + "/v1"``: the base URL OpenAI clients take."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen on the configured address in the running asyncio event loop.

        Raises:
            RuntimeError: no asyncio loop is running, or the server was started already.
            OSError: the address cannot be bound.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "MockModelServer runs in an asyncio event loop (aiohttp); start it from "
                "asyncio code or anyio with the asyncio backend"
            ) from None
        if self._runner is not None:
            raise RuntimeError("this MockModelServer is already started")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_response_prepare.append(_echo_request_id)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post(CHAT, self._chat)
        app.router.add_post(COMPLETIONS, self._completions)
        app.router.add_post(GENERATE, self._generate)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/metrics", self._metrics_text)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.config.host, self.config.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        host = f"[{host}]" if ":" in host else host
        self.url = f"http://{host}:{port}"
        self.base_url = self.url + "/v1"
        log.info("mock_server_started", url=self.url, model=self.config.model)

    async def stop(self) -> None:
        """Stop listening; in-flight requests get ``shutdown_timeout`` to finish."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            log.info("mock_server_stopped", url=self.url, requests=self._requests)

    async def __aenter__(self) -> MockModelServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def statistics(self) -> MockServerStatistics:
        """What the server has served so far."""
        return MockServerStatistics(
            requests=self._requests,
            by_endpoint=dict(self._by_endpoint),
            faults_injected=dict(self._faults),
            rate_limited=self._rate_limited,
            unauthorized=self._unauthorized,
        )

    # ------------------------------------------------------------------ checks

    def _refuse(self, request: web.Request, path: str) -> web.Response | None:
        """Count the request and check the key (all endpoints)."""
        self._requests += 1
        self._by_endpoint[path] += 1
        if self._auth is not None:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, self._auth):
                self._unauthorized += 1
                return error(
                    401,
                    "Incorrect API key provided. Send 'Authorization: Bearer <key>'.",
                    "invalid_request_error",
                    "invalid_api_key",
                )
        return None

    def _over_limit(self) -> web.Response | None:
        """Admit the request into the sliding 60 s window, or answer 429."""
        limit = self.config.rpm
        if limit is None:
            return None
        now = self._clock()
        window = self._window
        while window and window[0] <= now - 60.0:
            window.popleft()
        if len(window) < limit:
            window.append(now)
            return None
        self._rate_limited += 1
        wait = max(1, math.ceil(window[0] + 60.0 - now))
        response = error(
            429,
            f"Rate limit reached: {counted(limit, 'request')} per minute. Retry in {wait} s.",
            "requests",
            "rate_limit_exceeded",
        )
        response.headers["Retry-After"] = str(wait)
        return response

    def _draw_fault(self) -> FaultKind | None:
        if not self.config.fault_rate or self._fault_rng.random() >= self.config.fault_rate:
            return None
        if len(self._fault_kinds) == 1:
            return self._fault_kinds[0]
        return self._fault_rng.choices(self._fault_kinds, self._fault_weights)[0]

    def _injected(self, kind: FaultKind, stream: bool) -> FaultKind:
        """The fault a call gets (a stream-only kind falls back when not streaming),
        counted."""
        if not stream:
            kind = NOT_STREAMED.get(kind, kind)
        self._faults[kind] += 1
        return kind

    async def _delay(self, delay: Delay, times: int = 1) -> float:
        """Sleep for ``times`` draws of ``delay``; a zero delay never sleeps. Returns
        the seconds slept."""
        if times <= 0 or delay.is_zero:
            return 0.0
        if delay.is_fixed:
            ms = delay.params[0] * times
        else:
            ms = sum(delay.sample(self._delay_rng) for _ in range(times))
        if ms > 0:
            await self._sleep(ms / 1000.0)
            return ms / 1000.0
        return 0.0

    # ------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse(request, "/v1/models")
        if refused is not None:
            return refused
        return web.Response(body=self._models_body, content_type="application/json")

    async def _metrics_text(self, request: web.Request) -> web.StreamResponse:
        """``GET /metrics``: what was served, in the Prometheus text format. Open
        without the API key, as on vLLM (its key guards ``/v1`` only)."""
        self._requests += 1
        self._by_endpoint["/metrics"] += 1
        return web.Response(
            body=self._metrics.exposition().encode(), headers={"Content-Type": CONTENT_TYPE}
        )

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        self._requests += 1
        if request.path in ENDPOINTS:
            return error(
                405, f"{request.method} is not allowed on {request.path}", "invalid_request_error"
            )
        return error(404, f"Unknown path {request.path}", "invalid_request_error", "unknown_url")

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """vLLM's ``POST /tokenize``: the count the usage of the same input reports."""
        if not self.config.tokenize:  # as a server without the endpoint answers
            self._requests += 1
            path = request.path
            return error(404, f"Unknown path {path}", "invalid_request_error", "unknown_url")
        refused = self._refuse(request, "/tokenize")
        if refused is not None:
            return refused
        try:
            body = await read_json(request)
            if "messages" in body:
                turns = chat_messages(body)
                overhead = self.config.message_overhead_tokens * len(turns)
            else:
                turns = (Turn("user", prompt_text(body)),)
                overhead = 0
        except BadRequest as exc:
            return bad_request(str(exc))
        words = [w for t in turns for w in t.text.split()]
        tokens = [*(zlib.crc32(w.encode()) & 0xFFFF for w in words), *([0] * overhead)]
        return web.json_response({"count": len(tokens), "max_model_len": 32768, "tokens": tokens})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, GENERATE)

    async def _serve(self, request: web.Request, path: str) -> web.StreamResponse:
        refused = self._refuse(request, path) or self._over_limit()
        if refused is not None:
            return refused
        cfg = self.config
        echo = NO_ECHO
        step: ToolCall | str | None = None
        try:
            body = await read_json(request)
            if path == CHAT:
                turns = chat_messages(body)
                params = parse_params(body, cfg.model)
                tools = tool_request(body)
                if tools is not None:
                    step = next_tool_step(tools.messages, tools.tools, tools.choice)
            else:
                turns = (Turn("user", prompt_text(body)),)
                if path == COMPLETIONS:
                    echo = echo_options(body)
                # an echo may ask for no generated token (max_tokens=0), as vLLM allows
                params = parse_params(
                    body, cfg.model, legacy_max=True, min_tokens=0 if echo.echo else 1
                )
                if path == GENERATE and params.stream:
                    raise BadRequest("/generate does not stream")
        except BadRequest as exc:
            return bad_request(str(exc))
        fault = self._draw_fault() if cfg.fault_rate else None
        call = step if isinstance(step, ToolCall) else None
        if fault == "malformed_tool_args" and call is None:
            fault = None  # nothing to malform: answered as usual
        if fault is not None:
            fault = self._injected(fault, params.stream)
            response = fault_response(request, fault, cfg.retry_after_s)
            if response is not None:
                return response
        seed = cfg.seed if params.seed is None else params.seed
        answered = answer(turns, cfg.memory_turns, seed, cfg.output_tokens)
        if isinstance(step, str):  # the policy's answer after the tools it called
            sent = cut(tuple(step.split(" ")), params)
        else:
            sent = cut(() if call else answered.words, params)
        words, prompt_tokens = sent.words, answered.prompt_tokens
        finish: str = sent.finish_reason
        if call is not None:
            finish = "tool_calls"
            if fault == "malformed_tool_args":  # cut short: no longer valid JSON
                call = ToolCall(id=call.id, name=call.name, arguments=call.arguments[:-1])
        if cfg.message_overhead_tokens and path == CHAT:
            prompt_tokens += cfg.message_overhead_tokens * len(turns)
        looked_up = None
        if cfg.prefix_cache and path == CHAT:
            overhead = cfg.message_overhead_tokens
            looked_up = self._prefix_cache.lookup(
                turns, [len(t.text.split()) + overhead for t in turns]
            )
        if fault == "lone_surrogate":  # the last word ends in half an emoji
            words = (*words[:-1], (words[-1] if words else "") + HALF_EMOJI)
        thoughts = reasoning_words(cfg.reasoning_tokens) if path == CHAT else ()
        n = len(words) + len(thoughts) + (len(call.arguments.split()) + 1 if call else 0)
        model = self._model_json if params.model == cfg.model else json.dumps(params.model)
        cached = None
        if looked_up is not None:
            cached = looked_up.cached_tokens
            if call is None:  # a tool call comes back as tool_calls, not as this text
                self._prefix_cache.answered(
                    looked_up, " ".join(words), len(words) + cfg.message_overhead_tokens
                )
        usage = usage_json(prompt_tokens, n, len(thoughts), cached) if cfg.usage else "null"
        reply = Reply(words, finish, usage, model, thoughts, call)
        metrics = self._metrics
        slots = self._slots
        queued_s = 0.0
        if slots is not None:  # a place under max_running, in arrival order
            waited_from = time.monotonic()
            metrics.waiting += 1
            try:
                await slots.acquire()
            finally:
                metrics.waiting -= 1
            queued_s = time.monotonic() - waited_from
        metrics.started(prompt_tokens, n, cached)
        try:
            if params.stream:
                include_usage = params.include_usage and cfg.usage
                return await self._stream(
                    request, path == CHAT, reply, include_usage, fault, queued_s
                )
            metrics.first_token(queued_s + await self._delay(cfg.ttft_ms))
            return await self._answer(path, reply, n, fault, echo, turns, seed)
        finally:
            metrics.ended(prompt_tokens, n)
            if slots is not None:
                slots.release()

    async def _answer(
        self,
        path: str,
        reply: Reply,
        n: int,
        fault: FaultKind | None,
        echo: Echo,
        turns: tuple[Turn, ...],
        seed: int,
    ) -> web.StreamResponse:
        """A whole (not streamed) answer, after the time between its tokens."""
        cfg = self.config
        await self._delay(cfg.itl_ms, n - 1)
        if fault == "malformed":
            return web.Response(body=MALFORMED_BODY, content_type="application/json")
        if echo is not NO_ECHO:
            payload = echo_body(reply, next(self._ids), int(time.time()), turns[0].text, echo, seed)
        elif path == CHAT:
            payload = chat_body(reply, next(self._ids), int(time.time()))
        elif path == COMPLETIONS:
            payload = completion_body(reply, next(self._ids), int(time.time()))
        else:
            payload = generate_body(reply)
        return web.Response(body=payload, content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        chat: bool,
        reply: Reply,
        include_usage: bool,
        fault: FaultKind | None,
        queued_s: float = 0.0,
    ) -> web.StreamResponse:
        """Send the answer as server-sent events, one event per word."""
        events = stream_events(
            reply,
            chat=chat,
            number=next(self._ids),
            created=int(time.time()),
            include_usage=include_usage,
            fault=fault,
        )
        cfg = self.config
        self._metrics.first_token(queued_s + await self._delay(cfg.ttft_ms))
        if fault != "stream_drop" and (cfg.itl_ms.is_zero or len(events) == 1):
            return web.Response(
                body="".join(events).encode(),
                content_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        response = web.StreamResponse(headers=_SSE_HEADERS)
        response.content_type = "text/event-stream"
        try:
            await response.prepare(request)
            for i, event in enumerate(events):
                if i:
                    await self._delay(cfg.itl_ms)
                await response.write(event.encode())
            if fault == "stream_drop" and request.transport is not None:
                request.transport.abort()  # mid-stream: the chunked body never ends
                return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away; nothing to tell it
        return response
