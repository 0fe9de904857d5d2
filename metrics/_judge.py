"""LLM-as-judge: any adapter grades responses against a rubric.

The judge gets the conversation so far, the user's message, the response and the
rubric, and must answer with JSON ``{"score": 1-5, "reason": "..."}``. Unparsable
answers are re-asked (``max_reasks``); ``samples`` > 1 grades each turn several times
(all at once) and combines them by ``mean`` or ``majority`` (the most frequent grade; a
tie goes to the lowest of the tied grades, so the judge is never credited with a grade
nobody gave and doubt counts against the reply). Every score says how far the judge can
be trusted: the spread of its samples, a bootstrap 95% interval, and how many samples
were asked, graded, unparsable and failed. Scores are mapped to 0-1 ((s - 1) / 4).
The judge's calls go through its adapter like any model call (budgets, retries), and its
usage and cost are recorded in the score's details. A judge call that fails (the
adapter raised, retries included) loses only its own sample: it is listed under
``failures`` with the error, the other grades and the usage so far are kept, and the
score fails (status "failed") only when no grade at all survived. Cancellation is
never caught.

A judge sees the assistant's answers only: what a reasoning model thought before it
answered is not what the user got. With ``sees_reasoning`` (``--judge-sees-reasoning``)
each answer that has reasoning is preceded by it between ``<reasoning>`` and
``</reasoning>``, and the prompt says so (so the judge's prompt, and with it the
response cache's key, differs from the one that hides the reasoning).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import anyio

from convsim._records import Score, TurnRecord, TurnStatus
from convsim._types import GenerationParams, Message, Usage

from ._protocol import AsyncConversationScorer, JudgedMetric, Metric, MetricTraits
from ._stats import mean, percentile

if TYPE_CHECKING:
    from convsim.adapters import ModelAdapter
    from convsim.scenarios import Conversation

__all__ = [
    "JudgeSettings",
    "RubricJudgeMetric",
    "GUIDE_RUBRICS",
    "Grade",
    "parse_grade",
    "JUDGE_PROMPT",
    "REASONING_NOTE",
    "with_reasoning",
]

GUIDE_RUBRICS = {
    "engagement_quality": (
        "Does the response engage with the user's needs and invite the next step?"
    ),
    "clarity_score": "Is the response clear, well organised and easy to follow?",
    "analysis_depth": "How deeply does the response analyse the user's input?",
    "recommendation_quality": "Are the recommendations specific, justified and actionable?",
    "detail_level": "Does the response give the level of detail the question needs?",
    "accuracy": "Is every factual statement in the response correct?",
    "depth_of_analysis": "How thorough and well reasoned is the analysis?",
}

JUDGE_PROMPT = """You are grading one reply of an AI assistant in a conversation.

Rubric: {rubric}

Conversation before the reply:
{context}

The user's message:
{user}

The assistant's reply:
{response}

Grade the reply against the rubric from 1 (very poor) to 5 (excellent). Answer with a
JSON object only, for example {{"score": 4, "reason": "one short sentence"}}."""

REASONING_NOTE = (
    "The assistant's reasoning before a reply, where it gave any, is shown just before "
    "that reply between <reasoning> and </reasoning>; the user never saw it."
)
"""Put at the head of a judge's prompt when the judge sees the reasoning."""


def with_reasoning(answer: str, reasoning: str | None) -> str:
    """``answer`` preceded by ``reasoning``, marked, when there is any."""
    if not reasoning:
        return answer
    return f"<reasoning>\n{reasoning}\n</reasoning>\n{answer}"


REASK = (
    'That was not a JSON object with an integer "score" from 1 to 5. Answer again with '
    'only the JSON object, e.g. {"score": 3, "reason": "..."}.'
)


@dataclass(frozen=True)
class JudgeSettings:
    """Which model judges, and how."""

    adapter: ModelAdapter
    samples: int = 1
    combine: Literal["mean", "majority"] = "mean"
    max_reasks: int = 1
    max_tokens: int = 200
    temperature: float | None = 0.0
    sees_reasoning: bool = False
    """Each answer is shown with the reasoning before it (see the module's docstring)."""

    def framed(self, prompt: str) -> str:
        """``prompt`` as this judge is asked it: with :data:`REASONING_NOTE` first when
        it sees the reasoning."""
        return f"{REASONING_NOTE}\n\n{prompt}" if self.sees_reasoning else prompt

    def answer(self, text: str, reasoning: str | None) -> str:
        """An assistant's answer as this judge sees it."""
        return with_reasoning(text, reasoning) if self.sees_reasoning else text


class Grade(NamedTuple):
    """A judge's grade: 1-5, and the reason it gave."""

    score: int
    reason: str


class JudgeAnswer(NamedTuple):
    """What asking the judge gave: the grade or None, the usage and calls spent, the
    error (``"Type: message"``) if a call failed, and the answers taken from the
    response cache instead of a call (neither calls nor usage)."""

    grade: Grade | None
    usage: Usage
    calls: int
    error: str | None = None
    cached: int = 0


