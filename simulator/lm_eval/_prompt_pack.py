"""Single-turn packs whose documents come with their prompt already written: the
documents of an lm-eval task (``lm-eval:TASK``) or of a task class (``AdvancedTask``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convsim.scenarios import SINGLE_TURN_ID as TURN_ID
from convsim.scenarios import (
    Conversation,
    Flow,
    Pack,
    PreparedFlow,
    PreparedTurn,
    Scenario,
    Template,
    TurnConfig,
    TurnSettings,
)

from .._plural import counted

__all__ = ["PromptPackBuilder", "TURN_ID"]

_TEMPLATE = Template.parse("{prompt}")


@dataclass
class PromptPackBuilder:
    """Collects one single-turn conversation per document, sharing a flow between the
    documents with the same sampling settings, and hashes what it was given."""

    scenario_type: str
    salt: str
    """What identifies the source in the pack hash (its name and version)."""
    _flows: dict[str, PreparedFlow] = field(default_factory=dict)
    _conversations: list[Conversation] = field(default_factory=list)
    _digest: Any = None

    def __post_init__(self) -> None:
        self._digest = hashlib.sha256(f"{self.salt}\0".encode())

    def add(
        self,
        *,
        doc_id: int,
        name: str,
        description: str,
        prompt: str,
        settings: TurnSettings,
        reference: str,
        metadata: dict[str, Any],
        origin: Any,
        difficulty: str | None = None,
    ) -> None:
        """Add document ``doc_id`` of source ``name`` as conversation ``name-doc_id``."""
        key = settings.model_dump_json()
        if key not in self._flows:
            turn = TurnConfig(turn_id=TURN_ID, prompt_template="{prompt}", config=settings)
            flow = Flow(max_turns=1, conversation_timeout=300.0, metrics=[], turns=[turn])
            self._flows[key] = PreparedFlow(
                self.scenario_type, flow, (PreparedTurn(turn, 0, _TEMPLATE),)
            )
        self._digest.update(f"{doc_id}\0{prompt}\0{key}\0{reference}\0".encode())
        # model_construct: the values are built here, not read from a user's file
        scenario = Scenario.model_construct(
            scenario_id=f"{name}-{doc_id}",
            scenario_type=self.scenario_type,
            scenario_description=description,
            variables={"prompt": prompt},
            system_prompt=None,
            difficulty=difficulty,
            facts=[],
            probes=[],
            goal=None,
            user=None,
            required_keywords=[],
            reference_responses={TURN_ID: reference},
            tags=[],
            metadata=metadata,
        )
        self._conversations.append(
            Conversation(scenario, self._flows[key], "single_turn", f"{name}:{doc_id}", origin)
        )

    def pack(
        self, *, name: str, path: Path, metrics: tuple[str, ...], notes: tuple[str, ...] = ()
    ) -> Pack:
        return Pack(
            name=name,
            path=path,
            kind="single_turn",
            description=f"{name} ({counted(len(self._conversations), 'document')})",
            pack_hash=self._digest.hexdigest(),
            conversations=tuple(self._conversations),
            metrics=metrics,
            notes=notes,
        )
