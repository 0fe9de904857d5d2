"""Runs on Ray: a pack's conversations sharded over async actors, results streamed back.

Each actor hosts an ordinary convsim runtime (its own event loop, adapters and scoring)
over its shard; conversations are sharded by a hash of their id, so the same pack and
seed give the same conversations wherever they run (seeds derive from conversation ids).
Results come back to the driver as each conversation finishes and go into the driver's
results file, with its guarantees: one line per conversation, resume by re-running with
``resume=True``. An actor that dies has its unfinished conversations run by a new actor;
a conversation already recorded is never recorded again. A provider key's rpm/tpm is
split among the actors (:func:`convsim.adapters.split_limits`), so together they stay
within it.
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._log import get_logger
from convsim._records import ConversationResult, Status
from convsim._runtime._breaker import is_infrastructure_failure
from convsim._runtime._result_stream import ResultStream
from convsim.adapters import split_limits

from ._ray_watchdog import guard_local_ray

__all__ = [
    "shard_of",
    "RayRun",
    "RayProgress",
    "RayRunHandle",
    "RaySimulator",
    "run_on_ray",
    "ensure_ray",
]

log = get_logger("convsim.distributed")

_POLL_S = 0.2
_TAKE_TIMEOUT_S = 30.0
"""An actor that does not answer a poll for this long is asked again at the next one."""
_ATTEMPTED = frozenset({Status.DONE, Status.FAILED, Status.TIMED_OUT})
_MAX_RESTARTS = 3
_MAX_MISSED_POLLS = 4
"""Polls in a row an actor may leave unanswered (each up to ``_TAKE_TIMEOUT_S``) before
it is taken for dead."""
"""Restarts of one shard's actor before its conversations are left for a resume."""


