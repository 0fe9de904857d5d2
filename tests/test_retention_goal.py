"""Context retention and goal achievement move with what they measure."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import write_pack
from hypothesis import given, settings
from hypothesis import strategies as st

import convsim
from convsim import TurnRecord, TurnStatus
from convsim.metrics import METRICS
from convsim.metrics._retention import fact_recalled, stated_values
from convsim.scenarios import Fact, load_pack


def retention(model_args: dict[str, Any]) -> float:
    results = convsim.run_sync(
        "multi_session_memory", "scripted", model_args=model_args, metrics=["context_retention"]
    )
    ordered = sorted(results, key=lambda r: r.conversation_id)  # a fixed summation order
    values = [r.scores["context_retention"].value for r in ordered]
    assert all(v is not None for v in values)
    return math.fsum(values) / len(values)  # type: ignore[arg-type]


def test_retention_rises_monotonically_with_the_models_memory() -> None:
    window = [retention({"use_references": "false", "memory_turns": k}) for k in (1, 2, 3, 5)]
    full = retention({"use_references": "false"})
    curve = [*window, full]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(curve)), curve  # never falls
    assert curve[0] < 0.1 and full > 0.9 and curve[-1] > curve[0] + 0.5


def test_retention_curve_shows_that_far_facts_are_forgotten_first() -> None:
    results = convsim.run_sync(
        "multi_session_memory",
        "scripted",
        model_args={"use_references": "false", "memory_turns": 2},
        metrics=["context_retention"],
    )
    curves = [r.scores["context_retention"].details["curve"] for r in results]
    near_mean = [c[d] for c in curves for d in c if int(d) <= 1]
    far_mean = [c[d] for c in curves for d in c if int(d) >= 4]
    assert sum(near_mean) / len(near_mean) > sum(far_mean) / len(far_mean)


FACT = Fact(key="order_id", value="A-1042", aliases=["order 1042"], introduced_in="t0")


@pytest.mark.parametrize(
    ("fact", "text", "recalled"),
    [
        (FACT, "Your order A-1042 has shipped.", True),
        (FACT, "About order 1042: it has shipped.", True),  # an alias
        (FACT, "Your order A-10420 has shipped.", False),  # whole words only
        (Fact(key="amount", value=89, introduced_in="t0"), "You paid $89.00 for it.", True),
        (Fact(key="amount", value=89, introduced_in="t0"), "You paid $98.00.", False),
        (
            Fact(key="price", value=1250.5, tolerance=0.01, introduced_in="t0"),
            "It cost 1,250.50 euros.",
            True,
        ),
        (
            Fact(key="birthday", value="2026-03-14", introduced_in="t0"),
            "Your birthday is on March 14th.",
            True,
        ),
        (
            Fact(key="birthday", value="March 14, 2026", introduced_in="t0"),
            "So 14/03... no, 03/14/2026 it is.",
            True,
        ),
        (Fact(key="birthday", value="March 14", introduced_in="t0"), "It is March 15.", False),
    ],
)
def test_fact_matching(fact: Fact, text: str, recalled: bool) -> None:
    assert fact_recalled(fact, text) is recalled


def test_a_different_value_for_a_tracked_fact_is_a_contradiction() -> None:
    assert stated_values(FACT, "Your order id is B-2231, I believe.") == ["B-2231"]
    assert stated_values(FACT, "Your order id is A-1042.") == []
    assert stated_values(FACT, "Nothing about it here.") == []
    assert stated_values(FACT, "Your order id: B-2231.") == ["B-2231"]
    amount = Fact(key="amount", value=89, introduced_in="t0")
    when = Fact(key="order_date", value="3 March", introduced_in="t0")
    text = "Your order date is March 30, and the amount was $98."
    assert stated_values(when, text) == ["March 30"] and stated_values(amount, text) == ["$98"]
    assert stated_values(amount, "The amount was $89.00.") == []
    budget = Fact(key="budget", value="£340,000", introduced_in="t0")
    assert stated_values(budget, "Your budget is £380,000.") == ["£380,000"]


@pytest.mark.parametrize(
    "text",
    [
        "Your order id, which you gave me 3 turns ago, is A-1042.",
        "The order id for 2 parcels is A-1042.",
        "Order id A-1042 covers 3 items.",
        "I have your order id. It is A-1042, placed 2 days ago.",
    ],
)
def test_a_number_near_the_label_is_not_a_contradiction(text: str) -> None:
    assert stated_values(FACT, text) == []


def record(
    turn_id: str, response: str | None, status: TurnStatus = TurnStatus.COMPLETED
) -> TurnRecord:
    return TurnRecord(
        conversation_id="c",
        turn_index=0,
        turn_id=turn_id,
        role="assistant",
        status=status,
        response=response,
    )


def conversation_with(tmp_path: Path, *, allow_code: bool = False, **scenario: Any) -> Any:
    turns = [{"turn_id": t, "prompt_template": t} for t in ("t0", "t1", "t2", "t3")]
    folder = write_pack(
        tmp_path / "p",
        {"default": {"turns": turns}},
        [{"scenario_id": "s", "scenario_description": "x", **scenario}],
    )
    return load_pack(folder, allow_code=allow_code).conversations[0]


def retention_of(conv: Any, responses: list[str]) -> Any:
    scorer = METRICS.get("context_retention")().scorer(conv)
    for i, text in enumerate(responses):
        scorer.update(record(f"t{i}", text))
    return scorer.result()


def test_retention_scores_probes_and_flags_contradictions(tmp_path: Path) -> None:
    conv = conversation_with(
        tmp_path,
        facts=[{"key": "order_id", "value": "A-1042", "introduced_in": "t0"}],
        probes=[{"turn_id": "t2", "facts": ["order_id"]}, {"turn_id": "t3", "facts": ["order_id"]}],
    )
    good = retention_of(conv, ["Noted.", "Ok.", "Order A-1042.", "It is A-1042."])
    assert good.value == 1.0 and good.details["curve"] == {"2": 1.0, "3": 1.0}
    wrong = retention_of(conv, ["Noted.", "Ok.", "Order A-1042.", "Your order id is B-7."])
    assert wrong.value == 0.5
    assert wrong.details["contradictions"] == [
        {"fact": "order_id", "turn_id": "t3", "stated": "B-7"}
    ]
    assert retention_of(conv, ["Noted.", "Ok.", "No idea.", "No idea."]).value == 0.0


def test_retention_is_not_applicable_without_facts_or_completed_probes(tmp_path: Path) -> None:
    plain = conversation_with(tmp_path)
    reason = retention_of(plain, ["a", "b"]).reason or ""
    assert reason.startswith("not applicable: the scenario declares no facts and probes")
    (tmp_path / "p").rename(tmp_path / "old")
    conv = conversation_with(
        tmp_path,
        facts=[{"key": "k", "value": "v1", "introduced_in": "t0"}],
        probes=[{"turn_id": "t3", "facts": ["k"]}],
    )
    assert retention_of(conv, ["x", "y"]).value is None  # the probe never ran


def goal_of(conv: Any, responses: list[str]) -> Any:
    scorer = METRICS.get("goal_achievement")().scorer(conv)
    for i, text in enumerate(responses):
        scorer.update(record(f"t{i}", text))
    return scorer.result()


def test_a_conversation_that_reaches_its_goal_outscores_one_that_does_not(tmp_path: Path) -> None:
    goal = {
        "description": "refund approved and the amount stated",
        "all_of": [
            {"kind": "contains", "value": "refund approved"},
            {"kind": "number", "value": 89, "tolerance": 0.5},
        ],
        "any_of": [{"kind": "regex", "value": r"\bREF-\d{4}\b"}],
    }
    conv = conversation_with(tmp_path, goal=goal)
    reached = goal_of(conv, ["Let me check.", "Refund approved: 89 dollars, ref REF-1234."])
    halfway = goal_of(conv, ["Let me check.", "Refund approved, details to follow."])
    missed = goal_of(conv, ["Let me check.", "I cannot help with that."])
    assert reached.value == 1.0 and reached.details["turns_to_goal"] == 2
    assert missed.value == 0.0 and missed.details["turns_to_goal"] is None
    assert reached.value > halfway.value > missed.value
    assert halfway.value == pytest.approx(0.25)  # all_of half met, any_of not: (0.5 + 0) / 2


def has_ticket(text: str, scenario: Any) -> float:
    """A goal checker given by import path: (response, scenario) -> credit."""
    return 1.0 if "ticket" in text else 0.0


def test_goal_json_schema_python_and_judge_criteria(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"enum": ["open", "closed"]}},
    }
    goal = {
        "description": "structured answer",
        "all_of": [
            {"kind": "json_schema", "value": schema},
            {"kind": "python", "value": "test_retention_goal:has_ticket"},
            {"kind": "judge", "value": "polite?"},
        ],
    }
    conv = conversation_with(tmp_path, goal=goal, allow_code=True)  # the checker is code
    ok = goal_of(conv, ["Opened ticket 7."])
    assert ok.value == 0.5  # no JSON for the schema; the checker says 1; judge not counted
    kinds = {row["kind"]: row["credit"] for row in ok.details["criteria"]}
    assert kinds == {"json_schema": 0.0, "python": 1.0, "judge": None}
    structured = goal_of(conv, ['Done: ```json\n{"status": "open"}\n``` ticket 7'])
    assert structured.value == 1.0
    only_judge = conversation_with(
        tmp_path / "j", goal={"description": "x", "all_of": [{"kind": "judge", "value": "polite?"}]}
    )
    assert (
        goal_of(only_judge, ["hi"]).reason
        == "not applicable: every goal criterion needs a judge model"
    )


def test_goal_achievement_through_a_run_uses_the_final_state() -> None:
    results = convsim.run_sync("customer_support", "scripted", metrics=["goal_achievement"])
    with_refs = [r.scores["goal_achievement"].value for r in results]
    results = convsim.run_sync(
        "customer_support",
        "scripted",
        model_args={"use_references": "false"},
        metrics=["goal_achievement"],
    )
    without = [r.scores["goal_achievement"].value for r in results]
    assert sum(v for v in with_refs if v is not None) > sum(v for v in without if v is not None)
    assert json.dumps(results[0].scores["goal_achievement"].model_dump())  # serialisable


def test_reference_free_retention_follows_back_references() -> None:
    from convsim.metrics import score_transcript

    said = [
        {"role": "user", "content": "My dog is called Rex and my flight is BA-2490."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Any tips for the garden?"},
        {"role": "assistant", "content": "Water in the morning."},
        {"role": "user", "content": "Remind me, what did I say my dog is called?"},
    ]
    remembered = score_transcript(
        [*said, {"role": "assistant", "content": "Your dog is called Rex."}], ["context_retention"]
    )["context_retention"]
    forgotten = score_transcript(
        [*said, {"role": "assistant", "content": "I'm not sure."}], ["context_retention"]
    )["context_retention"]
    # two things stated (Rex, the flight); only the dog was asked back
    assert remembered.value == 1.0 and forgotten.value == 0.5
    assert remembered.details["mode"] == "reference-free"
    assert (remembered.details["recalled"], remembered.details["forgotten"]) == (1, 0)
    assert remembered.details["curve"] == {"2": 1.0} and forgotten.details["curve"] == {"2": 0.0}
    (missed,) = forgotten.details["missed"]
    assert missed["what"] == "Rex" and missed["reason"] == "not stated when asked back"
    silent = score_transcript(said[:4], ["context_retention"])["context_retention"]
    # no answer recalled or forgot anything: silence is not memory, so there is no value
    assert silent.value is None and silent.status == "not_applicable"
    assert (silent.reason or "").startswith("not applicable: no evidence:")
    assert silent.details["evidence"] == 0 and silent.details["untouched"] == 2
    assert silent.details["checks"] == 2 and silent.details["mode"] == "reference-free"


def test_a_single_turn_run_reports_no_retention() -> None:
    results = convsim.run_sync("single_turn_qa", "scripted", limit=4)
    scores = [r.scores["context_retention"] for r in results]
    assert scores and all(s.status == "not_applicable" for s in scores)  # it was 1.0
    report = convsim.summarize(results).metrics["context_retention"]
    assert report.mean is None and report.n == 0 and report.not_applicable == len(results)


def test_single_turn_retention_is_not_applicable(tmp_path: Path) -> None:
    from convsim.metrics import score_transcript

    stated = [
        {"role": "user", "content": "My order A-1042 was due on March 3 and I'm 34."},
        {"role": "assistant", "content": "Sorry about order A-1042, let me check."},
    ]
    free = score_transcript(stated, ["context_retention"])["context_retention"]
    assert free.value is None and free.status == "not_applicable"
    assert "one completed turn" in (free.reason or "") and free.details["completed_turns"] == 1
    # with facts too: one turn cannot both give a fact and probe it
    conv = conversation_with(
        tmp_path,
        facts=[{"key": "order", "value": "A-1042", "introduced_in": "t0"}],
        probes=[{"turn_id": "t1", "facts": ["order"]}],
    )
    facts = retention_of(conv, ["Your order A-1042."])
    assert facts.value is None and "one completed turn" in (facts.reason or "")
    none = retention_of(conv, [])
    assert none.value is None and "no completed turns" in (none.reason or "")


def _chat(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [
        {"role": role, "content": text}
        for user, answer in pairs
        for role, text in (("user", user), ("assistant", answer))
    ]


def _free(*pairs: tuple[str, str]) -> Any:
    from convsim.metrics import score_transcript

    return score_transcript(_chat(*pairs), ["context_retention"])["context_retention"]


def test_reference_free_retention_catches_a_question_already_answered() -> None:
    opening = ("Hi! I'm 34. I have two dogs.", "Nice! What are their names?")
    attentive = _free(opening, ("Rex and Bella.", "Lovely. Are 34 and two dogs a busy life?"))
    forgetful = _free(opening, ("Rex and Bella.", "Lovely. How old are you? Do you have a dog?"))
    repeating = _free(opening, ("Rex and Bella.", "Cute. What are their names?"))
    assert attentive.value == 1.0 and attentive.details["recalled"] == 1  # "34" again
    assert forgetful.value < attentive.value
    assert {m["reason"] for m in forgetful.details["missed"]} == {
        "asked again: age",
        "asked again: has:dog",
    }
    assert repeating.value < attentive.value
    assert [m["reason"] for m in repeating.details["missed"]] == ["asked the same question again"]


def test_reference_free_retention_catches_a_contradiction_of_the_user() -> None:
    told = ("My name is Ana and I live in Lisbon.", "Hello Ana.")
    right = _free(told, ("Any food tips?", "Since you live in Lisbon, try the pasteis."))
    wrong = _free(told, ("Any food tips?", "Since you live in Porto, try a francesinha."))
    assert right.value == 1.0 and right.details["recalled"] == 1
    assert wrong.value < right.value
    assert wrong.details["contradictions"][0]["reason"] == "stated home='porto', was told 'lisbon'"
    # the user changing their mind is followed, not held against the assistant
    moved = _free(
        told,
        ("I moved: I live in Porto now.", "Porto is lovely."),
        ("Food tips?", "Since you live in Porto, try a francesinha."),
    )
    assert moved.details["forgotten"] == 0


def test_reference_free_retention_hears_i_already_told_you() -> None:
    heard_alone = _free(
        ("My cat is called Tom.", "Nice."),
        ("Guess his name.", "Is he called Felix?"),
        ("I already told you.", "Sorry, Tom!"),
    )
    (missed,) = heard_alone.details["missed"]
    assert missed["reason"] == "the user said they had already told it"
    assert missed["turn_id"] == "t2" and heard_alone.value < 1.0
    # a lapse already seen (the question asked again) is not counted twice
    seen = _free(
        ("I work as a nurse.", "Great."),
        ("I like hiking.", "What do you do for a living?"),
        ("I already told you.", "Sorry!"),
    )
    assert [(m["reason"], m["turn_id"]) for m in seen.details["missed"]] == [
        ("asked again: work", "t2")
    ]


def test_ordinary_chat_is_not_taken_for_forgetting() -> None:
    support = _free(
        ("My order A-1042 is late.", "Sorry! Is there anything else I can help you with?"),
        ("Yes, the invoice.", "Sent. How can I help you today?"),
        ("That's all.", "Great. Is there anything else I can help you with?"),
    )
    assert support.details["forgotten"] == 0  # a closing formula, asked every time
    followed_up = _free(
        ("I'm a student.", "Are you a student in engineering or arts?"), ("Arts.", "Lovely.")
    )
    assert followed_up.details["forgotten"] == 0  # asks for more, not again
    from convsim.metrics._free_retention import _TOLD_ALREADY

    assert not _TOLD_ALREADY.search("I just told my boss I'm quitting.")
    assert not _TOLD_ALREADY.search("I already mentioned it to my doctor.")
    assert _TOLD_ALREADY.search("I already told you that.")
    described = _free(("I live in Lisbon.", "Nice."), ("Any tips?", "In a city where you live"))
    assert described.details["forgotten"] == 0
    broader = _free(("I live in Lisbon.", "Ok."), ("Tips?", "Since you live in a big city, walk."))
    assert broader.details["forgotten"] == 0  # a description, not another city
    offer = _free(("I have a question.", "Sure."), ("Also...", "Do you have a question about it?"))
    assert offer.details["forgotten"] == 0  # a question is not something one owns
    status = _free(
        ("My order number is A-1042.", "Thanks."),
        ("What is my order status?", "It ships tomorrow."),
    )
    assert status.details["forgotten"] == 0  # asks about the order, not for its number


def test_a_question_asked_every_turn_forgets_each_answer_once() -> None:
    pairs = [(f"Turn {i}: fine.", "What are you reading these days?") for i in range(400)]
    score = _free(*pairs)
    # each answer is forgotten once, at the first repeat after it: details grow with the
    # turns, not with their square (they had 79,800 entries)
    assert len(score.details["missed"]) == score.details["forgotten"] == 399
    assert {m["distance"] for m in score.details["missed"]} == {0}


def test_reference_free_retention_needs_something_stated() -> None:
    nothing = _free(("hello", "hi"), ("how is it going", "fine"))
    assert nothing.value is None and "stated nothing checkable" in (nothing.reason or "")
    # an echo of the message just answered is not memory
    echo = _free(("My order is A-1042.", "Order A-1042, noted."), ("Thanks.", "Welcome."))
    assert echo.details["recalled"] == 0 and echo.details["untouched"] == 1
    assert echo.value is None and "no evidence" in (echo.reason or "")


def test_an_embedder_lets_a_paraphrase_count_as_recalled(tmp_path: Path) -> None:
    from convsim.metrics._retention import ContextRetentionMetric

    class Synonyms:
        """A toy semantic model: 'canine' and 'dog' mean the same."""

        def embed(self, texts: Any) -> Any:
            return [
                [1.0 if ("dog" in t.lower() or "canine" in t.lower()) else 0.0, 1.0] for t in texts
            ]

    conv = conversation_with(
        tmp_path,
        facts=[{"key": "pet", "value": "a dog", "introduced_in": "t0"}],
        probes=[{"turn_id": "t2", "facts": ["pet"]}],
    )
    responses = ["Noted.", "Ok.", "You have a canine companion."]

    def value(metric: Any) -> Any:
        scorer = metric.scorer(conv)
        for i, text in enumerate(responses):
            scorer.update(record(f"t{i}", text))
        return scorer.result().value

    assert value(ContextRetentionMetric()) == 0.0  # no value named: forgotten
    assert value(ContextRetentionMetric(embedder=Synonyms(), semantic_threshold=0.9)) == 1.0

    # the embedder is CPU work: it runs in result(), which the runtime sends to a thread
    metric = ContextRetentionMetric(embedder=Synonyms(), semantic_threshold=0.9)
    assert metric.cpu_heavy and not ContextRetentionMetric().cpu_heavy
    calls: list[int] = []
    original = Synonyms.embed
    Synonyms.embed = lambda self, texts: calls.append(1) or original(self, texts)  # type: ignore[method-assign]
    scorer = metric.scorer(conv)
    for i, text in enumerate(responses):
        scorer.update(record(f"t{i}", text))
    assert not calls
    result = scorer.result()
    assert calls and result.value == 1.0 and result.details["checks"] == 1


@pytest.mark.anyio
async def test_judge_criteria_of_a_goal_are_graded_when_a_judge_is_given(
    tmp_path: Path, fake_adapter: Any
) -> None:
    from convsim.metrics import JudgeSettings

    goal = {
        "description": "calm the customer",
        "all_of": [
            {"kind": "contains", "value": "refund"},
            {"kind": "judge", "value": "The reply is apologetic and calm."},
        ],
    }
    conv = conversation_with(tmp_path, goal=goal)
    judge = fake_adapter(lambda messages, params: '{"score": 4, "reason": "fair"}')
    metric = METRICS.get("goal_achievement")().with_judge(JudgeSettings(judge))
    scorer = metric.scorer(conv)
    await scorer.update(record("t0", "So sorry: your refund is on its way."))
    score = await scorer.result()
    assert score.value == pytest.approx((1.0 + 0.75) / 2)  # contains met; judge said 4
    assert score.details["judge_calls"] == 1
    assert "The reply is apologetic and calm." in judge.calls[0][0][0].content


def test_ordinary_words_are_not_back_references() -> None:
    from convsim.metrics._free_retention import _BACK_REFERENCE, _content

    assert not _BACK_REFERENCE.search("Who is Loki? I've never heard that name before.")
    assert not _BACK_REFERENCE.search("Can you confirm the weather again?")
    assert not _BACK_REFERENCE.search("remember tarzan, i loved phil collins in it")
    assert not _BACK_REFERENCE.search("what was the score last night?")
    assert _BACK_REFERENCE.search("Remind me, what was my flight number?")
    assert _BACK_REFERENCE.search("Do you remember what I ordered?")
    assert _content("I've heard it, they'll stay") == {"heard", "they", "stay"}  # no "ve", "ll"


def test_a_one_turn_conversation_is_never_read_for_reference_free_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One completed turn has no retention: its turn is not even read (the read is the
    costliest part of scoring a one-turn conversation)."""
    from convsim.metrics._free_retention import FreeRetention

    reads: list[str] = []
    real = FreeRetention.update

    def spying(self: FreeRetention, user: str, answer: str, turn_id: str, at: int) -> None:
        reads.append(turn_id)
        real(self, user, answer, turn_id, at)

    monkeypatch.setattr(FreeRetention, "update", spying)
    conv = conversation_with(tmp_path)
    one = retention_of(conv, ["My name is Ana."])
    assert one.status == "not_applicable" and reads == []
    retention_of(conv, ["Hello Ana.", "Since you live in Lisbon, try the pasteis."])
    assert reads == ["t0", "t1"]  # the held first turn is read first, when a second comes


