"""Model adapters: the async contract, typed completions, the registry, the pool that
builds and owns them, the response cache, ``scripted``; and the developer guide's names
for them (``ModelConfiguration``, ``MODEL_ADAPTERS``, ``get_model_adapter``, the dict
forms of what an adapter says)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from convsim._types import CallTimings as CallTimings
    from convsim._types import Completion as Completion
    from convsim._types import Cost as Cost
    from convsim._types import GenerationParams as GenerationParams
    from convsim._types import Message as Message
    from convsim._types import ModelInfo as ModelInfo
    from convsim._types import RateLimits as RateLimits
    from convsim._types import Role as Role
    from convsim._types import ToolCall as ToolCall
    from convsim._types import ToolChoice as ToolChoice
    from convsim._types import ToolSpec as ToolSpec
    from convsim._types import Usage as Usage

    from ._app import AppAdapter as AppAdapter
    from ._app import AppOptions as AppOptions
    from ._app import AppReply as AppReply
    from ._app import app as app
    from ._app import load_app as load_app
    from ._budget import Budgets as Budgets
    from ._cache import CachedAdapter as CachedAdapter
    from ._cache import CacheStatistics as CacheStatistics
    from ._cache import ResponseCache as ResponseCache
    from ._cache import default_cache_dir as default_cache_dir
    from ._cache import parse_duration as parse_duration
    from ._egress import EgressPolicy as EgressPolicy
    from ._egress import is_public_address as is_public_address
    from ._guide_shapes import ConfigValidation as ConfigValidation
    from ._guide_shapes import CostDict as CostDict
    from ._guide_shapes import ModelInfoDict as ModelInfoDict
    from ._guide_shapes import RateLimitsDict as RateLimitsDict
    from ._guide_shapes import ResponseDict as ResponseDict
    from ._guide_shapes import UsageDict as UsageDict
    from ._model_configuration import ModelConfiguration as ModelConfiguration
    from ._pool import ModelPool as ModelPool
    from ._pool import ModelReference as ModelReference
    from ._pool import split_limits as split_limits
    from ._prompt import render_prompt as render_prompt
    from ._protocol import LogprobsUnsupported as LogprobsUnsupported
    from ._protocol import ModelAdapter as ModelAdapter
    from ._protocol import PromptLogprobs as PromptLogprobs
    from ._protocol import PromptScorer as PromptScorer
    from ._protocol import can_score_prompts as can_score_prompts
    from ._protocol import is_bridged as is_bridged
    from ._registry import ADAPTERS as ADAPTERS
    from ._registry import MODEL_ADAPTERS as MODEL_ADAPTERS
    from ._registry import AdapterTypes as AdapterTypes
    from ._registry import ModelSpec as ModelSpec
    from ._registry import build_adapter as build_adapter
    from ._registry import create_adapter as create_adapter
    from ._registry import get_model_adapter as get_model_adapter
    from ._registry import parse_model_args as parse_model_args
    from ._registry import parse_model_spec as parse_model_spec
    from ._registry import takes_argument as takes_argument
    from ._scripted import ScriptedAdapter as ScriptedAdapter
    from ._scripted import ScriptedConfig as ScriptedConfig

__getattr__, __dir__ = _lazy_module(__name__, globals())
