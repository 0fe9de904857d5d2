"""The simulated user: its prompt, repeat turns, stop marker, goals, and goal criteria."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeAdapter, write_pack

import convsim
from convsim import PackError, Simulator, Status, TerminationReason, TurnStatus, load_pack
from convsim.adapters import Cost, GenerationParams, Message, Usage
from convsim.metrics._goal import DETERMINISTIC_KINDS, check_criterion, goal_met
from convsim.scenarios._schema import Criterion, Goal

pytestmark = pytest.mark.anyio

USER_STOPPED = "the simulated user ended the conversation"
GOAL_REACHED = "the scenario goal was reached"


class PricedFake(FakeAdapter):
    """A fake adapter that prices every token at ``rate`` USD."""

    def __init__(self, behave: Any = None, *, name: str = "fake", rate: float = 0.0) -> None:
        super().__init__(behave, name=name)
        self.rate = rate

    def estimate_cost(self, usage: Usage) -> Cost:
        total = usage.total_tokens * self.rate
        return Cost(prompt_cost=total, total_cost=total)


def replies(*texts: str) -> Any:
    """Answer the n-th call with the n-th text (the last one repeats)."""
    calls = 0

    def behave(messages: Sequence[Message], params: GenerationParams) -> str:
        nonlocal calls
        calls += 1
        return texts[min(calls, len(texts)) - 1]

    return behave


def pack(
    tmp_path: Path,
    turns: list[dict[str, Any]],
    *,
    n: int = 1,
    name: str = "pack",
    **scenario: Any,
) -> Path:
    scenarios = [
        {
            "scenario_id": f"s{i}",
            "scenario_description": "A customer wants a refund for a broken kettle.",
            "variables": {"order": f"A-{100 + i}"},
            **scenario,
        }
        for i in range(n)
    ]
    return write_pack(tmp_path / name, {"default": {"turns": turns}}, scenarios)


async def run_one(sim: Simulator, path: Path) -> convsim.ConversationResult:
    (result,) = [r async for r in sim.run(path)]
    return result


def statuses(result: convsim.ConversationResult) -> dict[str, TurnStatus]:
    return {t.turn_id: t.status for t in result.turns}


def record(result: convsim.ConversationResult, turn_id: str) -> convsim.TurnRecord:
    (found,) = [t for t in result.turns if t.turn_id == turn_id]
    return found


PROFILE = {
    "persona": "a busy nurse who ordered a kettle",
    "goal": "get the money back for order A-100",
    "style": "short and a little impatient",
}
REFUND_GOAL = {
    "description": "the refund is approved",
    "all_of": [{"kind": "contains", "value": "refund approved"}],
}


# -- what the simulated user is told and what it answers ----------------------------


async def test_user_turn_prompt_roles_and_separate_usage(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [
            {"turn_id": "open", "prompt_template": "Hi, my order {order} arrived broken."},
            {"turn_id": "ask", "role": "user", "prompt_template": "Ask for a refund."},
            {"turn_id": "bye", "prompt_template": "Bye."},
        ],
        system_prompt="You are the shop's support agent.",
        user=PROFILE,
    )
    user = PricedFake(replies("I want my money back, please."), name="user-sim", rate=0.5)
    model = PricedFake(replies("Sorry to hear that.", "Let me look."), name="agent", rate=0.01)
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)

    assert result.status is Status.DONE
    assert result.termination_reason is TerminationReason.COMPLETED
    ((sent, params),) = user.calls
    system, *conversation = sent
    assert system.role == "system"
    for line in (
        "Scenario: A customer wants a refund for a broken kettle.",
        "Who you are: a busy nurse who ordered a kettle",
        "What you want: get the money back for order A-100",
        "How you write: short and a little impatient",
        "Your instruction for this message: Ask for a refund.",
    ):
        assert line in system.content.splitlines()
    assert "[DONE]" in system.content  # it is told how to end the conversation
    assert "support agent" not in system.content  # the assistant's system prompt is not its
    # the transcript seen from the other side: the user's words are its own (assistant)
    assert conversation == [
        Message(role="assistant", content="Hi, my order A-100 arrived broken."),
        Message(role="user", content="Sorry to hear that."),
    ]
    assert params.metadata["role"] == "user" and params.reference is None

    # its reply is the user message the assistant receives next
    ask = record(result, "ask")
    assert ask.prompt == "Ask for a refund."
    assert ask.user_message == "I want my money back, please."
    assert ask.messages[-1] == Message(role="user", content="I want my money back, please.")
    assert model.calls[1][0][-1] == Message(role="user", content="I want my money back, please.")
    assert ask.timings is not None and ask.timings.user_latency_s is not None

    # the user's usage and cost are kept apart from the assistant's
    assert ask.user_usage is not None and ask.user_usage.total_tokens == 2
    assert record(result, "open").user_usage is None
    assert result.user_usage is not None and result.user_usage.total_tokens == 2
    assert result.usage.total_tokens == 6  # three assistant calls
    assert result.cost_usd == pytest.approx(6 * 0.01)
    assert result.user_cost_usd == pytest.approx(2 * 0.5)


async def test_the_goal_defaults_to_the_scenarios_and_no_profile_lines_are_empty(
    tmp_path: Path,
) -> None:
    path = pack(
        tmp_path,
        [{"turn_id": "ask", "role": "user", "prompt_template": "Start."}],
        goal={"description": "get a refund"},
    )
    user = FakeAdapter(replies("Hello."), name="user-sim")
    async with Simulator(FakeAdapter(), user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.status is Status.DONE
    ((sent, _),) = user.calls
    lines = sent[0].content.splitlines()
    assert "What you want: get a refund" in lines
    assert not any(line.startswith(("Who you are:", "How you write:")) for line in lines)
    assert sent[1:] == (Message(role="user", content="(Write your next message.)"),)


async def test_the_user_model_keeps_its_own_default_settings(tmp_path: Path) -> None:
    class Configured(FakeAdapter):
        def __init__(self, defaults: GenerationParams, name: str) -> None:
            super().__init__(name=name)
            self.defaults = defaults

        def default_config(self) -> GenerationParams:
            return self.defaults

    model = Configured(GenerationParams(temperature=0.0, max_tokens=50), "agent")
    user = Configured(GenerationParams(temperature=1.0, max_tokens=300), "user-sim")
    path = pack(tmp_path, [{"turn_id": "ask", "role": "user", "prompt_template": "Start."}])
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        await run_one(sim, path)
    ((_, model_params),) = model.calls
    assert (model_params.temperature, model_params.max_tokens) == (0.0, 50)
    ((_, user_params),) = user.calls
    assert (user_params.temperature, user_params.max_tokens) == (1.0, 300)


# -- repeat ---------------------------------------------------------------------------


def test_repeat_expands_to_chained_turns(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [
            {"turn_id": "open", "prompt_template": "Hi."},
            {
                "turn_id": "t",
                "role": "user",
                "prompt_template": "Keep going.",
                "depends_on": ["open"],
                "repeat": 4,
            },
            {"turn_id": "close", "prompt_template": "Bye.", "depends_on": ["t"]},
        ],
    )
    (conversation,) = load_pack(path).conversations
    turns = conversation.flow.turns
    assert [t.turn_id for t in turns] == ["open", "t", "t.2", "t.3", "t.4", "close"]
    assert [t.config.depends_on for t in turns] == [[], ["open"], ["t"], ["t.2"], ["t.3"], ["t"]]
    assert all(t.config.role == "user" for t in turns[1:5])
    assert {t.config.prompt_template for t in turns[1:5]} == {"Keep going."}
    assert turns[1].index == turns[4].index == 1  # the same turn of the flow file


def test_a_repeat_that_collides_with_a_turn_id_is_a_pack_error(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [
            {"turn_id": "t", "prompt_template": "Again.", "repeat": 2},
            {"turn_id": "t.2", "prompt_template": "Other."},
        ],
    )
    with pytest.raises(PackError, match=r"t\.2"):
        load_pack(path)


async def test_repeated_user_turns_run_in_order(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [{"turn_id": "t", "role": "user", "prompt_template": "Say more.", "repeat": 3}],
        user=PROFILE,
    )
    user = FakeAdapter(replies("one", "two", "three"), name="user-sim")
    model = FakeAdapter(replies("a", "b", "c"), name="agent")
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.termination_reason is TerminationReason.COMPLETED
    assert [(t.turn_id, t.user_message, t.response) for t in result.turns] == [
        ("t", "one", "a"),
        ("t.2", "two", "b"),
        ("t.3", "three", "c"),
    ]
    assert [m.content for m in result.transcript] == ["one", "a", "two", "b", "three", "c"]


# -- the user's stop marker -----------------------------------------------------------


async def test_the_stop_marker_ends_the_conversation(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [
            {"turn_id": "open", "prompt_template": "My order {order} is broken."},
            {"turn_id": "t", "role": "user", "prompt_template": "Continue.", "repeat": 4},
            {"turn_id": "wrap", "prompt_template": "Anything else?"},
        ],
        user=PROFILE,
    )
    user = PricedFake(replies("Can I get a refund?", "Great, thanks! [DONE]"), rate=1.0)
    model = FakeAdapter(replies("Sorry!", "Yes, refunded."), name="agent")
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)

    assert result.status is Status.DONE
    assert result.termination_reason is TerminationReason.USER_STOP
    assert result.error is None
    assert statuses(result) == {
        "open": TurnStatus.COMPLETED,
        "t": TurnStatus.COMPLETED,
        "t.2": TurnStatus.SKIPPED,
        "t.3": TurnStatus.SKIPPED,
        "t.4": TurnStatus.SKIPPED,
        "wrap": TurnStatus.SKIPPED,
    }
    stopping = record(result, "t.2")
    assert stopping.user_message == "Great, thanks! [DONE]"
    assert stopping.prompt == "Continue."
    assert stopping.skip_reason == USER_STOPPED
    assert stopping.user_usage is not None and stopping.response is None
    for turn_id in ("t.3", "t.4", "wrap"):
        assert record(result, turn_id).skip_reason == USER_STOPPED
        assert record(result, turn_id).user_message is None
    assert len(model.calls) == 2 and len(user.calls) == 2  # nobody asked after the stop
    assert "[DONE]" not in " ".join(m.content for m in result.transcript)
    assert result.user_usage is not None and result.user_usage.total_tokens == 4
    assert result.user_cost_usd == pytest.approx(4.0)


async def test_a_custom_stop_marker(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [{"turn_id": "t", "role": "user", "prompt_template": "Go on.", "repeat": 3}],
        user={**PROFILE, "stop_marker": "<<GOODBYE>>"},
    )
    user = FakeAdapter(replies("[DONE] is what my last ticket said.", "ok <<GOODBYE>>"))
    model = FakeAdapter(name="agent")
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.termination_reason is TerminationReason.USER_STOP
    assert statuses(result) == {
        "t": TurnStatus.COMPLETED,  # the default marker means nothing here
        "t.2": TurnStatus.SKIPPED,
        "t.3": TurnStatus.SKIPPED,
    }
    assert record(result, "t").user_message == "[DONE] is what my last ticket said."
    assert "<<GOODBYE>>" in user.calls[0][0][0].content
    assert "[DONE]" not in user.calls[0][0][0].content


async def test_a_stop_on_the_first_message_runs_nothing(tmp_path: Path) -> None:
    path = pack(tmp_path, [{"turn_id": "t", "role": "user", "prompt_template": "Go."}], user={})
    model = FakeAdapter(name="agent")
    async with Simulator(model, user_model=FakeAdapter(replies("[DONE]")), metrics=[]) as sim:
        result = await run_one(sim, path)
    assert (result.status, result.termination_reason) == (Status.DONE, TerminationReason.USER_STOP)
    assert model.calls == [] and result.transcript == ()
    assert result.usage.total_tokens == 0


# -- the scenario goal ----------------------------------------------------------------


def goal_flow() -> list[dict[str, Any]]:
    return [
        {"turn_id": "ask", "role": "user", "prompt_template": "Ask for a refund."},
        {"turn_id": "push", "role": "user", "prompt_template": "Insist.", "repeat": 3},
        {"turn_id": "bye", "prompt_template": "Thank you, bye."},
    ]


def goal_models() -> tuple[FakeAdapter, FakeAdapter]:
    model = FakeAdapter(
        replies("Let me check.", "Good news: your Refund Approved today.", "Anything else?"),
        name="agent",
    )
    return model, FakeAdapter(replies("Refund please.", "Please hurry."), name="user-sim")


async def test_the_goal_ends_a_simulated_conversation(tmp_path: Path) -> None:
    path = pack(tmp_path, goal_flow(), user=PROFILE, goal=REFUND_GOAL)
    model, user = goal_models()
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.status is Status.DONE
    assert result.termination_reason is TerminationReason.GOAL_REACHED
    assert statuses(result) == {
        "ask": TurnStatus.COMPLETED,
        "push": TurnStatus.COMPLETED,  # the assistant said it here
        "push.2": TurnStatus.SKIPPED,
        "push.3": TurnStatus.SKIPPED,
        "bye": TurnStatus.SKIPPED,
    }
    assert record(result, "push").response == "Good news: your Refund Approved today."
    for turn_id in ("push.2", "push.3", "bye"):
        assert record(result, turn_id).skip_reason == GOAL_REACHED
    assert len(model.calls) == 2 and len(user.calls) == 2


async def test_stop_on_goal_false_runs_every_turn(tmp_path: Path) -> None:
    path = pack(tmp_path, goal_flow(), user={**PROFILE, "stop_on_goal": False}, goal=REFUND_GOAL)
    model, user = goal_models()
    async with Simulator(model, user_model=user, metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.termination_reason is TerminationReason.COMPLETED
    assert set(statuses(result).values()) == {TurnStatus.COMPLETED}
    assert len(result.turns) == 5 and len(model.calls) == 5


async def test_a_scripted_scenario_is_not_stopped_by_its_goal(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [
            {"turn_id": "ask", "prompt_template": "I want a refund for {order}."},
            {"turn_id": "push", "prompt_template": "Please."},
            {"turn_id": "bye", "prompt_template": "Bye."},
        ],
        goal=REFUND_GOAL,
    )
    model, _ = goal_models()
    async with Simulator(model, metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.termination_reason is TerminationReason.COMPLETED
    assert set(statuses(result).values()) == {TurnStatus.COMPLETED}
    assert len(model.calls) == 3


async def test_a_goal_on_a_named_turn(tmp_path: Path) -> None:
    goal = {
        "description": "the order number is confirmed",
        "all_of": [{"kind": "regex", "value": r"order A-\d+", "turn_id": "ask"}],
        "any_of": [{"kind": "contains", "value": "refund"}, {"kind": "contains", "value": "x"}],
    }
    path = pack(tmp_path, goal_flow(), user=PROFILE, goal=goal)
    model = FakeAdapter(
        replies("I see order A-100.", "We can offer a refund.", "More?"), name="agent"
    )
    async with Simulator(model, user_model=FakeAdapter(name="u"), metrics=[]) as sim:
        result = await run_one(sim, path)
    assert result.termination_reason is TerminationReason.GOAL_REACHED
    assert [t.turn_id for t in result.turns if t.status is TurnStatus.COMPLETED] == ["ask", "push"]


def test_a_broken_goal_criterion_is_a_pack_error(tmp_path: Path) -> None:
    goal = {
        "description": "d",
        "all_of": [{"kind": "regex", "value": "refund ("}, {"kind": "number", "value": "lots"}],
    }
    path = pack(tmp_path, goal_flow(), user=PROFILE, goal=goal)
    with pytest.raises(PackError):
        load_pack(path)


# -- model against model -------------------------------------------------------------


async def test_scripted_user_against_scripted_model(tmp_path: Path) -> None:
    path = pack(
        tmp_path,
        [
            {"turn_id": "greet", "prompt_template": "Hello, my order is {order}."},
            {"turn_id": "ask", "role": "user", "prompt_template": "Ask about the refund."},
            {"turn_id": "more", "role": "user", "prompt_template": "Follow up.", "repeat": 2},
            {"turn_id": "bye", "prompt_template": "Thanks, bye."},
        ],
        n=3,
        user=PROFILE,
        reference_responses={"greet": "Hello! How can I help with your order?"},
    )
    async with Simulator("scripted", user_model="scripted", metrics=[]) as sim:
        results = [r async for r in sim.run(path)]
    assert len(results) == 3
    for result in results:
        assert result.status is Status.DONE
        assert result.termination_reason is TerminationReason.COMPLETED
        assert [t.turn_id for t in result.turns] == ["greet", "ask", "more", "more.2", "bye"]
        assert set(statuses(result).values()) == {TurnStatus.COMPLETED}
        assert record(result, "greet").response == "Hello! How can I help with your order?"
        for turn_id in ("ask", "more", "more.2"):
            turn = record(result, turn_id)
            assert turn.user_message and turn.user_message != turn.prompt
            assert turn.user_usage is not None and turn.user_usage.total_tokens > 0
        assert result.user_usage is not None
        assert (result.cost_usd, result.user_cost_usd) == (0.0, 0.0)
        assert len(result.transcript) == 10


# -- goal criteria --------------------------------------------------------------------


def crit(kind: str, value: Any, **kw: Any) -> Criterion:
    return Criterion(kind=kind, value=value, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("criterion", "text", "met"),
    [
        (crit("contains", "refund approved"), "Your REFUND Approved today", True),
        (crit("contains", "refund approved"), "refund pending", False),
        (crit("contains", 42), "the answer is 42", True),
        (crit("regex", r"order [A-Z]-\d{3}"), "about ORDER a-123 ...", True),
        (crit("regex", r"^\d+$"), "12a", False),
        (crit("number", 1234.5), "The total is 1,234.50 dollars.", True),
        (crit("number", "1234.5"), "The total is 1,234.50 dollars.", True),
        (crit("number", 1000000), "one million: 1,000,000", True),
        (crit("number", 42), "It is 42.", True),
        (crit("number", -3), "a change of -3 degrees", True),
        (crit("number", 3), "a change of -3 degrees", False),
        (crit("number", 100, tolerance=1), "about 99 of them", True),
        (crit("number", 100, tolerance=0.5), "about 99 of them", False),
        (crit("number", 100), "about 99 or 101 of them", False),
        (crit("number", 100, tolerance=1.5), "1 or 2 or 101.4", True),
        (crit("number", 7), "no digits here", False),
    ],
)
def test_check_criterion(criterion: Criterion, text: str, met: bool) -> None:
    assert check_criterion(criterion, text) is met


@pytest.mark.parametrize("kind", ["json_schema", "python", "judge"])
def test_undecidable_kinds_give_none(kind: str) -> None:
    assert kind not in DETERMINISTIC_KINDS
    assert check_criterion(crit(kind, "anything"), "anything") is None
    assert not goal_met(Goal(description="d", all_of=[crit(kind, "x")]), {}, "x")


def test_goal_met_all_of_and_any_of() -> None:
    yes, no = crit("contains", "yes"), crit("contains", "nope")
    assert goal_met(Goal(description="d", all_of=[yes]), {}, "yes!")
    assert not goal_met(Goal(description="d", all_of=[yes, no]), {}, "yes!")
    assert goal_met(Goal(description="d", any_of=[no, yes]), {}, "yes!")
    assert not goal_met(Goal(description="d", any_of=[no]), {}, "yes!")
    assert goal_met(Goal(description="d", all_of=[yes], any_of=[no, yes]), {}, "yes!")
    assert not goal_met(Goal(description="d", all_of=[yes], any_of=[no]), {}, "yes!")
    assert not goal_met(Goal(description="d"), {}, "anything")  # no criteria: never met
    assert not goal_met(Goal(description="d", all_of=[yes]), {}, None)


def test_goal_met_checks_the_named_turn() -> None:
    named = crit("number", 42, turn_id="calc")
    goal = Goal(description="d", all_of=[named, crit("contains", "bye")])
    assert goal_met(goal, {"calc": "it is 42", "other": "0"}, "bye")
    assert not goal_met(goal, {"calc": "it is 41"}, "bye, 42")
    assert not goal_met(goal, {}, "bye, 42")  # the turn has not answered (yet)
