"""The one scoring path: ScoringSession feeding, isolation, awaiting, threads, cancellation."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convsim import ConfigError, Score, TurnRecord, TurnStatus
from convsim.metrics import AsyncConversationScorer, ScoringSession, score_transcript
from convsim.metrics._transcripts import build_transcript

pytestmark = pytest.mark.anyio

MESSAGES = [
    {"role": "user", "content": "My order is A-1042."},
    {"role": "assistant", "content": "Thanks, order A-1042 noted."},
    {"role": "user", "content": "What was my order?"},
    {"role": "assistant", "content": "It was A-1042."},
]


def _transcript(evaluation_metrics: tuple[str, ...] = ()) -> Any:
    transcript = build_transcript("c1", MESSAGES)
    if not evaluation_metrics:
        return transcript
    turns = tuple(
        TurnRecord(**{**_fields(t), "evaluation_metrics": evaluation_metrics})
        for t in transcript.turns
    )
    flow = transcript.conversation.flow
    configs = [
        t.config.model_copy(update={"evaluation_metrics": list(evaluation_metrics)})
        for t in flow.turns
    ]
    prepared = type(flow)(
        flow.scenario_type,
        flow.flow.model_copy(update={"turns": configs}),
        tuple(type(t)(c, t.index, t.template) for t, c in zip(flow.turns, configs, strict=True)),
    )
    conversation = type(transcript.conversation)(
        transcript.conversation.scenario, prepared, "multi_turn", "test"
    )
    return type(transcript)(conversation, turns)


def _fields(record: TurnRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


@dataclass
class Counting:
    """A plain scorer: counts completed turns; remembers the thread of result()."""

    name: str = "counting"
    higher_is_better: bool | None = True
    description: str = "completed turns"
    cpu_heavy: bool = False
    threads: list[int] = field(default_factory=list)

    def scorer(self, conversation: Any) -> Any:
        metric = self

        class _Scorer:
            n = 0

            def update(self, turn: TurnRecord) -> None:
                if turn.status is TurnStatus.COMPLETED:
                    self.n += 1

            def result(self) -> Score:
                metric.threads.append(threading.get_ident())
                return Score(value=float(self.n))

        return _Scorer()


@dataclass
class Broken:
    """A scorer that raises in update (or, with ``when='result'``, in result)."""

    name: str = "broken"
    when: str = "update"
    higher_is_better: bool | None = True
    description: str = "always raises"

    def scorer(self, conversation: Any) -> Any:
        when = self.when

        class _Scorer:
            def update(self, turn: TurnRecord) -> None:
                if when == "update":
                    raise ValueError("bad update")

            def result(self) -> Score:
                raise ValueError("bad result")

        return _Scorer()


@dataclass
class Gated:
    """A scorer that awaits (as a judge does): each update waits for ``gate``."""

    gate: anyio.Event
    entered: anyio.Event = field(default_factory=anyio.Event)
    name: str = "gated"
    higher_is_better: bool | None = True
    description: str = "awaits a gate per turn"
    seen: list[str] = field(default_factory=list)

    def scorer(self, conversation: Any) -> Any:
        metric = self

        class _Scorer(AsyncConversationScorer):
            async def update(self, turn: TurnRecord) -> None:
                metric.entered.set()
                await metric.gate.wait()
                metric.seen.append(turn.turn_id)

            async def result(self) -> Score:
                return Score(value=float(len(metric.seen)))

        return _Scorer()


@dataclass
class Undeclared:
    """An async scorer that forgot to say so: its coroutines are never awaited."""

    name: str = "undeclared"
    higher_is_better: bool | None = True
    description: str = "async without AsyncConversationScorer"

    def scorer(self, conversation: Any) -> Any:
        class _Scorer:
            def update(self, turn: TurnRecord) -> None:
                return None

            async def result(self) -> Score:  # not awaited by a plain scorer's caller
                return Score(value=1.0)

        return _Scorer()


async def test_a_failing_scorer_touches_no_other_metric() -> None:
    transcript = _transcript()
    session = ScoringSession(
        transcript.conversation, [Counting(), Broken(), Broken("late", when="result")]
    )
    async with session:
        for record in transcript.turns:
            session.add(record)
    scores = session.scored.scores
    assert list(scores) == ["counting", "broken", "late"]  # the order the metrics came in
    assert scores["counting"].value == 2.0
    assert (
        scores["broken"].status == "failed" and "ValueError: bad update" in scores["broken"].reason
    )
    assert scores["late"].status == "failed" and "bad result" in (scores["late"].reason or "")


async def test_cpu_heavy_results_are_computed_off_the_event_loop() -> None:
    transcript = _transcript()
    light, heavy = Counting("light"), Counting("heavy", cpu_heavy=True)
    session = ScoringSession(transcript.conversation, [light, heavy])
    async with session:
        for record in transcript.turns:
            session.add(record)
    loop_thread = threading.get_ident()
    assert light.threads == [loop_thread]
    assert heavy.threads and heavy.threads[0] != loop_thread
    assert session.scored.scores["heavy"].value == 2.0


async def test_scorers_that_await_run_beside_the_turns_and_in_order() -> None:
    transcript = _transcript()
    gated = Gated(anyio.Event())
    session = ScoringSession(transcript.conversation, [gated, Counting()])
    async with session:
        for record in transcript.turns:
            session.add(record)  # returns at once: the judge is still waiting
        await gated.entered.wait()
        assert gated.seen == []
        gated.gate.set()
    assert gated.seen == ["t1", "t2"]
    assert session.scored.scores["gated"].value == 2.0


async def test_a_cancellation_scores_what_it_can_and_says_what_it_cut_short() -> None:
    transcript = _transcript(evaluation_metrics=("slow_turn", "counting_turn"))
    gated = Gated(anyio.Event())  # never opened
    turn_gate = Gated(anyio.Event(), name="slow_turn")
    heavy = Counting("heavy", cpu_heavy=True)
    session = ScoringSession(
        transcript.conversation,
        [gated, heavy, Counting()],
        {"slow_turn": turn_gate, "counting_turn": Counting("counting_turn", cpu_heavy=True)},
    )
    with anyio.CancelScope() as scope:
        async with session:
            for record in transcript.turns:
                session.add(record)
            await gated.entered.wait()
            scope.cancel()
    assert scope.cancelled_caught
    scores = session.scored.scores
    assert scores["gated"].status == "failed"
    assert "ended before it was scored" in (scores["gated"].reason or "")
    assert scores["heavy"].value == 2.0 and scores["counting"].value == 2.0
    for turn_id in ("t1", "t2"):
        turn = session.scored.turn_scores[turn_id]
        assert turn["counting_turn"].value == 1.0  # computed after the cancellation
        assert turn["slow_turn"].status == "failed"
        assert "ended before the turn was scored" in (turn["slow_turn"].reason or "")


async def test_turn_metrics_are_scored_on_their_turn_alone() -> None:
    transcript = _transcript(evaluation_metrics=("counting_turn", "heavy_turn", "missing"))
    session = ScoringSession(
        transcript.conversation,
        [],
        {
            "counting_turn": Counting("counting_turn"),
            "heavy_turn": Counting("heavy_turn", cpu_heavy=True),
        },
    )
    async with session:
        for record in transcript.turns:
            session.add(record)
    for turn in session.scored.turn_scores.values():
        assert turn["counting_turn"].value == 1.0 and turn["heavy_turn"].value == 1.0
        assert turn["missing"].status == "failed" and "'missing' was not provided" in (
            turn["missing"].reason or ""
        )


async def test_sync_scoring_needs_no_event_loop_even_inside_one() -> None:
    # what an lm-eval task's process_results does when convsim runs it: score with
    # convsim's metrics from sync code on the loop's own thread
    scores = score_transcript(
        MESSAGES, ["exact_match", "coherence"], reference_responses={2: "It was A-1042."}
    )
    assert scores["exact_match"].value == 1.0  # the one turn with a reference
    assert scores["coherence"].status == "ok"


async def test_sync_scoring_refuses_a_scorer_that_must_be_awaited() -> None:
    transcript = _transcript()
    session = ScoringSession(transcript.conversation, [Gated(anyio.Event())])
    with pytest.raises(ConfigError, match="gated call a model and must be awaited"):
        session.score_now(transcript.turns)


async def test_an_async_scorer_that_does_not_declare_itself_fails_with_the_reason() -> None:
    transcript = _transcript()
    session = ScoringSession(transcript.conversation, [Undeclared()])
    async with session:
        for record in transcript.turns:
            session.add(record)
    score = session.scored.scores["undeclared"]
    assert score.status == "failed"
    assert "subclass convsim.metrics.AsyncConversationScorer" in (score.reason or "")


def test_a_session_scores_once() -> None:
    transcript = _transcript()
    session = ScoringSession(transcript.conversation, [Counting()])
    with pytest.raises(RuntimeError, match="not been scored yet"):
        _ = session.scored
    first = session.score_now(transcript.turns)
    assert session.score_now() is first
    with pytest.raises(RuntimeError, match="scored already"):
        session.add(transcript.turns[0])


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(st.sampled_from(["ok", "update", "result", "build"]), min_size=1, max_size=6))
def test_every_metric_gets_exactly_one_score_whatever_breaks(kinds: list[str]) -> None:
    @dataclass
    class Unbuildable:
        name: str
        higher_is_better: bool | None = True
        description: str = "raises when built"

        def scorer(self, conversation: Any) -> Any:
            raise RuntimeError("cannot build")

    metrics: list[Any] = []
    for i, kind in enumerate(kinds):
        name = f"m{i}"
        if kind == "ok":
            metrics.append(Counting(name))
        elif kind == "build":
            metrics.append(Unbuildable(name))
        else:
            metrics.append(Broken(name, when=kind))
    transcript = _transcript()
    scores = ScoringSession(transcript.conversation, metrics).score_now(transcript.turns).scores
    assert list(scores) == [m.name for m in metrics]
    for metric, kind in zip(metrics, kinds, strict=True):
        score = scores[metric.name]
        assert (score.status == "ok") == (kind == "ok"), (kind, score)
        if kind == "ok":
            assert score.value == 2.0


async def test_the_bodys_own_exception_comes_out_as_itself() -> None:
    transcript = _transcript()
    session = ScoringSession(transcript.conversation, [Gated(anyio.Event()), Counting()])
    with pytest.raises(KeyError, match="mine"):  # not wrapped in an exception group
        async with session:
            session.add(transcript.turns[0])
            raise KeyError("mine")
    assert session.scored.scores["counting"].value == 1.0
    assert session.scored.scores["gated"].status == "failed"


async def test_turns_added_before_the_block_reach_every_scorer() -> None:
    transcript = _transcript()
    gated = Gated(anyio.Event())
    gated.gate.set()
    session = ScoringSession(transcript.conversation, [gated, Counting()])
    for record in transcript.turns:
        session.add(record)
    async with session:
        pass
    assert gated.seen == ["t1", "t2"]
    assert session.scored.scores["gated"].value == 2.0
    assert session.scored.scores["counting"].value == 2.0


async def test_stopping_a_run_with_a_judge_mid_turn_records_every_conversation(
    tmp_path: Any,
) -> None:
    """The judge's background stops with the conversation; the turns the stop records
    afterwards must not break the run (they are scored from the records)."""
    import convsim
    from convsim.adapters import Completion, ModelAdapter

    in_flight = anyio.Event()
    started: set[str] = set()

    class Slow(ModelAdapter):
        async def generate(self, messages: Any, params: Any) -> Completion:
            started.add(params.metadata["conversation_id"])
            if len(started) == 4:
                in_flight.set()
            await anyio.sleep_forever()  # never answers: the stop cancels it
            raise AssertionError("unreachable")

    class Judge(ModelAdapter):
        async def generate(self, messages: Any, params: Any) -> Completion:
            return Completion(text='{"score": 4, "reason": "fine"}')

    async with convsim.Simulator(
        Slow(), judge=Judge(), metrics=["accuracy", "response_length"], concurrency=4
    ) as sim:
        handle = sim.run("customer_support", limit=4)
        await in_flight.wait()
        handle.stop(grace_period=0)
        results = [r async for r in handle]
    assert len(results) == 4
    for result in results:
        assert result.status is convsim.Status.CANCELLED
        assert result.scores["accuracy"].status in ("failed", "not_applicable")
        assert result.scores["response_length"].status == "not_applicable"
