"""The conversation state machine and the pure turn planner."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from conftest import write_pack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convsim import (
    ConversationState,
    InvalidTransition,
    Status,
    TerminationReason,
    TurnStatus,
    load_pack,
)
from convsim._runtime._state import TRANSITIONS, Finish, Run, Skip, StateMachine, TurnPlanner
from convsim.scenarios import (
    Conversation,
    Flow,
    PreparedFlow,
    PreparedTurn,
    Scenario,
    Template,
    TurnConfig,
)

S = ConversationState
TERMINAL_STATES = {S.DONE, S.FAILED, S.TIMED_OUT, S.CANCELLED}
ALL_PAIRS = list(itertools.product(list(S), repeat=2))
ALLOWED = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
DISALLOWED = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]


def _pair_id(pair: tuple[ConversationState, ConversationState]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


# -- the transition table -----------------------------------------------------------


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(S)
    for targets in TRANSITIONS.values():
        assert targets <= set(S)


def test_table_has_the_expected_shape() -> None:
    # Sanity anchors, so the parametrized tests below cannot pass on an empty table.
    assert TRANSITIONS[S.PENDING] >= {S.USER_TURN, S.DONE, S.CANCELLED}
    assert TRANSITIONS[S.USER_TURN] >= {S.ASSISTANT_TURN, S.SCORING}
    assert TRANSITIONS[S.ASSISTANT_TURN] == {S.SCORING, S.FAILED, S.TIMED_OUT, S.CANCELLED}
    assert TRANSITIONS[S.SCORING] >= {S.USER_TURN, S.DONE, S.FAILED}
    assert len(ALLOWED) > 10 and len(DISALLOWED) > 30


@pytest.mark.parametrize("pair", ALLOWED, ids=_pair_id)
def test_allowed_transition_succeeds(pair: tuple[ConversationState, ConversationState]) -> None:
    current, target = pair
    machine = StateMachine("conv-1", state=current)
    machine.advance(target)
    assert machine.state is target
    assert machine.finished is (target in TERMINAL_STATES)


@pytest.mark.parametrize("pair", DISALLOWED, ids=_pair_id)
def test_disallowed_transition_raises(pair: tuple[ConversationState, ConversationState]) -> None:
    current, target = pair
    machine = StateMachine("conv-7", state=current)
    with pytest.raises(InvalidTransition) as info:
        machine.advance(target)
    message = str(info.value)
    assert current.value in message
    assert target.value in message
    assert f"{current.value} -> {target.value}" in message
    assert "conv-7" in message
    assert info.value.conversation_id == "conv-7"
    assert info.value.current == current.value
    assert info.value.target == target.value
    assert machine.state is current  # a refused transition changes nothing


@pytest.mark.parametrize(
    "state", sorted(TERMINAL_STATES, key=lambda s: s.value), ids=lambda s: s.value
)
def test_terminal_states_have_no_exits(state: ConversationState) -> None:
    assert TRANSITIONS[state] == frozenset()
    machine = StateMachine("c", state=state)
    assert machine.finished
    for target in S:
        with pytest.raises(InvalidTransition):
            machine.advance(target)


def test_non_terminal_states_have_exits_and_reach_an_ending() -> None:
    for state in set(S) - TERMINAL_STATES:
        assert TRANSITIONS[state], state
        # Every live state can end the conversation one way or another.
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL_STATES, state
        assert S.CANCELLED in TRANSITIONS[state]  # a run can always be stopped


def test_every_state_is_reachable_from_pending() -> None:
    seen, frontier = {S.PENDING}, [S.PENDING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(S)


def test_a_normal_turn_cycle_walks_through_the_table() -> None:
    machine = StateMachine("c")
    assert machine.state is S.PENDING
    for target in (
        S.USER_TURN,
        S.ASSISTANT_TURN,
        S.SCORING,
        S.USER_TURN,
        S.ASSISTANT_TURN,
        S.SCORING,
        S.DONE,
    ):
        machine.advance(target)
    assert machine.finished and machine.status is Status.DONE


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (S.DONE, Status.DONE),
        (S.FAILED, Status.FAILED),
        (S.TIMED_OUT, Status.TIMED_OUT),
        (S.CANCELLED, Status.CANCELLED),
    ],
    ids=lambda v: getattr(v, "value", v),
)
def test_status_of_terminal_states(state: ConversationState, status: Status) -> None:
    assert StateMachine("c", state=state).status is status


@pytest.mark.parametrize(
    "state", [S.PENDING, S.USER_TURN, S.ASSISTANT_TURN, S.SCORING], ids=lambda s: s.value
)
def test_status_refused_in_live_states(state: ConversationState) -> None:
    machine = StateMachine("live-1", state=state)
    assert not machine.finished
    with pytest.raises(InvalidTransition) as info:
        _ = machine.status
    assert state.value in str(info.value)
    assert "live-1" in str(info.value)


# -- the planner, driven with conversations from a pack on disk ---------------------


def conversation(
    tmp_path: Path,
    turns: list[dict[str, Any]],
    *,
    variables: dict[str, Any] | None = None,
    max_turns: int = 20,
) -> Conversation:
    folder = write_pack(
        tmp_path / "pack",
        {"default": {"max_turns": max_turns, "turns": turns}},
        [{"scenario_id": "sc-1", "scenario_description": "a test", "variables": variables or {}}],
    )
    pack = load_pack(folder)
    assert len(pack.conversations) == 1
    return pack.conversations[0]


def drive(
    planner: TurnPlanner, outcomes: dict[str, TurnStatus] | None = None
) -> list[Run | Skip | Finish]:
    """Iterate the planner, recording each Run's outcome (COMPLETED unless given)."""
    outcomes = outcomes or {}
    steps: list[Run | Skip | Finish] = []
    for step in planner.steps():
        steps.append(step)
        if isinstance(step, Run):
            status = outcomes.get(step.turn.turn_id, TurnStatus.COMPLETED)
            planner.record(step.turn, status, failure=TerminationReason.MODEL_ERROR)
    return steps


