"""Taking a job from a tenant: every check before it is stored, none on the event loop.

The body is parsed and validated, the packs written and loaded, the models' URLs
resolved and the store written in worker threads; heavy work (a pack, an lm-eval task)
waits for its key's own slot, so a tenant's large upload queues behind that tenant's, not
behind everyone's. A job of several models and tasks is checked model by model and task
by task, each refusal naming its place (``models.1.config.base_url``, ``tasks.0``).
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convsim._errors import ConvsimError, EgressRefused, PackError
from convsim._plural import counted

from ._job_model import URL_ARGS, JobModel, Problem, Refused, build_adapter, choose_model
from ._jobs import JobRunner, load_isolated, load_job_pack
from ._plan import ModelEntry, arg_text
from ._settings import KeyLimits, ServiceSettings
from ._store import ACTIVE, JobRow

__all__ = [
    "EvaluationRequest",
    "JobIntake",
    "LimitReached",
    "PackCheck",
    "bundled_packs",
    "check_pack",
    "entry_point_tasks",
]

_PACK_FILE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_PACK_NAME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_\-]{0,49}:)?[A-Za-z0-9_.\-]{1,150}$")
TASK_GROUP = "convsim.tasks"
"""The entry-point group task classes are registered in (read by name: the task
registry belongs to convsim.lm_eval, a layer above)."""
_SERVER_PATH = re.compile(r"(?<![\w.#:/~-])/[^\s'\"(),;]*")
"""An absolute path in a message (never a URL's ``//`` or a JSON pointer's ``#/``)."""
_RESOLVE_TIMEOUT_S = 10.0


def bundled_packs() -> list[str]:
    from convsim.scenarios import list_packs

    return sorted(p.name for p in list_packs())


def entry_point_tasks() -> list[str]:
    """The task classes installed packages register (entry-point group
    ``convsim.tasks``): a job names them as tasks or packs, plain or as ``task:NAME``."""
    return sorted({ep.name for ep in entry_points(group=TASK_GROUP)})


class EvaluationRequest(BaseModel):
    """A job: packs (tasks) against models, each your own or an operator's endpoint.

    Give one pack (``pack`` or ``pack_files``) or several (``tasks``), and one model
    (``model`` or ``endpoint``, with ``model_args``) or several (``models``): the job
    runs every model on every task."""

    model_config = ConfigDict(extra="forbid")

    pack: str | None = Field(default=None, min_length=1, max_length=200)
    """A bundled pack's name, a registered task's name (or ``task:NAME``),
    ``lm-eval:TASK`` or ``SOURCE:NAME`` where the server takes that source; or give
    ``pack_files`` or ``tasks``."""
    tasks: list[str] | None = Field(default=None, min_length=1, max_length=20)
    """Several packs, each named as ``pack`` is (the developer guide's form)."""
    pack_files: dict[str, str] | None = Field(default=None, max_length=20)
    """A pack of your own, as its files by name (``scenarios.jsonl``,
    ``turn_configs.yml``, ...): validated before the job is accepted."""
    model: str | None = Field(default=None, min_length=1, max_length=300)
    """Your own model: ``TYPE:MODEL`` with ``model_args`` (its base_url must be under
    the server's allowed prefixes; its api_key is stored encrypted, never shown)."""
    models: list[ModelEntry] | None = Field(default=None, min_length=1, max_length=10)
    """Several models, each ``{model_id, model_type, config}`` (the developer guide's
    form); the first is the base the others are compared with."""
    endpoint: str | None = Field(default=None, min_length=1, max_length=100)
    """An endpoint the operator declared, by name; its key is the server's."""
    model_args: dict[str, str] = Field(default_factory=dict, max_length=50)
    """Adapter arguments (no ``*_env``: a job never names the server's variables)."""
    metrics: list[str] | None = Field(default=None, max_length=50)
    """The metrics of every task (default: each pack's own)."""
    limit: int | None = Field(default=None, ge=1, le=1_000_000)
    """The first N conversations of each task."""
    trials: int = Field(default=1, ge=1, le=1_000)
    """Runs of each scenario (pass^k and spread across trials in the summary)."""
    concurrency: int = Field(default=16, ge=1, le=1024)


class LimitReached(ConvsimError):
    """A key's limit stops the job (answered 429)."""


@dataclass(frozen=True)
class _Asked:
    """One model as the tenant asked for it, and where in the body it was asked."""

    model_id: str
    model: str | None
    endpoint: str | None
    args: dict[str, str]
    moves: dict[tuple[str | int, ...], tuple[str | int, ...]] = field(default_factory=dict)
    """Where :func:`choose_model` places a problem -> where this model is in the body."""

    def relocated(self, exc: Refused) -> Refused:
        return Refused([_moved(p, self.moves) for p in exc.problems])


def _moved(problem: Problem, moves: dict[tuple[str | int, ...], tuple[str | int, ...]]) -> Problem:
    """``problem`` with the longest matching prefix of its place replaced."""
    for size in range(len(problem.loc), 0, -1):
        head = problem.loc[:size]
        if head in moves:
            return Problem(moves[head] + problem.loc[size:], problem.msg)
    return problem


def _asked_models(request: EvaluationRequest, settings: ServiceSettings) -> list[_Asked]:
    """The models the job names, with the places of their fields in the body.

    Raises:
        Refused: a model of ``models`` names no endpoint and gives no type, or names an
            endpoint of another type, or two models have one model_id.
    """
    if request.models is None:
        return [_Asked(request.model or "", request.model, request.endpoint, request.model_args)]
    asked, problems, seen = [], [], set()
    for index, entry in enumerate(request.models):
        here: tuple[str | int, ...] = ("body", "models", index)
        if entry.model_id in seen:
            problems.append(Problem((*here, "model_id"), "given twice: each model of an "
                                    "evaluation is named once"))  # fmt: skip
        seen.add(entry.model_id)
        args = {name: arg_text(value) for name, value in entry.config.items()}
        named = entry.endpoint is not None
        endpoint = entry.endpoint if named else None
        if not named and entry.model_id in settings.endpoints:
            endpoint = entry.model_id
        if endpoint is not None and endpoint in settings.endpoints and entry.model_type:
            serves = settings.endpoints[endpoint].model.partition(":")[0]
            if serves != entry.model_type:
                problems.append(Problem((*here, "model_type"), f"the server's endpoint "
                                        f"{endpoint!r} serves a {serves} model, not "
                                        f"{entry.model_type}"))  # fmt: skip
        model = None
        if endpoint is None:
            if entry.model_type is None:
                known = ", ".join(sorted(settings.endpoints)) or "none"
                problems.append(Problem((*here, "model_type"), "needed for your own model "
                                        "(openai, anthropic, openai-compatible, http, "
                                        f"scripted, ...); or name one of the server's "
                                        f"endpoints: {known}"))  # fmt: skip
                continue
            model = f"{entry.model_type}:{entry.model_id}"
        moves: dict[tuple[str | int, ...], tuple[str | int, ...]] = {
            ("body",): here,
            ("body", "model"): (*here, "model_type"),
            ("body", "endpoint"): (*here, "endpoint" if named else "model_id"),
            ("body", "model_args"): (*here, "config"),
        }
        asked.append(_Asked(entry.model_id, model, endpoint, args, moves))
    if problems:
        raise Refused(problems)
    return asked


@dataclass(frozen=True)
class PackCheck:
    """What loading a job's pack found: its name, conversations and the most turns one
    has; or its problems."""

    name: str = ""
    conversations: list[str] = field(default_factory=list)
    most_turns: int = 0
    problems: list[Problem] = field(default_factory=list)


def check_pack(stored: dict[str, Any]) -> PackCheck:
    """Load the job's pack as it will run (blocking; run in a worker process for a
    tenant's own pack, so its CPU and memory are the worker's)."""
    folder = Path(stored["pack_dir"]) if stored.get("pack_dir") else None
    try:
        pack = load_job_pack(stored)
    except PackError as exc:  # every problem with its file, line and field
        return PackCheck(problems=[_pack_problem(p, folder) for p in exc.problems])
    except ConvsimError as exc:
        return PackCheck(problems=[Problem(("body", "pack"), str(exc))])
    return PackCheck(
        pack.name,
        [c.conversation_id for c in pack.conversations],
        max((len(c.flow.turns) for c in pack.conversations), default=0),
    )


@dataclass(frozen=True)
class _TaskCheck:
    """A task of the job as checked: its stored source and its conversations."""

    name: str
    source: dict[str, Any]
    conversations: list[str]


@dataclass
class JobIntake:
    """Checks, stores and starts the jobs tenants ask for."""

    runner: JobRunner
    packs_dir: Path
    _turn: dict[str, anyio.Lock] = field(default_factory=dict)
    _bundled: frozenset[str] = field(default_factory=lambda: frozenset(bundled_packs()))
    _tasks: frozenset[str] = field(default_factory=lambda: frozenset(entry_point_tasks()))

    @property
    def store(self) -> Any:
        return self.runner.store

    async def create(self, body: bytes, key_name: str) -> str:
        """Check and store the job; return its id.

        Raises:
            Refused: 422, naming each refused field.
            LimitReached: 429, a limit of the key.
        """
        request = await anyio.to_thread.run_sync(_parse, body)
        # one job at a time per key from here: its limits hold however many requests
        # it sends at once, and its heavy work waits for its own turn only
        async with self._turn.setdefault(key_name, anyio.Lock()):
            limits, active = await anyio.to_thread.run_sync(self._key_state, key_name)
            if len(active) >= limits.jobs:
                raise LimitReached(
                    f"this key has {counted(len(active), 'job')} queued or running: at most "
                    f"{limits.jobs}"
                )
            _check_numbers(request, limits)
            models = await self._models(request, limits)
            job_id = uuid.uuid4().hex[:16]
            sources, upload = await anyio.to_thread.run_sync(
                self._prepare, job_id, key_name, request, limits
            )
            try:
                tasks = [
                    await self._check_task(where, name, source, request, limits)
                    for where, name, source in sources
                ]
                total = len(models) * sum(len(t.conversations) for t in tasks)
                if total > limits.conversations:
                    pairs = f" ({counted(len(models) * len(tasks), 'pair')} of a model and a task)"
                    why = (
                        f"the job has {counted(total, 'conversation')} (trials included"
                        f"{pairs if len(models) * len(tasks) > 1 else ''}): at most "
                        f"{limits.conversations} for this key; set limit"
                    )
                    raise Refused([Problem(("body", "limit"), why)])
                stored = _stored(request, models, tasks)
                secrets = [model.secret for _, model in models]
                sealed = await anyio.to_thread.run_sync(
                    self.store.seal, {"models": secrets} if any(secrets) else {}
                )
                totals = [len(t.conversations) for t in tasks for _ in models]
                await anyio.to_thread.run_sync(
                    lambda: self.store.add_job(
                        job_id, key_name, stored, sealed, upload_bytes=upload, pair_totals=totals
                    )
                )
            except BaseException:
                for _, _, source in sources:
                    _remove(Path(source["pack_dir"]) if source.get("pack_dir") else None)
                raise
        self.runner.start(job_id)
        return job_id

    async def _models(
        self, request: EvaluationRequest, limits: KeyLimits
    ) -> list[tuple[str, JobModel]]:
        """Each model of the job, as the tenant may have it, with its name in the job."""
        chosen = []
        for asked in _asked_models(request, self.runner.settings):
            try:
                model = choose_model(
                    asked.model, asked.endpoint, asked.args, self.runner.settings, limits
                )
                if model.endpoint is None:
                    await self._check_egress(model)
                adapter = build_adapter(
                    model, self.runner.settings, limits,
                    concurrency=request.concurrency, egress=self.runner.egress,
                )  # fmt: skip
                await adapter.aclose()  # built to check its arguments; nothing was opened
            except Refused as exc:
                raise asked.relocated(exc) from None
            chosen.append((asked.model_id or model.model, model))
        return chosen

    async def _check_task(
        self,
        where: tuple[str | int, ...],
        name: str,
        source: dict[str, Any],
        request: EvaluationRequest,
        limits: KeyLimits,
    ) -> _TaskCheck:
        """Load a task's pack as it will run (in a worker), within the key's limits."""
        checked = await load_isolated(check_pack, source, self.runner.workers)
        if checked.problems:
            moves: dict[tuple[str | int, ...], tuple[str | int, ...]] = {("body", "pack"): where}
            raise Refused([_moved(p, moves) for p in checked.problems])
        if checked.most_turns > limits.turns:
            why = (
                f"a conversation of the pack has {counted(checked.most_turns, 'turn')} "
                f"(repeats included): at most {limits.turns} for this key"
            )
            raise Refused([Problem(where, why)])
        # the job is these conversations, fixed now: a resumed job runs the rest
        conversations = checked.conversations[: request.limit]
        return _TaskCheck(name or checked.name, source, conversations)

    def _key_state(self, key_name: str) -> tuple[KeyLimits, list[JobRow]]:
        return self.runner.limits(key_name), self.store.jobs(key_name, states=ACTIVE)

    async def _check_egress(self, model: JobModel) -> None:
        given = [name for name in URL_ARGS if name in model.secret]
        for name in given:
            try:
                with anyio.fail_after(_RESOLVE_TIMEOUT_S):
                    await self.runner.egress.check(model.secret[name], field=name)
            except EgressRefused as exc:
                raise Refused([Problem(("body", "model_args", name), exc.reason)]) from None
            except TimeoutError:
                raise Refused([Problem(("body", "model_args", name),
                                       "the host did not resolve in time")]) from None  # fmt: skip

    def _prepare(
        self,
        job_id: str,
        key_name: str,
        request: EvaluationRequest,
        limits: KeyLimits,
    ) -> tuple[list[tuple[tuple[str | int, ...], str, dict[str, Any]]], int]:
        """The job's tasks (where each is in the body, its name, what loads its pack) and
        its upload's size, with an uploaded pack written (blocking)."""
        upload = 0
        if request.pack_files is not None:
            upload = sum(len(t.encode()) for t in request.pack_files.values())
            self._check_uploads(key_name, upload, limits)
            folder = _write_pack(self.packs_dir / job_id, request.pack_files)
            return [
                (("body", "pack_files"), "", _source(None, str(folder), request.trials))
            ], upload
        if request.tasks is None:
            assert request.pack is not None
            pack = self._resolve_pack(request.pack, ("body", "pack"))
            return [(("body", "pack"), request.pack, _source(pack, None, request.trials))], upload
        if len(set(request.tasks)) < len(request.tasks):
            raise Refused([Problem(("body", "tasks"), "a task is named twice")])
        found = []
        for index, name in enumerate(request.tasks):
            where: tuple[str | int, ...] = ("body", "tasks", index)
            found.append(
                (where, name, _source(self._resolve_pack(name, where), None, request.trials))
            )
        return found, upload

    def _resolve_pack(self, name: str, where: tuple[str | int, ...]) -> str:
        """The pack a job's ``name`` loads: a bundled pack, a task class installed
        packages register (``task:NAME``), or a source the operator allows; never a
        path on the server."""
        sources = self.runner.settings.pack_sources
        source, sep, _ = name.partition(":")
        if sep and source not in sources:
            allowed = ", ".join(f"{s}:" for s in sources) or "none"
            raise Refused([Problem(where, f"this server takes no {source}: packs (sources "
                                   f"it takes: {allowed})")])  # fmt: skip
        if _PACK_NAME.match(name):
            if sep or name in self._bundled:
                return name
            if "task" in sources and name in self._tasks:
                return f"task:{name}"
        tasks = f"; registered tasks: {', '.join(sorted(self._tasks))}" if self._tasks else ""
        named = "".join(f", {s}:NAME" for s in sources)
        upload = ", or upload pack_files" if where == ("body", "pack") else ""
        raise Refused([Problem(where, f"no bundled pack or registered task {name!r}; "
                               f"bundled packs: {', '.join(sorted(self._bundled))}{tasks} "
                               f"(a package registers a task class in the entry-point group "
                               f"{TASK_GROUP}; names: bundled, NAME{named}{upload})")])  # fmt: skip

    def _check_uploads(self, key_name: str, size: int, limits: KeyLimits) -> None:
        kept = self.store.uploads(key_name)
        if len(kept) + 1 > limits.uploads:
            raise LimitReached(
                f"this key keeps {len(kept)} uploaded packs: at most {limits.uploads} "
                "(each is removed some time after its job ends)"
            )
        held = sum(job.upload_bytes for job in kept)
        if held + size > limits.upload_bytes:
            raise LimitReached(
                f"this key's uploaded packs would hold {counted(held + size, 'byte')}: at most "
                f"{limits.upload_bytes}"
            )


def _source(pack: str | None, pack_dir: str | None, trials: int) -> dict[str, Any]:
    """What loads a task's pack as it runs (see ``load_job_pack``)."""
    return {"pack": pack, "pack_dir": pack_dir, "trials": trials}


def _stored(
    request: EvaluationRequest,
    models: Sequence[tuple[str, JobModel]],
    tasks: Sequence[_TaskCheck],
) -> dict[str, Any]:
    """The job as stored: its settings, models (secrets left out) and tasks."""
    stored: dict[str, Any] = request.model_dump(
        include={"metrics", "limit", "trials", "concurrency"}
    )
    stored["models"] = [
        {
            "model_id": model_id,
            "model": model.model,
            "endpoint": model.endpoint,
            "model_args": model.plain,
            "secret_names": sorted(model.secret),
            "shown_args": model.shown_args(),
        }
        for model_id, model in models
    ]
    stored["tasks"] = [
        {"name": task.name, **task.source, "conversations": task.conversations} for task in tasks
    ]
    return stored


def _parse(body: bytes) -> EvaluationRequest:
    try:
        return EvaluationRequest.model_validate_json(body)
    except ValidationError as exc:
        raise Refused(
            [Problem(("body", *err["loc"]), err["msg"]) for err in exc.errors()]
        ) from None


def _check_numbers(request: EvaluationRequest, limits: KeyLimits) -> None:
    problems = []
    packs = [request.pack, request.pack_files, request.tasks]
    if sum(p is not None for p in packs) != 1:
        problems.append(Problem(("body",), "give pack, pack_files or tasks"))
    chosen = [request.model, request.endpoint, request.models]
    if request.models is not None and (request.model_args or any(chosen[:2])):
        problems.append(Problem(("body", "models"), "give models, or model or endpoint with "
                                "model_args: not both"))  # fmt: skip
    if request.concurrency > limits.concurrency:
        problems.append(
            Problem(("body", "concurrency"), f"at most {limits.concurrency} for this key")
        )
    if request.trials > limits.trials:
        problems.append(Problem(("body", "trials"), f"at most {limits.trials} for this key"))
    if problems:
        raise Refused(problems)


def _write_pack(folder: Path, files: dict[str, str]) -> Path:
    """An uploaded pack's files in a folder of its own (plain names only: no paths)."""
    for name in files:
        if not _PACK_FILE.match(name) or name.startswith("."):
            raise Refused([Problem(("body", "pack_files", name), "a plain file name")])
    folder.mkdir(parents=True, mode=0o700)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _pack_problem(p: Any, folder: Path | None) -> Problem:
    where: list[Any] = ["body", "pack_files", Path(p.file).name]  # never a server path
    if p.line is not None:
        where.append(p.line)
    if p.field:
        where.append(p.field)
    message = p.message
    if folder is not None:
        for form in {str(folder.resolve()), str(folder)}:
            message = message.replace(f"{form}/", "").replace(form, "the pack")
    return Problem(tuple(where), _SERVER_PATH.sub("a path outside the pack", message))
