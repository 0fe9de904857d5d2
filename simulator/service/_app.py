"""The evaluation service: a FastAPI app over the store and the job runner.

Every request needs ``Authorization: Bearer KEY`` (401 otherwise); a key sees only its
own jobs (another key's job is 404). Job results stream as server-sent events, one per
conversation, with the line number as event id: a client that reconnects with
``Last-Event-ID`` gets only what it has not seen.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from ._jobs import JobRunner, split_secrets
from ._store import JobRow, Store

__all__ = ["create_app", "EvaluationRequest", "Evaluation"]

State = Literal["queued", "running", "done", "failed", "cancelled"]


def _bundled() -> list[str]:
    from convsim.scenarios import list_packs

    return sorted(p.name for p in list_packs())


_BUNDLED: list[Any] = _bundled()


class EvaluationRequest(BaseModel):
    """A job: a bundled pack against a model."""

    model_config = ConfigDict(extra="forbid")

    pack: str | None = Field(
        default=None, min_length=1, max_length=200, json_schema_extra={"enum": list(_BUNDLED)}
    )
    """A bundled pack's name; or give ``pack_files``."""
    pack_files: dict[str, str] | None = Field(default=None, max_length=20)
    """A pack of your own, as its files by name (``scenarios.jsonl``,
    ``turn_configs.yml``, ...): validated before the job is accepted."""
    model: str = Field(min_length=1, max_length=300)
    model_args: dict[str, str] = Field(default_factory=dict, max_length=50)
    """Adapter arguments; those named like a credential (api_key) are stored encrypted
    and never shown back."""
    metrics: list[str] | None = Field(default=None, max_length=50)
    limit: int | None = Field(default=None, ge=1, le=1_000_000)
    concurrency: int = Field(default=16, ge=1, le=1024)


class Problem(BaseModel):
    """An error: what went wrong (a text, or FastAPI's list of refused fields)."""

    detail: str | list[dict[str, Any]]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route documents (all carry a :class:`Problem`)."""
    return {code: {"model": Problem} for code in (401, 413, *codes)}


class Progress(BaseModel):
    total: int | None = None
    done: int = 0
    failed: int = 0


class Evaluation(BaseModel):
    id: str
    status: State
    pack: str
    model: str
    model_args: dict[str, str]
    """The plain arguments; secret ones show as ``***``."""
    metrics: list[str] | None = None
    created: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    progress: Progress


def _count(path: Path) -> Progress:
    done = failed = 0
    if path.exists():
        with path.open("rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break
                try:
                    status = json.loads(raw).get("status")
                except ValueError:
                    continue
                done += status == "DONE"
                failed += status in ("FAILED", "TIMED_OUT")
    return Progress(done=done, failed=failed)


_PACK_FILE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def _write_pack(folder: Path, files: dict[str, str]) -> Path:
    """An uploaded pack's files in a folder of its own (plain names only: no paths)."""
    from fastapi import HTTPException

    for name in files:
        if not _PACK_FILE.match(name) or name.startswith("."):
            problem = {"loc": ["body", "pack_files", name], "msg": "a plain file name",
                       "type": "value_error"}  # fmt: skip
            raise HTTPException(422, [problem])
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _problem(p: Any) -> dict[str, Any]:
    where: list[Any] = ["body", "pack_files", Path(p.file).name]  # never a server path
    if p.line is not None:
        where.append(p.line)
    if p.field:
        where.append(p.field)
    return {"loc": where, "msg": p.message, "type": "value_error"}


