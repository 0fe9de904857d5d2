"""The evaluation service: a FastAPI app over the store and the job runner.

Every request needs ``Authorization: Bearer KEY`` (401 otherwise); a key sees only its
own jobs (another key's job is 404). Job results stream as server-sent events, one per
conversation, numbered in the order of the job's pairs: a client that reconnects with
``Last-Event-ID`` gets only what it has not seen. A job of several (model, task) pairs
tags each result with its pair, and summarises each pair and compares its models.
Nothing blocking runs on the event loop: SQLite, files, packs and name resolution go to
worker threads.
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
from ._jobs import FINISHED, JobRunner
from ._plan import Plan, plan_of
from ._settings import ServiceSettings
from ._store import ACTIVE, JobRow, PairRow, Store
from ._summaries import EvaluationSummary, ModelComparison, compare_models, summarize_pairs

__all__ = ["create_app", "Evaluation", "EvaluationPair", "EvaluationModel"]

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


class EvaluationModel(BaseModel):
    """A model of the job, as its tenant sees it."""

    model_id: str
    model: str
    """The model spec, or ``endpoint:NAME`` for an operator's endpoint."""
    endpoint: str | None = None
    config: dict[str, str]
    """The arguments as given; keys show as ``***``, URLs with their credentials blanked."""


class EvaluationPair(BaseModel):
    """One model on one task: its state, progress and cost."""

    index: int
    model_id: str
    task: str
    status: State
    progress: Progress
    cost_usd: float | None = None
    error: str | None = None
    started: float | None = None
    finished: float | None = None


class Evaluation(BaseModel):
    id: str
    status: State
    pack: str
    """The task (pack); for several, their names joined by ``, ``."""
    model: str
    """The model spec, or ``endpoint:NAME`` for an operator's endpoint; for several,
    their model_ids joined by ``, ``."""
    endpoint: str | None = None
    model_args: dict[str, str]
    """The arguments as given; keys show as ``***``, URLs with their credentials blanked
    (for several models: empty, see ``models``)."""
    metrics: list[str] | None = None
    trials: int = 1
    created: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    progress: Progress
    cost_usd: float | None = None
    """What the job's model calls cost, as priced by their adapter (None: no price)."""
    models: list[EvaluationModel] = []
    tasks: list[str] = []
    pairs: list[EvaluationPair] = []
    """Every model on every task, task by task; progress and cost above are their sums."""


_LISTED = 1000
"""The most jobs a list gives (the newest)."""
_EVENT_ID_DIGITS = 18


def _total(job: JobRow) -> int | None:
    """The conversations the job runs: as its run counted them, or as the intake fixed
    them (a job stored by an older convsim has neither until it runs)."""
    if job.total is not None:
        return job.total
    plan = plan_of(job.request)
    totals = [task.total for task in plan.tasks]
    if any(total is None for total in totals):
        return None
    return len(plan.models) * sum(total for total in totals if total is not None)


def _pair_views(job: JobRow, plan: Plan, rows: list[PairRow]) -> list[EvaluationPair]:
    by_index = {row.pair: row for row in rows}
    views = []
    for pair in plan.pairs:
        row = by_index.get(pair.index)
        named = {"model_id": plan.models[pair.model].model_id, "task": plan.tasks[pair.task].name}
        if row is None:  # a job stored before jobs had pairs: the job is its one pair
            views.append(
                EvaluationPair(
                    index=pair.index,
                    status=job.state,  # type: ignore[arg-type]
                    progress=Progress(total=_total(job), done=job.done, failed=job.failed),
                    cost_usd=job.cost_usd,
                    error=job.error,
                    started=job.started,
                    finished=job.finished,
                    **named,
                )
            )
            continue
        views.append(
            EvaluationPair(
                index=pair.index,
                status=row.state,  # type: ignore[arg-type]
                progress=Progress(total=row.total, done=row.done, failed=row.failed),
                cost_usd=row.cost_usd,
                error=row.error,
                started=row.started,
                finished=row.finished,
                **named,
            )
        )
    return views