async def ask_judge(judge: JudgeSettings, prompt: str, *, seed: int = 0) -> JudgeAnswer:
    """Ask the judge, re-asking on an unparsable answer.

    A failing call (an AdapterError after the adapter's retries, or any other Exception
    from a judge adapter) ends the asking: the answer carries the usage so far and the
    error instead of raising. Cancellation (a BaseException under asyncio and trio alike)
    is not caught and propagates.
    """
    messages = [Message(role="user", content=prompt)]
    params = GenerationParams(max_tokens=judge.max_tokens, temperature=judge.temperature, seed=seed)
    usage, calls, cached = Usage(), 0, 0
    for _ in range(judge.max_reasks + 1):
        try:
            completion = await judge.adapter.generate(messages, params)
        except Exception as exc:  # never BaseException: cancellation must propagate
            return JudgeAnswer(None, usage, calls + 1, f"{type(exc).__name__}: {exc}", cached)
        if completion.cached:
            cached += 1
        else:
            calls += 1
            usage = usage + completion.usage
        try:
            return JudgeAnswer(parse_grade(completion.text), usage, calls, cached=cached)
        except (ValueError, TypeError):
            messages = [
                *messages,
                Message(role="assistant", content=completion.text),
                Message(role="user", content=REASK),
            ]
    return JudgeAnswer(None, usage, calls, cached=cached)


def judge_details(
    judge: JudgeSettings, usage: Usage, calls: int, cached: int = 0
) -> dict[str, Any]:
    """The judge's model, calls, usage and (when it can be priced) cost, for details;
    with the answers the response cache gave (``judge_cached``) when there were any."""
    details: dict[str, Any] = {
        "judge": judge.adapter.model_info().model_id,
        "judge_calls": calls,
        "judge_usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        },
    }
    if cached:
        details["judge_cached"] = cached
    cost = judge.adapter.usage_cost(usage) if calls else None
    if cost is not None:
        details["judge_cost_usd"] = cost.total_cost
    return details


def combine_grades(grades: list[int], how: Literal["mean", "majority"]) -> float:
    """The samples' grades combined: their mean, or the most frequent grade with a tie
    going to the lowest of the tied grades (conservative, and always a grade given)."""
    if how == "majority":
        counts = Counter(grades)
        top = max(counts.values())
        return float(min(g for g, c in counts.items() if c == top))
    return mean(grades)


def parse_grade(text: str) -> Grade:
    """The grade in a judge's answer; ValueError if it is not strict JSON."""
    # the outermost braces, found in linear time (a regex search is quadratic on "{{{...")
    start, end = text.find("{"), text.rfind("}")
    if not 0 <= start < end:
        raise ValueError("no JSON object")
    try:
        data = json.loads(text[start : end + 1])
    except RecursionError:  # a model's answer nested past the parser's depth
        raise ValueError("the JSON is nested too deeply") from None
    score = data.get("score") if isinstance(data, dict) else None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or score != int(score):
        raise ValueError("score is not an integer")
    if not 1 <= score <= 5:
        raise ValueError("score is outside 1-5")
    return Grade(int(score), str(data.get("reason", "")))


@dataclass(frozen=True)
class RubricJudgeMetric:
    """A metric graded by a judge model against a rubric (``judge:<rubric>`` or a guide
    rubric name). Without a judge it reports "not applicable: needs a judge"."""

    traits: ClassVar[MetricTraits] = MetricTraits("turn", needs=frozenset({"judge"}))
    name: str
    rubric: str
    judge: JudgeSettings | None = None
    higher_is_better: bool = True

    @property
    def description(self) -> str:
        return f"Judge rubric, 1-5 mapped to 0-1: {self.rubric}"

    def with_judge(self, judge: JudgeSettings) -> RubricJudgeMetric:
        return replace(self, judge=judge)

    def scorer(self, conversation: Conversation) -> Any:
        if self.judge is None:
            return _NeedsJudge(self.name)
        return _JudgeScorer(self.rubric, self.judge)


@dataclass
class _NeedsJudge:
    name: str

    def update(self, turn: TurnRecord) -> None:
        return None

    def result(self) -> Score:
        return Score.not_applicable(f"{self.name} needs a judge model (--judge SPEC)")


