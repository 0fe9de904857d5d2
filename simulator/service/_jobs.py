"""Running the service's jobs on one runtime, durably, each tenant apart.

A job runs its (model, task) pairs one after another (see :mod:`._plan`), each a run of
a pack against a model written to its results file by a resuming
:class:`~convsim.JsonlSink`: a job found queued or running when the server starts (it
was killed) is started again, skips its finished pairs and continues the one it was
running, so no conversation is lost or recorded twice. A pair that fails does not stop
the others; the job then ends ``failed``, naming each failed pair.

Jobs on an operator's endpoint share the server's budgets for it (the operator's rpm
and tpm hold across tenants); a tenant's own endpoints have budgets of the tenant's
own, dropped when its last job ends, so no tenant's limits or 429s slow another. A
revoked key's jobs are stopped; an uploaded pack is removed ``upload_retention_s`` after
its job ends.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio

from convsim._errors import ConvsimError
from convsim._log import get_logger
from convsim._plural import counted

from ._job_model import JobModel, Refused, build_adapter
from ._plan import Pair, Plan, model_secrets, plan_of
from ._settings import KeyLimits, ServiceSettings
from ._store import ACTIVE, JobRow, Store
from ._tenant_sink import TenantSink, sanitized

__all__ = ["JobRunner", "load_job_pack", "load_isolated"]

log = get_logger("convsim.service")

T = TypeVar("T")

FINISHED = ("done", "failed", "cancelled")
_WATCH_EVERY_S = 1.0

_PACK_WORKERS = 4
_FAILURES_SHOWN = 5
"""The failed pairs a failed job's error names (each pair's own error is on the pair)."""
_IN_PROCESS = "task:"


def load_job_pack(request: dict[str, Any]) -> Any:
    """The job's pack as it runs: trials included, and only the job's conversations
    once they are fixed (blocking: see :func:`load_isolated`)."""
    from convsim._runtime._packs import load_pack

    pack = load_pack(request.get("pack_dir") or request["pack"])
    pack = pack.with_trials(request.get("trials") or 1)
    planned = request.get("conversations")
    if planned is None:
        return pack
    wanted = set(planned)
    return dataclasses.replace(
        pack, conversations=tuple(c for c in pack.conversations if c.conversation_id in wanted)
    )


async def load_isolated(
    function: Callable[[dict[str, Any]], T], request: dict[str, Any], workers: Any
) -> T:
    """``function(request)`` off the event loop: in a worker process for a tenant's
    own pack or a pack source (``lm-eval:``, ...: its CPU, memory and garbage
    collections are not the server's), in a thread for a bundled pack or a task class's
    (``task:``): its pack holds the task object its metrics call, which stays in the
    process that runs it, and its code is the operator's installed package."""
    pack = str(request.get("pack"))
    if request.get("pack_dir") or (":" in pack and not pack.startswith(_IN_PROCESS)):
        return await anyio.to_process.run_sync(function, request, limiter=workers)
    return await anyio.to_thread.run_sync(function, request)


@dataclass
class _TenantBudgets:
    budgets: Any
    jobs: int = 0


@dataclass
class JobRunner:
    """Starts jobs in the server's task group and remembers how to stop them."""

    store: Store
    results_dir: Path
    settings: ServiceSettings = field(default_factory=ServiceSettings)
    tg: Any = None
    handles: dict[str, Any] = field(default_factory=dict)
    cancelled: dict[str, str | None] = field(default_factory=dict)
    """Jobs asked to stop, with why when it was not their tenant's asking."""
    endpoint_budgets: Any = None
    """The operator's endpoints' budgets, shared by every job using them."""
    _tenant_budgets: dict[str, _TenantBudgets] = field(default_factory=dict)
    _keys: dict[str, str] = field(default_factory=dict)
    """Running jobs' key names."""
    workers: anyio.CapacityLimiter = field(
        default_factory=lambda: anyio.CapacityLimiter(_PACK_WORKERS)
    )
    """Worker processes that load tenants' packs."""

    def __post_init__(self) -> None:
        self.egress = self.settings.egress()

    def results_path(self, job_id: str, pair: int | None = None) -> Path:
        """The results file of a job of one pair, or of the job's ``pair``."""
        name = f"{job_id}.jsonl" if pair is None else f"{job_id}.{pair}.jsonl"
        return self.results_dir / name

    def limits(self, key_name: str) -> KeyLimits:
        """A key's limits: its own where it has them, the server's otherwise (blocking)."""
        row = self.store.key(key_name)
        return self.settings.limits.merged(row.limits if row is not None else {})

    def start(self, job_id: str) -> None:
        assert self.tg is not None, "the runner starts with the server"
        self.tg.start_soon(self._run, job_id)

    async def resume_all(self) -> list[str]:
        """Start again every job a killed server left queued or running."""
        jobs = await anyio.to_thread.run_sync(lambda: self.store.jobs(states=ACTIVE))
        for job in jobs:
            self.start(job.id)
        return [job.id for job in jobs]

    async def cancel(self, job_id: str, *, why: str | None = None) -> None:
        """Stop the job: its run stops its pair in flight and ends the others; a job
        with no run under way is marked cancelled now."""
        self.cancelled.setdefault(job_id, why)
        handle = self.handles.get(job_id)
        if handle is not None:
            handle.stop(grace_period=0)
        elif job_id not in self._keys:
            await self._finish(job_id, "cancelled", why)

    async def watch(self) -> None:
        """Stop the jobs of revoked keys, and remove uploads past their retention."""
        while True:
            revoked = await anyio.to_thread.run_sync(
                self.store.revoked_since, set(self._keys.values())
            )
            for job_id, key_name in list(self._keys.items()):
                if key_name in revoked:
                    log.info("job_stopped_key_revoked", job_id=job_id, key=key_name)
                    await self.cancel(job_id, why="the job's API key was revoked")
            await anyio.to_thread.run_sync(self.remove_expired_uploads)
            await anyio.sleep(_WATCH_EVERY_S)

    def remove_expired_uploads(self, now: float | None = None) -> list[str]:
        """Remove the packs of jobs that ended over ``upload_retention_s`` ago."""
        now = time.time() if now is None else now
        removed = []
        for job in self.store.uploads():
            ended = job.finished if job.state in FINISHED else None
            if ended is not None and ended + self.settings.upload_retention_s <= now:
                for task in plan_of(job.request).tasks:
                    folder = task.source.get("pack_dir")
                    if folder:
                        shutil.rmtree(folder, ignore_errors=True)
                self.store.upload_removed(job.id)
                removed.append(job.id)
        return removed

    def _budgets_for(self, job: JobRow, model: JobModel) -> Any:
        from convsim.adapters import Budgets

        if model.endpoint is not None:
            if self.endpoint_budgets is None:
                self.endpoint_budgets = Budgets()
            return self.endpoint_budgets
        shared = self._tenant_budgets.get(job.key_name)
        if shared is None:
            shared = self._tenant_budgets[job.key_name] = _TenantBudgets(Budgets())
        shared.jobs += 1
        return shared.budgets

    def _release_budgets(self, job: JobRow, model: JobModel) -> None:
        shared = self._tenant_budgets.get(job.key_name)
        if model.endpoint is None and shared is not None:
            shared.jobs -= 1
            if shared.jobs == 0:
                del self._tenant_budgets[job.key_name]

    async def _run(self, job_id: str) -> None:
        job = await anyio.to_thread.run_sync(self.store.job, job_id)
        if job is None or job.state not in ACTIVE:
            return
        if job_id in self.cancelled:
            await self._finish(job_id, "cancelled", self.cancelled[job_id])
            return
        self._keys[job_id] = job.key_name  # its run is under way: a cancel is its to see
        try:
            await self._run_pairs(job)
        finally:
            self.handles.pop(job_id, None)
            self._keys.pop(job_id, None)

    async def _run_pairs(self, job: JobRow) -> None:
        """Run the pairs the job has not finished, one after another; then end it."""
        job_id = job.id
        starts = await anyio.to_thread.run_sync(self.store.started, job_id)
        if starts > self.settings.max_starts:
            log.warning("job_not_restarted", job_id=job_id, starts=starts - 1)
            stopped = counted(starts - 1, "time")
            await self._finish(job_id, "failed", f"the server stopped {stopped} while "
                               "this job ran: it is not started again")  # fmt: skip
            return
        plan = plan_of(job.request)
        unsealed = await anyio.to_thread.run_sync(self.store.unseal, job.secret_args)
        secrets = model_secrets(job.request, unsealed)
        rows = (await anyio.to_thread.run_sync(self.store.pairs, [job_id]))[job_id]
        ended = {row.pair: row for row in rows if row.state in FINISHED}
        failures = [f"{plan.label(p)}: {ended[p.index].error}" for p in plan.pairs
                    if p.index in ended and ended[p.index].state == "failed"]  # fmt: skip
        for pair in plan.pairs:
            if job_id in self.cancelled:
                break
            if pair.index in ended:
                continue  # finished before the server stopped
            planned = plan.models[pair.model]
            model = JobModel(planned.model, planned.endpoint, planned.plain, secrets[pair.model])
            error = await self._run_pair(job, plan, pair, model)
            if error is not None:
                failures.append(f"{plan.label(pair)}: {error}" if plan.several else error)
        if job_id in self.cancelled:
            await self._finish(job_id, "cancelled", self.cancelled[job_id])
        elif failures:
            shown = failures[:_FAILURES_SHOWN]
            if len(failures) > len(shown):
                shown.append(f"and {counted(len(failures) - len(shown), 'other pair')} failed")
            await self._finish(job_id, "failed", "; ".join(shown))
        else:
            await self._finish(job_id, "done", None)

    async def _run_pair(self, job: JobRow, plan: Plan, pair: Pair, model: JobModel) -> str | None:
        """Run one pair of the job; its error as its tenant sees it, or None."""
        await anyio.to_thread.run_sync(self.store.set_pair_state, job.id, pair.index, "running")
        budgets = self._budgets_for(job, model)
        try:
            await self._execute(job, plan, pair, model, budgets)
        except Exception as exc:
            error = _job_error(exc)
            # the operator's log has the whole failure; the tenant sees ``error``
            log.warning("job_failed", job_id=job.id, pair=pair.index, error=error,
                        exc_info=not isinstance(exc, ConvsimError))  # fmt: skip
            await anyio.to_thread.run_sync(
                lambda: self.store.set_pair_state(job.id, pair.index, "failed", error=error)
            )
            return error
        finally:
            self._release_budgets(job, model)
        state = "cancelled" if job.id in self.cancelled else "done"
        await anyio.to_thread.run_sync(self.store.set_pair_state, job.id, pair.index, state)
        return None

    async def _finish(self, job_id: str, state: str, error: str | None) -> None:
        """The job's end; a cancelled job's pairs not yet ended end with it."""

        def finish() -> None:
            if state == "cancelled":
                self.store.end_pairs(job_id, "cancelled")
            self.store.set_state(job_id, state, error=error)

        await anyio.to_thread.run_sync(finish)

    async def _execute(
        self, job: JobRow, plan: Plan, pair: Pair, model: JobModel, budgets: Any
    ) -> None:
        from convsim._runtime._simulator import Simulator
        from convsim.results._sinks import JsonlSink

        request = job.request
        task = plan.tasks[pair.task]
        limits = await anyio.to_thread.run_sync(self.limits, job.key_name)
        concurrency = min(request.get("concurrency", 16), limits.concurrency)
        adapter = build_adapter(
            model, self.settings, limits, concurrency=concurrency, egress=self.egress
        )
        try:
            pack = await load_isolated(load_job_pack, task.source, self.workers)
            path = self.results_dir / plan.results_name(job.id, pair.index)
            async with Simulator(
                adapter,
                budgets=budgets,
                metrics=request.get("metrics"),
                concurrency=concurrency,
                max_transcript_chars=limits.transcript_chars,
            ) as sim:
                sink = TenantSink(
                    JsonlSink(path, resume=path.exists()),
                    max_bytes=limits.results_bytes,
                    record=lambda progress: self.store.record_progress(
                        job.id, progress, pair=pair.index
                    ),
                )
                handle = sim.run(pack, sink=sink, only=task.source.get("conversations"))
                self.handles[job.id] = handle
                if job.id in self.cancelled:
                    handle.stop(grace_period=0)
                try:
                    await handle.wait()
                finally:
                    stats = handle.statistics()
                    if stats.total or stats.resumed:  # the run counted its conversations
                        total = stats.total + stats.resumed
                        await anyio.to_thread.run_sync(
                            lambda: self.store.set_total(job.id, total, pair=pair.index)
                        )
        finally:
            with anyio.CancelScope(shield=True):
                await adapter.aclose()


def _job_error(exc: Exception) -> str:
    """What a failed job says to its tenant: nothing a model server said, nor where
    an operator's endpoint is or where its key comes from (the log has it all)."""
    if isinstance(exc, Refused):
        return str(exc)
    from convsim._errors import EgressRefused, EndpointError
    from convsim._records import ErrorInfo

    if isinstance(exc, EndpointError):
        if isinstance(exc.__cause__, EgressRefused):
            return f"EgressRefused: {exc.__cause__}"
        status = f" (HTTP {exc.status_code})" if exc.status_code else ""
        return f"EndpointError: the endpoint check failed{status}"
    info = sanitized(ErrorInfo.from_exception(exc))
    assert info is not None
    return f"{info.type}: {info.message}"
