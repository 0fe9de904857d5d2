"""A metrics engine's custom metrics as convsim metrics, usable by name in runs.

The developer guide registers custom metrics on an engine (``register_custom_metrics``
sets ``self.custom_metrics = {name: function}``). Each becomes a metric of convsim's
registry: in this process as soon as the engine is built, and in every process (``convsim
run --metrics NAME``) for engine classes a package declares in the entry-point group
``convsim.metric_engines`` (``NAME = "package.module:EngineClass"``); convsim.lm_eval's
metric source ``engines`` builds them on the registry's first miss or listing.

A function's parameters are filled by name from the conversation:

- ``response`` (or ``code``, ``text``, ``answer``, ``output``, ``model_output``,
  ``prediction``, ``completion``): the answer of a turn;
- ``reference`` (``expected_answer``, ``target``): the turn's reference response;
- ``prompt`` (``question``): what the user said in the turn;
- ``domain``: the scenario's ``metadata.domain``; ``language``: its ``metadata.language``,
  else ``"python"``; ``required_keywords`` (``keywords``): its required keywords;
- ``context``: a dict of the scenario's metadata, variables, domain, language, required
  keywords, and the turn's prompt and reference; ``doc``: the scenario as a dict;
- ``conversation_history`` (``history``): the turns before, as dicts;
- ``conversation_turns`` (``turns``): every answered turn, as dicts (``turn_index``,
  ``turn_id``, ``prompt``, ``response``); the function is then called once per
  conversation, else once per answered turn and the values averaged.

Parameters with defaults that match none of these keep their defaults; a required one is
an error, raised when a run asks for the metric. A function that returns None, or a
score that is not applicable, measured nothing for that turn; one needing a reference or
a domain is not called where there is none. A number (a bool counts) is the value.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol

from convsim._errors import ConfigError
from convsim._records import Score, TurnRecord, TurnStatus
from convsim._registry import Registry
from convsim.metrics import LogicCheck, Metric, MetricTraits
from convsim.scenarios import Conversation, Scenario

__all__ = [
    "ENGINE_GROUP",
    "EngineMetric",
    "EngineRegistration",
    "MetricEngine",
    "engine_origin",
    "register_engine_metrics",
    "register_engines",
]

ENGINE_GROUP = "convsim.metric_engines"
"""Entry-point group of metrics engine classes whose custom metrics runs may name."""

Role = Literal[
    "response",
    "reference",
    "prompt",
    "domain",
    "language",
    "keywords",
    "context",
    "doc",
    "history",
    "turns",
]

_ROLES: dict[str, Role] = {
    **dict.fromkeys(
        (
            "response",
            "code",
            "text",
            "answer",
            "output",
            "model_output",
            "prediction",
            "completion",
        ),
        "response",
    ),
    **dict.fromkeys(("reference", "expected_answer", "target"), "reference"),
    **dict.fromkeys(("prompt", "question"), "prompt"),
    "domain": "domain",
    "language": "language",
    **dict.fromkeys(("required_keywords", "keywords"), "keywords"),
    "context": "context",
    "doc": "doc",
    **dict.fromkeys(("conversation_history", "history"), "history"),
    **dict.fromkeys(("conversation_turns", "turns"), "turns"),
}


class MetricEngine(Protocol):
    """What this module asks of a metrics engine: its custom metrics by name."""

    @property
    def custom_metrics(self) -> Mapping[str, Callable[..., Any]]: ...


def engine_origin(engine: object) -> str:
    """Where an engine's metrics come from, as the registry records it: its class."""
    cls = type(engine)
    return f"{cls.__module__}:{cls.__qualname__}"


@dataclass(frozen=True)
class _Parameter:
    name: str
    role: Role
    positional_only: bool


@dataclass(frozen=True)
class _Binding:
    """How a function's parameters are filled from a conversation."""

    parameters: tuple[_Parameter, ...]

    @property
    def roles(self) -> frozenset[Role]:
        return frozenset(p.role for p in self.parameters)

    @property
    def per_conversation(self) -> bool:
        return "turns" in self.roles


