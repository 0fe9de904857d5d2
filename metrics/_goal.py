"""Checking a scenario goal's success criteria against responses."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

from pydantic import ValidationError

from convsim._records import Score, TurnRecord
from convsim._registry import import_object
from convsim._types import Usage
from convsim.scenarios._regex import RegexError, compile_pack_regex, pack_regex_search
from convsim.scenarios._schema import Criterion, Goal
from convsim.scenarios._state_checks import check_state
from convsim.scenarios._tool_schema import StateCheck

from ._final_state import NO_DOCUMENT, final_environment
from ._judge import ask_judge, judge_details
from ._once import LoadedOnce
from ._protocol import AsyncConversationScorer, MetricTraits

__all__ = [
    "check_criterion",
    "criterion_credit",
    "goal_met",
    "state_verdict",
    "StateCriterionVerdict",
    "GoalAchievementMetric",
    "DETERMINISTIC_KINDS",
]

#: Criterion kinds that can be checked without a model or user code.
DETERMINISTIC_KINDS = frozenset({"contains", "regex", "number"})
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def check_criterion(criterion: Criterion, text: str) -> bool | None:
    """Whether ``text`` meets the criterion; None for kinds this cannot decide here."""
    if criterion.kind == "contains":
        return str(criterion.value).casefold() in text.casefold()
    if criterion.kind == "regex":
        # RE2: linear in the text, whatever the pattern (validation refused what it lacks)
        try:
            return pack_regex_search(str(criterion.value), text)
        except RegexError:
            return False
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


class StateCriterionVerdict(NamedTuple):
    """Whether a ``state`` criterion holds on a document, and what was found."""

    held: bool
    message: str


def state_verdict(criterion: Criterion, environment: Any) -> StateCriterionVerdict:
    """A ``state`` criterion (its value a :class:`StateCheck`) checked on the tools'
    environment document ``environment``; not met, saying why, when there is no
    document (None) or the value is no state check."""
    if environment is None:
        return StateCriterionVerdict(False, NO_DOCUMENT)
    try:
        check = StateCheck.model_validate(criterion.value)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"] if exc.errors() else str(exc)
        return StateCriterionVerdict(False, f"the criterion is no state check: {problem}")
    verdict = check_state(environment, check)
    return StateCriterionVerdict(verdict.held, verdict.message)


def goal_met(
    goal: Goal,
    responses: Mapping[str, str],
    final: str | None,
    environment: Any = None,
) -> bool:
    """True when every ``all_of`` and at least one ``any_of`` criterion hold.

    Criteria name the turn whose response they check (``turn_id``), else the final
    response; ``state`` criteria check ``environment``, the tools' environment document
    as it is now (not met without one). A criterion of a kind that cannot be decided
    here counts as not met.
    """
    if not goal.all_of and not goal.any_of:
        return False

    def holds(criterion: Criterion) -> bool:
        if criterion.kind == "state":
            return state_verdict(criterion, environment).held
        text = responses.get(criterion.turn_id) if criterion.turn_id else final
        return text is not None and check_criterion(criterion, text) is True

    return all(holds(c) for c in goal.all_of) and (
        not goal.any_of or any(holds(c) for c in goal.any_of)
    )


def _json_in(text: str) -> Any:
    """The first JSON value in ``text``: a fenced ```json block, or the outermost braces."""
    fenced = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser
            continue
    raise ValueError("no JSON in the response")


def criterion_credit(criterion: Criterion, text: str, scenario: Any) -> float | None:
    """Credit in [0, 1] for one criterion, or None where it cannot be decided here."""
    decided = check_criterion(criterion, text)
    if decided is not None:
        return 1.0 if decided else 0.0
    if criterion.kind == "json_schema":
        return _schema_credit(criterion.value, text)
    if criterion.kind == "python":
        # only packs loaded with allow_code reach here with a python criterion
        checker: Any = import_object(str(criterion.value))
        outcome = checker(text, scenario)
        return max(0.0, min(1.0, float(outcome)))
    return None  # judge: needs a judge model


def _schema_credit(schema: Any, text: str) -> float:
    """1.0 when the first JSON value in ``text`` fits ``schema``, else 0.0. The schema's
    ``pattern`` and ``patternProperties`` run on RE2 (linear time) as goal regexes do."""
    import jsonschema
    import referencing.exceptions

    try:
        instance = _json_in(text)
        validator = _re2_validator(jsonschema.validators.validator_for(schema))
        checker = validator(schema, registry=_local_registry())
        error = jsonschema.exceptions.best_match(checker.iter_errors(instance))
    except (
        ValueError,
        RecursionError,
        jsonschema.SchemaError,
        referencing.exceptions.Unresolvable,
    ):
        return 0.0
    return 0.0 if error is not None else 1.0


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    import jsonschema

    if validator.is_type(instance, "string") and not _schema_search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _re2_pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _schema_search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _schema_search(pattern: str, text: str) -> bool:
    compile_pack_regex(pattern, ignore_case=False)  # RegexError is a ValueError
    return pack_regex_search(pattern, text, ignore_case=False)


def _no_retrieval(uri: str) -> Any:
    import referencing.exceptions

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs


@LoadedOnce
def _local_registry() -> Any:
    """The JSON Schema metaschemas, and nothing fetched: a reference a pack's schema
    makes to a URL or a file (``$ref``, ``$dynamicRef``, a remote ``$id``) is
    unresolvable, never retrieved."""
    import referencing
    from jsonschema_specifications import REGISTRY

    registry: Any = referencing.Registry(retrieve=_no_retrieval)  # type: ignore[call-arg]  # attrs
    return registry.combine(REGISTRY)


@LoadedOnce
def _re2_validator(base: Any) -> Any:
    import jsonschema

    return jsonschema.validators.extend(
        base, {"pattern": _re2_pattern, "patternProperties": _re2_pattern_properties}
    )


GOAL_PROMPT = """You are checking whether an AI assistant's reply meets a goal.

Goal: {goal}
Criterion: {criterion}

The reply:
{response}

Grade how fully the reply meets the criterion, from 1 (not at all) to 5 (completely).
Answer with a JSON object only, for example {{"score": 4, "reason": "one short sentence"}}."""


@dataclass(frozen=True)
class GoalAchievementMetric:
    """How much of the scenario goal the conversation achieved, and when."""

    traits: ClassVar[MetricTraits] = MetricTraits(
        "conversation", needs=frozenset({"goal"}), uses=frozenset({"judge"})
    )
    judge: Any = None
    name: str = "goal_achievement"
    higher_is_better: bool = True
    description: str = (
        "Partial credit over the scenario goal's criteria on the final state: the share of "
        "all_of criteria met, and whether any any_of criterion is, averaged; plus "
        "turns_to_goal, the first completed turn after which every deterministic criterion "
        "held. Criteria: contains, regex, number (with tolerance), json_schema, a Python "
        "checker (module:function), state (a check on the tools' environment document "
        "after the conversation) and judge rubrics (graded by --judge)."
    )

    def with_judge(self, judge: Any) -> GoalAchievementMetric:
        return replace(self, judge=judge)

    def scorer(self, conversation: Any) -> Any:
        goal = conversation.scenario.goal
        has_judge_criteria = goal is not None and any(
            c.kind == "judge" for c in [*goal.all_of, *goal.any_of]
        )
        if self.judge is not None and has_judge_criteria:
            return _JudgedGoalScorer(conversation, self.judge)
        return _GoalScorer(conversation)


class GoalCredit(NamedTuple):
    """How much of a goal was met, and one row per criterion."""

    value: float | None
    rows: list[dict[str, Any]]


class _GoalScorer:
    def __init__(self, conversation: Any) -> None:
        self.conversation = conversation
        self.scenario = conversation.scenario
        self.goal: Goal | None = self.scenario.goal
        self.responses: dict[str, str] = {}
        self.final: str | None = None
        self.reasonings: dict[str, str | None] = {}
        """Each answered turn's reasoning (None when it had none): a judge may see it."""
        self.final_reasoning: str | None = None
        self.completed = 0
        self.turns_to_goal: int | None = None
        self.changed: list[TurnRecord] = []
        """The latest record that left an environment document (at most one): a turn
        that failed after its tool calls changed the document still changed it."""
        self.has_state = self.goal is not None and any(
            c.kind == "state" for c in [*self.goal.all_of, *self.goal.any_of]
        )

    def update(self, turn: Any) -> None:
        if turn.environment is not None:
            self.changed[:] = [turn]
        if turn.status.value != "completed" or turn.response is None or self.goal is None:
            return
        self.responses[turn.turn_id] = turn.response
        self.final = turn.response
        reasoning = getattr(turn, "reasoning", None)
        self.reasonings[turn.turn_id] = reasoning
        self.final_reasoning = reasoning
        self.completed += 1
        if self.turns_to_goal is None and self._credit().value == 1.0:
            self.turns_to_goal = self.completed

    def _credit(
        self,
        judged: dict[tuple[str, int], float] | None = None,
        ungraded: Collection[tuple[str, int]] = (),
        fill: float = 0.0,
    ) -> GoalCredit:
        """The goal's credit and one row per criterion. Judge criteria take their grade
        from ``judged``; those in ``ungraded`` (the judge tried and failed) count as
        ``fill``; any other judge criterion is left out."""
        assert self.goal is not None
        rows: list[dict[str, Any]] = []
        parts: list[float] = []
        document = final_environment(self.conversation, self.changed) if self.has_state else None
        for group in ("all_of", "any_of"):
            credits = []
            for i, criterion in enumerate(getattr(self.goal, group)):
                text = self.responses.get(criterion.turn_id) if criterion.turn_id else self.final
                row: dict[str, Any] = {"group": group, "index": i, "kind": criterion.kind}
                if criterion.kind == "state":
                    verdict = state_verdict(criterion, document)
                    credit: float | None = 1.0 if verdict.held else 0.0
                    row["message"] = verdict.message
                elif text is None:
                    credit = None
                else:
                    credit = criterion_credit(criterion, text, self.scenario)
                if criterion.kind == "judge":
                    credit = (judged or {}).get((group, i))
                rows.append({**row, "credit": credit})
                if (group, i) in ungraded:
                    credits.append(fill)
                elif credit is not None or text is None:
                    credits.append(credit or 0.0)
            if credits:
                parts.append(sum(credits) / len(credits) if group == "all_of" else max(credits))
        return GoalCredit(sum(parts) / len(parts) if parts else None, rows)

    def result(
        self,
        judged: dict[tuple[str, int], float] | None = None,
        ungraded: Collection[tuple[str, int]] = (),
    ) -> Score:
        if self.goal is None or not (self.goal.all_of or self.goal.any_of):
            return Score.not_applicable("the scenario declares no goal criteria")
        if self.final is None:
            return Score.not_applicable("no turn completed")
        value, rows = self._credit(judged, ungraded, fill=0.0)
        if ungraded:
            # decided only if the ungraded criteria could not move the score either way
            best, _ = self._credit(judged, ungraded, fill=1.0)
            if value is None or best is None or not math.isclose(value, best):
                named = ", ".join(f"{group}[{i}]" for group, i in ungraded)
                return Score.failed(
                    f"the judge could not grade goal criterion {named}",
                    criteria=rows,
                    turns_to_goal=self.turns_to_goal,
                    turns=self.completed,
                )
        if value is None:
            return Score.not_applicable("every goal criterion needs a judge model")
        return Score(
            value=value,
            details={
                "criteria": rows,
                "turns_to_goal": self.turns_to_goal,
                "turns": self.completed,
            },
        )


class _JudgedGoalScorer(AsyncConversationScorer):
    """Goal achievement whose judge criteria a judge model grades on the final state.

    A judge criterion the judge cannot grade (its answers stay unparsable after the
    re-asks, or the call fails) is "ungraded" and listed so in the details with the
    error. The score then stands only if it is the same whatever grade that criterion
    would have got (scored with it at 0 and at 1, both agree): e.g. an ``any_of`` with
    another criterion fully met. Otherwise (e.g. ``all_of``, whose share of criteria met
    it would change) the score is failed, the reason naming the criterion as
    ``all_of[1]``. The judge's calls, usage and cost are in the details either way.
    """

    def __init__(self, conversation: Any, judge: Any) -> None:
        self.inner = _GoalScorer(conversation)
        self.judge = judge

    async def update(self, turn: Any) -> None:
        self.inner.update(turn)

    async def result(self) -> Score:
        inner, calls, usage, cached = self.inner, 0, Usage(), 0
        judged: dict[tuple[str, int], float] = {}
        ungraded: list[dict[str, Any]] = []
        if inner.goal is not None:
            for group in ("all_of", "any_of"):
                for i, criterion in enumerate(getattr(inner.goal, group)):
                    text = (
                        inner.responses.get(criterion.turn_id) if criterion.turn_id else inner.final
                    )
                    if criterion.kind != "judge" or text is None:
                        continue
                    reasoning = (
                        inner.reasonings.get(criterion.turn_id)
                        if criterion.turn_id
                        else inner.final_reasoning
                    )
                    prompt = self.judge.framed(
                        GOAL_PROMPT.format(
                            goal=inner.goal.description,
                            criterion=criterion.value,
                            response=self.judge.answer(text, reasoning),
                        )
                    )
                    answer = await ask_judge(self.judge, prompt)
                    calls += answer.calls
                    cached += answer.cached
                    usage = usage + answer.usage
                    if answer.grade is not None:
                        judged[(group, i)] = (answer.grade.score - 1) / 4
                    else:
                        error = answer.error or "the judge's answers could not be parsed"
                        ungraded.append({"group": group, "index": i, "error": error})
        score = inner.result(judged, [(u["group"], u["index"]) for u in ungraded])
        if not calls and not cached:
            return score
        details = {**score.details, **judge_details(self.judge, usage, calls, cached)}
        return score.model_copy(update={"details": {**details, "ungraded": ungraded}})
