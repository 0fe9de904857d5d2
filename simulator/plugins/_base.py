"""The plugin extension point: one class, hooks with no-op defaults.

A plugin has a ``name`` and a ``version``, declares the scores it gives in ``metrics``
(:class:`PluginMetric`: ``convsim metrics`` lists them), takes its configuration through
:meth:`BasePlugin.initialize` (validated against its ``Config`` model first), and
overrides only the hooks it needs. Hooks see records (a manifest, a conversation's
result, a turn record), never the runtime's own objects. :meth:`BasePlugin.score` is
how a plugin contributes scores: it returns them for a finished conversation and they
are recorded in its result before it is written, once checked (each a :class:`Score`
with a finite value within :meth:`BasePlugin.score_range`).

The developer guide's form works too, beside convsim's: a plugin built from a dict of
settings (``Plugin(config)``), ``initialize()`` with no argument returning True when it
is ready, ``get_capabilities()``, ``get_config_schema()``, ``validate_config(config)``,
``process(data, context)`` and a plain ``cleanup()``. A plugin that declares no
``name`` is named after its class, as the guide names it.

Settings are checked in this order (:func:`checked_settings`): the plugin's own
``validate_config``, if it has one; the JSON schema of its own ``get_config_schema``, if
it has one; then its ``Config`` model. A plugin that declares no ``Config`` keeps its
settings as the dict they came in if it checks them itself (its own
``validate_config`` or schema) or is written to the guide's contract (its
``initialize`` takes no argument): such a plugin, like the guide's, accepts any
settings it does not check. Otherwise no ``Config`` means no settings, and settings
become the ``Config`` model.

Each hook call is isolated from the run (see ``_calls``): it has ``hook_timeout``
seconds; a sync hook (``score``, or any hook written without ``async``) runs in a
thread of its own, so blocking work belongs there, never in an ``async`` hook.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict

from convsim._errors import ConfigError, parse_config
from convsim._records import ConversationResult, Score, TurnRecord
from convsim.metrics import MetricTraits

__all__ = [
    "BasePlugin",
    "PluginMetric",
    "PluginScores",
    "ScoreRange",
    "NoConfig",
    "DEFAULT_HOOK_TIMEOUT_S",
    "CAPABILITY_HOOKS",
    "checked_settings",
    "guide_style",
]

DEFAULT_HOOK_TIMEOUT_S = 10.0
"""How long one hook call may take unless the plugin or its settings say otherwise."""

CAPABILITY_HOOKS = (
    "on_run_start",
    "on_run_end",
    "on_conversation_start",
    "on_turn",
    "on_conversation_end",
    "score",
    "process",
)
"""The hooks a plugin's default :meth:`BasePlugin.get_capabilities` lists, when the
plugin implements them."""


class NoConfig(BaseModel):
    """A plugin that takes no settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PluginScores:
    """What a plugin adds to a conversation: conversation scores, and scores per turn
    (by turn_id). Names should carry the plugin's name as a prefix (``code_analysis:``)."""

    scores: dict[str, Score] = field(default_factory=dict)
    turn_scores: dict[str, dict[str, Score]] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginMetric:
    """A score a plugin gives (from :meth:`BasePlugin.score`), declared so that
    ``convsim metrics`` can list it before any run."""

    name: str
    """As scored, with the plugin's prefix: ``code_analysis:summary``."""
    traits: MetricTraits
    """``turn`` for scores of each answer (``turn_scores``), ``conversation`` for those
    of the whole conversation (``scores``)."""
    description: str
    higher_is_better: bool | None = None