def _view(job: JobRow, rows: list[PairRow]) -> Evaluation:
    """The job as its tenant sees it (from the database alone: never its file)."""
    request = job.request
    plan = plan_of(request)
    one = plan.models[0] if len(plan.models) == 1 else None
    return Evaluation(
        id=job.id,
        status=job.state,  # type: ignore[arg-type]
        pack=", ".join(t.name for t in plan.tasks),
        model=one.model if one else ", ".join(m.model_id for m in plan.models),
        endpoint=one.endpoint if one else None,
        model_args=one.shown if one else {},
        metrics=request.get("metrics"),
        trials=request.get("trials") or 1,
        created=job.created,
        started=job.started,
        finished=job.finished,
        error=job.error,
        progress=Progress(total=_total(job), done=job.done, failed=job.failed),
        cost_usd=job.cost_usd,
        models=[
            EvaluationModel(model_id=m.model_id, model=m.model, endpoint=m.endpoint, config=m.shown)
            for m in plan.models
        ],
        tasks=[t.name for t in plan.tasks],
        pairs=_pair_views(job, plan, rows),
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

    async def view(self, job_id: str, name: str) -> Evaluation:
        job = await self.owned(job_id, name)
        rows = await anyio.to_thread.run_sync(self.store.pairs, [job_id])
        return _view(job, rows[job_id])

    async def read_results(
        self, job_id: str, name: str, read: Any, *, pair: int | None = None
    ) -> Any:
        """``read(path)`` of the results of the key's job (of one pair), off the loop,
        one read per key at a time.

        Raises:
            HTTPException: 404 no such job or pair; 409 no results yet, or a job of
                several pairs asked for one file without naming its pair.
        """
        job = await self.owned(job_id, name)
        plan = plan_of(job.request)
        if pair is None and plan.several:
            raise HTTPException(409, f"the evaluation has {len(plan.pairs)} pairs of a model and "
                                "a task: ask for one, .../pairs/{pair}/...")  # fmt: skip
        if pair is not None and not 0 <= pair < len(plan.pairs):
            raise HTTPException(404, f"no pair {pair}: the evaluation has {len(plan.pairs)}")
        path = self.runner.results_dir / plan.results_name(job_id, pair or 0)
        if not path.exists():
            raise HTTPException(409, "the evaluation has no results yet")
        return await self.read(name, lambda: read(path))

    async def read(self, name: str, read: Any) -> Any:
        """``read()`` off the loop, one read of results files per key at a time."""
        async with self.reading.setdefault(name, anyio.CapacityLimiter(1)):
            return await anyio.to_thread.run_sync(read)


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
    return await service.view(job_id, name)


@router.get("/v1/evaluations", response_model=list[Evaluation], responses=_errors())
async def list_evaluations(name: Key, service: Service) -> list[Evaluation]:
    """The key's jobs, oldest first (the newest 1000)."""

    def listed() -> list[Evaluation]:
        jobs = service.store.jobs(name, newest=_LISTED)
        rows = service.store.pairs([job.id for job in jobs])
        return [_view(job, rows[job.id]) for job in jobs]

    views: list[Evaluation] = await anyio.to_thread.run_sync(listed)
    return views


@router.get("/v1/evaluations/{job_id}", response_model=Evaluation, responses=_errors(404))
async def get_evaluation(job_id: str, name: Key, service: Service) -> Evaluation:
    return await service.view(job_id, name)


@router.post("/v1/evaluations/{job_id}/cancel", response_model=Evaluation, responses=_errors(404))
async def cancel(job_id: str, name: Key, service: Service) -> Evaluation:
    job = await service.owned(job_id, name)
    if job.state in ACTIVE:
        await service.runner.cancel(job_id)
    return await service.view(job_id, name)


@router.get(
    "/v1/evaluations/{job_id}/summary",
    responses={
        **_errors(404, 409),
        200: {
            "description": "A job of one pair: its summary (as `convsim report --json`). "
            "A job of several: an EvaluationSummary, a summary per pair and the models "
            "compared task by task."
        },
    },
)
async def summary(job_id: str, name: Key, service: Service) -> Any:
    from convsim.results._report import summarize_file

    job = await service.owned(job_id, name)
    plan = plan_of(job.request)
    if not plan.several:
        report = await service.read_results(job_id, name, summarize_file)
        return json.loads(report.model_dump_json())
    results = service.runner.results_dir
    return await service.read(
        name,
        lambda: EvaluationSummary(
            pairs=summarize_pairs(results, job_id, plan),
            comparisons=compare_models(results, job_id, plan),
        ).model_dump(mode="json"),
    )


@router.get(
    "/v1/evaluations/{job_id}/comparison",
    response_model=list[ModelComparison],
    responses=_errors(404),
)
async def comparison(job_id: str, name: Key, service: Service) -> Any:
    """Each model after the first against the first, task by task, paired by
    conversation (none for a job of one model)."""
    job = await service.owned(job_id, name)
    plan = plan_of(job.request)
    results = service.runner.results_dir
    return await service.read(name, lambda: compare_models(results, job_id, plan))


@router.get("/v1/evaluations/{job_id}/pairs/{pair}/summary", responses=_errors(404, 409))
async def pair_summary(job_id: str, pair: int, name: Key, service: Service) -> Any:
    """The summary of one pair of the job (a model on a task)."""
    from convsim.results._report import summarize_file

    report = await service.read_results(job_id, name, summarize_file, pair=pair)
    return json.loads(report.model_dump_json())


_HTML: dict[int | str, dict[str, Any]] = {200: {"content": {"text/html": {}}}}


async def _report(job_id: str, name: str, service: _Service, pair: int | None) -> Any:
    from convsim.results._html import write_html

    try:
        page = await service.read_results(job_id, name, write_html, pair=pair)
    except MissingExtra as exc:  # the server's install, not the caller's request
        raise HTTPException(501, str(exc)) from None
    return FileResponse(page, media_type="text/html")


@router.get("/v1/evaluations/{job_id}/report", responses={**_errors(404, 409, 501), **_HTML})
async def report(job_id: str, name: Key, service: Service) -> Any:
    """The HTML report of a job of one pair."""
    return await _report(job_id, name, service, None)


@router.get(
    "/v1/evaluations/{job_id}/pairs/{pair}/report", responses={**_errors(404, 409, 501), **_HTML}
)
async def pair_report(job_id: str, pair: int, name: Key, service: Service) -> Any:
    """The HTML report of one pair of the job."""
    return await _report(job_id, name, service, pair)


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
    """Each finished conversation as a server-sent event, from ``Last-Event-ID`` on; a
    job of several pairs tags each with its ``pair`` (index, model_id, task)."""
    job = await service.owned(job_id, name)
    limit = (await anyio.to_thread.run_sync(service.runner.limits, name)).streams
    if service.streams.get(name, 0) >= limit:
        raise HTTPException(429, f"this key has {limit} result streams open: at most {limit}")
    given = last_event_id or ""
    seen = int(given) if given.isdigit() and len(given) <= _EVENT_ID_DIGITS else 0
    service.streams[name] = service.streams.get(name, 0) + 1

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in _events(service, job_id, seen, plan_of(job.request)):
                yield event
        finally:
            service.streams[name] -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


def _tags(plan: Plan) -> list[bytes]:
    """What opens each pair's results in a stream: ``{"pair": {...},`` for a job of
    several pairs (spliced into each result's JSON object), nothing for one."""
    if not plan.several:
        return [b"{"]
    return [
        b'{"pair": %s, '
        % json.dumps(
            {
                "index": pair.index,
                "model_id": plan.models[pair.model].model_id,
                "task": plan.tasks[pair.task].name,
            }
        ).encode()
        for pair in plan.pairs
    ]


def _ended(store: Store, job_id: str) -> tuple[JobRow | None, set[int]]:
    """The job, and which of its pairs have ended (blocking)."""
    job = store.job(job_id)
    rows = store.pairs([job_id])[job_id]
    return job, {row.pair for row in rows if row.state in FINISHED}


async def _events(service: _Service, job_id: str, seen: int, plan: Plan) -> AsyncIterator[bytes]:
    """The job's results after the ``seen`` first, pair by pair as they are written;
    then its end. The job's and pairs' states are read before the files, so a pair seen
    ended has all its lines in its file."""
    paths = [service.runner.results_dir / plan.results_name(job_id, p.index) for p in plan.pairs]
    tags = _tags(plan)
    current = number = offset = 0
    while not service.stopping.is_set():
        job, ended = await anyio.to_thread.run_sync(_ended, service.store, job_id)
        over = job is None or job.state not in ACTIVE
        while current < len(paths):
            lines, offset = await anyio.to_thread.run_sync(_read_lines, paths[current], offset)
            for raw in lines:
                number += 1
                if number > seen and raw.startswith(b"{"):
                    data = tags[current] + raw[1:] if plan.several else raw
                    yield b"id: %d\nevent: result\ndata: %s\n\n" % (number, data)
            if not (over or current in ended):
                break
            current, offset = current + 1, 0
        if over:
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