def create_app(
    db: str | Path,
    results_dir: str | Path,
    *,
    max_jobs_per_key: int = 4,
    max_body_bytes: int = 1024 * 1024,
) -> Any:
    """The ASGI app (mount it, or serve it with uvicorn); starts the job runner, and
    resumes interrupted jobs, at startup."""
    from fastapi import Depends, FastAPI, Header, HTTPException, Request
    from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

    store = Store(db)
    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    runner = JobRunner(store, results)

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            runner.tg = tg
            runner.resume_all()
            yield
            for job_id in list(runner.handles):
                runner.handles[job_id].stop(grace_period=0)
            tg.cancel_scope.cancel()

    app = FastAPI(title="convsim evaluation service", version="1", lifespan=lifespan)

    @app.middleware("http")
    async def limit_size(request: Request, call_next: Any) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > max_body_bytes):
            return JSONResponse({"detail": "request body too large"}, status_code=413)
        return await call_next(request)

    def key_name(authorization: str | None = Header(default=None)) -> str:
        scheme, _, key = (authorization or "").partition(" ")
        name = store.key_name(key.strip()) if scheme.lower() == "bearer" and key else None
        if name is None:
            raise HTTPException(401, "a valid API key is needed: Authorization: Bearer KEY",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return name

    def owned(job_id: str, name: str) -> JobRow:
        job = store.job(job_id)
        if job is None or job.key_name != name:
            raise HTTPException(404, f"no evaluation {job_id}")
        return job

    def view(job: JobRow) -> Evaluation:
        shown = dict(job.request.get("model_args", {}))
        shown.update(dict.fromkeys(job.request.get("secret_names", []), "***"))
        progress = _count(runner.results_path(job.id))
        return Evaluation(
            id=job.id,
            status=job.state,  # type: ignore[arg-type]
            pack=job.request["pack"],
            model=job.request["model"],
            model_args=shown,
            metrics=job.request.get("metrics"),
            created=job.created,
            started=job.started,
            finished=job.finished,
            error=job.error,
            progress=progress,
        )

    @app.post("/v1/evaluations", status_code=201, response_model=Evaluation, responses=_errors(429))
    async def create_evaluation(
        body: EvaluationRequest, name: str = Depends(key_name)
    ) -> Evaluation:
        from convsim import load_pack
        from convsim._errors import ConvsimError, PackError

        active = store.jobs(name, states=("queued", "running"))
        if len(active) >= max_jobs_per_key:
            raise HTTPException(429, f"this key has {len(active)} jobs running: at most "
                                f"{max_jobs_per_key}")  # fmt: skip
        job_id = uuid.uuid4().hex[:16]
        if (body.pack is None) == (body.pack_files is None):
            problem = {"loc": ["body"], "msg": "give pack or pack_files", "type": "value_error"}
            raise HTTPException(422, [problem])
        pack_dir = None
        if body.pack_files is not None:
            pack_dir = _write_pack(results / "packs" / job_id, body.pack_files)
        try:
            pack = load_pack(pack_dir or body.pack)
        except PackError as exc:  # every problem with its file, line and field
            if pack_dir is not None:
                shutil.rmtree(pack_dir, ignore_errors=True)
            raise HTTPException(422, [_problem(p) for p in exc.problems]) from None
        except ConvsimError as exc:  # in FastAPI's own shape for a refused request
            if pack_dir is not None:
                shutil.rmtree(pack_dir, ignore_errors=True)
            problem = {"loc": ["body", "pack"], "msg": str(exc), "type": "value_error"}
            raise HTTPException(422, [problem]) from None
        plain, secret = split_secrets(body.model_args)
        request = body.model_dump(exclude={"model_args", "pack_files"})
        request["pack"] = body.pack or pack.name
        request["pack_dir"] = str(pack_dir) if pack_dir else None
        request["model_args"] = plain
        request["secret_names"] = sorted(secret)
        # the job is these conversations, fixed now: a resumed job runs the rest of them
        request["conversations"] = [c.conversation_id for c in pack.conversations][: body.limit]
        store.add_job(job_id, name, request, store.seal(secret))
        runner.start(job_id)
        job = store.job(job_id)
        assert job is not None
        return view(job)

    @app.get("/v1/evaluations", response_model=list[Evaluation], responses=_errors())
    def list_evaluations(name: str = Depends(key_name)) -> list[Evaluation]:
        return [view(job) for job in store.jobs(name)]

    @app.get("/v1/evaluations/{job_id}", response_model=Evaluation, responses=_errors(404))
    def get_evaluation(job_id: str, name: str = Depends(key_name)) -> Evaluation:
        return view(owned(job_id, name))

    @app.post("/v1/evaluations/{job_id}/cancel", response_model=Evaluation, responses=_errors(404))
    async def cancel(job_id: str, name: str = Depends(key_name)) -> Evaluation:
        job = owned(job_id, name)
        if job.state in ("queued", "running"):
            runner.cancel(job_id)
        again = store.job(job_id)
        assert again is not None
        return view(again)

    @app.get("/v1/evaluations/{job_id}/summary", responses=_errors(404, 409))
    def summary(job_id: str, name: str = Depends(key_name)) -> Any:
        from convsim import summarize_file

        owned(job_id, name)
        path = runner.results_path(job_id)
        if not path.exists():
            raise HTTPException(409, "the evaluation has no results yet")
        return json.loads(summarize_file(path).model_dump_json())

    @app.get(
        "/v1/evaluations/{job_id}/report",
        responses={**_errors(404, 409), 200: {"content": {"text/html": {}}}},
    )
    def report(job_id: str, name: str = Depends(key_name)) -> Any:
        from convsim.results._html import write_html

        owned(job_id, name)
        path = runner.results_path(job_id)
        if not path.exists():
            raise HTTPException(409, "the evaluation has no results yet")
        return FileResponse(write_html(path), media_type="text/html")

    @app.get(
        "/v1/evaluations/{job_id}/results",
        responses={**_errors(404), 200: {"content": {"text/event-stream": {}}}},
    )
    async def results_stream(
        job_id: str,
        name: str = Depends(key_name),
        last_event_id: str | None = Header(default=None),
    ) -> Any:
        owned(job_id, name)
        seen = int(last_event_id) if last_event_id and last_event_id.isdigit() else 0
        path = runner.results_path(job_id)

        async def events() -> AsyncIterator[bytes]:
            number = 0
            offset = 0
            while True:
                if path.exists():
                    with path.open("rb") as fh:
                        fh.seek(offset)
                        while True:
                            raw = fh.readline()
                            if not raw.endswith(b"\n"):
                                break  # a line still being written: read it next time
                            offset += len(raw)
                            number += 1
                            if number > seen:
                                yield b"id: %d\nevent: result\ndata: %s\n\n" % (number, raw.strip())
                job = await anyio.to_thread.run_sync(store.job, job_id)  # off the loop
                if job is None or job.state not in ("queued", "running"):
                    state = job.state if job else "gone"
                    yield f"event: end\ndata: {json.dumps({'status': state})}\n\n".encode()
                    return
                await asyncio.sleep(0.2)

        return StreamingResponse(events(), media_type="text/event-stream")

    app.state.runner = runner
    app.state.store = store
    return app