def summary(steps: list[Run | Skip | Finish]) -> list[tuple[str, str]]:
    out = []
    for step in steps:
        if isinstance(step, Run):
            out.append(("run", step.turn.turn_id))
        elif isinstance(step, Skip):
            out.append(("skip", step.turn.turn_id))
        else:
            out.append(("finish", step.reason.value))
    return out


def skip_reasons(steps: list[Run | Skip | Finish]) -> dict[str, str]:
    return {s.turn.turn_id: s.reason for s in steps if isinstance(s, Skip)}


def test_planner_runs_every_turn_when_all_succeed(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "b", "prompt_template": "B", "depends_on": ["a"]},
            {"turn_id": "c", "prompt_template": "C"},
        ],
    )
    planner = TurnPlanner(conv)
    steps = drive(planner)
    assert summary(steps) == [("run", "a"), ("run", "b"), ("run", "c"), ("finish", "completed")]
    assert planner.outcomes == {
        "a": TurnStatus.COMPLETED,
        "b": TurnStatus.COMPLETED,
        "c": TurnStatus.COMPLETED,
    }
    assert steps[-1].failed_turn is None


def test_depends_on_a_failed_optional_turn_is_skipped(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "opt", "prompt_template": "O", "optional": True},
            {"turn_id": "after", "prompt_template": "X", "depends_on": ["opt"]},
            {"turn_id": "last", "prompt_template": "L", "depends_on": ["a"]},
        ],
    )
    planner = TurnPlanner(conv)
    steps = drive(planner, {"opt": TurnStatus.FAILED})
    assert summary(steps) == [
        ("run", "a"),
        ("run", "opt"),
        ("skip", "after"),
        ("run", "last"),
        ("finish", "completed"),
    ]
    reason = skip_reasons(steps)["after"]
    assert "'opt'" in reason and "failed" in reason
    assert steps[-1].failed_turn is None  # an optional failure does not end the walk
    assert planner.outcomes["after"] is TurnStatus.SKIPPED


def test_depends_on_a_skipped_turn_is_skipped(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "opt", "prompt_template": "Also {extra}", "optional": True},
            {"turn_id": "child", "prompt_template": "C", "depends_on": ["opt"]},
            {"turn_id": "grandchild", "prompt_template": "G", "depends_on": ["child"]},
        ],
    )
    steps = drive(TurnPlanner(conv))
    assert summary(steps) == [
        ("run", "a"),
        ("skip", "opt"),
        ("skip", "child"),
        ("skip", "grandchild"),
        ("finish", "completed"),
    ]
    reasons = skip_reasons(steps)
    assert "'opt'" in reasons["child"] and "was skipped" in reasons["child"]
    assert "'child'" in reasons["grandchild"] and "was skipped" in reasons["grandchild"]


