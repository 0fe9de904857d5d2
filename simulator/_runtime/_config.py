"""What a :class:`~convsim.Simulator` is built from: models, judge settings and limits.

One frozen, validated object, built the same way by the Python API (from keyword
arguments or directly) and by the command line, and recorded in the run manifest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from convsim._errors import ConfigError, describe_validation_error, parse_config
from convsim.adapters import ModelAdapter, ResponseCache, parse_model_spec

from .._secrets import MASK, is_secret_key, looks_like_url, redact_url

__all__ = ["ModelRef", "ModelChoice", "JudgeConfig", "SimulatorConfig"]


class ModelRef(BaseModel):
    """A model named by its spec (``scripted``, ``openai:gpt-4o-mini``) and the adapter
    arguments (``--model-arg KEY=VALUE``) it is built with."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    spec: str
    """``TYPE`` or ``TYPE:MODEL``; the type picks the adapter."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Adapter arguments; values named like secrets never show in reprs or manifests."""

    @field_validator("spec")
    @classmethod
    def _valid_spec(cls, spec: str) -> str:
        try:
            parse_model_spec(spec)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return spec

    @field_serializer("args")
    def _dump_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """Dumped (to JSON, to a dict), a secret-named argument is never in clear."""
        return {k: _shown(k, v) for k, v in args.items()}

    def redacted_args(self) -> dict[str, str]:
        """The arguments fit for a manifest or a log: secrets replaced, values as text."""
        return {k: str(_shown(k, v)) for k, v in sorted(self.args.items())}

    def __repr_args__(self) -> Any:
        return [("spec", self.spec), ("args", self.redacted_args())]

    def __str__(self) -> str:
        return self.spec


def _shown(name: str, value: Any) -> Any:
    """An adapter argument as it may be shown: a secret masked, a URL without credentials."""
    if is_secret_key(name):
        return MASK
    return redact_url(value) if looks_like_url(value) else value


ModelChoice: TypeAlias = ModelRef | ModelAdapter
"""A model given by reference (built, owned and closed by the simulator) or as an
adapter instance (the caller's own, which it closes)."""


def _model_choice(value: Any) -> Any:
    """A spec string is a reference with no arguments; anything that is not a model
    is refused with what would be."""
    if isinstance(value, (str, Mapping)):
        try:
            return ModelRef.model_validate({"spec": value} if isinstance(value, str) else value)
        except ValidationError as exc:
            raise ValueError(describe_validation_error(exc, "model reference")) from None
    if value is None or isinstance(value, (ModelRef, ModelAdapter)):
        return value
    raise ValueError(
        f"a {type(value).__name__} is not a model: give a spec such as 'scripted', a "
        "ModelRef, or an instance of a convsim.adapters.ModelAdapter subclass (subclass "
        "it and implement generate(), or the guide's generate_response())"
    )


_ModelField = Annotated[ModelChoice, BeforeValidator(_model_choice)]


