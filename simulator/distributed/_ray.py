"""Runs on Ray: a pack's conversations sharded over async actors, results streamed back.

Each actor hosts an ordinary convsim runtime (its own event loop, adapters and scoring)
over its shard; conversations are sharded by a hash of their id, so the same pack and
seed give the same conversations wherever they run (seeds derive from conversation ids).
Results come back to the driver as each conversation finishes and go into the driver's
results file, with its guarantees: one line per conversation, resume by re-running with
``resume=True``. An actor that dies has its unfinished conversations run by a new actor;
a conversation already recorded is never recorded again. A provider key's rpm/tpm is
split evenly among the actors, so together they stay within it.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from convsim._errors import ConfigError
from convsim._log import get_logger
from convsim._records import ConversationResult

__all__ = ["shard_of", "RayRun", "RaySimulator", "run_on_ray", "ensure_ray"]

log = get_logger("convsim.distributed")

_POLL_S = 0.2


def shard_of(conversation_id: str, shards: int) -> int:
    """The shard of a conversation: stable across processes and machines."""
    digest = hashlib.sha256(conversation_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def _split_budgets(model_args: Mapping[str, Any], actors: int) -> dict[str, Any]:
    args = dict(model_args)
    for name in ("rpm", "tpm"):
        if name in args and actors > 1:
            args[name] = str(float(args[name]) / actors)
    return args


def ensure_ray(address: str | None, *, num_cpus: int = 2) -> Any:
    """Ray, started or joined once per process: the cluster at ``address``, or a local
    instance of ``num_cpus`` without a dashboard.

    Raises:
        ConfigError: Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("the Ray backend needs Ray: pip install 'convsim[ray]'") from None
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray


