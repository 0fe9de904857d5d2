"""Conditions on the tools' environment document: paths, placeholders and each test."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from convsim.scenarios import MISSING, StateCheck, check_state, resolve_path

DOC = {
    "orders": {
        "A-1001": {"status": "delivered", "total": 120.5, "items": ["shoes", "socks"]},
        "A-1002": {"status": "refunded", "total": 40, "gift": False},
    },
    "log": [],
}


def test_a_path_reads_keys_and_list_items_and_tells_missing_from_null() -> None:
    assert resolve_path(DOC, "orders.A-1001.items.1") == "socks"
    assert resolve_path(DOC, "orders.A-1001.items.-1") == "socks"
    assert resolve_path(DOC, "orders.A-1001.items.2") is MISSING
    assert resolve_path(DOC, "orders.A-1003.status") is MISSING
    assert resolve_path(DOC, "orders.A-1001.status.deeper") is MISSING
    assert resolve_path({"a": None}, "a") is None


@pytest.mark.parametrize(
    ("check", "held"),
    [
        ({"path": "orders.A-1001.status", "equals": "delivered"}, True),
        ({"path": "orders.A-1001.status", "equals": "refunded"}, False),
        ({"path": "orders.A-1002.total", "equals": 40.0}, True),  # numbers by value
        ({"path": "orders.A-1002.gift", "equals": 0}, False),  # a bool is not a number
        ({"path": "orders.A-1003.status", "equals": None}, False),  # missing is not null
        ({"path": "orders.A-1003", "exists": False}, True),
        ({"path": "orders.A-1001", "exists": False}, False),
        ({"path": "orders.A-1001.status", "not_equals": "refunded"}, True),
        ({"path": "orders.A-1001.status", "one_of": ["shipped", "delivered"]}, True),
        ({"path": "orders.A-1001.total", "at_most": 100}, False),
        ({"path": "orders.A-1001.total", "at_least": 100}, True),
        ({"path": "orders.A-1001.status", "at_least": 1}, False),  # not a number
        ({"path": "log", "equals": []}, True),
    ],
)
def test_each_test_holds_or_not(check: dict[str, object], held: bool) -> None:
    verdict = check_state(DOC, StateCheck.model_validate(check))
    assert verdict.held is held, verdict.message


def test_placeholders_take_the_call_arguments_and_a_missing_one_fails() -> None:
    check = StateCheck(path="orders.{order_id}.status", equals="delivered")
    assert check_state(DOC, check, {"order_id": "A-1001"}).held
    refused = check_state(DOC, check, {"order_id": "A-1002"})
    assert not refused.held
    assert refused.message == "orders.A-1002.status: expected 'delivered', found 'refunded'"
    unfilled = check_state(DOC, check, {})
    assert not unfilled.held and "no argument 'order_id'" in unfilled.message


@pytest.mark.parametrize(
    "check",
    [{"path": "a"}, {"path": "a", "equals": 1, "exists": True}, {"path": "", "equals": 1}],
)
def test_a_check_makes_exactly_one_test(check: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        StateCheck.model_validate(check)


def test_equals_null_is_a_test_of_its_own() -> None:
    check = StateCheck.model_validate({"path": "a", "equals": None})
    assert check.test == "equals"
    assert check_state({"a": None}, check).held