class BasePlugin:
    """Subclass it, set ``name`` (and ``version``, ``Config``, ``metrics``), override
    hooks."""

    name: ClassVar[str]
    """The plugin's name: the prefix of its scores, in the manifest and in failures.
    A plugin that sets none is named after its class."""
    version: ClassVar[str] = "0"
    metrics: ClassVar[tuple[PluginMetric, ...]] = ()
    """The scores the plugin gives, for ``convsim metrics`` (none declared: none
    listed, any still scored)."""
    Config: ClassVar[type[BaseModel]] = NoConfig
    hook_timeout: ClassVar[float] = DEFAULT_HOOK_TIMEOUT_S
    """Seconds one hook call may take; a user overrides it with the plugin setting
    ``hook_timeout`` (``--plugin-arg NAME.hook_timeout=30``). A hook that overruns it is
    abandoned and recorded, and the plugin is called no more: it may still be stuck."""

    config: Any
    """The settings: as given to the constructor until :meth:`initialize` has checked
    them; then the ``Config`` model (or, for a guide-style plugin, the checked dict)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "name"):
            cls.name = cls.__name__

    def __init__(self, config: Mapping[str, Any] | BaseModel | None = None) -> None:
        """A plugin holding its settings (the guide's form), checked by :meth:`initialize`.

        Raises:
            TypeError: ``config`` is neither a mapping of settings nor a settings model.
        """
        if config is not None and not isinstance(config, Mapping | BaseModel):
            raise TypeError(
                f"plugin {self.name}: config must be a mapping of settings, "
                f"not {type(config).__name__}"
            )
        self.config = config if isinstance(config, BaseModel) else dict(config or {})

    def initialize(self, config: Mapping[str, Any] | BaseModel | None = None) -> bool:
        """Take the settings, checked (:func:`checked_settings`); called once before the
        first run. Without an argument (the guide's call), the settings given to the
        constructor are checked.

        Returns:
            True: the plugin is ready (the guide's contract; an override may return
            False to say it is not).

        Raises:
            ConfigError: settings the plugin refuses, naming each field.
        """
        given = getattr(self, "config", None) if config is None else config
        self.config = checked_settings(self, given, f"plugin {self.name}")
        return True

    def get_capabilities(self) -> list[str]:
        """What the plugin does: by default, the hooks of :data:`CAPABILITY_HOOKS` it
        implements, in that order."""
        own = type(self)
        return [h for h in CAPABILITY_HOOKS if getattr(own, h) is not getattr(BasePlugin, h)]

    def get_config_schema(self) -> dict[str, Any]:
        """The JSON schema of the plugin's settings: by default its ``Config`` model's,
        or ``{}`` (any settings) for a guide-style plugin that declares none."""
        if self.Config is NoConfig and guide_style(self):
            return {}
        return self.Config.model_json_schema()

    def validate_config(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is settings the plugin accepts (:func:`checked_settings`
        says why not)."""
        try:
            checked_settings(self, config, f"plugin {self.name}")
        except ConfigError:
            return False
        return True

    def process(self, data: Any, context: Mapping[str, Any] | None = None) -> Any:
        """Process ``data`` on demand (the guide's call); plugins that offer it override it.

        Raises:
            NotImplementedError: this plugin does not process data on demand.
        """
        offers = ", ".join(self.get_capabilities()) or "no hooks"
        raise NotImplementedError(
            f"plugin {self.name} does not process data on demand; it offers: {offers}"
        )

    def cleanup(self) -> None:
        """Release what :meth:`initialize` took; called once when the plugin is
        unloaded or its simulator closes. An override may be ``async``."""

    async def on_run_start(self, manifest: Any) -> None:
        """A run starts (its :class:`~convsim.RunManifest`)."""

    async def on_run_end(self, statistics: Any) -> None:
        """A run ended (its :class:`~convsim.RunStatistics`)."""

    async def on_conversation_start(self, conversation_id: str, scenario_id: str) -> None:
        """A conversation starts."""

    async def on_turn(self, turn: TurnRecord) -> None:
        """A turn ended (completed, failed or skipped). Called in turn order, off the
        conversation's own task: a slow hook never holds a conversation up."""

    async def on_conversation_end(self, result: ConversationResult) -> None:
        """A conversation ended, scores included (the plugin's own among them)."""

    def score(self, result: ConversationResult) -> PluginScores | None:
        """Scores for a finished conversation, recorded in its result; None for none.
        Runs in a worker thread (it may block or compute)."""
        return None

    def score_range(self, name: str) -> ScoreRange | None:
        """The values score ``name`` may take; None: any finite value. A score outside
        its range is not written (the plugin's scores for that conversation are
        recorded as failed)."""
        return None


def _overrides(plugin: BasePlugin, method: str) -> bool:
    return getattr(type(plugin), method) is not getattr(BasePlugin, method)


def guide_style(plugin: BasePlugin) -> bool:
    """Whether ``plugin`` is written to the guide's contract: its ``initialize`` takes
    no argument (it holds its settings from construction and returns True or False)."""
    if not _overrides(plugin, "initialize"):
        return False
    parameters = inspect.signature(type(plugin).initialize).parameters
    return len(parameters) == 1  # self alone


def checked_settings(
    plugin: BasePlugin, config: Mapping[str, Any] | BaseModel | None, what: str
) -> Any:
    """``config`` as ``plugin`` takes it, once checked (see the module): its ``Config``
    model, or, for a guide-style plugin, the dict itself.

    Raises:
        ConfigError: naming ``what`` and what is wrong: the plugin's ``validate_config``
            said no, a JSON-schema error (with the field's path), a field the ``Config``
            model refuses, or a schema that is not one.
    """
    if isinstance(config, BaseModel):
        if isinstance(config, plugin.Config):
            return config
        raise ConfigError(
            f"invalid {what}: settings are a {type(config).__name__}, "
            f"not the plugin's {plugin.Config.__name__}"
        )
    settings = dict(config or {})
    own_check = _overrides(plugin, "validate_config")
    own_schema = _overrides(plugin, "get_config_schema")
    if own_check and not plugin.validate_config(settings):
        listed = ", ".join(sorted(map(str, settings))) or "no settings"
        raise ConfigError(f"invalid {what}: its validate_config() refused {listed}")
    if own_schema:
        problems = _schema_problems(plugin.get_config_schema(), settings, what)
        if problems:
            raise ConfigError(f"invalid {what}: " + "; ".join(problems))
    if plugin.Config is NoConfig and (own_check or own_schema or guide_style(plugin)):
        return settings
    return parse_config(plugin.Config, settings, what)


def _schema_problems(schema: Mapping[str, Any], settings: dict[str, Any], what: str) -> list[str]:
    """What ``settings`` get wrong against the JSON ``schema``, one line per error."""
    import jsonschema

    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(
            f"{what}: get_config_schema() returned an invalid JSON schema: {exc.message}"
        ) from None
    errors = sorted(validator_class(schema).iter_errors(settings), key=lambda e: list(e.path))
    return [
        f"{'.'.join(str(p) for p in error.path) or '(root)'}: {error.message}" for error in errors
    ]


class ScoreRange(NamedTuple):
    """The closed interval a score's value lies in."""

    low: float = -math.inf
    high: float = math.inf