def _shard_settings(
    model: str,
    actors: int,
    model_args: Mapping[str, Any] | None,
    metrics: Sequence[str] | None,
    seed: int,
    concurrency: int,
) -> dict[str, Any]:
    """What every actor's Simulator is built from: budgets and concurrency split."""
    if actors < 1:
        raise ConfigError(f"actors must be at least 1, got {actors}")
    return {
        "model": model,
        "model_args": _split_budgets(model_args or {}, actors),
        "metrics": list(metrics) if metrics is not None else None,
        "seed": seed,
        "concurrency": max(1, concurrency // actors),
        "preflight": False,
    }


def _manifest(loaded: Any, settings: dict[str, Any], actors: int) -> Any:
    from convsim import RunManifest

    return RunManifest(
        run_id=uuid.uuid4().hex[:12],
        pack=loaded.name,
        pack_path=str(loaded.path),
        pack_hash=loaded.pack_hash,
        model=settings["model"],
        started_at=time.time(),
        settings={
            "seed": settings["seed"],
            "metrics": settings["metrics"],
            "backend": "ray",
            "actors": actors,
        },
    )


def _todo(loaded: Any, done: set[str], limit: int | None) -> list[str]:
    """The conversations still to run, in pack order."""
    todo = [c.conversation_id for c in loaded.conversations if c.conversation_id not in done]
    return todo if limit is None else todo[:limit]


class _Shard:
    """One actor: a runtime over its share of the conversations (made a Ray actor by
    :func:`run_on_ray`, so this module imports without Ray)."""

    def __init__(self) -> None:
        self.buffer: list[str] = []
        self.finished = False
        self.error: str | None = None

    async def start(self, pack: str, settings: dict[str, Any], only: list[str]) -> None:
        import asyncio

        asyncio.get_running_loop().create_task(self._run(pack, settings, only))

    async def _run(self, pack: str, settings: dict[str, Any], only: list[str]) -> None:
        from convsim import Simulator

        try:
            async with Simulator(**settings) as sim:
                async for result in sim.run(pack, only=set(only)):
                    self.buffer.append(result.model_dump_json())
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.finished = True

    async def take(self) -> tuple[list[str], bool, str | None]:
        """The results finished since the last call, whether the shard is done, and
        its error if it failed."""
        taken, self.buffer = self.buffer, []
        return taken, self.finished, self.error


@dataclass
class RayRun:
    """What a run on Ray did."""

    results: int
    actors: int
    restarted_actors: int
    duplicates_dropped: int
    first_result_s: float | None
    elapsed_s: float
    shards: dict[int, int] = field(default_factory=dict)


async def _drive(
    pack: Any,
    todo: list[str],
    settings: dict[str, Any],
    actors: int,
    write: Callable[[ConversationResult], Any],
    kill_after: Callable[[int, Any], None] | None,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> RayRun:
    import ray

    remote = ray.remote(num_cpus=0)(_Shard)
    started = time.perf_counter()
    shards: dict[int, list[str]] = {k: [] for k in range(actors)}
    for cid in todo:
        shards[shard_of(cid, actors)].append(cid)
    pending: dict[int, set[str]] = {k: set(ids) for k, ids in shards.items() if ids}
    handles: dict[int, Any] = {}
    for k, ids in shards.items():
        if ids:
            handles[k] = remote.remote()
            await handles[k].start.remote(str(pack.path), settings, ids)
    written: set[str] = set()
    restarted = duplicates = 0
    first: float | None = None
    while pending:
        await anyio.sleep(_POLL_S)
        if on_progress is not None:
            on_progress(len(written), len(todo), len(pending))
        for k in list(pending):
            try:
                lines, finished, error = await handles[k].take.remote()
            except ray.exceptions.RayActorError:
                # the actor died: its unfinished conversations go to a new one
                restarted += 1
                left = sorted(pending[k])
                log.warning("ray_actor_died", shard=k, restarting=len(left))
                handles[k] = remote.remote()
                await handles[k].start.remote(str(pack.path), settings, left)
                continue
            for line in lines:
                result = ConversationResult.model_validate_json(line)
                cid = result.conversation_id
                if cid in written:
                    duplicates += 1
                    continue
                written.add(cid)
                pending[k].discard(cid)
                if first is None:
                    first = time.perf_counter() - started
                await write(result)
                if kill_after is not None:
                    kill_after(len(written), handles[k])
            if finished and error is not None:
                raise ConfigError(f"shard {k} failed: {error}")
            if (finished and not pending[k]) or finished:
                del pending[k]
    for handle in handles.values():
        ray.kill(handle)
    return RayRun(
        results=len(written),
        actors=actors,
        restarted_actors=restarted,
        duplicates_dropped=duplicates,
        first_result_s=first,
        elapsed_s=time.perf_counter() - started,
        shards={k: len(v) for k, v in shards.items()},
    )


class RaySimulator:
    """The :class:`~convsim.Simulator` API on Ray: ``async with RaySimulator(...) as sim``
    and ``async for result in sim.run(pack, sink=...)``, results in finishing order."""

    def __init__(
        self,
        model: str = "scripted",
        *,
        actors: int = 2,
        address: str | None = None,
        model_args: Mapping[str, Any] | None = None,
        metrics: Sequence[str] | None = None,
        seed: int = 0,
        concurrency: int = 32,
    ) -> None:
        self.actors, self.address = actors, address
        self.settings = _shard_settings(model, actors, model_args, metrics, seed, concurrency)
        self.last: RayRun | None = None

    async def __aenter__(self) -> RaySimulator:
        ensure_ray(self.address)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def run(
        self, pack: str | Path, *, sink: Any = None, limit: int | None = None
    ) -> AsyncIterator[ConversationResult]:
        """Run ``pack``; yields each conversation's result as it finishes (written to
        ``sink`` first, when one is given)."""
        from convsim import load_pack

        loaded = load_pack(pack)
        manifest = _manifest(loaded, self.settings, self.actors)
        done = await sink.open(manifest) if sink is not None else set()
        todo = _todo(loaded, done, limit)
        send, receive = anyio.create_memory_object_stream[ConversationResult](1_000_000)

        async def deliver(result: ConversationResult) -> None:
            if sink is not None:
                await sink.write(result)
            await send.send(result)

        async def produce() -> None:
            async with send:
                try:
                    self.last = await _drive(
                        loaded, todo, self.settings, self.actors, deliver, None
                    )
                finally:
                    if sink is not None:
                        manifest.finished_at = time.time()
                        with anyio.CancelScope(shield=True):
                            await sink.close(manifest)

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            async with receive:
                async for result in receive:
                    yield result


def run_on_ray(
    pack: str | Path,
    model: str = "scripted",
    *,
    out: str | Path,
    actors: int = 2,
    address: str | None = None,
    model_args: Mapping[str, Any] | None = None,
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    concurrency: int = 32,
    limit: int | None = None,
    resume: bool = False,
    kill_after: Callable[[int, Any], None] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> RayRun:
    """Run ``pack`` on Ray with ``actors`` actors into the results file ``out``.

    Without ``address`` a local Ray instance is started (2 CPUs' worth of actors are
    light: they mostly wait on models); with one, the cluster is joined. ``kill_after``
    is for tests: called after each recorded result with the count and an actor.
    ``on_progress(done, total, busy_actors)`` is called a few times a second with the
    whole cluster's progress.

    Raises:
        ConfigError: Ray is not installed (``pip install 'convsim[ray]'``), or a shard
            failed.
    """
    from convsim import JsonlSink, load_pack

    settings = _shard_settings(model, actors, model_args, metrics, seed, concurrency)
    loaded = load_pack(pack)
    manifest = _manifest(loaded, settings, actors)
    ensure_ray(address)  # before the results file: without Ray, nothing is created
    sink = JsonlSink(out, resume=resume)
    sink.prepare()

    async def main() -> RayRun:
        todo = _todo(loaded, await sink.open(manifest), limit)
        try:
            outcome = await _drive(
                loaded, todo, settings, actors, sink.write, kill_after, on_progress
            )
        finally:
            manifest.finished_at = time.time()
            await sink.close(manifest)
        return outcome

    return anyio.run(main)
