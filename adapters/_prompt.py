"""A conversation as one prompt, for backends that take text rather than messages (the
legacy completions endpoint, the guide's ``/generate``, an adapter's
``generate_response``), and a client-side count of its tokens where no server gave one."""

from __future__ import annotations

from collections.abc import Sequence

from convsim._types import Message, ToolCall, Usage

__all__ = ["render_prompt", "estimate_tokens", "estimated_usage", "tool_calls_text"]


def render_prompt(messages: Sequence[Message]) -> str:
    """A conversation as one prompt: a lone user message as itself, otherwise a
    role-prefixed transcript that ends where the assistant speaks next."""
    if len(messages) == 1 and messages[0].role == "user":
        return messages[0].content
    lines = [f"{m.role.capitalize()}: {m.content}" for m in messages]
    return "\n\n".join([*lines, "Assistant:"])


def tool_calls_text(calls: Sequence[ToolCall]) -> str:
    """The text of tool calls a model wrote (names and arguments), for counting their
    tokens where the server counts none; empty for none."""
    return "".join(f" {c.name} {c.arguments}" for c in calls)


def estimate_tokens(text: str) -> int:
    """A client-side token estimate (about four characters a token)."""
    return max(1, (len(text) + 3) // 4)


def estimated_usage(prompt: str, text: str) -> Usage:
    """The usage of a call whose backend reported none: both sides estimated, and
    marked so (``source="estimate"``)."""
    prompt_tokens = estimate_tokens(prompt)
    completion = estimate_tokens(text) if text else 0
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
        source="estimate",
    )
