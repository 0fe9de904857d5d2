"""Applications under test: a function of the conversation evaluated as a model.

A user's application (a RAG pipeline, an agent graph) is one callable::

    async def answer(messages: list[dict], tools: list[dict]) -> str | AppReply | dict

named on the command line as ``--model python:package.module:function`` or wrapped in
Python with :func:`app`. It runs where a model adapter runs, so it gets what a model
gets: the run's concurrency (its cap), the conversation's deadline and cancellation,
bounded retries of the errors it declares retryable (``retry_on``), usage (its own,
else estimated and marked so), and results and manifests that name it
(``python:package.module:function``, never its code).

What it is given:

- ``messages``: the conversation so far as plain dicts, oldest first, a fresh list
  per call, in the OpenAI chat shapes (:mod:`convsim.adapters._app_tools`): a text
  message is ``{"role", "content"}``; an assistant message that called tools adds
  ``tool_calls`` (``[{id, type: "function", function: {name, arguments}}]``); a tool's
  answer is ``{"role": "tool", "tool_call_id", "name", "content"}``.
- ``tools``: the tools the turn offers, as OpenAI ``tools`` entries (``[{type:
  "function", function: {name, description, parameters}}]``); empty when the pack has
  no tools or the turn forbids them (``tool_choice: none``). A function that takes only
  ``messages`` is called without it.

What it returns: the reply's text (a ``str``), an :class:`AppReply`, or a mapping, a
dataclass or a pydantic model with the text as ``content`` (or ``text``) and optionally
``tool_calls``, ``usage`` (``prompt_tokens``, ``completion_tokens``,
``total_tokens``), ``finish_reason`` and ``model``; other keys are the application's
own and are left alone.

Tools, two ways:

- The pack's tools: a reply with ``tool_calls`` (:class:`~convsim.adapters.ToolCall`
  objects or OpenAI-style dicts; arguments as JSON text or a dict; an id made up when
  missing) asks convsim to run them, as a model's would: the pack's tools run on the
  conversation's environment, and the function is called again with the calls and
  their results at the end of ``messages``, until it answers with text or the turn's
  round limit. These calls are recorded and graded like a model's. A forced
  ``tool_choice`` (``required``, a tool's name) is not passed on: the application
  decides.
- Its own tools: an application that runs tools itself (its retriever, its own
  agent graph) returns its final text. convsim sees only that text: the tools it ran
  are not recorded as tool calls, and the pack's environment (its final state) does
  not see what they did.

Errors: an exception of a ``retry_on`` type is retried (three retries by default, with
backoff); a convsim :class:`~convsim.AdapterError` counts as it declares; any other
exception fails the turn at once as :class:`~convsim.AdapterCodeError` naming it, and
the conversation and the run go on as they do after a failed model call.

Named on the command line, the module is imported from ``sys.path`` and, failing that,
from the current directory (as ``python -m`` would); the user names the code, so no
``--allow-code`` is asked for. ``--model-arg`` takes ``concurrency``, ``timeout``,
``max_retries`` and ``stream=false`` (an application answers whole; ``convsim load``
needs to be told so).

A synchronous function runs in a worker thread (the event loop never waits on it), as
the guide-style adapters' ``generate_response`` does
(:mod:`convsim.adapters._sync_bridge`): a thread cannot be stopped, so a call past its
deadline or cancelled is abandoned and its answer dropped when it comes.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from convsim._errors import (
    AdapterCodeError,
    AdapterError,
    ConfigError,
    ProtocolError,
    Timeout,
    parse_config,
)
from convsim._types import (
    CallTimings,
    Completion,
    GenerationParams,
    Message,
    ModelInfo,
    RateLimits,
    ToolCall,
    Usage,
)

from ._app_tools import app_messages, app_tool_calls, app_tools
from ._prompt import estimated_usage, render_prompt, tool_calls_text
from ._protocol import ModelAdapter
from ._retry import RetryPolicy
from ._sync_bridge import DEFAULT_CONCURRENCY, read_usage
from ._text import repair_text

__all__ = ["AppAdapter", "AppOptions", "AppReply", "app", "load_app", "python_app"]

SPEC_TYPE = "python"
"""The model type of an application: ``--model python:package.module:function``."""

_REFERENCE = re.compile(
    r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$"
)


@dataclasses.dataclass(frozen=True)
class AppReply:
    """An application's reply.

    The fields a model's answer has; an application with nothing more to say may
    return the text alone.
    """

    content: str = ""
    """The reply's text: the assistant's message (may be empty beside tool calls)."""
    tool_calls: Sequence[ToolCall | Mapping[str, Any]] = ()
    """The pack's tools to run before the application is called again:
    :class:`~convsim.adapters.ToolCall` objects or OpenAI-style dicts (``{id, type:
    function, function: {name, arguments}}``, arguments as JSON text or a dict)."""
    usage: Usage | Mapping[str, int] | None = None
    """Tokens the application spent, if it counts them (``prompt_tokens``,
    ``completion_tokens``, ``total_tokens``); None: estimated from the text."""
    finish_reason: str | None = None
    """None: ``tool_calls`` when the reply asks for tools, else ``stop``."""
    model: str | None = None
    """The model the application used, if it says; the results name the application."""


class AppOptions(BaseModel):
    """How an application's calls are made: the ``--model-arg`` values of a
    ``python:`` model, the keyword arguments of :func:`app`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int | None = Field(default=None, ge=1)
    """Calls in flight at most; None: the run's concurrency (else 64)."""
    timeout: float | None = Field(default=None, gt=0)
    """Seconds one attempt may take; None: only the conversation's deadline."""
    max_retries: int = Field(default=3, ge=0)
    """Retries of a ``retry_on`` error after the first attempt."""
    stream: bool = False
    """An application answers whole: only ``false`` is taken (``convsim load`` asks
    for streaming unless told ``--model-arg stream=false``)."""

    @field_validator("stream")
    @classmethod
    def _whole(cls, stream: bool) -> bool:
        if stream:
            raise ValueError(
                "an application answers whole and does not stream: give stream=false "
                "(convsim load then measures whole-reply latency, no time to first token)"
            )
        return stream


