"""The contract every model adapter fulfils: one method that does the work, and hooks
with safe defaults for everything the runtime asks of an adapter.

Two ways to write an adapter meet here. convsim's: implement the async
:meth:`ModelAdapter.generate` (messages in, a :class:`~convsim.adapters.Completion` out).
The developer guide's: implement a synchronous ``generate_response(prompt, config) ->
dict`` and the guide's dict-returning methods (``get_model_info``,
``get_default_config``, ``validate_config``, ``get_rate_limits``,
``estimate_cost(prompt_tokens, completion_tokens)``). The base class bridges each way to
the other: a guide-style adapter's ``generate`` runs its ``generate_response`` in a
worker thread with convsim's budgets, retries and deadline
(:class:`~convsim.adapters._sync_bridge.SyncBridge`), and every convsim adapter answers
the guide's methods.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, overload, runtime_checkable

import anyio

from convsim._errors import AdapterError, ConfigError, parse_config
from convsim._secrets import Redactor, is_secret_key, redact_url, shown_setting
from convsim._types import (
    Completion,
    Cost,
    GenerationParams,
    Message,
    ModelInfo,
    RateLimits,
    Usage,
)

from ._budget import BudgetLimits
from ._guide_shapes import (
    ConfigValidation,
    CostDict,
    ModelInfoDict,
    RateLimitsDict,
    ResponseDict,
    cost_dict,
    cost_from_dict,
    info_dict,
    info_from_dict,
    limits_dict,
    limits_from_dict,
    params_from_dict,
    response_dict,
    settings_dict,
    unknown_settings,
)
from ._model_configuration import PACING_SETTINGS, ModelConfiguration
from ._retry import RetryPolicy
from ._sync_bridge import DEFAULT_TIMEOUT_S, BridgeSettings, SyncBridge

if TYPE_CHECKING:
    from ._budget import Budgets

__all__ = [
    "ModelAdapter",
    "PromptLogprobs",
    "PromptScorer",
    "LogprobsUnsupported",
    "can_score_prompts",
    "is_bridged",
]

_GENERATION_SETTINGS = (
    *("temperature", "max_tokens", "top_p", "frequency_penalty", "presence_penalty"),
)
"""Settings of a :class:`ModelConfiguration` that are also a call's defaults."""

_CONFIGURATION_ONLY = frozenset(ModelConfiguration.model_fields) - frozenset(
    GenerationParams.model_fields
)
"""Keys that make a mapping a model configuration rather than sampling settings."""


class LogprobsUnsupported(ConfigError, NotImplementedError):
    """The adapter cannot return prompt logprobs (what loglikelihood requests need)."""


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """The log-probability of every token of a prompt, as the model read it.

    The sequences run in parallel, one entry per token of the prompt (tokens the server
    generated after it are not included). The first token has no preceding context, so
    its logprob is usually None.
    """

    tokens: tuple[str, ...]
    """The prompt's tokens as the server's tokenizer split it."""
    token_logprobs: tuple[float | None, ...]
    """Natural-log probability of each token given the tokens before it."""
    text_offset: tuple[int, ...]
    """Character offset in the prompt where each token starts."""
    top_logprobs: tuple[Mapping[str, float] | None, ...] | None
    """The most likely tokens at each position with their logprobs (None where the
    server gave none); tells whether each token was the model's greedy choice."""
    usage: Usage
    """Tokens the scoring call used (the prompt, plus any generated token)."""
    attempts: int = 1
    """Attempts the call took, retries included."""


