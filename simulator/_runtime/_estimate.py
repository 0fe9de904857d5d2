"""What a run will cost before it runs: calls by role, prompt tokens and a cost range.

Worked out from the pack alone, without a model call. Each conversation is walked turn
by turn as the actor would run it (at most ``max_turns`` turns): the prompt of each
call is the transcript so far and the turn's rendered text. The **low** bound takes
every answer as empty (the prompts only); the **high** bound takes every answer at
its ``max_tokens`` cap, both as an answer and in every later prompt. Text is counted
at about four characters a token, with four tokens of framing per message. A call
whose answer has no cap leaves the high bound unknown (``None``) rather than guessed.
The judge's re-asks of an unparsable grade are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from convsim._errors import ConvsimError
from convsim._types import Message, Usage
from convsim.adapters import ModelAdapter
from convsim.metrics import JudgeSettings, Metric
from convsim.metrics._judge import JUDGE_PROMPT
from convsim.scenarios import Conversation

from ._call_settings import CallSettings
from ._user import SimulatedUser

if TYPE_CHECKING:
    from ._config import SimulatorConfig

__all__ = ["ROLES", "ConversationEstimate", "CostEstimator", "RoleEstimate", "RunEstimate"]

Role = Literal["model", "user", "judge"]
ROLES: tuple[Role, ...] = ("model", "user", "judge")

_FRAME = 4
"""Tokens of chat framing per message (role, separators), as the adapters estimate."""


def _tokens(text: str) -> int:
    """About four characters a token (the adapters' own estimate)."""
    return (len(text) + 3) // 4


@dataclass
class _Tally:
    """One role's calls and tokens, low and high."""

    calls: int = 0
    prompt_low: int = 0
    prompt_high: int = 0
    completion_high: int | None = 0
    """None once a call's answer has no cap."""

    def call(self, prompt_low: int, prompt_high: int, cap: int | None) -> None:
        self.calls += 1
        self.prompt_low += prompt_low
        self.prompt_high += prompt_high
        self.completion_high = (
            None if cap is None or self.completion_high is None else self.completion_high + cap
        )

    def add(self, other: _Tally) -> None:
        self.calls += other.calls
        self.prompt_low += other.prompt_low
        self.prompt_high += other.prompt_high
        self.completion_high = (
            None
            if self.completion_high is None or other.completion_high is None
            else self.completion_high + other.completion_high
        )


@dataclass(frozen=True)
class RoleEstimate:
    """One role's calls, tokens and cost range (USD) over the estimated conversations."""

    calls: int
    prompt_tokens_low: int
    prompt_tokens_high: int
    completion_tokens_high: int | None
    """None: an answer of the conversations has no max_tokens cap, so neither it nor
    the prompts after it have a bound (``prompt_tokens_high`` then counts it as empty)."""
    cost_low: float | None
    """The prompts priced (answers empty); None: the model has no price."""
    cost_high: float | None
    """Prompts and answers at their caps; None without a price or without a cap."""
    model: str | None = None
    """The model's name; None when the role makes no call."""

    @property
    def priced(self) -> bool:
        return self.calls == 0 or self.cost_low is not None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "priced": self.priced}


@dataclass(frozen=True)
class ConversationEstimate:
    """The estimate of one conversation: its turns and each role's calls and tokens."""

    turns: int
    tallies: Mapping[Role, _Tally]


@dataclass(frozen=True)
class RunEstimate:
    """What a run of the estimated conversations will take, before it runs."""

    conversations: int
    turns: int
    roles: dict[str, RoleEstimate]
    unpriced: tuple[str, ...] = ()
    """The models that have no price (``input_price``/``output_price``, the price table)."""

    @property
    def cost_low(self) -> float | None:
        """The whole run's lower bound (USD); None when a model with calls has no price."""
        if self.unpriced:
            return None
        return sum(r.cost_low or 0.0 for r in self.roles.values())

    @property
    def cost_high(self) -> float | None:
        """The whole run's upper bound (USD); None without a price or a cap."""
        if self.unpriced or any(r.calls and r.cost_high is None for r in self.roles.values()):
            return None
        return sum(r.cost_high or 0.0 for r in self.roles.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "turns": self.turns,
            "calls": {name: r.calls for name, r in self.roles.items()},
            "roles": {name: r.as_dict() for name, r in self.roles.items()},
            "cost_usd": {"low": self.cost_low, "high": self.cost_high},
            "unpriced": list(self.unpriced),
        }