def test_optional_turn_with_a_missing_variable_is_skipped(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "Hi {name}"},
            {"turn_id": "opt", "prompt_template": "About {topic} and {zeta}", "optional": True},
            {"turn_id": "z", "prompt_template": "Z"},
        ],
        variables={"name": "Ann"},
    )
    steps = drive(TurnPlanner(conv))
    assert summary(steps) == [("run", "a"), ("skip", "opt"), ("run", "z"), ("finish", "completed")]
    reason = skip_reasons(steps)["opt"]
    assert reason.startswith("optional turn")
    assert "topic" in reason and "zeta" in reason


def test_optional_turn_with_its_variables_runs(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {
                "turn_id": "opt",
                "prompt_template": "About {topic} in turn {turn_index}",
                "optional": True,
            },
        ],
        variables={"topic": "tea"},
    )
    assert summary(drive(TurnPlanner(conv))) == [("run", "opt"), ("finish", "completed")]


@pytest.mark.parametrize("source", ["flow", "override"])
def test_max_turns_cuts_the_rest(tmp_path: Path, source: str) -> None:
    turns = [{"turn_id": t, "prompt_template": t.upper()} for t in ("a", "b", "c", "d")]
    if source == "flow":
        planner = TurnPlanner(conversation(tmp_path, turns, max_turns=2))
    else:
        planner = TurnPlanner(conversation(tmp_path, turns, max_turns=20), max_turns=2)
    steps = drive(planner)
    assert summary(steps) == [
        ("run", "a"),
        ("run", "b"),
        ("skip", "c"),
        ("skip", "d"),
        ("finish", "max_turns"),
    ]
    assert steps[-1] == Finish(TerminationReason.MAX_TURNS)
    for reason in skip_reasons(steps).values():
        assert "max_turns" in reason and "2" in reason


def test_max_turns_counts_only_turns_that_run(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "opt", "prompt_template": "{missing}", "optional": True},
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "b", "prompt_template": "B"},
        ],
        max_turns=2,
    )
    steps = drive(TurnPlanner(conv))
    assert summary(steps) == [("skip", "opt"), ("run", "a"), ("run", "b"), ("finish", "completed")]


def test_override_max_turns_wins_over_the_flow(tmp_path: Path) -> None:
    turns = [{"turn_id": t, "prompt_template": t} for t in ("a", "b", "c")]
    steps = drive(TurnPlanner(conversation(tmp_path, turns, max_turns=1), max_turns=3))
    assert summary(steps) == [("run", "a"), ("run", "b"), ("run", "c"), ("finish", "completed")]


def test_a_failed_required_turn_ends_the_walk(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "b", "prompt_template": "B"},
            {"turn_id": "c", "prompt_template": "C"},
            {"turn_id": "d", "prompt_template": "D", "optional": True},
        ],
    )
    planner = TurnPlanner(conv)
    steps = drive(planner, {"b": TurnStatus.FAILED})
    assert summary(steps)[:-1] == [("run", "a"), ("run", "b"), ("skip", "c"), ("skip", "d")]
    assert isinstance(steps[-1], Finish)
    assert steps[-1].reason is TerminationReason.MODEL_ERROR  # the reason given to record()
    assert steps[-1].failed_turn == "b"
    for reason in skip_reasons(steps).values():
        assert reason.startswith("conversation ended")
        assert "'b'" in reason and "failed" in reason


def test_a_failed_required_last_turn_still_finishes_once(tmp_path: Path) -> None:
    conv = conversation(tmp_path, [{"turn_id": "a", "prompt_template": "A"}])
    planner = TurnPlanner(conv)
    steps = drive(planner, {"a": TurnStatus.FAILED})
    assert summary(steps) == [("run", "a"), ("finish", "model_error")]
    assert steps[-1].failed_turn == "a"


def test_unrecorded_dependency_reads_has_not_run(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"turn_id": "a", "prompt_template": "A"},
            {"turn_id": "b", "prompt_template": "B", "depends_on": ["a"]},
        ],
    )
    planner = TurnPlanner(conv)
    it = planner.steps()
    first = next(it)
    assert isinstance(first, Run) and first.turn.turn_id == "a"
    second = next(it)  # the caller forgot to record a's outcome
    assert isinstance(second, Skip)
    assert "has not run" in second.reason


