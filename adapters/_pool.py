"""One owner for the models an application builds: :class:`ModelPool`.

A pool builds adapters from model references through the adapter registry, one adapter
per distinct reference; shares one :class:`~convsim.adapters.Budgets` among everything
it holds, so that adapters with the same connection key share one rate budget; sizes
the connection pools of what it built for the application's concurrency; checks every
distinct endpoint before the work starts; and closes what it built, never an adapter a
caller handed it. :func:`split_limits` divides a reference's rpm and tpm among the
workers (processes, Ray actors) that run it at once.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import anyio

from convsim._errors import ConfigError, EndpointError
from convsim._log import get_logger
from convsim._plural import counted
from convsim._registry import Registry

from ._budget import Budgets
from ._cache import CachedAdapter, ResponseCache
from ._protocol import ModelAdapter
from ._registry import ADAPTERS, ModelSpec, build_adapter, parse_model_spec

__all__ = ["ModelPool", "ModelReference", "split_limits"]

log = get_logger("convsim.adapters")

CLOSE_TIMEOUT_S = 30.0
"""The longest closing the pool's adapters may take, even when cancelled."""

SPLIT_LIMITS = ("rpm", "tpm")
"""The adapter arguments that are a provider key's budget, divided among workers."""


@runtime_checkable
class ModelReference(Protocol):
    """A model named by its spec and the adapter arguments it is built with, such as
    :class:`convsim.ModelRef`."""

    @property
    def spec(self) -> str: ...

    @property
    def args(self) -> Mapping[str, Any]: ...


@dataclass
class _Held:
    """One adapter of the pool, and what names it."""

    adapter: ModelAdapter
    owned: bool
    """Built by the pool (it closes it), or handed in by a caller (who closes it)."""
    name: str
    """The reference or model id, when no role names it."""
    roles: list[str] = field(default_factory=list)

    def shown(self) -> str:
        """How errors name this endpoint: its roles, else its reference."""
        return " and ".join(self.roles) or self.name


