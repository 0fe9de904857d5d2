"""Checking a scenario goal's success criteria against responses."""

from __future__ import annotations

import re
from collections.abc import Mapping

from convsim.scenarios._schema import Criterion, Goal

__all__ = ["check_criterion", "goal_met", "DETERMINISTIC_KINDS"]

#: Criterion kinds that can be checked without a model or user code.
DETERMINISTIC_KINDS = frozenset({"contains", "regex", "number"})
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def check_criterion(criterion: Criterion, text: str) -> bool | None:
    """Whether ``text`` meets the criterion; None for kinds this cannot decide here."""
    if criterion.kind == "contains":
        return str(criterion.value).casefold() in text.casefold()
    if criterion.kind == "regex":
        return re.search(str(criterion.value), text, re.IGNORECASE) is not None
    if criterion.kind == "number":
        target = float(criterion.value)
        tolerance = criterion.tolerance or 0.0
        for match in _NUMBER.findall(text):
            try:
                if abs(float(match.replace(",", "")) - target) <= tolerance:
                    return True
            except ValueError:
                continue
        return False
    return None


def goal_met(goal: Goal, responses: Mapping[str, str], final: str | None) -> bool:
    """True when every ``all_of`` and at least one ``any_of`` criterion hold.

    Criteria name the turn whose response they check (``turn_id``), else the final
    response. A criterion of a kind that cannot be decided here counts as not met.
    """
    if not goal.all_of and not goal.any_of:
        return False

    def holds(criterion: Criterion) -> bool:
        text = responses.get(criterion.turn_id) if criterion.turn_id else final
        return text is not None and check_criterion(criterion, text) is True

    return all(holds(c) for c in goal.all_of) and (
        not goal.any_of or any(holds(c) for c in goal.any_of)
    )