@dataclass
class _JudgeScorer(AsyncConversationScorer):
    rubric: str
    judge: JudgeSettings
    grades: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Turns no sample could grade."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """Samples whose judge call failed: turn_id, sample and error."""
    reasons: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    calls: int = 0
    cached: int = 0
    samples: list[list[int]] = field(default_factory=list)
    """Each graded turn's sample grades (1-5)."""
    asked: int = 0
    unparsable: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    """Details a subclass adds to every score (its prompt's version and hash)."""

    async def update(self, turn: TurnRecord) -> None:
        if turn.status is not TurnStatus.COMPLETED or turn.response is None:
            return
        judge = self.judge
        context = (
            "\n".join(
                f"{m.role}: {judge.answer(m.content, m.reasoning)}"
                for m in turn.messages[:-1]
                if m.role != "system"
            )
            or "(none)"
        )
        prompt = judge.framed(
            JUDGE_PROMPT.format(
                rubric=self.rubric,
                context=context,
                user=turn.user_message or "",
                response=judge.answer(turn.response, turn.reasoning),
            )
        )
        await self.grade(prompt, turn.turn_id)

    async def grade(self, prompt: str, unit_id: str) -> None:
        """Ask the judge ``prompt`` ``samples`` times and fold the grades in as one
        graded unit (a turn, or a whole conversation) called ``unit_id``."""
        # the samples are asked at once: one after another they multiply the latency
        answers: list[JudgeAnswer | None] = [None] * self.judge.samples

        async def ask(k: int) -> None:
            answers[k] = await ask_judge(self.judge, prompt, seed=k)

        async with anyio.create_task_group() as tg:
            for k in range(self.judge.samples):
                tg.start_soon(ask, k)
        samples: list[int] = []
        for k, answer in enumerate(answers):
            assert answer is not None
            grade = self._take(answer, seed=k, turn_id=unit_id)
            if grade is not None:
                samples.append(grade)
        self.asked += len(answers)
        if not samples:
            self.failures.append(unit_id)
            return
        self.samples.append(samples)
        self.grades.append((combine_grades(samples, self.judge.combine) - 1) / 4)

    def _take(self, answer: JudgeAnswer, *, seed: int, turn_id: str) -> int | None:
        self.calls += answer.calls
        self.cached += answer.cached
        self.usage = self.usage + answer.usage
        if answer.error is not None:
            self.errors.append({"turn_id": turn_id, "sample": seed, "error": answer.error})
            return None
        if answer.grade is None:
            self.unparsable += 1
            return None
        score, reason = answer.grade
        if reason and len(self.reasons) < 5:
            self.reasons.append(reason)
        return score

    async def result(self) -> Score:
        failed = {e["turn_id"] for e in self.errors}
        details: dict[str, Any] = {
            **judge_details(self.judge, self.usage, self.calls, self.cached),
            "unparsable_turns": [t for t in self.failures if t not in failed],
            "failures": self.errors,
            "reasons": self.reasons,
            **reliability(self.samples, self.judge.combine),
            "samples_asked": self.asked,
            "samples_unparsable": self.unparsable,
            "samples_failed": len(self.errors),
            **self.extra,
        }
        if not self.grades:
            if self.errors:  # an outage is a failure to measure, not "nothing to measure"
                return Score.failed(f"the judge call failed ({self.errors[0]['error']})", **details)
            if self.failures:
                return Score.failed("the judge's answers could not be parsed", **details)
            return Score.not_applicable("no completed turns to judge", **details)
        return Score(value=mean(self.grades), details={**details, "turns": len(self.grades)})


_BOOTSTRAP = 2000


def reliability(samples: list[list[int]], how: Literal["mean", "majority"]) -> dict[str, Any]:
    """How far the judge can be trusted on this conversation: the spread of its samples
    (mean over turns of their standard deviation, on the 0-1 scale) and a 95% interval
    of the score, by a bootstrap that redraws the turns and, within each, the samples
    (seeded: the same grades give the same interval). None where there is nothing to
    draw from (one turn graded once)."""
    import numpy as np  # here: importing the runtime must not cost numpy

    from ._bootstrap import integers_draw

    graded = sum(len(s) for s in samples)
    spread = [float(np.std(np.asarray(s, dtype=np.float64) / 4)) for s in samples if len(s) > 1]
    out: dict[str, Any] = {
        "samples_graded": graded,
        "sample_spread": mean(spread) if spread else None,
        "ci95": None,
    }
    if not samples or (len(samples) == 1 and len(samples[0]) == 1):
        return out
    draw = integers_draw(0)
    per_turn = np.empty((len(samples), _BOOTSTRAP))
    for t, grades in enumerate(samples):
        drawn = np.asarray(grades)[draw(_BOOTSTRAP, len(grades))]
        if how == "majority":  # the most frequent grade, a tie to the lowest (argmax: first)
            counts = (drawn[:, :, None] == np.arange(1, 6)).sum(axis=1)
            per_turn[t] = counts.argmax(axis=1) + 1
        else:
            per_turn[t] = drawn.mean(axis=1)
    turns = draw(_BOOTSTRAP, len(samples))
    means = (per_turn[turns, np.arange(_BOOTSTRAP)[:, None]].mean(axis=1) - 1) / 4
    low, high = percentile(means, [2.5, 97.5])
    out["ci95"] = [round(float(low), 4), round(float(high), 4)]
    return out


def rubric_metric(name: str) -> RubricJudgeMetric:
    """A guide rubric by name, or ``judge:<rubric text or guide name>``."""
    rubric = name.removeprefix("judge:")
    return RubricJudgeMetric(name, GUIDE_RUBRICS.get(rubric, rubric))


def judged(metric: Metric, judge: JudgeSettings | None) -> Metric:
    """``metric`` with the judge given to it, if it is graded by one."""
    if judge is None or not isinstance(metric, JudgedMetric):
        return metric
    return metric.with_judge(judge)
