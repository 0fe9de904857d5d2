"""Asking the model under test a prompt of its own while a conversation is scored.

A scorer that needs the model's answer to a prompt the conversation did not send (a
task's ``get_model_response`` with a prompt of its own) asks :func:`ask_model`. Whoever
runs the conversation gives its :class:`~convsim.metrics.ScoringSession` an
:data:`AskModel`: the runtime's goes through the run's adapter, so the call has the
run's rate limits, token caps, retries and response cache, and is recorded on its turn.

Scorers of CPU-heavy metrics run in a worker thread (``anyio.to_thread``); there
:func:`ask_model` hands the call to the event loop and waits for its answer. Anywhere
else (scoring recorded turns, ``score_now``, after the conversation was cancelled)
there is no model to ask, and it says so.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import anyio.from_thread

from convsim._errors import ConfigError
from convsim._records import ExtraCall, TurnRecord

__all__ = ["AskModel", "ask_model", "asking"]

AskModel = Callable[[TurnRecord, str], Coroutine[Any, Any, ExtraCall]]
"""Ask the model under test ``prompt`` in place of ``turn``'s own prompt (the turn's
history and settings): the call as made, its failure included (never raised)."""

_ASK: contextvars.ContextVar[AskModel | None] = contextvars.ContextVar(
    "convsim_ask_model", default=None
)


@contextmanager
def asking(ask: AskModel | None) -> Iterator[None]:
    """Let :func:`ask_model` reach ``ask`` in this context (and the worker threads it
    starts, which copy it)."""
    token = _ASK.set(ask)
    try:
        yield
    finally:
        _ASK.reset(token)


def ask_model(turn: TurnRecord, prompt: str) -> ExtraCall:
    """The model under test's answer to ``prompt``, asked for ``turn`` from a scorer
    running in the scoring session's worker thread.

    Raises:
        ConfigError: no model can be asked here (recorded turns scored again, or a
            scorer not run by a session of a conversation being run).
    """
    ask = _ASK.get()
    if ask is None:
        raise ConfigError(
            f"turn {turn.turn_id!r}: asking the model a prompt of its own needs the run "
            "that plays the conversation; recorded turns are scored without calling a model"
        )
    # set only around the session's worker-thread work, so this is such a thread
    return anyio.from_thread.run(ask, turn, prompt)