_SAYINGS = [
    "Hi! I'm 34. I have two dogs.",
    "Nice! What are their names?",
    "Rex and Bella.",
    "How old are you? Do you have a dog?",
    "My name is Ana and I live in Lisbon.",
    "Since you live in Porto, try a francesinha.",
    "I already told you that.",
    "",
]


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.sampled_from(_SAYINGS), st.sampled_from(_SAYINGS), st.booleans()),
        max_size=5,
    )
)
def test_holding_the_first_turn_back_scores_as_reading_it_at_once(
    turns: list[tuple[str, str, bool]],
) -> None:
    from convsim.metrics._free_retention import FreeRetention
    from convsim.metrics._retention import _RetentionScorer

    held = _RetentionScorer(facts={}, probes={})
    direct = FreeRetention()
    position = 0
    for i, (user, answer, completed) in enumerate(turns):
        status = TurnStatus.COMPLETED if completed else TurnStatus.FAILED
        held.update(
            TurnRecord(
                conversation_id="c",
                turn_index=i,
                turn_id=f"t{i}",
                role="assistant",
                status=status,
                response=answer if completed else None,
                user_message=user,
            )
        )
        if completed:
            direct.update(user, answer, f"t{i}", position)
            position += 1
    got = held.result()
    if position >= 2:
        assert got == direct.result()
    else:
        assert got.status == "not_applicable"
