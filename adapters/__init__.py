"""Model adapters: the async contract, typed completions, the registry, ``scripted``."""

from __future__ import annotations

from ._protocol import ModelAdapter as ModelAdapter
from ._protocol import PromptLogprobs as PromptLogprobs
from ._protocol import PromptScorer as PromptScorer
from ._protocol import can_score_prompts as can_score_prompts
from ._registry import ADAPTERS as ADAPTERS
from ._registry import ModelSpec as ModelSpec
from ._registry import create_adapter as create_adapter
from ._registry import get_model_adapter as get_model_adapter
from ._registry import parse_model_args as parse_model_args
from ._registry import parse_model_spec as parse_model_spec
from ._scripted import ScriptedAdapter as ScriptedAdapter
from ._scripted import ScriptedConfig as ScriptedConfig
from ._types import CallTimings as CallTimings
from ._types import Completion as Completion
from ._types import Cost as Cost
from ._types import GenerationParams as GenerationParams
from ._types import Message as Message
from ._types import ModelInfo as ModelInfo
from ._types import RateLimits as RateLimits
from ._types import Role as Role
from ._types import Usage as Usage

__all__ = [
    "register_lm_eval_model",
    "ModelAdapter",
    "PromptScorer",
    "PromptLogprobs",
    "can_score_prompts",
    "ADAPTERS",
    "ModelSpec",
    "create_adapter",
    "get_model_adapter",
    "parse_model_args",
    "parse_model_spec",
    "ScriptedAdapter",
    "ScriptedConfig",
    "CallTimings",
    "Completion",
    "Cost",
    "GenerationParams",
    "Message",
    "ModelInfo",
    "RateLimits",
    "Role",
    "Usage",
]


def register_lm_eval_model() -> type:
    """Register convsim as the lm-eval model ``convsim`` and return its class. Imports
    lm_eval (which ``import convsim`` never does); call it before
    ``lm_eval.simple_evaluate(model="convsim", ...)``."""
    from ._lm_eval import register_lm_eval_model as register

    return register()
