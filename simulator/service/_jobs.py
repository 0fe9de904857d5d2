"""Running the service's jobs on one runtime, durably.

A job is a run of a pack against a model, written to ``RESULTS_DIR/JOB_ID.jsonl`` by a
resuming :class:`~convsim.JsonlSink`: a job found queued or running when the server
starts (it was killed) is started again and continues its results file, so no
conversation is lost or recorded twice. Jobs share the process's provider budgets
through one simulator per job whose adapters bind to a shared :class:`Budgets`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convsim._log import get_logger

from ._store import Store

__all__ = ["JobRunner", "split_secrets"]

log = get_logger("convsim.service")

_SECRET_NAME = re.compile(r"key|token|secret|password|auth", re.I)


def split_secrets(model_args: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, secret) model arguments: those named like a credential are secret."""
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name, value in model_args.items():
        (secret if _SECRET_NAME.search(name) else plain)[name] = str(value)
    return plain, secret


@dataclass
class JobRunner:
    """Starts jobs in the server's task group and remembers how to stop them."""

    store: Store
    results_dir: Path
    tg: Any = None
    budgets: Any = None
    """One set of provider budgets for every job: the same key's rpm/tpm holds across
    jobs, as across the conversations of one run."""
    handles: dict[str, Any] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)

    def results_path(self, job_id: str) -> Path:
        return self.results_dir / f"{job_id}.jsonl"

    def start(self, job_id: str) -> None:
        assert self.tg is not None, "the runner starts with the server"
        self.tg.start_soon(self._run, job_id)

    def resume_all(self) -> list[str]:
        """Start again every job a killed server left queued or running."""
        pending = [job.id for job in self.store.jobs(states=("queued", "running"))]
        for job_id in pending:
            self.start(job_id)
        return pending

    def cancel(self, job_id: str) -> None:
        self.cancelled.add(job_id)
        handle = self.handles.get(job_id)
        if handle is not None:
            handle.stop(grace_period=0)
        else:
            self.store.set_state(job_id, "cancelled")

    async def _run(self, job_id: str) -> None:
        from convsim import JsonlSink, Simulator
        from convsim.adapters import Budgets

        if self.budgets is None:
            self.budgets = Budgets()
        job = self.store.job(job_id)
        if job is None or job.state not in ("queued", "running"):
            return
        request = job.request
        model_args = {**request.get("model_args", {}), **self.store.unseal(job.secret_args)}
        path = self.results_path(job_id)
        self.store.set_state(job_id, "running")
        try:
            async with Simulator(
                request["model"],
                budgets=self.budgets,
                model_args=model_args,
                metrics=request.get("metrics"),
                concurrency=request.get("concurrency", 16),
            ) as sim:
                sink = JsonlSink(path, resume=path.exists())
                planned = request.get("conversations")
                pack = request.get("pack_dir") or request["pack"]
                handle = sim.run(pack, sink=sink, only=planned)
                self.handles[job_id] = handle
                if job_id in self.cancelled:
                    handle.stop(grace_period=0)
                await handle.wait()
        except Exception as exc:
            log.warning("job_failed", job_id=job_id, error=f"{type(exc).__name__}: {exc}")
            self.store.set_state(job_id, "failed", error=f"{type(exc).__name__}: {exc}")
            return
        finally:
            self.handles.pop(job_id, None)
        self.store.set_state(job_id, "cancelled" if job_id in self.cancelled else "done")