@dataclass
class CostEstimator:
    """Estimates conversations of one run from its models and settings.

    Args:
        model: the model under test, and ``assistant`` its calls' settings.
        user: the simulated user's adapter and settings (None: no simulated user).
        metrics: the conversation metrics of each flow (``scenario_type``); the judged
            ones add judge calls.
        turn_metrics: the turn metrics by name (``evaluation_metrics`` of a turn).
        max_turns: the user's max_turns over each flow's.
        names: each role's model name, for the estimate.
    """

    model: ModelAdapter
    assistant: CallSettings
    user: ModelAdapter | None = None
    user_settings: CallSettings | None = None
    metrics: Mapping[str, Sequence[Metric]] = field(default_factory=dict)
    turn_metrics: Mapping[str, Metric] = field(default_factory=dict)
    max_turns: int | None = None
    names: Mapping[Role, str] = field(default_factory=dict)

    def conversation(self, conv: Conversation) -> ConversationEstimate:
        """Walk ``conv``'s turns as the actor would (every turn run, none ended early)."""
        tallies: dict[Role, _Tally] = {role: _Tally() for role in ROLES}
        flow = conv.flow
        limit = self.max_turns or flow.flow.max_turns or len(flow.turns)
        turns = flow.turns[:limit]
        system = conv.scenario.system_prompt or flow.flow.system_prompt
        history_low = history_high = _tokens(system) + _FRAME if system else 0
        said_low = said_high = 0  # the transcript without the system prompt
        transcript: list[Message] = [Message(role="system", content=system)] if system else []
        judges = _judges(self.metrics.get(flow.scenario_type, ()))
        unbounded = False
        for turn in turns:
            try:
                text = conv.render(turn, transcript)
            except ConvsimError:  # rendered at run time from what ran before
                text = turn.template.source
            cap = self.assistant.for_call(conv, turn, 0).max_tokens
            context_high = 0
            if "context" in turn.template.fields:  # the transcript again, answers at their caps
                context_high = said_high - said_low
            message_low = _tokens(text) + _FRAME
            message_high = message_low + context_high
            if turn.config.role == "user" and self.user is not None and self.user_settings:
                instruction = SimulatedUser(self.user, conv.scenario).system_prompt(text)
                user_cap = self.user_settings.for_call(conv, turn, 0).max_tokens
                framing = _tokens(instruction) + 2 * _FRAME
                tallies["user"].call(
                    framing + said_low, framing + context_high + said_high, user_cap
                )
                # the model is told what the simulated user wrote: nothing to its cap
                message_low = _FRAME
                message_high = _FRAME + (user_cap or 0)
                unbounded = unbounded or user_cap is None
            tallies["model"].call(history_low + message_low, history_high + message_high, cap)
            answer_high = cap or 0
            unbounded = unbounded or cap is None
            for rubric, judge in judges + _judges(
                self.turn_metrics[n]
                for n in turn.config.evaluation_metrics
                if n in self.turn_metrics
            ):
                frame = _tokens(JUDGE_PROMPT) + _tokens(rubric) + _FRAME
                for _ in range(judge.samples):
                    tallies["judge"].call(
                        frame + said_low + message_low,
                        frame + said_high + message_high + answer_high,
                        judge.max_tokens,
                    )
            history_low += message_low + _FRAME
            history_high += message_high + _FRAME + answer_high
            said_low += message_low + _FRAME
            said_high += message_high + _FRAME + answer_high
            transcript += [
                Message(role="user", content=text),
                Message(role="assistant", content=""),
            ]
        if unbounded:  # an answer without a cap: no call after it has a high bound
            for tally in tallies.values():
                tally.completion_high = None
        return ConversationEstimate(len(turns), tallies)

    def adapter(self, role: Role, judge: JudgeSettings | None = None) -> ModelAdapter | None:
        if role == "model":
            return self.model
        if role == "user":
            return self.user
        return judge.adapter if judge is not None else self.judge_adapter()

    def judge_adapter(self) -> ModelAdapter | None:
        for metrics in self.metrics.values():
            for _, judge in _judges(metrics):
                return judge.adapter
        for _, judge in _judges(self.turn_metrics.values()):
            return judge.adapter
        return None

    def high_cost(self, conv: Conversation) -> float | None:
        """The most ``conv`` may cost (USD): every answer at its cap; None when a model
        it calls has no price or an answer has no cap."""
        total = 0.0
        for role, tally in self.conversation(conv).tallies.items():
            if not tally.calls:
                continue
            cost = _high(self.adapter(role), tally)
            if cost is None:
                return None
            total += cost
        return total

    def run(self, conversations: Iterable[Conversation]) -> RunEstimate:
        """The estimate of a run of ``conversations``."""
        totals: dict[Role, _Tally] = {role: _Tally() for role in ROLES}
        count = turns = 0
        for conv in conversations:
            one = self.conversation(conv)
            count += 1
            turns += one.turns
            for role, tally in one.tallies.items():
                totals[role].add(tally)
        roles: dict[str, RoleEstimate] = {}
        unpriced: list[str] = []
        for role, tally in totals.items():
            adapter = self.adapter(role)
            name = self.names.get(role) or (
                adapter.model_info().model_id if adapter is not None else None
            )
            low = _price(adapter, tally.prompt_low, 0) if tally.calls else 0.0
            high = _high(adapter, tally) if tally.calls else 0.0
            if tally.calls and low is None:
                unpriced.append(f"{name} ({role})")
            roles[role] = RoleEstimate(
                calls=tally.calls,
                prompt_tokens_low=tally.prompt_low,
                prompt_tokens_high=tally.prompt_high,
                completion_tokens_high=tally.completion_high,
                cost_low=low,
                cost_high=high,
                model=name if tally.calls else None,
            )
        return RunEstimate(count, turns, roles, tuple(unpriced))


