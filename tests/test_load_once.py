"""Models and files metrics load: once per process, whatever the concurrency.

Scorers run in worker threads (anyio.to_thread), so callers that ask for a model at the
same time must wait for one load instead of each loading a copy. Each test holds the
first load until every caller has started, so that on code without a lock the callers
would overlap and load several times.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest
from conftest import write_pack

import convsim
from convsim.metrics import _domain, _goal, _wordllama
from convsim.metrics._once import LoadedOnce

CALLERS = 256
DEADLINE = 30.0
"""Seconds a held load waits for the callers at most (they arrive in milliseconds)."""


class Gate:
    """Counts loads and holds each until ``expected`` callers have arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived = 0
        self.loads = 0
        self.everyone = threading.Event()
        self._lock = threading.Lock()

    def arrive(self) -> None:
        with self._lock:
            self.arrived += 1
            if self.arrived >= self.expected:
                self.everyone.set()

    def load(self) -> None:
        """One load: counted, then held until every caller has arrived."""
        with self._lock:
            self.loads += 1
        self.everyone.wait(DEADLINE)


class Outcome:
    """What each caller of a concurrent run got: values, or exceptions."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.errors: list[BaseException] = []


def call_at_once(call: Callable[[], Any], gate: Gate, callers: int = CALLERS) -> Outcome:
    """``call`` from ``callers`` threads at once; each arrives at ``gate`` first."""
    outcome = Outcome()

    def caller() -> None:
        gate.arrive()
        try:
            outcome.values.append(call())
        except Exception as exc:
            outcome.errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert not any(t.is_alive() for t in threads), "a caller never returned"
    return outcome


# -- the helper -----------------------------------------------------------------------


def test_concurrent_first_callers_share_one_load() -> None:
    gate = Gate(CALLERS)

    @LoadedOnce
    def model() -> object:
        gate.load()
        return object()

    outcome = call_at_once(model, gate)
    assert gate.loads == 1
    assert not outcome.errors and len(outcome.values) == CALLERS
    assert all(v is outcome.values[0] for v in outcome.values)
    assert model() is outcome.values[0] and gate.loads == 1


def test_a_failed_load_is_not_kept_and_the_next_caller_loads_again() -> None:
    attempts: list[int] = []

    @LoadedOnce
    def model() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("weights half written")
        return "model"

    with pytest.raises(OSError, match="weights half written"):
        model()
    assert model() == "model" and len(attempts) == 2
    assert model() == "model" and len(attempts) == 2


def test_a_failed_load_under_concurrency_fails_its_own_caller_only() -> None:
    """The callers waiting on a load that fails do not get its error: one of them loads
    again, and the rest get that value."""
    gate = Gate(CALLERS)

    @LoadedOnce
    def model() -> str:
        gate.load()
        if gate.loads == 1:
            raise MemoryError("out of memory")
        return "model"

    outcome = call_at_once(model, gate)
    assert gate.loads == 2
    assert [type(e) for e in outcome.errors] == [MemoryError]
    assert outcome.values == ["model"] * (CALLERS - 1)


def test_each_set_of_arguments_loads_once() -> None:
    loads: list[tuple[str, int]] = []

    @LoadedOnce
    def terms(path: str, *, version: int = 1) -> str:
        loads.append((path, version))
        return f"{path}@{version}"

    assert [terms("a"), terms("a"), terms("b"), terms("a", version=2)] == [
        "a@1",
        "a@1",
        "b@1",
        "a@2",
    ]
    assert terms("a", version=2) == "a@2"
    assert loads == [("a", 1), ("b", 1), ("a", 2)]
    terms.cache_clear()
    assert terms("a") == "a@1" and loads[-1] == ("a", 1) and len(loads) == 4


def test_the_wrapper_keeps_the_loaders_name_and_doc() -> None:
    @LoadedOnce
    def model() -> int:
        """The model."""
        return 1

    assert model.__name__ == "model" and model.__doc__ == "The model."


# -- WordLlama --------------------------------------------------------------------------


class StubTokenizer:
    """Stands for WordLlama's tokenizer: a word's id is a hash of it."""

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[Any]:
        return [
            SimpleNamespace(ids=[zlib.crc32(w.encode()) % 64 for w in t.lower().split()])
            for t in texts
        ]


def stub_model() -> _wordllama._WordVectors:
    """Stands for WordLlama: a vector per word hash."""
    return _wordllama._WordVectors(np.eye(64, dtype=np.float16), StubTokenizer())


@pytest.fixture
def fresh_model() -> Iterator[None]:
    """No model loaded before the test, and none of the test's kept after it."""
    _wordllama._model.cache_clear()
    yield
    _wordllama._model.cache_clear()


