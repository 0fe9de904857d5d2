"""What a plugin's scores must be before they are written.

A results file is read back by ``report``, ``score`` and ``--resume``; a score that
cannot be read back (a NaN is written as null beside status ``ok``), or is not a
:class:`~convsim.Score` at all, would make the whole file unreadable. So a plugin's
scores are checked first, and refused whole when any of them is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from convsim._records import ConversationResult, Score

from ._base import BasePlugin, PluginScores

__all__ = ["checked_scores"]


def checked_scores(
    added: object, plugin: BasePlugin, result: ConversationResult
) -> PluginScores | None:
    """``added``, what ``plugin.score(result)`` returned, if it may be written.

    Raises:
        ValueError: saying which score is wrong and how: not a PluginScores, a name
            that is not a string, a value that is not a Score, a value that is not a
            finite number or is outside the plugin's :meth:`~BasePlugin.score_range`, a
            turn that is not in the conversation, a score that does not read back.
    """
    if added is None:
        return None
    if not isinstance(added, PluginScores):
        raise ValueError(f"score() returned a {type(added).__name__}, not PluginScores or None")
    _check_all(plugin, _mapping(added.scores, "scores"), "")
    turn_ids = {turn.turn_id for turn in result.turns}
    for turn_id, scores in _mapping(added.turn_scores, "turn_scores").items():
        if turn_id not in turn_ids:
            raise ValueError(
                f"turn scores for {turn_id!r}, which is not a turn of {result.conversation_id!r}"
            )
        _check_all(plugin, _mapping(scores, f"turn_scores[{turn_id!r}]"), f" (turn {turn_id})")
    return added


def _mapping(value: object, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is a {type(value).__name__}, not a mapping")
    return value


def _check_all(plugin: BasePlugin, scores: Mapping[Any, Any], where: str) -> None:
    for name, score in scores.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"score name {name!r}{where} is not a non-empty string")
        _check(plugin, name, score, where)


def _check(plugin: BasePlugin, name: str, score: object, where: str) -> None:
    label = f"{name}{where}"
    if not isinstance(score, Score):
        raise ValueError(f"{label} is a {type(score).__name__}, not a Score")
    value = score.value
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, float | int):
            raise ValueError(f"{label}: value {value!r} is not a number")
        if not math.isfinite(value):
            raise ValueError(f"{label}: value {value} is not a finite number")
        bounds = plugin.score_range(name)
        if bounds is not None and not bounds.low <= value <= bounds.high:
            raise ValueError(
                f"{label}: value {value:g} is outside [{bounds.low:g}, {bounds.high:g}]"
            )
    try:  # exactly what the results file will hold must validate again
        Score.model_validate_json(score.model_dump_json())
    except ValidationError as exc:
        why = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(f"{label}: does not read back once written ({why})") from None
    except (ValueError, TypeError) as exc:  # details that cannot be serialised
        raise ValueError(f"{label}: cannot be written ({exc})") from None