class JudgeConfig(BaseModel):
    """The model that grades judge metrics (``judge:<rubric>``, the guide's rubrics)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, hide_input_in_errors=True
    )

    model: _ModelField
    samples: int = Field(default=1, ge=1)
    """Grades per turn."""
    combine: Literal["mean", "majority"] = "mean"
    """How several grades of a turn combine (a majority tie goes to the lowest)."""
    sees_reasoning: bool = False
    """Each answer is shown to the judge with a reasoning model's reasoning before it,
    marked; by default the judge sees the answers only, as the user did."""


class SimulatorConfig(BaseModel):
    """Everything a simulator is built from, validated once.

    ``model``, ``user_model`` and the judge's ``model`` take a :class:`ModelRef` (or just
    its spec string) or an adapter instance.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, hide_input_in_errors=True
    )

    model: _ModelField = ModelRef(spec="scripted")
    """The model under test."""
    user_model: _ModelField | None = None
    """The simulated user, for turns with role ``user``."""
    judge: JudgeConfig | None = None
    """The model that grades judge metrics."""
    concurrency: int = Field(default=32, ge=1)
    """Conversations at once, across every run of the simulator."""
    metrics: tuple[str, ...] | None = None
    """Conversation metrics of every run (None: the defaults); packs add their own."""
    seed: int = 0
    """The run seed; each conversation derives its own from it."""
    conversation_timeout: float | None = Field(default=None, gt=0)
    """Seconds per conversation; overrides every flow's."""
    max_turns: int | None = Field(default=None, ge=1)
    """Overrides every flow's max_turns."""
    max_tokens: int | None = Field(default=None, ge=1)
    """The most tokens any model call of a turn may ask for (the model under test's
    and the simulated user's): a pack's larger per-turn ``max_tokens`` is clipped to
    it, a smaller one kept, a turn without one asks for this many (None: the pack's).
    A ``max_tokens`` model argument caps its own model's calls the same way; the
    smaller cap wins (see :meth:`token_cap`)."""
    max_cost: float | None = Field(default=None, gt=0)
    """USD a run may spend (the model under test's, the simulated user's and the
    judge's calls, as their adapters price them): no conversation starts that could take
    the run past it, counting what the conversations in flight may still cost. The run
    then stops cleanly, like a stop (in-flight conversations get the grace period, the
    rest stay unrecorded for ``--resume``). Every model must have a price."""
    grace_period: float = Field(default=5.0, ge=0)
    """Seconds in-flight conversations get to finish after a stop."""
    preflight: bool = True
    """Check each model endpoint with one cheap call before the first conversation,
    and stop at once when one is unreachable, refuses the key or has a wrong URL."""
    circuit_breaker: int = Field(default=20, ge=0)
    """Start no more conversations after this many in a row failed for infrastructure
    reasons with no answer from the model (0: never stop early)."""
    plugins: tuple[str, ...] = ()
    """Plugins to run, by name (``code_analysis``, or any entry point in the group
    ``convsim.plugins``)."""
    plugin_config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Settings by plugin name, validated against each plugin's ``Config``."""
    max_loop_lag: float | None = Field(default=0.05, gt=0)
    """Seconds the event loop may run late before the run starts no more conversations
    until it catches up (None: never hold back). A late loop adds its lag to every
    timing it takes, so this keeps latencies true when the process is the bottleneck."""
    max_transcript_chars: int | None = Field(default=None, ge=1)
    """The most characters one conversation's transcript may hold (prompts and answers);
    a turn that would pass it fails with TranscriptTooLong (None: no limit). Bounds
    the memory of packs whose prompts repeat ``{context}`` and of endless answers."""
    allow_code: bool = False
    """Let packs the simulator loads by name or folder run the code they name (python
    goal criteria; ``validate_logic`` runs their test cases against the answers' code,
    in a sandboxed subprocess); packs with code are code, so only for packs you trust."""
    cache: ResponseCache | None = None
    """Answer model, simulated-user and judge calls made before from this response
    cache (a :class:`~convsim.adapters.ResponseCache`, or the folder of one; True: the
    default folder); None: every call goes to its model."""

    @field_validator("cache", mode="before")
    @classmethod
    def _cache(cls, value: Any) -> Any:
        if value is True:
            return ResponseCache()
        if value is False:
            return None
        if isinstance(value, (str, os.PathLike)):
            if not str(value):
                raise ValueError("give the folder of the response cache")
            return ResponseCache(value)
        return value

    @field_validator("concurrency", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a positive integer")
        return value

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _tokens_not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number of tokens")
        return value

    @field_validator("circuit_breaker", mode="before")
    @classmethod
    def _count_not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number of conversations (0: off)")
        return value

    @field_validator("metrics", mode="before")
    @classmethod
    def _metric_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("takes a list of metric names, not one string")
        return value

    def token_cap(self, side: Literal["assistant", "user"]) -> int | None:
        """The most tokens a call of the model under test (``assistant``) or of the
        simulated user (``user``) may ask for: the smaller of :attr:`max_tokens` and
        that model's own ``max_tokens`` argument; None when neither is set (or there
        is no simulated user)."""
        model = self.model if side == "assistant" else self.user_model
        if model is None:
            return None
        own = _count(model.args.get("max_tokens")) if isinstance(model, ModelRef) else None
        caps = [c for c in (self.max_tokens, own) if c is not None]
        return min(caps) if caps else None

    @classmethod
    def from_arguments(
        cls,
        model: ModelAdapter | str = "scripted",
        *,
        model_args: Mapping[str, Any] | None = None,
        user_model: ModelAdapter | str | None = None,
        user_model_args: Mapping[str, Any] | None = None,
        judge: ModelAdapter | str | None = None,
        judge_args: Mapping[str, Any] | None = None,
        judge_samples: int = 1,
        judge_combine: str = "mean",
        judge_sees_reasoning: bool = False,
        **settings: Any,
    ) -> SimulatorConfig:
        """The config for the keyword arguments :class:`~convsim.Simulator` takes.

        Raises:
            ConfigError: naming every invalid setting.
        """
        data: dict[str, Any] = {
            "model": _reference(model, model_args, "model_args"),
            "user_model": _reference(user_model, user_model_args, "user_model_args"),
            **settings,
        }
        if judge is not None:
            if isinstance(judge_samples, bool) or not isinstance(judge_samples, int):
                raise ConfigError(f"judge_samples must be an integer, not {judge_samples!r}")
            if judge_samples < 1:
                raise ConfigError(f"judge_samples must be >= 1, not {judge_samples!r}")
            if judge_combine not in ("mean", "majority"):
                raise ConfigError(f"judge_combine must be mean or majority, not {judge_combine!r}")
            if not isinstance(judge_sees_reasoning, bool):
                raise ConfigError(
                    f"judge_sees_reasoning must be True or False, not {judge_sees_reasoning!r}"
                )
            data["judge"] = {
                "model": _reference(judge, judge_args, "judge_args"),
                "samples": judge_samples,
                "combine": judge_combine,
                "sees_reasoning": judge_sees_reasoning,
            }
        elif judge_args:
            raise ConfigError("judge_args given without a judge")
        elif judge_sees_reasoning:
            raise ConfigError("judge_sees_reasoning given without a judge")
        return parse_config(cls, data, "simulator setting")


def _count(value: Any) -> int | None:
    """A model argument as a positive count (``--model-arg`` gives text); None when it
    is not one (the adapter refuses it when it is built)."""
    if isinstance(value, bool):
        return None
    try:
        count = int(value)
    except (TypeError, ValueError):
        return None
    return count if count > 0 else None


def _reference(model: Any, args: Mapping[str, Any] | None, what: str) -> Any:
    """What the config validates for a model given as keyword arguments."""
    if model is None:
        if args:
            raise ConfigError(f"{what} given without a model")
        return None
    if isinstance(model, str):
        return {"spec": model, "args": dict(args or {})}
    if args and isinstance(model, ModelAdapter):
        raise ConfigError("model arguments only apply when the model is given as a spec")
    return model