def _judges(metrics: Iterable[Metric]) -> list[tuple[str, JudgeSettings]]:
    """The rubric and judge of each metric graded by a judge model."""
    found = []
    for metric in metrics:
        judge = getattr(metric, "judge", None)
        if isinstance(judge, JudgeSettings):
            found.append((str(getattr(metric, "rubric", "")), judge))
    return found


def _high(adapter: ModelAdapter | None, tally: _Tally) -> float | None:
    """A role's upper bound (USD): prompts and answers at their caps. Without a cap
    only a model whose answers are free (an offline one) has a bound."""
    if tally.completion_high is not None:
        return _price(adapter, tally.prompt_high, tally.completion_high)
    if _price(adapter, 0, 1_000_000) == 0.0:
        return _price(adapter, tally.prompt_high, 0)
    return None


def _price(adapter: ModelAdapter | None, prompt: int, completion: int) -> float | None:
    """What ``adapter`` charges for these tokens (USD); None without a price."""
    if adapter is None:
        return None
    try:
        cost = adapter.usage_cost(Usage(prompt_tokens=prompt, completion_tokens=completion))
    except Exception:  # pricing is advisory, as in the actor
        return None
    return None if cost is None else cost.total_cost


def estimator_for(
    config: SimulatorConfig,
    metrics: Mapping[str, Sequence[Metric]],
    turn_metrics: Mapping[str, Metric],
    model: ModelAdapter,
    user: ModelAdapter | None,
    model_name: str | None = None,
    user_name: str | None = None,
) -> CostEstimator:
    """The estimator of one run: its models and their settings as the run uses them,
    and its metrics by flow (the judged ones call the judge)."""
    names: dict[Role, str] = {}
    if model_name:
        names["model"] = model_name
    if user_name:
        names["user"] = user_name
    return CostEstimator(
        model=model,
        assistant=CallSettings(model.default_config(), "assistant", config.token_cap("assistant")),
        user=user,
        user_settings=CallSettings(user.default_config(), "user", config.token_cap("user"))
        if user is not None
        else None,
        metrics=metrics,
        turn_metrics=turn_metrics,
        max_turns=config.max_turns,
        names=names,
    )