def _bind(name: str, function: Callable[..., Any]) -> _Binding:
    """The binding of ``function``'s parameters; ConfigError for one it cannot fill."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"custom metric {name!r}: cannot read its parameters: {exc}") from exc
    parameters = []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        role = _ROLES.get(p.name)
        if role is None:
            if p.default is p.empty:
                raise ConfigError(
                    f"custom metric {name!r}: a run cannot fill its parameter {p.name!r}; "
                    f"it fills {', '.join(sorted(_ROLES))} (give {p.name!r} a default)"
                )
            continue
        parameters.append(_Parameter(p.name, role, p.kind is p.POSITIONAL_ONLY))
    binding = _Binding(tuple(parameters))
    if binding.per_conversation and binding.roles & {"response", "reference", "prompt"}:
        raise ConfigError(
            f"custom metric {name!r}: it takes the conversation's turns and one turn's "
            "answer at once; take one or the other"
        )
    return binding


def _turn_dict(turn: TurnRecord) -> dict[str, Any]:
    return {
        "turn_index": turn.turn_index,
        "turn_id": turn.turn_id,
        "prompt": turn.user_message or turn.prompt or "",
        "response": turn.response or "",
    }


def _domain(scenario: Scenario) -> str | None:
    domain = scenario.metadata.get("domain")
    return domain if isinstance(domain, str) and domain else None


class _Missing(Exception):
    """An input the function needs is not there (a reference, a domain)."""


def _values(
    binding: _Binding, scenario: Scenario, turn: TurnRecord | None, turns: Sequence[TurnRecord]
) -> dict[Role, Any]:
    """The value of each role the binding uses."""
    reference = scenario.reference_responses.get(turn.turn_id) if turn is not None else None
    prompt = (turn.user_message or turn.prompt or "") if turn is not None else ""
    domain = _domain(scenario)
    language = scenario.metadata.get("language") or "python"
    missing = []
    if "reference" in binding.roles and reference is None:
        missing.append("no completed turn has a reference response")
    if "domain" in binding.roles and domain is None:
        missing.append("the scenario names no domain (metadata.domain)")
    if missing:
        raise _Missing("; ".join(missing))
    values: dict[Role, Any] = {}
    for role in binding.roles:
        if role == "response":
            values[role] = turn.response if turn is not None else ""
        elif role == "reference":
            values[role] = reference
        elif role == "prompt":
            values[role] = prompt
        elif role == "domain":
            values[role] = domain
        elif role == "language":
            values[role] = language
        elif role == "keywords":
            values[role] = list(scenario.required_keywords)
        elif role == "context":
            values[role] = {
                **scenario.metadata,
                "variables": dict(scenario.variables),
                "domain": domain,
                "language": language,
                "required_keywords": list(scenario.required_keywords),
                "prompt": prompt,
                "reference": reference,
            }
        elif role == "doc":
            values[role] = scenario.model_dump(mode="json")
        elif role == "history":
            before = [t for t in turns if turn is not None and t.turn_index < turn.turn_index]
            values[role] = [_turn_dict(t) for t in before]
        else:
            values[role] = [_turn_dict(t) for t in turns]
    return values


def _call(function: Callable[..., Any], binding: _Binding, values: Mapping[Role, Any]) -> Any:
    args = [values[p.role] for p in binding.parameters if p.positional_only]
    kwargs = {p.name: values[p.role] for p in binding.parameters if not p.positional_only}
    return function(*args, **kwargs)


def _measured(result: Any) -> float | Score | None:
    """A function's result as a value, a score that is not a value, or None."""
    if isinstance(result, LogicCheck):
        result = result.score
    if result is None or isinstance(result, Score):
        return result
    if isinstance(result, bool):
        return 1.0 if result else 0.0
    if isinstance(result, (int, float)) and math.isfinite(float(result)):
        return float(result)
    raise TypeError(f"returned {type(result).__name__} {result!r:.80}, not a number")