# -- property: whatever the outcomes, each turn is yielded once, then one Finish ------


@st.composite
def flows(draw: st.DrawFn) -> tuple[Conversation, int | None, list[TurnStatus]]:
    n = draw(st.integers(min_value=1, max_value=7))
    variables = {"have": "x"}
    turns = []
    for i in range(n):
        deps = (
            draw(st.lists(st.sampled_from([f"t{j}" for j in range(i)]), unique=True, max_size=2))
            if i
            else []
        )
        optional = draw(st.booleans())
        needs_missing = optional and draw(st.booleans())
        template = f"turn {i} {{have}}" + (" {absent}" if needs_missing else "")
        turns.append(
            TurnConfig(
                turn_id=f"t{i}", prompt_template=template, depends_on=deps, optional=optional
            )
        )
    flow = Flow(max_turns=draw(st.integers(min_value=1, max_value=8)), turns=turns)
    prepared = PreparedFlow(
        "default",
        flow,
        tuple(PreparedTurn(t, i, Template.parse(t.prompt_template)) for i, t in enumerate(turns)),
    )
    scenario = Scenario(scenario_id="prop", scenario_description="property", variables=variables)
    conv = Conversation(scenario, prepared, "multi_turn", "scenarios.jsonl:1")
    override = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=8)))
    outcomes = draw(
        st.lists(st.sampled_from([TurnStatus.COMPLETED, TurnStatus.FAILED]), min_size=n, max_size=n)
    )
    return conv, override, outcomes


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flows())
def test_every_turn_is_yielded_once_then_one_finish(
    case: tuple[Conversation, int | None, list[TurnStatus]],
) -> None:
    conv, override, outcomes = case
    planner = TurnPlanner(conv, override)
    feed = iter(outcomes)
    steps: list[Run | Skip | Finish] = []
    for step in planner.steps():
        steps.append(step)
        if isinstance(step, Run):
            planner.record(step.turn, next(feed), failure=TerminationReason.MODEL_ERROR)
    flow_ids = [t.turn_id for t in conv.flow.turns]

    # Shape: one Run/Skip per turn in flow order, then exactly one Finish, last.
    assert [s.turn.turn_id for s in steps[:-1]] == flow_ids
    assert all(isinstance(s, Run | Skip) for s in steps[:-1])
    assert isinstance(steps[-1], Finish)
    assert sum(isinstance(s, Finish) for s in steps) == 1

    limit = override or conv.flow.flow.max_turns or len(conv.flow.turns)
    runs = [s for s in steps if isinstance(s, Run)]
    assert len(runs) <= limit
    assert set(planner.outcomes) == set(flow_ids)

    # Each decision is justified by what came before it.
    status: dict[str, TurnStatus] = {}
    failed_required: str | None = None
    for step in steps[:-1]:
        cfg = step.turn.config
        if isinstance(step, Run):
            assert failed_required is None
            assert all(status.get(d) is TurnStatus.COMPLETED for d in cfg.depends_on)
            assert not (cfg.optional and conv.missing_variables(step.turn))
            status[cfg.turn_id] = planner.outcomes[cfg.turn_id]
            if status[cfg.turn_id] is TurnStatus.FAILED and not cfg.optional:
                failed_required = cfg.turn_id
        else:
            assert step.reason
            status[cfg.turn_id] = TurnStatus.SKIPPED
            if failed_required is not None:
                assert (
                    step.reason.startswith("conversation ended")
                    and repr(failed_required) in step.reason
                )
            elif step.reason.startswith("max_turns"):
                assert len([s for s in status.values() if s is not TurnStatus.SKIPPED]) >= limit
            elif step.reason.startswith("depends on"):
                assert any(status.get(d) is not TurnStatus.COMPLETED for d in cfg.depends_on)
            else:
                assert step.reason.startswith("optional turn") and "absent" in step.reason

    finish = steps[-1]
    if failed_required is not None:
        assert finish.failed_turn == failed_required
        assert finish.reason is TerminationReason.MODEL_ERROR
    elif any(isinstance(s, Skip) and s.reason.startswith("max_turns") for s in steps):
        assert finish.reason is TerminationReason.MAX_TURNS
    else:
        assert finish.reason is TerminationReason.COMPLETED