class ModelPool:
    """Builds model adapters from references and owns them; use it as an async
    context manager, which closes what it built::

        async with ModelPool(concurrency=32) as models:
            model = models.get("openai:gpt-4o-mini", {"rpm": "600"}, role="model under test")
            judge = models.get(ModelRef(spec="openai:gpt-4o"), role="judge")
            await models.preflight()
            ...

    Args:
        budgets: the rate budgets to share (default: a new one, this pool's own).
        concurrency: calls the application makes at once: the connection pool and cap
            of every adapter the pool builds, unless its arguments set ``concurrency``
            (None: each adapter keeps its own default).
        registry: where model types are looked up.
        cache: answer every model of the pool from this response cache where it can
            (None: no cache): each adapter handed out is a
            :class:`~convsim.adapters.CachedAdapter` in front of the real one.
    """

    def __init__(
        self,
        *,
        budgets: Budgets | None = None,
        concurrency: int | None = None,
        registry: Registry[ModelAdapter] = ADAPTERS,
        cache: ResponseCache | None = None,
    ) -> None:
        if concurrency is not None and concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, not {concurrency}")
        self.budgets = budgets if budgets is not None else Budgets()
        """Rate budgets by provider key, shared by every adapter of the pool."""
        self.concurrency = concurrency
        self.cache = cache
        """The response cache in front of every model of the pool, if any."""
        self._registry = registry
        self._held: list[_Held] = []
        self._by_reference: dict[Hashable, _Held] = {}

    # -- building -----------------------------------------------------------------------

    def get(
        self,
        model: str | ModelSpec | ModelReference | ModelAdapter,
        args: Mapping[str, Any] | None = None,
        *,
        role: str | None = None,
    ) -> ModelAdapter:
        """The adapter for ``model``: built on the first request for a reference (a
        spec with ``args``, or a :class:`ModelReference`), the same one afterwards; a
        caller's adapter instance is taken as it is, sharing the pool's budgets but
        keeping its own connection pool, and is never closed by the pool.

        Args:
            model: ``TYPE[:MODEL]`` (or ``module:Class``), a parsed spec, a reference,
                or an adapter.
            args: the adapter's arguments (``--model-arg``), with a spec only.
            role: what the model does here (``judge``); errors of the check before the
                run name it.

        Raises:
            ConfigError: the spec is malformed, the arguments are invalid (an adapter's
                own ``validate_config`` included), or the registered factory does not
                make a ModelAdapter.
            RegistryError: no such model type.
        """
        if isinstance(model, ModelAdapter):
            if args is not None:
                raise ConfigError("model arguments go with a model spec, not an adapter")
            return self._adopt(model, role)
        if isinstance(model, str):
            spec = parse_model_spec(model)
        elif isinstance(model, ModelSpec):
            spec = model
        else:
            if not isinstance(model, ModelReference):
                raise ConfigError(
                    f"a {type(model).__name__} is not a model: give a spec such as "
                    "'scripted', a reference (spec and args), or a ModelAdapter"
                )
            if args is not None:
                raise ConfigError(f"{model.spec}: the reference carries its arguments already")
            spec, args = parse_model_spec(model.spec), model.args
        config = dict(args or {})
        named = dict(config)
        if spec.model is not None:  # openai:m and openai with model=m are one model
            named.setdefault("model", spec.model)
        key = (spec.type, _frozen(named))
        held = self._by_reference.get(key)
        if held is None:
            adapter = build_adapter(spec, config, registry=self._registry)
            if not isinstance(adapter, ModelAdapter):
                raise ConfigError(
                    f"{spec}: the registered factory made a {type(adapter).__name__}, "
                    "not a convsim.adapters.ModelAdapter"
                )
            self._attach(adapter, size=True)
            held = _Held(self._cached(adapter), owned=True, name=str(spec))
            self._held.append(held)
            self._by_reference[key] = held
        _add_role(held, role)
        return held.adapter

    def _adopt(self, adapter: ModelAdapter, role: str | None) -> ModelAdapter:
        held = next((h for h in self._held if adapter in (h.adapter, _inner(h.adapter))), None)
        if held is None:
            adapter.check_configuration()
            # the caller's adapter keeps its own pool and cap (it may serve others too)
            self._attach(adapter, size=False)
            held = _Held(self._cached(adapter), owned=False, name=adapter.model_info().model_id)
            self._held.append(held)
        _add_role(held, role)
        return held.adapter

    def _cached(self, adapter: ModelAdapter) -> ModelAdapter:
        """``adapter`` behind the pool's cache, when it has one."""
        if self.cache is None or isinstance(adapter, CachedAdapter):
            return adapter
        return CachedAdapter(adapter, self.cache)

    def _attach(self, adapter: ModelAdapter, *, size: bool) -> None:
        """Give ``adapter`` the pool's budgets and, when ``size``, its concurrency."""
        legacy = getattr(adapter, "bind_budgets", None)
        if legacy is not None:  # written for the one hook these two replaced
            warnings.warn(
                f"{type(adapter).__name__}.bind_budgets() is no longer called by that name: "
                "implement share_budgets(budgets) and size_pool(concurrency) instead",
                DeprecationWarning,
                stacklevel=3,
            )
            if size and self.concurrency is not None:
                legacy(self.budgets, concurrency=self.concurrency)
            else:
                legacy(self.budgets)
            return
        if size and self.concurrency is not None:
            adapter.size_pool(self.concurrency)
        adapter.share_budgets(self.budgets)

    # -- what the application asks of its models -----------------------------------------

    def adapters(self) -> list[ModelAdapter]:
        """Every adapter of the pool, built or handed in, in the order first asked for."""
        return [held.adapter for held in self._held]

    def connections_needed(self) -> int:
        """Connections the pool's models may hold at once: for each that talks to a
        server (one with a connection key), its own cap, at most the concurrency."""
        needed = 0
        for held in self._held:
            if held.adapter.connection_key() is None:
                continue
            cap = held.adapter.rate_limits().concurrency
            caps = [c for c in (cap, self.concurrency) if c is not None]
            needed += min(caps) if caps else 0
        return needed

    async def preflight(self) -> None:
        """Check each distinct endpoint with one cheap call (adapters sharing a
        connection key are checked once), in the order they were first asked for.

        Raises:
            EndpointError: naming the endpoint (its roles, else its reference) and what
                to fix (server down, key refused, wrong base_url).
        """
        checked: set[str] = set()
        for held in list(self._held):
            key = held.adapter.connection_key()
            if key is not None:
                if key in checked:
                    continue
                checked.add(key)
            try:
                await held.adapter.preflight()
            except EndpointError as exc:
                raise EndpointError(
                    f"{held.shown()}: {exc}", url=exc.url, status_code=exc.status_code
                ) from exc
            log.debug("endpoint_checked", role=held.shown(), model=held.name)

    # -- closing ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close every adapter the pool built, and forget all it holds. Runs shielded
        from cancellation, for at most :data:`CLOSE_TIMEOUT_S`.

        Raises:
            Exception: the first error an adapter's ``aclose`` raised, once every other
                adapter has been closed (each error is logged).
        """
        owned = [held for held in self._held if held.owned]
        self._held.clear()
        self._by_reference.clear()
        errors: list[Exception] = []
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True) as scope:
            for held in owned:
                try:
                    await held.adapter.aclose()
                except Exception as exc:
                    errors.append(exc)
                    log.warning("model_close_failed", model=held.name, error=repr(exc))
        if scope.cancelled_caught:
            log.warning("model_close_timed_out", timeout_s=CLOSE_TIMEOUT_S)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> ModelPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.aclose()
        except Exception:
            if exc is None:
                raise
            # the body's error is the one to see; the failed close was logged


def _inner(adapter: ModelAdapter) -> ModelAdapter | None:
    """The adapter a cache stands in front of, if ``adapter`` is such a front."""
    return adapter.inner if isinstance(adapter, CachedAdapter) else None


def _add_role(held: _Held, role: str | None) -> None:
    if role is not None and role not in held.roles:
        held.roles.append(role)


def _frozen(value: Any) -> Hashable:
    """``value`` as a dictionary key: equal arguments give equal keys."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def split_limits(args: Mapping[str, Any], workers: int) -> list[dict[str, Any]]:
    """Adapter arguments for each of ``workers`` running one reference at once, with
    its rpm and tpm divided among them, so that together they keep to the totals.

    A whole total of at least one per worker is dealt out in whole units (100 among 3:
    34, 33, 33), so the shares add up to it exactly and none is 0; a smaller or
    fractional total is divided evenly (2 among 4: 0.5 each). Other arguments are
    copied unchanged.

    Raises:
        ConfigError: ``workers`` is below 1, or an rpm or tpm is not a number above 0.
    """
    if workers < 1:
        raise ConfigError(f"cannot split model limits among {counted(workers, 'worker')}")
    shares = [dict(args) for _ in range(workers)]
    for name in SPLIT_LIMITS:
        if name not in args:
            continue
        for share, part in zip(shares, _split(_limit(name, args[name]), workers), strict=True):
            share[name] = part
    return shares


def _limit(name: str, value: Any) -> float:
    try:
        total = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"model argument {name}={value!r} is not a number") from None
    if not (math.isfinite(total) and total > 0):
        raise ConfigError(f"model argument {name}={value!r} must be a number above 0")
    return total


def _split(total: float, parts: int) -> list[int] | list[float]:
    if total.is_integer() and total >= parts:
        whole, extra = divmod(int(total), parts)
        return [whole + (1 if index < extra else 0) for index in range(parts)]
    return [total / parts] * parts
