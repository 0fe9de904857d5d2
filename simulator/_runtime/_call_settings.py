"""The sampling settings of each model call: the answering adapter's defaults, then the
turn's own settings, then what belongs to the one call (seed, reference, metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field

from convsim._types import GenerationParams
from convsim.scenarios import Conversation, PreparedTurn

__all__ = ["CallSettings"]


@dataclass
class CallSettings:
    """One side's settings (the model under test, or the simulated user) for a run;
    each turn's merge is worked out once and shared by every conversation of the run."""

    defaults: GenerationParams
    side: str
    """``assistant`` or ``user``: who answers, for the call's metadata."""
    _by_turn: dict[int, GenerationParams] = field(default_factory=dict, repr=False)

    def for_call(
        self, conversation: Conversation, turn: PreparedTurn, seed: int
    ) -> GenerationParams:
        base = self._by_turn.get(id(turn))
        if base is None:
            cfg = turn.config.config
            base = self._by_turn[id(turn)] = self.defaults.merged(
                {
                    "temperature": cfg.temperature,
                    "max_tokens": cfg.max_tokens,
                    "top_p": cfg.top_p,
                    "stop": tuple(cfg.stop) if cfg.stop is not None else None,
                }
            )
        scenario = conversation.scenario
        return base.model_copy(
            update={
                "seed": seed,
                "reference": scenario.reference_responses.get(turn.turn_id)
                if self.side == "assistant"
                else None,
                "metadata": {
                    "conversation_id": conversation.conversation_id,
                    "scenario_id": scenario.scenario_id,
                    "turn_id": turn.turn_id,
                    "role": self.side,
                },
            }
        )