class EngineMetric:
    """A custom metric of a metrics engine, scored by calling its function."""

    higher_is_better: bool | None = True
    cpu_heavy = True  # the engine's own code may take its time

    def __init__(self, name: str, function: Callable[..., Any], origin: str) -> None:
        self.name = name
        self.function = function
        self.binding = _bind(name, function)
        roles = self.binding.roles
        self.traits = MetricTraits(
            "conversation" if self.binding.per_conversation else "turn",
            needs=frozenset(need for need in ("reference", "domain") if need in roles),
        )
        doc = inspect.getdoc(function) or ""
        first = " ".join(doc.split("\n\n", 1)[0].split())
        what = first.rstrip(".") + "." if first else "A custom metric."
        self.description = f"{what} From the metrics engine {origin}."

    def scorer(self, conversation: Conversation) -> _EngineScorer:
        return _EngineScorer(self, conversation.scenario)


@dataclass
class _EngineScorer:
    metric: EngineMetric
    scenario: Scenario
    turns: list[TurnRecord] = field(default_factory=list)

    def update(self, turn: TurnRecord) -> None:
        if turn.status is TurnStatus.COMPLETED and turn.response is not None:
            self.turns.append(turn)

    def result(self) -> Score:
        if not self.turns:
            return Score.not_applicable("no completed turns")
        binding = self.metric.binding
        calls = [None] if binding.per_conversation else self.turns
        values: list[float] = []
        missing: set[str] = set()
        for turn in calls:
            try:
                inputs = _values(binding, self.scenario, turn, self.turns)
            except _Missing as exc:
                missing.add(str(exc))
                continue
            try:
                measured = _measured(_call(self.metric.function, binding, inputs))
            except Exception as exc:  # the engine's own code: anything can go wrong
                return Score.failed(f"{self.metric.name}: {type(exc).__name__}: {exc}"[:500])
            if isinstance(measured, Score):
                if measured.status == "failed":
                    return measured
                if measured.value is None:
                    continue
                measured = measured.value
            if measured is not None:
                values.append(measured)
        if not values:
            reason = "; ".join(sorted(missing)) or "the metric measured nothing (it returned None)"
            return Score.not_applicable(reason)
        details: dict[str, Any] = {"n": len(values)}
        if not binding.per_conversation:
            details["turns_read"] = len(self.turns)
        return Score(value=sum(values) / len(values), details=details)


def _unbuildable(reason: str) -> Metric:
    raise ConfigError(reason)


@dataclass(frozen=True)
class EngineRegistration:
    """What registering an engine's custom metrics did."""

    registered: tuple[str, ...]
    """Names now scored by the engine's functions."""
    kept: tuple[str, ...]
    """Names another metric holds (convsim's own, another package's): runs keep
    scoring those; the engine's function is reached through ``calculate_metric``."""


def register_engine_metrics(engine: MetricEngine, registry: Registry[Metric]) -> EngineRegistration:
    """Register ``engine``'s custom metrics in ``registry``. A name this engine's class
    registered before is replaced (an engine built again); one held by another metric
    is kept as it is."""
    origin = engine_origin(engine)
    registered, kept = [], []
    for name, function in engine.custom_metrics.items():
        if name in registry and registry.origin(name) != origin:
            kept.append(name)
            continue
        factory: Callable[[], Metric]
        try:
            _bind(name, function)
            factory = partial(EngineMetric, name, function, origin)
        except ConfigError as exc:  # named by a run, it says why it cannot be scored
            factory = partial(_unbuildable, str(exc))
        registry.register(name, factory, replace=True, origin=origin)
        registered.append(name)
    return EngineRegistration(tuple(registered), tuple(kept))


def _engines() -> Iterator[Any]:
    for ep in entry_points(group=ENGINE_GROUP):
        try:
            engine_class = ep.load()
            yield engine_class()
        except Exception as exc:  # a package's engine: anything can go wrong
            raise ConfigError(
                f"metric engine {ep.name!r} ({ep.value}, entry point {ENGINE_GROUP}): "
                f"cannot be built: {type(exc).__name__}: {exc}"
            ) from exc


def register_engines(registry: Registry[Metric]) -> None:
    """The metric source ``engines`` (entry point ``convsim.metric_sources``): builds
    every engine class of ``convsim.metric_engines`` and registers its custom metrics."""
    for engine in _engines():
        if getattr(engine, "metric_registry", None) is not registry:
            register_engine_metrics(engine, registry)
