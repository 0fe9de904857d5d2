"""The sampling settings of each model call: the answering adapter's defaults, then the
turn's own settings, clipped to the user's token cap, then what belongs to the one call
(seed, reference, metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from convsim._types import GenerationParams
from convsim.scenarios import Conversation, PreparedTurn

__all__ = ["CallSettings"]


class _TurnCall(NamedTuple):
    """A turn's settings, worked out once per run."""

    params: GenerationParams
    clipped_from: int | None
    """The pack's max_tokens for the turn when the cap asked for fewer."""


@dataclass
class CallSettings:
    """One side's settings (the model under test, or the simulated user) for a run;
    each turn's merge is worked out once and shared by every conversation of the run."""

    defaults: GenerationParams
    side: str
    """``assistant`` or ``user``: who answers, for the call's metadata."""
    max_tokens: int | None = None
    """The user's cap on every call (``--max-tokens``, a ``max_tokens`` model argument):
    it wins over the pack's larger values and the adapter's default; None: no cap."""
    _by_turn: dict[int, _TurnCall] = field(default_factory=dict, repr=False)

    def _turn(self, turn: PreparedTurn) -> _TurnCall:
        known = self._by_turn.get(id(turn))
        if known is not None:
            return known
        cfg = turn.config.config
        params = self.defaults.merged(
            {
                "temperature": cfg.temperature,
                "max_tokens": cfg.max_tokens,
                "top_p": cfg.top_p,
                "stop": tuple(cfg.stop) if cfg.stop is not None else None,
                "frequency_penalty": cfg.frequency_penalty,
                "presence_penalty": cfg.presence_penalty,
            }
        )
        cap, clipped_from = self.max_tokens, None
        if cap is not None and (params.max_tokens is None or params.max_tokens > cap):
            params = params.model_copy(update={"max_tokens": cap})
            if cfg.max_tokens is not None and cfg.max_tokens > cap:
                clipped_from = cfg.max_tokens
        known = self._by_turn[id(turn)] = _TurnCall(params, clipped_from)
        return known

    def clipped_from(self, turn: PreparedTurn) -> int | None:
        """The pack's max_tokens for ``turn`` when the cap clipped it; None when the
        pack's value was kept (or it set none)."""
        return self._turn(turn).clipped_from

    def for_call(
        self, conversation: Conversation, turn: PreparedTurn, seed: int
    ) -> GenerationParams:
        base = self._turn(turn).params
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