def shard_of(conversation_id: str, shards: int) -> int:
    """The shard of a conversation: stable across processes and machines."""
    digest = hashlib.sha256(conversation_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def ensure_ray(address: str | None, *, num_cpus: int = 2) -> Any:
    """Ray, started or joined once per process: the cluster at ``address``, or a local
    instance of ``num_cpus`` without a dashboard, which ends with this process however
    it ends (see :mod:`convsim.distributed._ray_watchdog`).

    Raises:
        MissingExtra: Ray is not installed (the ``ray`` extra).
    """
    with needs_extra("ray", "the Ray backend"):
        import ray
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            with needs_extra("ray", "the Ray backend"):
                import psutil

            before = {p.pid for p in psutil.Process().children(recursive=True)}
            context: Any = ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            guard_local_ray(context.address_info["session_dir"], before)
    return ray


def _shard_settings(
    model: str,
    actors: int,
    model_args: Mapping[str, Any] | None,
    metrics: Sequence[str] | None,
    seed: int,
    concurrency: int,
) -> dict[str, Any]:
    """What every actor's Simulator is built from, concurrency split (the model's
    rpm and tpm are split per actor: :func:`_actor_settings`)."""
    if actors < 1:
        raise ConfigError(f"actors must be at least 1, got {actors}")
    split_limits(model_args or {}, actors)  # a limit that cannot be split fails now
    return {
        "model": model,
        "model_args": dict(model_args or {}),
        "metrics": list(metrics) if metrics is not None else None,
        "seed": seed,
        "concurrency": max(1, concurrency // actors),
        "preflight": False,
    }


def _actor_settings(settings: Mapping[str, Any], actors: int, shard: int) -> dict[str, Any]:
    """The settings of shard ``shard``'s actor: its share of the model's rpm and tpm,
    so that the actors together keep to them."""
    return {**settings, "model_args": split_limits(settings["model_args"], actors)[shard]}


def _manifest(loaded: Any, settings: dict[str, Any], actors: int) -> Any:
    from convsim import RunManifest

    return RunManifest(
        run_id=uuid.uuid4().hex[:12],
        pack=loaded.name,
        pack_path=str(loaded.path),
        pack_hash=loaded.pack_hash,
        pack_options=dict(loaded.load_options),
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


class _Taken(NamedTuple):
    """What an actor hands the driver at a poll."""

    lines: list[str]
    """Results not yet acknowledged, as JSON lines."""
    first: int
    """The sequence number of ``lines[0]`` among this actor's results (0, 1, ...)."""
    finished: bool
    """Whether the actor's run has ended."""
    error: str | None
    """Why the run failed, when it did."""
    pauses: list[tuple[str, float]]
    """429 pauses heard since the last poll: (provider key, seconds)."""
    stopped_early: str | None = None
    """Why the actor's runtime started no more conversations (its circuit breaker)."""


class _Shipment(NamedTuple):
    """A pack as it travels to the actors: its folder's files by relative path (what an
    actor on another machine needs without a shared file system) and the folder's name;
    no files for a pack that is not a folder (a registered source), loaded by ``name``."""

    files: dict[str, bytes]
    name: str


def _ship(spec: str | Path, loaded: Any) -> _Shipment:
    """The pack folder ``spec`` names, with its files; any other spec (a bundled pack's
    name, ``lm-eval:``, ``task:`` or another registered source) is sent as it is and
    resolved on the actor, where convsim is installed too."""
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        return _Shipment({}, str(spec))
    folder = folder.resolve()
    files = {
        str(f.relative_to(folder)): f.read_bytes()
        for f in sorted(folder.rglob("*"))
        if f.is_file() and "__pycache__" not in f.parts
    }
    return _Shipment(files, folder.name)


def _unpack(files: Mapping[str, bytes], name: str, into: Path) -> Path | str:
    if not files:
        return name
    folder = into / name
    for relative, data in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


class _Shard:
    """One actor: a runtime over its share of the conversations (made a Ray actor by
    :func:`run_on_ray`, so this module imports without Ray)."""

    def __init__(self) -> None:
        self.buffer: list[str] = []
        self.base = 0
        """The sequence number of ``buffer[0]``: results before it were acknowledged."""
        self.pauses: list[tuple[str, float]] = []
        self.finished = False
        self.error: str | None = None
        self.budgets: Any = None
        self.handle: Any = None
        self.stop_asked = False
        self.stop_grace: float | None = None
        """A stop asked before the run had started, and its grace period."""
        self.task: Any = None
        """The running shard (held: the event loop keeps only weak references)."""
        self.stopped_early: str | None = None

    async def start(
        self, files: dict[str, bytes], name: str, settings: dict[str, Any], only: list[str]
    ) -> None:
        import asyncio

        self.task = asyncio.get_running_loop().create_task(self._run(files, name, settings, only))

    async def _run(
        self, files: dict[str, bytes], name: str, settings: dict[str, Any], only: list[str]
    ) -> None:
        import tempfile

        from convsim import Simulator
        from convsim.adapters import Budgets

        try:
            with tempfile.TemporaryDirectory(prefix="convsim-shard-") as tmp:
                folder = _unpack(files, name, Path(tmp))
                self.budgets = Budgets(on_pause=self._heard)
                async with Simulator(budgets=self.budgets, **settings) as sim:
                    self.handle = sim.run(folder, only=set(only))
                    if self.stop_asked:
                        self.handle.stop(self.stop_grace)
                    async for result in self.handle:
                        self.buffer.append(result.model_dump_json())
                    self.stopped_early = self.handle.statistics().stopped_early
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.finished = True

    def _heard(self, key: str, seconds: float) -> None:
        self.pauses.append((key, seconds))

    async def pause(self, key: str, seconds: float) -> None:
        """Pause this actor's budget of ``key`` for ``seconds``: a 429 another actor
        heard. A duration, not a time: the nodes' clocks need not agree."""
        if self.budgets is not None:
            self.budgets.pause(key, seconds)

    async def stop(self, grace_period: float | None) -> None:
        """Start no more conversations; in-flight ones get the grace period."""
        self.stop_asked, self.stop_grace = True, grace_period
        if self.handle is not None:
            self.handle.stop(grace_period)

    async def take(self, ack: int) -> _Taken:
        """The results the driver has not acknowledged (it has the first ``ack``), the
        429 pauses since the last call, and the shard's state. A result is kept until
        acknowledged: a reply the driver gave up waiting for loses nothing."""
        drop = ack - self.base
        if drop > 0:
            del self.buffer[:drop]
            self.base = ack
        pauses, self.pauses = self.pauses, []
        return _Taken(
            list(self.buffer), self.base, self.finished, self.error, pauses, self.stopped_early
        )


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
    pauses_relayed: int = 0
    """429 pauses one actor heard and passed on to the others."""
    interrupted: bool = False
    """The run was stopped (a signal, or ``stop()``): conversations may be unrun or
    recorded CANCELLED, for a resume."""
    not_run: int = 0
    """Conversations no actor ran: stopped, or an actor's circuit breaker tripped, or an
    actor died more than ``_MAX_RESTARTS`` times. A resume runs them."""
    stopped_early: str | None = None
    """Why an actor's runtime started no more conversations, when one did."""
    attempted: int = 0
    """Conversations recorded DONE, FAILED or TIMED_OUT by this run."""
    infrastructure_failures: int = 0
    """Of those, the ones that failed for infrastructure reasons (as the circuit breaker
    counts them): what ``--max-failure-rate`` judges."""
    timed_out: int = 0
    """Of those, the ones that hit their conversation timeout: judged by
    ``--max-failure-rate`` on their own."""


class RayProgress(NamedTuple):
    """The whole cluster's progress, as the driver sees it."""

    finished: int
    total: int
    busy_actors: int
    elapsed_s: float


@dataclass
class _StopRequest:
    """A stop the driver passes to every actor: the grace period (None: the runtime's)."""

    asked: bool = False
    grace_period: float | None = None
    count: int = 0
    """Stops asked so far (a second one usually with 0: at once)."""
    sent: int = 0
    """Stops the actors have been told of."""
    scope: anyio.CancelScope | None = None
    """The driver's wait for its actors, which a third request cancels."""

    def ask(self, grace_period: float | None = None) -> None:
        self.asked = True
        self.grace_period = grace_period
        self.count += 1
        if self.abandon and self.scope is not None:
            self.scope.cancel()

    @property
    def abandon(self) -> bool:
        """A third request: stop waiting for the actors at all (they are killed)."""
        return self.count >= 3


@dataclass
class _Driver:
    """Drives one run's actors: starts them, polls them for results and 429 pauses,
    relays pauses, restarts the dead, passes a stop on."""

    shipment: _Shipment
    todo: list[str]
    settings: dict[str, Any]
    actors: int
    write: Callable[[ConversationResult], Any]
    kill_after: Callable[[int, Any], None] | None = None
    stop: _StopRequest = field(default_factory=_StopRequest)
    written: set[str] = field(default_factory=set)
    busy: int = 0
    started: float = field(default_factory=time.perf_counter)

    def progress(self) -> RayProgress:
        return RayProgress(
            len(self.written), len(self.todo), self.busy, time.perf_counter() - self.started
        )

    async def run(self, on_progress: Callable[[int, int, int], None] | None = None) -> RayRun:
        import asyncio

        import ray

        remote = ray.remote(num_cpus=0, scheduling_strategy="SPREAD")(_Shard)
        files = ray.put(self.shipment.files)
        name = self.shipment.name
        shards: dict[int, list[str]] = {k: [] for k in range(self.actors)}
        for cid in self.todo:
            shards[shard_of(cid, self.actors)].append(cid)
        pending: dict[int, set[str]] = {k: set(ids) for k, ids in shards.items() if ids}
        handles: dict[int, Any] = {}
        acked: dict[int, int] = {}
        """Results received from each shard's current actor (what the next poll acks)."""
        missed: dict[int, int] = {}
        restarts: dict[int, int] = {}
        duplicates = relayed = attempted = infrastructure = timed_out = 0
        first: float | None = None
        stopped_early: str | None = None

        async def start(k: int, ids: list[str]) -> None:
            handles[k], acked[k], missed[k] = remote.remote(), 0, 0
            # a failed start shows as a dead actor at the next poll
            with contextlib.suppress(ray.exceptions.RayActorError):
                settings = _actor_settings(self.settings, self.actors, k)
                await handles[k].start.remote(files, name, settings, ids)

        async def record(k: int, taken: _Taken) -> None:
            nonlocal first, duplicates, attempted, infrastructure, timed_out
            for seq, line in enumerate(taken.lines, start=taken.first):
                if seq < acked[k]:
                    continue  # received before: its acknowledgement had not arrived
                acked[k] = seq + 1
                result = ConversationResult.model_validate_json(line)
                cid = result.conversation_id
                if cid in self.written:
                    duplicates += 1  # run again by a restarted actor: the first one counts
                    continue
                self.written.add(cid)
                pending[k].discard(cid)
                if result.status in _ATTEMPTED:
                    attempted += 1
                    infrastructure += is_infrastructure_failure(result)
                    timed_out += result.status is Status.TIMED_OUT
                if first is None:
                    first = time.perf_counter() - self.started
                await self.write(result)
                if self.kill_after is not None:
                    self.kill_after(len(self.written), handles[k])

        try:
            with anyio.CancelScope() as scope:
                self.stop.scope = scope
                for k, ids in shards.items():
                    if ids:
                        await start(k, ids)
                self.busy = len(pending)
                while pending:
                    await anyio.sleep(_POLL_S)
                    if self.stop.count > self.stop.sent:
                        self.stop.sent = self.stop.count
                        for k in pending:
                            # a dead or stuck actor has nothing to stop: the poll sees it
                            with (
                                anyio.move_on_after(_TAKE_TIMEOUT_S),
                                contextlib.suppress(ray.exceptions.RayActorError),
                            ):
                                await handles[k].stop.remote(self.stop.grace_period)
                    if on_progress is not None:
                        on_progress(len(self.written), len(self.todo), len(pending))
                    polled = list(pending)
                    takes = await asyncio.gather(
                        *(
                            asyncio.wait_for(handles[k].take.remote(acked[k]), _TAKE_TIMEOUT_S)
                            for k in polled
                        ),
                        return_exceptions=True,
                    )
                    failures: list[str] = []
                    for k, taken in zip(polled, takes, strict=True):
                        silent = isinstance(taken, ray.exceptions.ActorUnavailableError)
                        if silent or isinstance(taken, (TimeoutError, asyncio.TimeoutError)):
                            missed[k] += 1  # unreachable for now: asked again next time
                            if missed[k] < _MAX_MISSED_POLLS:
                                continue
                            taken = ray.exceptions.RayActorError()  # as good as dead
                        if isinstance(taken, ray.exceptions.RayActorError):
                            ray.kill(handles[k])  # dead, or as good as: it must not go on
                            if self.stop.asked or restarts.get(k, 0) >= _MAX_RESTARTS:
                                del pending[k]  # its conversations wait for a resume
                                continue
                            restarts[k] = restarts.get(k, 0) + 1
                            log.warning("ray_actor_died", shard=k, restarting=len(pending[k]))
                            await start(k, sorted(pending[k]))
                            continue
                        if isinstance(taken, BaseException):
                            failures.append(f"shard {k} could not be polled: {taken}")
                            continue
                        missed[k] = 0
                        for key, seconds in taken.pauses:
                            for j in pending:
                                if j != k:
                                    handles[j].pause.remote(key, seconds)
                                    relayed += 1
                            log.info("ray_429_relayed", key=key, pause_s=seconds)
                        await record(k, taken)
                        if taken.finished and taken.error is not None:
                            failures.append(f"shard {k} failed: {taken.error}")
                        elif taken.finished:
                            stopped_early = stopped_early or taken.stopped_early
                            del pending[k]  # what it did not run was stopped
                    if failures:  # raised once every shard's results are written
                        raise ConfigError("; ".join(failures))
                    self.busy = len(pending)
        finally:
            self.stop.scope = None
            for handle in handles.values():
                ray.kill(handle)
        not_run = len(self.todo) - len(self.written)
        return RayRun(
            results=len(self.written),
            actors=self.actors,
            restarted_actors=sum(restarts.values()),
            duplicates_dropped=duplicates,
            first_result_s=first,
            elapsed_s=time.perf_counter() - self.started,
            shards={k: len(v) for k, v in shards.items()},
            pauses_relayed=relayed,
            interrupted=self.stop.asked,
            not_run=not_run,
            stopped_early=stopped_early,
            attempted=attempted,
            infrastructure_failures=infrastructure,
            timed_out=timed_out,
        )


class RayRunHandle(ResultStream):
    """One run on Ray: iterate it for results as conversations finish, as with
    :class:`~convsim.RunHandle`. Returned by :meth:`RaySimulator.run`; the work starts
    on creation and goes on in the simulator's task group whether or not you iterate."""

    def __init__(self) -> None:
        super().__init__()
        self._driver: _Driver | None = None
        self._stop = _StopRequest()
        self.outcome: RayRun | None = None
        """What the run did, once it has ended."""

    async def wait(self) -> RayRun:
        """Wait until the run has ended; what it did."""
        await self._finished.wait()
        if self._error is not None:
            raise self._error
        if self.outcome is None:
            raise ConfigError("the run was cancelled before it ended (its simulator closed)")
        return self.outcome

    def stop(self, grace_period: float | None = None) -> None:
        """Start no more conversations on any actor; in-flight ones get the grace period
        (default: the runtime's); a second call with 0 cancels them at once."""
        self._stop.ask(grace_period)

    def statistics(self) -> RayProgress:
        if self._driver is None:
            return RayProgress(0, 0, 0, 0.0)
        return self._driver.progress()

    async def _deliver(self, result: ConversationResult) -> None:
        # nobody may read this handle any more: the sink still has the result
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._send.send(result)


class RaySimulator:
    """The :class:`~convsim.Simulator` API on Ray: ``async with RaySimulator(...) as sim``,
    then ``handle = sim.run(pack, sink=...)`` and ``async for result in handle``,
    results in finishing order. Leaving the block stops unfinished runs gracefully."""

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
        self._tg: anyio.abc.TaskGroup | None = None
        self._handles: list[RayRunHandle] = []

    async def __aenter__(self) -> RaySimulator:
        ensure_ray(self.address)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        for handle in self._handles:
            if not handle._finished.is_set():
                handle.stop()
        assert self._tg is not None
        try:
            return await self._tg.__aexit__(*exc)
        finally:
            self._tg = None

    def run(self, pack: str | Path, *, sink: Any = None, limit: int | None = None) -> RayRunHandle:
        """Start running ``pack`` on the actors (written to ``sink`` too, when given).

        Raises:
            ConfigError: outside ``async with RaySimulator(...)``.
            PackError: the pack is invalid (before anything runs).
        """
        from convsim import load_pack

        if self._tg is None:
            raise ConfigError("RaySimulator.run() needs 'async with RaySimulator(...)' first")
        loaded = load_pack(pack, seed=self.settings["seed"])
        handle = RayRunHandle()
        self._handles.append(handle)
        self._tg.start_soon(self._produce, handle, pack, loaded, sink, limit)
        return handle

    async def _produce(
        self, handle: RayRunHandle, spec: str | Path, loaded: Any, sink: Any, limit: int | None
    ) -> None:
        async def deliver(result: ConversationResult) -> None:
            if sink is not None:
                await sink.write(result)
            await handle._deliver(result)

        try:
            async with handle._send:
                manifest = _manifest(loaded, self.settings, self.actors)
                done = await sink.open(manifest) if sink is not None else set()
                handle._driver = _Driver(
                    _ship(spec, loaded), _todo(loaded, done, limit), self.settings,
                    self.actors, deliver, stop=handle._stop,
                )  # fmt: skip
                try:
                    handle.outcome = self.last = await handle._driver.run()
                finally:
                    if sink is not None:
                        manifest.finished_at = time.time()
                        with anyio.CancelScope(shield=True):
                            await sink.close(manifest)
        except Exception as exc:
            handle._error = exc
        finally:
            handle._finished.set()


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
    overwrite: bool = False,
    retry_failed: bool = False,
    kill_after: Callable[[int, Any], None] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
    on_interrupt: Callable[[bool], None] | None = None,
) -> RayRun:
    """Run ``pack`` on Ray with ``actors`` actors into the results file ``out``.

    Without ``address`` a local Ray instance is started (2 CPUs' worth of actors are
    light: they mostly wait on models); with one, the cluster is joined. The pack's
    files travel to the actors with the work, so a cluster needs no shared file system.
    ``kill_after`` is for tests: called after each recorded result with the count and
    an actor. ``on_progress(done, total, busy_actors)`` is called a few times a second
    with the whole cluster's progress.

    ``resume``, ``overwrite`` and ``retry_failed`` are the results file's, as for
    :class:`~convsim.JsonlSink`. Called from the main thread, SIGINT and SIGTERM stop
    the run gracefully: every actor starts no more conversations and its in-flight ones
    get the grace period; a second signal cancels them at once, a third stops waiting
    for the actors (they are killed). Finished results are written, the rest wait for a
    resume; ``on_interrupt(at_once)`` hears each signal and the outcome says
    ``interrupted``.

    Raises:
        ConfigError: Ray is not installed (``pip install 'convsim[ray]'``), or a shard
            failed.
    """
    from convsim import JsonlSink, load_pack

    settings = _shard_settings(model, actors, model_args, metrics, seed, concurrency)
    loaded = load_pack(pack, seed=seed)
    manifest = _manifest(loaded, settings, actors)
    ensure_ray(address)  # before the results file: without Ray, nothing is created
    sink = JsonlSink(out, resume=resume, overwrite=overwrite, retry_failed=retry_failed)
    sink.prepare()
    signals = threading.current_thread() is threading.main_thread()

    async def watch_signals(stop: _StopRequest) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for _ in received:
                at_once = stop.asked
                stop.ask(0.0 if at_once else None)
                log.info("ray_run_stopping", at_once=at_once, abandon=stop.abandon)
                if on_interrupt is not None:
                    on_interrupt(at_once)

    async def main() -> RayRun:
        todo = _todo(loaded, await sink.open(manifest), limit)
        driver = _Driver(_ship(pack, loaded), todo, settings, actors, sink.write, kill_after)
        error: Exception | None = None
        outcome: RayRun | None = None
        try:
            async with anyio.create_task_group() as tg:
                if signals:
                    tg.start_soon(watch_signals, driver.stop)
                try:
                    outcome = await driver.run(on_progress)
                except Exception as exc:  # kept out of the task group: no ExceptionGroup
                    error = exc
                tg.cancel_scope.cancel()
        finally:
            manifest.finished_at = time.time()
            with anyio.CancelScope(shield=True):
                await sink.close(manifest)
        if error is not None:
            raise error
        assert outcome is not None
        return outcome

    return anyio.run(main)
