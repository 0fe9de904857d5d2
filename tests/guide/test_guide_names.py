"""Every name of the guide's non-task sections is where _guide_names.py says convsim
has it, and answers as the guide calls it (or, where not honoured, convsim does what
the note says instead)."""

from __future__ import annotations

import pytest
from _guide_names import NAMES, GuideName, table


@pytest.mark.parametrize("name", NAMES, ids=[f"{n.section}: {n.guide[:60]}" for n in NAMES])
def test_the_guides_name_is_where_the_table_says(name: GuideName) -> None:
    name.check()


def test_every_name_has_a_place_or_a_reason() -> None:
    assert len({n.guide for n in NAMES}) == len(NAMES), "a name is listed twice"
    for name in NAMES:
        assert name.status in {"yes", "partly", "no"}, name.guide
        assert name.status == "yes" or name.note, f"{name.guide}: say what differs, and why"
    rows = table().splitlines()
    assert len(rows) == len(NAMES) + 2 and all(row.count(" | ") == 5 for row in rows[2:])


def test_the_checks_leave_convsims_metric_registry_as_it_was() -> None:
    from convsim.metrics import METRICS

    before = set(METRICS)
    for name in NAMES:
        name.check()
    assert set(METRICS) == before
