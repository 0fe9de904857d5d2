"""The evaluation service: a FastAPI app over the store and the job runner.

Every request needs ``Authorization: Bearer KEY`` (401 otherwise); a key sees only its
own jobs (another key's job is 404). Job results stream as server-sent events, one per
conversation, with the line number as event id: a client that reconnects with
``Last-Event-ID`` gets only what it has not seen. Nothing blocking runs on the event
loop: SQLite, files, packs and name resolution go to worker threads.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from pydantic import BaseModel

from convsim._errors import MissingExtra
from convsim._extras import needs_extra

with needs_extra("service", "convsim.service"):
    from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request
    from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from ._body_limit import BodyLimit
from ._intake import EvaluationRequest, JobIntake, LimitReached
from ._job_model import Refused
from ._jobs import JobRunner
from ._settings import ServiceSettings
from ._store import ACTIVE, JobRow, Store

__all__ = ["create_app", "Evaluation"]

State = Literal["queued", "running", "done", "failed", "cancelled"]

_POLL_S = 0.2


class Problem(BaseModel):
    """An error: what went wrong (a text, or FastAPI's list of refused fields)."""

    detail: str | list[dict[str, Any]]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route documents (all carry a :class:`Problem`)."""
    return {code: {"model": Problem} for code in (401, 413, *codes)}


class Progress(BaseModel):
    total: int | None = None
    """The conversations the job runs (trials included); null only for a job stored by
    an older convsim that has not run since."""
    done: int = 0
    failed: int = 0


class Evaluation(BaseModel):
    id: str
    status: State
    pack: str
    model: str
    """The model spec, or ``endpoint:NAME`` for an operator's endpoint."""
    endpoint: str | None = None
    model_args: dict[str, str]
    """The arguments as given; keys show as ``***``, URLs with their credentials blanked."""
    metrics: list[str] | None = None
    trials: int = 1
    created: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    progress: Progress
    cost_usd: float | None = None
    """What the job's model calls cost, as priced by their adapter (None: no price)."""


_LISTED = 1000
"""The most jobs a list gives (the newest)."""
_EVENT_ID_DIGITS = 18


def _total(job: JobRow) -> int | None:
    """The conversations the job runs: as its run counted them, or as the intake fixed
    them (a job stored by an older convsim has neither until it runs)."""
    if job.total is not None:
        return job.total
    planned = job.request.get("conversations")
    return None if planned is None else len(planned)


def _view(job: JobRow) -> Evaluation:
    """The job as its tenant sees it (from the database alone: never its file)."""
    request = job.request
    return Evaluation(
        id=job.id,
        status=job.state,  # type: ignore[arg-type]
        pack=request["pack"],
        model=request["model"],
        endpoint=request.get("endpoint"),
        model_args=request.get("shown_args", request.get("model_args", {})),
        metrics=request.get("metrics"),
        trials=request.get("trials") or 1,
        created=job.created,
        started=job.started,
        finished=job.finished,
        error=job.error,
        progress=Progress(total=_total(job), done=job.done, failed=job.failed),
        cost_usd=job.cost_usd,
    )


def _read_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """Whole lines of ``path`` from ``offset``, and the offset after them (blocking)."""
    lines: list[bytes] = []
    if path.exists():
        with path.open("rb") as fh:
            fh.seek(offset)
            while True:
                raw = fh.readline()
                if not raw.endswith(b"\n"):
                    break  # a line still being written: read it next time
                offset += len(raw)
                lines.append(raw.strip())
    return lines, offset


@dataclass
class _Service:
    """What the routes share: the store, the runner, the intake, and per-key state."""

    store: Store
    runner: JobRunner
    intake: JobIntake
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set at shutdown: open result streams end."""
    reading: dict[str, anyio.CapacityLimiter] = field(default_factory=dict)
    """Each key's turn to read a whole results file (summary, report): one at a time."""
    streams: dict[str, int] = field(default_factory=dict)
    """Each key's result streams open now."""

    async def owned(self, job_id: str, name: str) -> JobRow:
        """The key's job, or 404 (another key's job is as good as none)."""
        job = await anyio.to_thread.run_sync(self.store.job, job_id)
        if job is None or job.key_name != name:
            raise HTTPException(404, f"no evaluation {job_id}")
        return job

    async def read_results(self, job_id: str, name: str, read: Any) -> Any:
        """``read(path)`` of the key's job, off the loop, one read per key at a time."""
        await self.owned(job_id, name)
        path = self.runner.results_path(job_id)
        if not path.exists():
            raise HTTPException(409, "the evaluation has no results yet")
        async with self.reading.setdefault(name, anyio.CapacityLimiter(1)):
            return await anyio.to_thread.run_sync(read, path)


def _service(request: Request) -> _Service:
    service: _Service = request.app.state.service
    return service


Service = Annotated[_Service, Depends(_service)]


async def _key_name(service: Service, authorization: str | None = Header(default=None)) -> str:
    """The name of the request's API key; 401 without a valid one."""
    scheme, _, key = (authorization or "").partition(" ")
    name = None
    if scheme.lower() == "bearer" and key:
        name = await anyio.to_thread.run_sync(service.store.key_name, key.strip())
    if name is None:
        raise HTTPException(401, "a valid API key is needed: Authorization: Bearer KEY",
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    return name


def _request_schema() -> dict[str, Any]:
    schema = EvaluationRequest.model_json_schema()
    schema["properties"]["pack"]["examples"] = ["customer_support"]
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


router = APIRouter()
Key = Annotated[str, Depends(_key_name)]


@router.post(
    "/v1/evaluations",
    status_code=201,
    response_model=Evaluation,
    responses=_errors(422, 429),
    openapi_extra=_request_schema(),
)
async def create_evaluation(request: Request, name: Key, service: Service) -> Any:
    """Check the job (the body is read and parsed off the event loop), store it, start it."""
    body = await request.body()
    try:
        job_id = await service.intake.create(body, name)
    except Refused as exc:
        return JSONResponse({"detail": [p.as_dict() for p in exc.problems]}, status_code=422)
    except LimitReached as exc:
        return JSONResponse({"detail": str(exc)}, status_code=429)
    return _view(await service.owned(job_id, name))


@router.get("/v1/evaluations", response_model=list[Evaluation], responses=_errors())
async def list_evaluations(name: Key, service: Service) -> list[Evaluation]:
    """The key's jobs, oldest first (the newest 1000)."""
    jobs = await anyio.to_thread.run_sync(lambda: service.store.jobs(name, newest=_LISTED))
    return [_view(job) for job in jobs]


@router.get("/v1/evaluations/{job_id}", response_model=Evaluation, responses=_errors(404))
async def get_evaluation(job_id: str, name: Key, service: Service) -> Evaluation:
    return _view(await service.owned(job_id, name))


@router.post("/v1/evaluations/{job_id}/cancel", response_model=Evaluation, responses=_errors(404))
async def cancel(job_id: str, name: Key, service: Service) -> Evaluation:
    job = await service.owned(job_id, name)
    if job.state in ACTIVE:
        await service.runner.cancel(job_id)
    return _view(await service.owned(job_id, name))


@router.get("/v1/evaluations/{job_id}/summary", responses=_errors(404, 409))
async def summary(job_id: str, name: Key, service: Service) -> Any:
    from convsim.results._report import summarize_file

    report = await service.read_results(job_id, name, summarize_file)
    return json.loads(report.model_dump_json())


@router.get(
    "/v1/evaluations/{job_id}/report",
    responses={**_errors(404, 409, 501), 200: {"content": {"text/html": {}}}},
)
async def report(job_id: str, name: Key, service: Service) -> Any:
    from convsim.results._html import write_html

    try:
        page = await service.read_results(job_id, name, write_html)
    except MissingExtra as exc:  # the server's install, not the caller's request
        raise HTTPException(501, str(exc)) from None
    return FileResponse(page, media_type="text/html")


@router.get(
    "/v1/evaluations/{job_id}/results",
    responses={**_errors(404, 429), 200: {"content": {"text/event-stream": {}}}},
)
async def results_stream(
    job_id: str,
    name: Key,
    service: Service,
    last_event_id: str | None = Header(default=None),
) -> Any:
    """Each finished conversation as a server-sent event, from ``Last-Event-ID`` on."""
    await service.owned(job_id, name)
    limit = (await anyio.to_thread.run_sync(service.runner.limits, name)).streams
    if service.streams.get(name, 0) >= limit:
        raise HTTPException(429, f"this key has {limit} result streams open: at most {limit}")
    given = last_event_id or ""
    seen = int(given) if given.isdigit() and len(given) <= _EVENT_ID_DIGITS else 0
    service.streams[name] = service.streams.get(name, 0) + 1

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in _events(service, job_id, seen):
                yield event
        finally:
            service.streams[name] -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


async def _events(service: _Service, job_id: str, seen: int) -> AsyncIterator[bytes]:
    """The job's results after the ``seen`` first, as they are written; then its end."""
    path = service.runner.results_path(job_id)
    number = 0
    offset = 0
    while not service.stopping.is_set():
        lines, offset = await anyio.to_thread.run_sync(_read_lines, path, offset)
        for raw in lines:
            number += 1
            if number > seen:
                yield b"id: %d\nevent: result\ndata: %s\n\n" % (number, raw)
        job = await anyio.to_thread.run_sync(service.store.job, job_id)
        if job is None or job.state not in ACTIVE:
            state = job.state if job else "gone"
            yield f"event: end\ndata: {json.dumps({'status': state})}\n\n".encode()
            return
        await anyio.sleep(_POLL_S)


def create_app(
    db: str | Path,
    results_dir: str | Path,
    *,
    settings: ServiceSettings | None = None,
    max_jobs_per_key: int | None = None,
    max_body_bytes: int | None = None,
) -> Any:
    """The ASGI app (mount it, or serve it with uvicorn); starts the job runner, and
    resumes interrupted jobs, at startup.

    ``app.state.stopping`` (a :class:`threading.Event`) ends open result streams when
    set: ``convsim serve`` sets it on SIGTERM or SIGINT so the server stops at once.
    """
    settings = settings or ServiceSettings()
    if max_jobs_per_key is not None:
        settings = settings.model_copy(
            update={"limits": settings.limits.model_copy(update={"jobs": max_jobs_per_key})}
        )
    if max_body_bytes is not None:
        settings = settings.model_copy(update={"max_body_bytes": max_body_bytes})
    store = Store(db)
    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True, mode=0o700)
    results.chmod(0o700)  # tenants' results: the server's owner's alone
    runner = JobRunner(store, results, settings)
    service = _Service(store, runner, JobIntake(runner, results / "packs"))

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            runner.tg = tg
            await runner.resume_all()
            tg.start_soon(runner.watch)
            yield
            service.stopping.set()
            for job_id in list(runner.handles):
                runner.handles[job_id].stop(grace_period=0)
            tg.cancel_scope.cancel()

    app = FastAPI(title="convsim evaluation service", version="1", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(router)
    app.state.service = service
    app.state.stopping = service.stopping
    app.state.runner = runner
    app.state.store = store
    return app
