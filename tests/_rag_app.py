"""A tiny retrieval-augmented application, evaluated as ``--model python:_rag_app:answer``:
a dict of documents, keyword retrieval, an answer that quotes the document it found."""

from __future__ import annotations

import re
from typing import Any

import anyio

DOCUMENTS = {
    "france": "Paris is the capital of France.",
    "australia": "Canberra is the capital city of Australia.",
    "japan": "Tokyo is the capital of Japan.",
    "photosynthesis": "Photosynthesis turns light, water and carbon dioxide into sugar.",
}

WORD = re.compile(r"[a-z]+")


def retrieve(question: str) -> str | None:
    """The key of the first document whose keyword is a word of ``question``."""
    words = set(WORD.findall(question.lower()))
    return next((key for key in DOCUMENTS if key in words), None)


def reply(messages: list[dict[str, Any]]) -> str:
    """The answer to the last user message: the retrieved document, quoted."""
    question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    key = retrieve(question)
    if key is None:
        return "I found nothing on that."
    return f'From "{key}": "{DOCUMENTS[key]}"'


async def answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The application: retrieval, then a reply quoting what was found."""
    assert tools == []
    await anyio.lowlevel.checkpoint()
    return reply(messages)


class Crowd:
    """Calls in flight together: each call waits until ``expected`` have arrived (or
    a deadline passes), so a run that never holds that many at once is seen."""

    def __init__(self) -> None:
        self.reset(1)

    def reset(self, expected: int) -> None:
        self.expected = expected
        self.in_flight = 0
        self.peak = 0
        self.calls = 0
        self.full: anyio.Event | None = None  # made in the run's event loop

    async def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        self.calls += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.full is None:
            self.full = anyio.Event()
        if self.in_flight >= self.expected:
            self.full.set()
        try:
            with anyio.move_on_after(5):
                await self.full.wait()
            return reply(messages)
        finally:
            self.in_flight -= 1


crowded = Crowd()
"""``python:_rag_app:crowded``: the application, counting the calls in flight."""