class _Answer(NamedTuple):
    """One attempt's reply, read and checked."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    model: str | None
    total_s: float
    replaced_chars: int


class AppAdapter(ModelAdapter):
    """An application under test, called as a model: see the module's docstring.

    Args:
        function: ``(messages, tools)`` or ``(messages)``, async or not.
        name: how results and manifests name it (default:
            ``python:module:qualified_name``).
        retry_on: exception types worth a retry (a flaky retriever, a 429 from the
            application's own model); others fail the turn at once.
        options: concurrency, per-attempt timeout and retries.
        sleep: how the waits between retries are made (tests inject a recorder).

    Raises:
        ConfigError: ``function`` is not callable with ``(messages, tools)`` or
            ``(messages)``, or ``retry_on`` holds something that is no exception type.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        retry_on: Sequence[type[BaseException]] = (),
        options: AppOptions | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        if not callable(function) or isinstance(function, type):
            raise ConfigError(
                f"an application is a function of the conversation's messages, not "
                f"{_described(function)}"
            )
        self.function = function
        self.name = name or _name_of(function)
        self.retry_on = _exception_types(retry_on, self.name)
        self.options = options or AppOptions()
        self.sleep = sleep
        self.is_async = _is_async(function)
        self.takes_tools = _takes_tools(function, self.name)
        self._concurrency = self.options.concurrency
        self._slots: anyio.Semaphore | None = None
        self._threads: anyio.CapacityLimiter | None = None

    def with_options(self, name: str | None = None, **options: Any) -> AppAdapter:
        """A new adapter for the same function: ``options`` over this one's.

        Raises:
            ConfigError: an unknown or invalid option, naming it.
        """
        merged = parse_config(
            AppOptions, {**self.options.model_dump(exclude_unset=True), **options}, self.name
        )
        return AppAdapter(
            self.function,
            name=name or self.name,
            retry_on=self.retry_on,
            options=merged,
            sleep=self.sleep,
        )

    def __repr__(self) -> str:
        return f"AppAdapter({self.name})"

    # -- what the runtime asks of it -------------------------------------------------

    @property
    def concurrency(self) -> int:
        """Calls in flight at most."""
        return self._concurrency or DEFAULT_CONCURRENCY

    def model_info(self) -> ModelInfo:
        return ModelInfo(model_id=self.name, model_type=SPEC_TYPE, provider="application")

    def rate_limits(self) -> RateLimits:
        return RateLimits(concurrency=self.concurrency)

    def size_pool(self, concurrency: int) -> None:
        """Take the run's concurrency as the cap, unless the options set one."""
        if self.options.concurrency is not None:
            return
        if self._slots is not None:
            raise RuntimeError("size_pool() must come before the first call")
        self._concurrency = concurrency

    def cache_identity(self) -> Mapping[str, Any]:
        return {"adapter": type(self).__qualname__, "application": self.name}

    # -- one call -------------------------------------------------------------------

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """Ask the application for the next assistant message: text, or tool calls
        (``params`` give the tools the turn offers; its sampling settings an
        application does not take).

        Raises:
            AdapterError: the application failed, after retries where they apply.
        """
        if self._slots is None:
            self._slots = anyio.Semaphore(self.concurrency, fast_acquire=True)
            self._threads = anyio.CapacityLimiter(self.concurrency)
        policy = RetryPolicy(max_retries=self.options.max_retries)
        queued = time.perf_counter()
        async with self._slots:
            started = time.perf_counter()
            answer, attempts = await policy.call(
                lambda _number: self._attempt(messages, params),
                sleep=self.sleep,
                should_retry=self.should_retry,
            )
            spent = time.perf_counter() - started
        usage = answer.usage or _estimated(messages, answer)
        return Completion(
            text=answer.text,
            tool_calls=answer.tool_calls,
            finish_reason=answer.finish_reason,
            usage=usage,
            timings=CallTimings(
                queue_wait_s=started - queued,
                retry_wait_s=max(0.0, spent - answer.total_s),
                total_s=answer.total_s,
            ),
            attempts=attempts,
            model=answer.model or self.name,
            replaced_chars=answer.replaced_chars,
        )

    async def _attempt(self, messages: Sequence[Message], params: GenerationParams) -> _Answer:
        """One call of the application, within the per-attempt timeout if set."""
        tools = app_tools(params)
        arguments: list[Any] = [app_messages(messages)]
        if self.takes_tools:
            arguments.append(tools)
        timeout = self.options.timeout
        t0 = time.perf_counter()
        with anyio.move_on_after(timeout) as scope:
            try:
                if self.is_async:
                    result = await self.function(*arguments)
                else:
                    result = await anyio.to_thread.run_sync(
                        self._call_sync, arguments, limiter=self._threads, abandon_on_cancel=True
                    )
            except AdapterError:
                raise
            except Exception as exc:
                raise AdapterCodeError(
                    f"the application {self.name} raised {_shown(exc)}",
                    cause=type(exc).__name__,
                    model=self.name,
                    retryable=isinstance(exc, self.retry_on),
                ) from exc
        if scope.cancelled_caught:
            abandoned = "" if self.is_async else " (its thread runs on; the answer will be dropped)"
            raise Timeout(
                f"the application {self.name} did not answer within timeout={timeout:g} s"
                f"{abandoned}",
                model=self.name,
            )
        return self._read(result, time.perf_counter() - t0, len(messages), offered=bool(tools))

    def _call_sync(self, arguments: list[Any]) -> Any:
        result = self.function(*arguments)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: closed so it warns of nothing
            raise ConfigError(
                f"{self.name} returned an awaitable but is not an async function: "
                "declare it `async def`"
            )
        return result

    def _read(self, result: Any, total_s: float, position: int, *, offered: bool) -> _Answer:
        """The application's reply, checked; ``position``: where it stands in the
        conversation (its calls' ids are made from it when it gives none)."""
        try:
            fields = _fields(result)
            calls = app_tool_calls(fields.get("tool_calls") or (), position)
            if calls and not offered:
                raise TypeError(
                    "it asks for tool calls, and this turn offers no tools (the pack "
                    "declares none, or the turn forbids them): return the reply's text"
                )
            text = fields.get("content", fields.get("text"))
            if text is None and calls:
                text = ""
            if not isinstance(text, str):
                raise TypeError(
                    f"its content is {type(text).__name__}, not a string"
                    if "content" in fields or "text" in fields
                    else "it has no content (or text)"
                )
            finish = fields.get("finish_reason") or ("tool_calls" if calls else "stop")
            if not isinstance(finish, str):
                raise TypeError(f"finish_reason is {type(finish).__name__}, not a string")
            model = fields.get("model")
            if model is not None and not isinstance(model, str):
                raise TypeError(f"model is {type(model).__name__}, not a string")
            usage = fields.get("usage")
            if not isinstance(usage, Usage):
                usage = read_usage(usage, text + tool_calls_text(calls))
        except TypeError as exc:
            raise ProtocolError(
                f"the application {self.name} returned an unusable reply: {exc} (return a "
                "string, an AppReply, or a mapping with 'content' or 'tool_calls')",
                snippet=repr(result)[:200],
                model=self.name,
            ) from None
        repaired = repair_text(text)
        return _Answer(
            repaired.text,
            calls,
            repair_text(finish).text,
            usage,
            model or None,
            total_s,
            repaired.replaced,
        )


def _fields(result: Any) -> Mapping[str, Any]:
    """A reply as a mapping of its fields.

    Raises:
        TypeError: a reply of no readable shape.
    """
    if isinstance(result, str):
        return {"content": result}
    if isinstance(result, Mapping):
        return result
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    if isinstance(result, BaseModel):
        return dict(result)
    raise TypeError(f"it is {_described(result)}")


def _estimated(messages: Sequence[Message], answer: _Answer) -> Usage:
    """Usage estimated from the prompt and the reply, tool calls counted with both."""
    prompt = render_prompt(messages) + "".join(tool_calls_text(m.tool_calls) for m in messages)
    return estimated_usage(prompt, answer.text + tool_calls_text(answer.tool_calls))


def _shown(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _described(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    return f"a {type(value).__name__}"


def _name_of(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if module and qualname:
        return f"{SPEC_TYPE}:{module}:{qualname}"
    return f"{SPEC_TYPE}:{type(function).__module__}:{type(function).__qualname__}"


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` gives a coroutine (an async function, or an object
    whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - the method itself is asked about
    )


def _takes_tools(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` is called as ``(messages, tools)`` rather than ``(messages)``.

    Raises:
        ConfigError: it can be called as neither.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: the full form
        return True
    forms: tuple[tuple[tuple[Any, ...], bool], ...] = ((([], []), True), (([],), False))
    for arguments, takes_tools in forms:
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return takes_tools
    raise ConfigError(
        f"{name} cannot be called as (messages, tools) or (messages): its signature is {signature}"
    )


def _exception_types(retry_on: Sequence[object], name: str) -> tuple[type[Exception], ...]:
    """``retry_on`` checked: exception classes (Exception subclasses) only."""
    types: list[type[Exception]] = []
    for kind in (retry_on,) if isinstance(retry_on, type) else retry_on:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise ConfigError(f"{name}: retry_on takes exception classes, and {kind!r} is not one")
        types.append(kind)
    return tuple(types)


def app(
    function: Callable[..., Any],
    *,
    name: str | None = None,
    retry_on: Sequence[type[BaseException]] | type[BaseException] = (),
    concurrency: int | None = None,
    timeout: float | None = None,
    max_retries: int = 3,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> AppAdapter:
    """Evaluate ``function``, a user's application, as the model under test::

        async def answer(messages, tools):
            return my_rag_pipeline(messages[-1]["content"])

        async with Simulator(convsim.app(answer, retry_on=(VectorStoreBusy,))) as sim:
            ...

    ``function`` takes the conversation's messages (dicts with ``role`` and
    ``content``, and the OpenAI tool fields where tools were called) and the turn's
    tools (OpenAI ``tools`` entries, empty when the turn offers none; a function of
    ``messages`` alone is called without it) and returns the reply: text, an
    :class:`AppReply` (with ``tool_calls`` to have the pack's tools run), or a mapping
    with ``content`` or ``tool_calls``. It may be async (awaited on the
    event loop) or not (run in a worker thread). A module-level ``app(...)`` may be
    named on the command line (``--model python:module:name``), its settings kept.

    Args:
        function: the application.
        name: how results name it (default ``python:module:qualified_name``).
        retry_on: exception types to retry; others fail the turn at once.
        concurrency: calls in flight at most (default: the run's concurrency).
        timeout: seconds one attempt may take (default: only the conversation's
            deadline bounds it).
        max_retries: retries after the first attempt, for ``retry_on`` errors.
        sleep: how the waits between retries are made.

    Raises:
        ConfigError: the function, a retry_on entry or an option is unusable.
    """
    types = (retry_on,) if isinstance(retry_on, type) else tuple(retry_on)
    options = parse_config(
        AppOptions,
        {"concurrency": concurrency, "timeout": timeout, "max_retries": max_retries},
        "convsim.app()",
    )
    return AppAdapter(function, name=name, retry_on=types, options=options, sleep=sleep)


def load_app(reference: str) -> AppAdapter:
    """The application ``package.module:function`` names: the function imported now,
    or the :func:`app` it holds (its settings kept).

    Raises:
        ConfigError: the reference is malformed, the module cannot be imported or
            fails, or it names nothing callable.
    """
    spec = f"{SPEC_TYPE}:{reference}"
    match = _REFERENCE.match(reference)
    if match is None:
        raise ConfigError(f"invalid application {spec!r}: expected python:package.module:function")
    module_name = match["module"]
    try:
        module = _imported(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name and not module_name.startswith(f"{exc.name}."):
            raise ConfigError(f"{spec}: importing {module_name} failed: {exc}") from exc
        raise ConfigError(
            f"{spec}: there is no module {module_name!r} (is its folder on PYTHONPATH, or "
            "the current directory?)"
        ) from None
    except Exception as exc:  # the module's own code failed: say so, with its error
        raise ConfigError(f"{spec}: importing {module_name} failed: {exc!r}") from exc
    found: Any = module
    for part in match["attr"].split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ConfigError(f"{spec}: {module_name} has no {match['attr']}")
    if isinstance(found, AppAdapter):
        return found
    if isinstance(found, type) and issubclass(found, ModelAdapter):
        raise ConfigError(
            f"{spec} is a ModelAdapter class: name it without python: (--model {reference})"
        )
    return AppAdapter(found, name=spec)


def _imported(module_name: str) -> ModuleType:
    """``module_name`` imported; a module not found on ``sys.path`` is looked for in the
    current directory too, as ``python -m`` would find it (the ``convsim`` command's
    path starts at its own folder instead). The directory is appended, so it shadows
    nothing installed."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name != module_name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
    sys.path.append(here)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def python_app(config: Mapping[str, Any]) -> AppAdapter:
    """The adapter of the model spec ``python:package.module:function``: the registry's
    factory for the type ``python``; ``config`` holds ``model`` (the reference) and the
    ``--model-arg`` values (:class:`AppOptions`).

    Raises:
        ConfigError: no reference, an unusable one, or an unknown or invalid option.
    """
    options = dict(config)
    reference = options.pop("model", None)
    if not isinstance(reference, str) or not reference:
        raise ConfigError(
            "the python model type needs the application: --model python:package.module:function"
        )
    found = load_app(reference)
    return found.with_options(name=f"{SPEC_TYPE}:{reference}", **options)