class ModelAdapter(ABC):
    """A model backend.

    Subclass it and implement the async :meth:`generate`; every other method is a hook
    with a safe default, overridden where a backend has more to say (its name and
    price, its rate budgets, streaming, prompt scoring). Adapters are shared services:
    one instance serves many conversations at once, so ``generate`` must be safe to call
    concurrently. A failed call raises an :class:`~convsim.AdapterError` subclass, never
    returns a sentinel.

    Or write it as the developer guide does: ``__init__(self, config)`` calling
    ``super().__init__(config)``, and a synchronous :meth:`generate_response` instead
    of ``generate``. Such a class gets a ``generate`` that runs ``generate_response`` in
    a worker thread, under the rate budget of its endpoint and key (``rpm``/``tpm`` of
    its :attr:`configuration`, else what its ``get_rate_limits()`` says), a concurrency
    cap, a deadline per attempt (``timeout``, 60 s) and bounded retries, several calls
    at once (so ``generate_response`` must be thread-safe, as ``requests.post`` is). An
    exception from its code is read through the exceptions it was raised from: an HTTP
    status is mapped as convsim's HTTP adapters map it (408, 409, 429 and 5xx retried,
    a 429's Retry-After honoured), a timeout or a failed connection is retried, and
    anything else (a KeyError, a bare Exception) fails the call at once as
    :class:`~convsim.AdapterCodeError`. Its dict-returning methods
    (``get_model_info``, ``get_default_config``, ``get_rate_limits``,
    ``estimate_cost(prompt_tokens, completion_tokens)``) are what convsim reads as its
    :meth:`model_info`, :meth:`default_config`, :meth:`rate_limits` and prices, and its
    ``validate_config`` checks its configuration when it is built by name.

    Each of the guide's methods and convsim's exists on every adapter: convsim's
    return typed values (``model_info() -> ModelInfo``), the guide's the guide's dicts
    (``get_model_info() -> dict``). The two forms of ``validate_config`` could not share
    the name: ``validate_config(config)`` is the guide's (``{"valid": bool, "error":
    str}``), and :meth:`check_config` is convsim's (GenerationParams, or ConfigError).
    """

    supports_streaming: ClassVar[bool] = False
    """Whether :meth:`stream` works (and ``stream=true`` may be asked for)."""
    configuration: ModelConfiguration | None = None
    """What the adapter was built with, when its ``__init__`` hands it to this class's
    (the guide's adapters do: ``super().__init__(config)``); None for adapters that keep
    their own settings (convsim's)."""
    registered_type: str | None = None
    """The model type this adapter was built as (``get_model_adapter``, a model spec);
    None when it was built directly."""

    def __init__(
        self,
        config: ModelConfiguration | Mapping[str, Any] | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        """Keep ``config``, checked, as :attr:`configuration`.

        Args:
            config: the adapter's settings (a dict is made a ModelConfiguration).
            sleep: how a guide-style adapter waits between retries and for its rate
                budget (tests inject one that records instead).

        Raises:
            ConfigError: naming every invalid setting.
        """
        self.configuration = ModelConfiguration.of(config)
        self._bridge_sleep = sleep

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a guide-style class (generate_response, no generate) is given the bridge as its
        # generate before ABCMeta counts abstract methods, so it can be instantiated
        if _overrides(cls, "generate_response") and getattr(
            cls.generate, "__isabstractmethod__", False
        ):
            cls.generate = _generate_from_sync  # type: ignore[method-assign]

    @abstractmethod
    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        """Answer the conversation ``messages`` with the next assistant message."""

    def generate_response(
        self, prompt: str, config: Mapping[str, Any] | None = None
    ) -> ResponseDict:
        """The guide's synchronous call: answer ``prompt`` (one user message) with the
        settings in ``config`` (the guide's dict: ``temperature``, ``max_tokens``,
        ``top_p``, ``stop``, the penalties; None values left to the backend) over this
        adapter's defaults; returns ``{"text", "usage", "model", "finish_reason"}``.

        A thin wrapper of :meth:`generate`: each call runs in an event loop of its
        own, and the adapter's connections are closed when it ends. From async code,
        await :meth:`generate`.

        Raises:
            RuntimeError: called inside a running event loop.
            ConfigError: a setting in ``config`` is unknown or out of range.
            AdapterError: the call failed (after retries where they apply).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "generate_response() is the synchronous API and was called inside a running "
                "event loop; there, use: await adapter.generate(messages, params)"
            )
        params = self.default_config().merged(self.check_config(_settings(config)))
        messages = [Message(role="user", content=prompt)]

        async def once() -> Completion:
            try:
                return await self.generate(messages, params)
            finally:
                with anyio.CancelScope(shield=True):  # its connections belong to this loop
                    await self.aclose()

        completion = anyio.run(once)
        return response_dict(completion, self.model_info().model_id)

    # -- what the adapter says about its model ------------------------------------------

    def model_info(self) -> ModelInfo:
        """Describe the model: id, type, provider, capabilities, context length.

        Default: what the class's ``get_model_info()`` says, where it defines one; else
        the configuration's ``model_name`` (or the class's name), the type it was built
        as (or the class's name) and provider ``custom``.
        """
        name = type(self).__name__
        cfg = self.configuration
        fallback = ModelInfo(
            model_id=str(cfg.get("model_name") or name) if cfg is not None else name,
            model_type=self.registered_type or name,
            provider="custom",
            context_length=cfg.context_length if cfg is not None else None,
            supports_streaming=self.supports_streaming,
        )
        if _overrides(type(self), "get_model_info"):
            return info_from_dict(self.get_model_info(), fallback)
        return fallback

    def get_model_info(self) -> ModelInfoDict:
        """The guide's form of :meth:`model_info`: ``{"model_id", "model_type",
        "provider", "capabilities", "context_length", "supports_streaming"}``."""
        return info_dict(self.model_info())

    def default_config(self) -> GenerationParams:
        """Sampling settings used where a turn sets none.

        Default: what the class's ``get_default_config()`` says, where it defines one
        (the settings GenerationParams has; a guide-style adapter gets the others back
        in every call's config), with the generation settings of :attr:`configuration`
        over it; else the backend's own (nothing set).
        """
        if _overrides(type(self), "get_default_config"):
            params = params_from_dict(
                self.get_default_config(), "get_default_config()", known_only=True
            )
        else:
            params = GenerationParams()
        cfg = self.configuration
        if cfg is not None:
            params = params.merged({name: getattr(cfg, name) for name in _GENERATION_SETTINGS})
        return params

    def get_default_config(self) -> dict[str, Any]:
        """The guide's form of :meth:`default_config`: ``temperature``, ``max_tokens``,
        ``top_p``, ``frequency_penalty`` and ``presence_penalty`` always (None where the
        backend's own default applies), and any other setting that is set."""
        return settings_dict(self.default_config())

    def check_config(self, config: Mapping[str, Any]) -> GenerationParams:
        """Check a turn's sampling settings as this adapter takes them; raise
        ConfigError naming the bad field. (Named ``validate_config`` before the guide's
        form took that name; a subclass that still overrides ``validate_config`` to
        return GenerationParams is honoured here.)"""
        if _overrides(type(self), "validate_config"):
            try:
                verdict: object = self.validate_config(config)
            except ConfigError:
                raise  # convsim's form refusing the settings
            except Exception:  # the guide's form, asked about what it does not check
                verdict = None
            if isinstance(verdict, GenerationParams):
                return verdict
            # any other verdict is the guide's: about the configuration, not a turn
        return parse_config(GenerationParams, config, "generation config")

    def validate_config(self, config: Mapping[str, Any]) -> ConfigValidation:
        """The guide's check, which never raises: ``{"valid": True}``, or ``{"valid":
        False, "error": "what is wrong"}``. Default: whether ``config`` is usable as
        this adapter's sampling settings (:meth:`check_config`); a model configuration
        (the guide's ``api_endpoint``, ``api_key``, ``model_name``... beside them) is
        checked as :class:`ModelConfiguration` checks it, its sampling settings too."""
        try:
            if not isinstance(config, Mapping):
                raise ConfigError(f"a configuration is a mapping, not {type(config).__name__}")
            if any(key in _CONFIGURATION_ONLY for key in config):
                ModelConfiguration(config)
                config = {k: v for k, v in config.items() if k in GenerationParams.model_fields}
            self.check_config(config)
        except ConfigError as exc:
            return {"valid": False, "error": str(exc)}
        return {"valid": True}

    def check_configuration(self) -> None:
        """Ask the class's own ``validate_config`` (the guide's form) about the
        :attr:`configuration` the adapter was built with; called when it is built by
        name. Nothing to ask without either.

        Raises:
            ConfigError: it answered ``{"valid": False, "error": ...}``, or raised one.
        """
        cfg = self.configuration
        if cfg is None or not _overrides(type(self), "validate_config"):
            return
        verdict = self.validate_config(dict(cfg))
        if isinstance(verdict, Mapping) and not verdict.get("valid", True):
            error = verdict.get("error") or "validate_config() refused it"
            raise ConfigError(f"{self.model_info().model_type} model configuration: {error}")

    @overload
    def estimate_cost(self, usage: Usage) -> Cost | None: ...

    @overload
    def estimate_cost(self, prompt_tokens: int, completion_tokens: int) -> CostDict | None: ...

    def estimate_cost(self, *args: Any, **kwargs: Any) -> Cost | CostDict | None:
        """Price some usage; None when the adapter has no price for its model.

        Two call forms: convsim's, ``estimate_cost(usage)`` -> :class:`Cost`; the
        guide's, ``estimate_cost(prompt_tokens, completion_tokens)`` -> ``{"prompt_cost",
        "completion_cost", "total_cost", "currency"}``. Both price through
        :meth:`usage_cost`, the method to override (a subclass may instead override
        ``estimate_cost`` in either form, as it could before).

        Raises:
            TypeError: the arguments fit neither form.
        """
        usage = _usage_argument(args, kwargs)
        if usage is not None:
            return self.usage_cost(usage)
        prompt, completion = _token_arguments(args, kwargs)
        cost = self.usage_cost(
            Usage(
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
            )
        )
        return None if cost is None else cost_dict(cost)

    def usage_cost(self, usage: Usage) -> Cost | None:
        """Price ``usage``: what callers holding a Usage call, and adapters override.

        Default: the class's own ``estimate_cost``, in whichever form it defines it;
        else the ``input_price`` and ``output_price`` (USD per million tokens) of the
        :attr:`configuration`; else None.
        """
        own = type(self).estimate_cost
        if own is not ModelAdapter.estimate_cost:
            if _guide_form(own):
                priced = own(self, usage.prompt_tokens, usage.completion_tokens)
                return None if priced is None else cost_from_dict(priced)
            return own(self, usage)
        cfg = self.configuration
        if cfg is None or cfg.input_price is None or cfg.output_price is None:
            return None
        prompt = usage.prompt_tokens * cfg.input_price / 1e6
        completion = usage.completion_tokens * cfg.output_price / 1e6
        return Cost(prompt_cost=prompt, completion_cost=completion, total_cost=prompt + completion)

    def rate_limits(self) -> RateLimits:
        """The request and token budgets this adapter runs under.

        Default: a guide-style adapter's (its configuration's ``rpm``, ``tpm``, ``rpd``,
        else what its ``get_rate_limits()`` says; its concurrency cap); for others what
        the class's ``get_rate_limits()`` says, else none.
        """
        declared = (
            limits_from_dict(self.get_rate_limits())
            if _overrides(type(self), "get_rate_limits")
            else RateLimits()
        )
        if not is_bridged(self):
            return declared
        cfg = self.configuration or ModelConfiguration()
        return RateLimits(
            requests_per_minute=cfg.rpm or declared.requests_per_minute,
            tokens_per_minute=cfg.tpm or declared.tokens_per_minute,
            requests_per_day=cfg.rpd or declared.requests_per_day,
            concurrency=self._sync_bridge().concurrency,
        )

    def get_rate_limits(self) -> RateLimitsDict:
        """The guide's form of :meth:`rate_limits`: ``{"requests_per_minute",
        "tokens_per_minute", "requests_per_day", "concurrency"}`` (None: unlimited)."""
        return limits_dict(self.rate_limits())

    async def aclose(self) -> None:
        """Release connections and other resources."""
        return None

    # -- what the runtime asks of it -------------------------------------------------

    def cache_identity(self) -> Mapping[str, Any]:
        """What, beside the request, decides this adapter's answers: part of every
        response-cache key. Never a key or other secret. Default: the class, and the
        model's type, provider and id; and, for an adapter built with a
        :attr:`configuration`, every setting of it that shapes answers (its endpoint
        without credentials; never a secret, a limit, a timeout or a price)."""
        info = self.model_info()
        identity: dict[str, Any] = {
            "adapter": type(self).__qualname__,  # its module varies with how it was imported
            "model_type": info.model_type,
            "provider": info.provider,
            "model": info.model_id,
        }
        cfg = self.configuration
        if cfg is not None:
            identity["arguments"] = {
                name: _plain(shown_setting(name, value))
                for name, value in cfg.items()
                if name not in PACING_SETTINGS and not is_secret_key(name)
            }
        return identity

    def connection_key(self) -> str | None:
        """Adapters with the same key share one rate budget (same API, same key);
        None when the adapter has no budget to share. A guide-style adapter's key is its
        type, its endpoint and a digest of its secrets."""
        return self._sync_bridge().settings.connection_key if is_bridged(self) else None

    def share_budgets(self, budgets: Budgets) -> None:
        """Take the rate budgets of the application that runs this adapter: adapters
        with the same :meth:`connection_key` share one budget. Called by the
        :class:`~convsim.adapters.ModelPool` that holds the adapter, before the first
        call. Default: a guide-style adapter takes them; others have none to share."""
        if is_bridged(self):
            self._sync_bridge().share_budgets(budgets)

    def size_pool(self, concurrency: int) -> None:
        """Take the number of calls the application makes at once as the size of this
        adapter's connection pool and its concurrency cap, unless the adapter was
        configured with its own. Called by the :class:`~convsim.adapters.ModelPool`
        that built the adapter, before the first call (never for an adapter a caller
        built). Default: a guide-style adapter takes it as its cap (and its worker
        threads); others have nothing to size."""
        if is_bridged(self):
            self._sync_bridge().size_pool(concurrency)

    def _sync_bridge(self) -> SyncBridge:
        """The calls of a guide-style adapter: made once, from its configuration."""
        bridge: SyncBridge | None = self.__dict__.get("_bridge")
        if bridge is None:
            bridge = SyncBridge(
                self.generate_response,
                self._bridge_settings(),
                sleep=self.__dict__.get("_bridge_sleep", anyio.sleep),
                should_retry=self.should_retry,
            )
            self.__dict__["_bridge"] = bridge
        return bridge

    def _bridge_settings(self) -> BridgeSettings:
        cfg = self.configuration or ModelConfiguration()
        declared = (
            limits_from_dict(self.get_rate_limits())
            if _overrides(type(self), "get_rate_limits")
            else RateLimits()
        )
        secrets = [v for k, v in cfg.items() if is_secret_key(k) and isinstance(v, str)]
        endpoint = cfg.get("api_endpoint")
        scrub = Redactor.of(keys=secrets, urls=[endpoint])
        digest = (
            hashlib.sha256("\n".join(scrub.secrets).encode()).hexdigest()[:12]
            if scrub.secrets
            else "-"
        )
        kind = self.registered_type or f"{type(self).__module__}.{type(self).__qualname__}"
        where = redact_url(endpoint) if isinstance(endpoint, str) else "-"
        defaults = RetryPolicy()
        own_defaults = (
            unknown_settings(self.get_default_config())
            if _overrides(type(self), "get_default_config")
            else {}
        )
        return BridgeSettings(
            model=str(cfg.get("model_name") or self.model_info().model_id),
            own_defaults=own_defaults,
            connection_key=f"{kind}|{where}|{digest}",
            limits=BudgetLimits(
                rpm=cfg.rpm or declared.requests_per_minute,
                tpm=cfg.tpm or declared.tokens_per_minute,
            ),
            concurrency=cfg.concurrency or declared.concurrency,
            timeout_s=cfg.timeout or DEFAULT_TIMEOUT_S,
            retry=RetryPolicy(
                max_retries=defaults.max_retries if cfg.max_retries is None else cfg.max_retries,
                max_elapsed_s=cfg.max_retry_time or defaults.max_elapsed_s,
            ),
            max_retry_after=60.0 if cfg.max_retry_after is None else cfg.max_retry_after,
            scrub=scrub,
        )

    async def preflight(self) -> None:
        """Check, with one cheap call, that the endpoint can serve a run; called once
        before the first conversation. Raise :class:`~convsim.EndpointError` saying what
        to fix when it cannot (unreachable, key refused, wrong URL); anything less
        certain passes. Default: nothing to check."""
        return None

    def should_retry(self, error: AdapterError) -> bool:
        """Whether a failed attempt is worth trying again (default: what the error
        declares, ``error.retryable``)."""
        return error.retryable

    async def stream(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        on_text: Callable[[str], None],
    ) -> Completion:
        """Like :meth:`generate`, streaming: ``on_text`` gets each piece as it arrives.

        Raises:
            ConfigError: the adapter does not stream (:attr:`supports_streaming`).
        """
        raise ConfigError(f"{self.model_info().model_type} models do not stream")

    async def count_tokens(self, text: str) -> int | None:
        """The tokens of ``text`` by the model's own tokenizer (the server's tokenize
        endpoint, or a local tokenizer), for answers that came without usage; None when
        the adapter has none (the default)."""
        return None

    @property
    def supports_prompt_logprobs(self) -> bool:
        """Whether this adapter, as configured, can score a prompt
        (:meth:`prompt_logprobs`, what lm-eval's loglikelihood tasks need)."""
        return False

    def no_prompt_logprobs_reason(self) -> str:
        """Why this adapter, as configured, cannot score prompts."""
        return f"the {self.model_info().model_type} adapter returns no prompt logprobs"

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs:
        """Score ``prompt``: each of its tokens with its logprob.

        Raises:
            LogprobsUnsupported: the adapter cannot (:attr:`supports_prompt_logprobs`).
        """
        raise LogprobsUnsupported(self.no_prompt_logprobs_reason())


def is_bridged(adapter: ModelAdapter | type[ModelAdapter]) -> bool:
    """Whether an adapter (or its class) is written in the guide's style: its
    ``generate`` is the bridge to its own ``generate_response``."""
    cls = adapter if isinstance(adapter, type) else type(adapter)
    return cls.generate is _generate_from_sync


async def _generate_from_sync(
    self: ModelAdapter, messages: Sequence[Message], params: GenerationParams
) -> Completion:
    """Answer with the adapter's own ``generate_response`` (the conversation as one
    prompt, the settings as the guide's dict), run in a worker thread under the
    adapter's budget, cap, deadline and retries."""
    return await self._sync_bridge().call(messages, params)


def _overrides(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a class between it and ModelAdapter) defines ``name``."""
    return getattr(cls, name, None) is not getattr(ModelAdapter, name)


@cache
def _guide_form(function: Callable[..., Any]) -> bool:
    """Whether an ``estimate_cost`` takes the guide's (prompt_tokens, completion_tokens)
    rather than convsim's (usage)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())[1:]  # self
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) >= 2


def _usage_argument(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Usage | None:
    """The Usage of an ``estimate_cost(usage)`` call, or None for the other form."""
    if len(args) == 1 and not kwargs and isinstance(args[0], Usage):
        return args[0]
    if not args and set(kwargs) == {"usage"} and isinstance(kwargs["usage"], Usage):
        return kwargs["usage"]
    return None


def _token_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int]:
    names = ("prompt_tokens", "completion_tokens")
    given = dict(zip(names, args, strict=False))
    extra = set(kwargs) - set(names)
    given_twice = set(given) & set(kwargs)
    given.update(kwargs)
    if len(args) > 2 or extra or given_twice or set(given) != set(names):
        raise TypeError("estimate_cost takes a Usage, or prompt_tokens and completion_tokens")
    counts = [given[name] for name in names]
    for name, count in zip(names, counts, strict=True):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise TypeError(f"estimate_cost: {name} must be a number of tokens, not {count!r}")
    return counts[0], counts[1]


def _settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A guide settings dict as a turn's settings: None values left to the backend."""
    params = params_from_dict(dict(config or {}), "generation config")
    return params.model_dump(exclude_none=True, exclude={"metadata"})


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it (a cache key is JSON): as it is, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


@runtime_checkable
class PromptScorer(Protocol):
    """What scoring a prompt takes (``echo`` + ``logprobs`` on OpenAI-compatible
    completions servers such as vLLM); every :class:`ModelAdapter` has it, and says with
    ``supports_prompt_logprobs`` whether it works."""

    async def count_tokens(self, text: str) -> int | None:
        """The tokens of ``text`` by the model's own tokenizer (the server's tokenize
        endpoint, or a local tokenizer), for answers that came without usage; None when
        the adapter has none (the default)."""
        return None

    @property
    def supports_prompt_logprobs(self) -> bool: ...

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs: ...


def can_score_prompts(adapter: ModelAdapter) -> bool:
    """True when ``adapter`` says it can score prompts, so callers can refuse at once
    instead of failing on every request."""
    return adapter.supports_prompt_logprobs
