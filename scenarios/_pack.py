"""A loaded, validated scenario pack and the conversations it expands to."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from convsim._records import MetricTiers
from convsim._types import Message

from ._schema import BUILTIN_VARIABLES, Flow, Scenario, TurnConfig
from ._templates import Template
from ._toolset import ToolSet

__all__ = ["Pack", "PackKind", "PreparedFlow", "PreparedTurn", "Conversation", "render_context"]

PackKind = Literal["multi_turn", "single_turn"]


@dataclass(frozen=True)
class PreparedTurn:
    """A turn with its template parsed; ``index`` is its position in the flow file."""

    config: TurnConfig
    index: int
    template: Template

    @property
    def turn_id(self) -> str:
        return self.config.turn_id


@dataclass(frozen=True)
class PreparedFlow:
    """A flow whose turns are in execution order (depends_on first, else file order)."""

    scenario_type: str
    flow: Flow
    turns: tuple[PreparedTurn, ...]


@dataclass(frozen=True)
class Conversation:
    """One scenario bound to its flow: the unit the runtime runs."""

    scenario: Scenario
    flow: PreparedFlow
    kind: PackKind
    source: str
    """Where the scenario was defined, e.g. ``scenarios.jsonl:7``."""
    origin: Any = field(default=None, compare=False, repr=False)
    """The object the conversation was built from, when a scorer needs it (the lm-eval
    task of an ``lm-eval:TASK`` document); None for packs read from files."""
    trial: int | None = None
    """Which of a scenario's repeated trials this is (1-based); None when run once."""
    allow_code: bool = False
    """The pack was loaded with ``allow_code``: scorers may run the code it carries
    (``validate_logic`` runs its test cases against the answers' code)."""
    tools: ToolSet | None = field(default=None, compare=False, repr=False)
    """The pack's tools (``tools.yml``); None for a pack without tools."""

    @property
    def conversation_id(self) -> str:
        sid = self.scenario.scenario_id
        return sid if self.trial is None else f"{sid}#{self.trial}"

    def missing_variables(self, turn: PreparedTurn) -> frozenset[str]:
        """Template variables of ``turn`` that neither the scenario nor the built-ins give."""
        return turn.template.fields - self.scenario.variables.keys() - _builtins(self.kind)

    def render(
        self,
        turn: PreparedTurn,
        transcript: Sequence[Message],
        *,
        max_chars: int | None = None,
    ) -> str:
        """The user's message for ``turn`` (or the user simulator's instruction);
        TemplateError before it would pass ``max_chars`` characters."""
        values: dict[str, object] = dict(self.scenario.variables)
        fields = turn.template.fields
        if self.kind == "multi_turn":
            if "context" in fields:
                values["context"] = render_context(transcript)
            values["scenario"] = self.scenario.scenario_description
            values["turn_index"] = turn.index
        return turn.template.render(values, max_chars=max_chars)


def _builtins(kind: PackKind) -> frozenset[str]:
    return BUILTIN_VARIABLES if kind == "multi_turn" else frozenset()


def render_context(transcript: Sequence[Message]) -> str:
    """The conversation so far as text, for the ``{context}`` template variable: what
    the user and the assistant said (tool calls and results left out)."""
    return "\n".join(
        f"{m.role.capitalize()}: {m.content}"
        for m in transcript
        if m.role not in ("system", "tool") and (m.content or not m.tool_calls)
    )


@dataclass(frozen=True)
class Pack:
    """A validated scenario pack. Build it with :func:`convsim.load_pack`."""

    name: str
    path: Path
    kind: PackKind
    description: str
    pack_hash: str
    """sha256 over the pack's files and load options; resume keys on it."""
    conversations: tuple[Conversation, ...]
    metrics: tuple[str, ...] = ()
    """Conversation-level metrics the pack asks for (config.yml ``metrics``)."""
    metric_tiers: MetricTiers | None = None
    """The tiers of config.yml's ``metrics.primary`` and ``metrics.secondary``; None
    for packs that declare none (multi-turn flows and task classes have no tiers)."""
    notes: tuple[str, ...] = field(default=())
    """Things worth knowing that are not errors (e.g. optional turns that will skip)."""
    load_options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The options it was loaded with besides its name (num_fewshot, context_mode,
    include_path, seed), as text and numbers: what loads it again the same way."""
    dataset: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Where a single-turn pack's problems came from: format, file (or name, config,
    split, revision and fingerprint of a ``datasets`` dataset) and, when ``dataset.size``
    sampled them, size, rows, seed and the ``sampled`` sentence; empty for other packs."""

    def __len__(self) -> int:
        return len(self.conversations)

    def with_trials(self, trials: int) -> Pack:
        """The pack with every scenario run ``trials`` times: conversations
        ``SCENARIO#1`` ... ``SCENARIO#K``, each with its own seed (seeds derive from the
        conversation id), resumable trial by trial. One trial is the pack itself."""
        if trials < 1:
            raise ValueError(f"trials must be at least 1, got {trials}")
        if trials == 1:
            return self
        digest = hashlib.sha256(f"{self.pack_hash}:trials={trials}".encode()).hexdigest()
        return replace(
            self,
            pack_hash=digest,
            conversations=tuple(
                replace(c, trial=k) for c in self.conversations for k in range(1, trials + 1)
            ),
            load_options={**self.load_options, "trials": trials},
        )

    def metric_names(self) -> frozenset[str]:
        """Every metric named anywhere in the pack."""
        names = set(self.metrics)
        for conv in self.conversations:
            names.update(conv.flow.flow.metrics)
            for turn in conv.flow.turns:
                names.update(turn.config.evaluation_metrics)
        return frozenset(names)

    def uses_user_role(self) -> bool:
        """True when some turn is answered by the simulated user."""
        return any(t.config.role == "user" for c in self.conversations for t in c.flow.turns)
