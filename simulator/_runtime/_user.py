"""The simulated user: a model that plays the user side of a conversation.

A turn with ``role: user`` renders an instruction, not a message; the simulated user
turns it into the user's next message, in character (the scenario's persona, goal and
style), seeing the conversation with the roles swapped. It ends the conversation by
saying its stop marker, or when the scenario goal is reached (``stop_on_goal``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convsim._types import Completion, GenerationParams, Message
from convsim.adapters import ModelAdapter
from convsim.metrics import goal_met
from convsim.scenarios import Scenario, UserProfile

__all__ = ["SimulatedUser", "NO_PROFILE", "ends_on_goal"]

NO_PROFILE = UserProfile()
"""A scenario without a ``user`` section: the defaults (stop marker, no persona)."""


@dataclass(frozen=True)
class SimulatedUser:
    """One conversation's simulated user."""

    model: ModelAdapter
    scenario: Scenario

    @property
    def profile(self) -> UserProfile:
        return self.scenario.user or NO_PROFILE

    def system_prompt(self, instruction: str) -> str:
        """Who the user is and what to write next."""
        scenario, profile = self.scenario, self.profile
        goal = profile.goal or (scenario.goal.description if scenario.goal else None)
        lines = (
            "You are playing the user in a conversation with an AI assistant. Stay in "
            "character and never say that you are an AI.",
            f"Scenario: {scenario.scenario_description}",
            f"Who you are: {profile.persona}" if profile.persona else "",
            f"What you want: {goal}" if goal else "",
            f"How you write: {profile.style}" if profile.style else "",
            f"Your instruction for this message: {instruction}",
            "Write only the user's next message. When what you want has been done, or "
            f"there is nothing more to say, reply with exactly {profile.stop_marker}",
        )
        return "\n".join(line for line in lines if line)

    async def reply(
        self, instruction: str, transcript: Sequence[Message], params: GenerationParams
    ) -> Completion:
        """The user's next message: the conversation so far with the roles swapped (the
        assistant's answers are what the user was told), after the system prompt."""
        flipped = [
            Message(role="user" if m.role == "assistant" else "assistant", content=m.content)
            for m in transcript
            if _seen_by_user(m)
        ]
        if not flipped or flipped[-1].role != "user":
            flipped.append(Message(role="user", content="(Write your next message.)"))
        system = Message(role="system", content=self.system_prompt(instruction))
        return await self.model.generate([system, *flipped], params)

    def stops(self, text: str) -> bool:
        """Whether the user said its stop marker."""
        return self.profile.stop_marker in text


def _seen_by_user(message: Message) -> bool:
    """What a user of the assistant sees: what either side said, not the system prompt,
    not tool calls and results (an assistant's words beside its calls are seen)."""
    if message.role in ("system", "tool"):
        return False
    return bool(message.content) or not message.tool_calls


def ends_on_goal(
    scenario: Scenario, responses: Mapping[str, str], latest: str, environment: Any = None
) -> bool:
    """Whether a simulated conversation (a scenario with a ``user`` section) ends here
    because its goal's criteria hold (``stop_on_goal``). ``environment`` is the tools'
    environment document as it is now, which ``state`` criteria check (never met
    without it)."""
    profile, goal = scenario.user, scenario.goal
    return (
        profile is not None
        and profile.stop_on_goal
        and goal is not None
        and goal_met(goal, responses, latest, environment)
    )