def counted_reader(monkeypatch: pytest.MonkeyPatch, gate: Gate) -> None:
    def read_model() -> _wordllama._WordVectors:
        gate.load()
        return stub_model()

    monkeypatch.setattr(_wordllama, "_read_model", read_model)


@pytest.mark.usefixtures("fresh_model")
def test_wordllama_is_loaded_once_by_concurrent_embedders(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(CALLERS)
    counted_reader(monkeypatch, gate)
    embedder = _wordllama.WordLlamaEmbedder()
    outcome = call_at_once(lambda: embedder.embed(["a red car", "a blue car"]), gate)
    assert gate.loads == 1
    assert not outcome.errors and len(outcome.values) == CALLERS
    assert all(np.array_equal(v, outcome.values[0]) for v in outcome.values)


@pytest.mark.usefixtures("fresh_model")
def test_a_wordllama_load_that_fails_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[int] = []

    def read_model() -> _wordllama._WordVectors:
        loads.append(1)
        if len(loads) == 1:
            raise OSError("weights unreadable")
        return stub_model()

    monkeypatch.setattr(_wordllama, "_read_model", read_model)
    embedder = _wordllama.WordLlamaEmbedder()
    with pytest.raises(OSError, match="weights unreadable"):
        embedder.embed(["a red car"])
    assert embedder.embed(["a red car"]).shape == (1, 64)
    assert embedder.embed(["a blue car"]).shape == (1, 64)
    assert len(loads) == 2


@pytest.mark.anyio
@pytest.mark.usefixtures("fresh_model")
async def test_a_run_of_256_conversations_at_once_loads_the_embedder_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """256 conversations at concurrency 256, each scored by coherence in a worker
    thread of its own: the first load is held until all 256 are embedding."""
    gate = Gate(CALLERS)
    counted_reader(monkeypatch, gate)
    embed = _wordllama.WordLlamaEmbedder.embed

    def arriving(self: _wordllama.WordLlamaEmbedder, texts: Sequence[str]) -> Any:
        gate.arrive()
        return embed(self, texts)

    monkeypatch.setattr(_wordllama.WordLlamaEmbedder, "embed", arriving)
    turns = [
        {"turn_id": "ask", "prompt_template": "My order {order} is late, where is it?"},
        {"turn_id": "more", "depends_on": ["ask"], "prompt_template": "It was a {item}."},
    ]
    scenarios = [
        {
            "scenario_id": f"s{i}",
            "scenario_description": "a late order",
            "variables": {"order": f"A-{i}", "item": "red bicycle"},
        }
        for i in range(CALLERS)
    ]
    pack = write_pack(tmp_path / "pack", {"default": {"turns": turns}}, scenarios)
    # one worker thread per conversation: all 256 score at the same time
    anyio.to_thread.current_default_thread_limiter().total_tokens = CALLERS
    results = []
    async with convsim.Simulator("scripted", concurrency=CALLERS, metrics=["coherence"]) as sim:
        async for result in sim.run(pack):
            results.append(result)
    assert gate.arrived == CALLERS and gate.loads == 1
    assert len(results) == CALLERS
    scores = [r.scores["coherence"] for r in results]
    assert all(s.status == "ok" and s.details["embedder"] == "wordllama" for s in scores), {
        s.reason for s in scores
    }


# -- the other files metrics load ---------------------------------------------------------


def test_domain_terms_are_read_once_by_concurrent_callers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate = Gate(CALLERS)
    bundled = _domain.TERMS_FILE

    class CountedFile:
        def read_text(self, encoding: str) -> str:
            gate.load()
            return bundled.read_text(encoding=encoding)

    extra = tmp_path / "terms.json"
    extra.write_text('{"gardening": ["compost", "mulch"]}', encoding="utf-8")
    monkeypatch.setenv("CONVSIM_DOMAIN_TERMS", str(extra))  # a key of its own: a fresh load
    monkeypatch.setattr(_domain, "TERMS_FILE", CountedFile())
    outcome = call_at_once(_domain.domain_terms, gate)
    assert gate.loads == 1 and not outcome.errors
    assert all(v is outcome.values[0] for v in outcome.values)
    assert outcome.values[0]["gardening"] == ("compost", "mulch")


def test_the_goal_schemas_registry_is_built_once_by_concurrent_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jsonschema_specifications  # noqa: F401  (its import needs the real Registry)
    import referencing

    gate = Gate(CALLERS)
    registry = referencing.Registry

    def counted(**kwargs: Any) -> Any:
        gate.load()
        return registry(**kwargs)

    _goal._local_registry.cache_clear()
    monkeypatch.setattr(referencing, "Registry", counted)
    try:
        outcome = call_at_once(_goal._local_registry, gate)
    finally:
        _goal._local_registry.cache_clear()
    assert gate.loads == 1 and not outcome.errors
    assert all(v is outcome.values[0] for v in outcome.values)
