"""Scenario packs: the file formats, safe templates, loading and validation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from convsim._lazy import lazy_module as _lazy_module

if TYPE_CHECKING:
    from ._code_tests import TESTS_FIELD as TESTS_FIELD
    from ._code_tests import CodeTests as CodeTests
    from ._code_tests import code_tests as code_tests
    from ._code_tests import code_tests_problems as code_tests_problems
    from ._criteria import CriterionProblem as CriterionProblem
    from ._criteria import goal_problems as goal_problems
    from ._files import DEFAULT_MAX_FILE_BYTES as DEFAULT_MAX_FILE_BYTES
    from ._files import DEFAULT_MAX_LINE_BYTES as DEFAULT_MAX_LINE_BYTES
    from ._loader import BUNDLED_PACKS_DIR as BUNDLED_PACKS_DIR
    from ._loader import SINGLE_TURN_ID as SINGLE_TURN_ID
    from ._loader import MultiTurnFiles as MultiTurnFiles
    from ._loader import PackInfo as PackInfo
    from ._loader import list_packs as list_packs
    from ._loader import load_multi_turn_files as load_multi_turn_files
    from ._loader import load_pack as load_pack
    from ._loader import problems_pack as problems_pack
    from ._pack import Conversation as Conversation
    from ._pack import Pack as Pack
    from ._pack import PreparedFlow as PreparedFlow
    from ._pack import PreparedTurn as PreparedTurn
    from ._pack import render_context as render_context
    from ._regex import RegexError as RegexError
    from ._schema import BUILTIN_VARIABLES as BUILTIN_VARIABLES
    from ._schema import Criterion as Criterion
    from ._schema import Fact as Fact
    from ._schema import Flow as Flow
    from ._schema import Goal as Goal
    from ._schema import Probe as Probe
    from ._schema import Problem as Problem
    from ._schema import Scenario as Scenario
    from ._schema import SingleTurnConfig as SingleTurnConfig
    from ._schema import TurnConfig as TurnConfig
    from ._schema import TurnSettings as TurnSettings
    from ._schema import UserProfile as UserProfile
    from ._sources import PACK_SOURCES as PACK_SOURCES
    from ._sources import LoadOptions as LoadOptions
    from ._sources import PackSource as PackSource
    from ._state_checks import MISSING as MISSING
    from ._state_checks import StateVerdict as StateVerdict
    from ._state_checks import check_state as check_state
    from ._state_checks import fill_placeholders as fill_placeholders
    from ._state_checks import resolve_path as resolve_path
    from ._templates import Template as Template
    from ._tool_schema import ExpectedToolCall as ExpectedToolCall
    from ._tool_schema import StateCheck as StateCheck
    from ._tool_schema import ToolDefinition as ToolDefinition
    from ._tool_schema import ToolOperation as ToolOperation
    from ._tool_schema import ToolResponse as ToolResponse
    from ._tool_schema import ToolsFile as ToolsFile
    from ._tool_schema import TrajectoryMode as TrajectoryMode
    from ._toolbox import ToolBox as ToolBox
    from ._toolbox import ToolOutcome as ToolOutcome
    from ._toolset import ToolSet as ToolSet

__getattr__, __dir__ = _lazy_module(__name__, globals())
