"""Taking a job from a tenant: every check before it is stored, none on the event loop.

The body is parsed and validated, the pack written and loaded, the model's URL resolved
and the store written in worker threads; heavy work (a pack, an lm-eval task) waits for
its key's own slot, so a tenant's large upload queues behind that tenant's, not behind
everyone's.
"""

from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convsim._errors import ConvsimError, EgressRefused, PackError
from convsim._plural import counted

from ._job_model import URL_ARGS, JobModel, Problem, Refused, build_adapter, choose_model
from ._jobs import JobRunner, load_isolated, load_job_pack
from ._settings import KeyLimits
from ._store import ACTIVE, JobRow

__all__ = [
    "EvaluationRequest",
    "JobIntake",
    "LimitReached",
    "PackCheck",
    "bundled_packs",
    "check_pack",
]

_PACK_FILE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_PACK_NAME = re.compile(r"^(?:(?:lm-eval|task):)?[A-Za-z0-9_.\-]{1,150}$")
_SOURCES = ("lm-eval:", "task:")
_SERVER_PATH = re.compile(r"(?<![\w.#:/~-])/[^\s'\"(),;]*")
"""An absolute path in a message (never a URL's ``//`` or a JSON pointer's ``#/``)."""
_RESOLVE_TIMEOUT_S = 10.0


def bundled_packs() -> list[str]:
    from convsim.scenarios import list_packs

    return sorted(p.name for p in list_packs())


class EvaluationRequest(BaseModel):
    """A job: a pack against a model (your own, or an operator's endpoint)."""

    model_config = ConfigDict(extra="forbid")

    pack: str | None = Field(default=None, min_length=1, max_length=200)
    """A bundled pack's name, ``lm-eval:TASK`` or ``task:NAME``; or give ``pack_files``."""
    pack_files: dict[str, str] | None = Field(default=None, max_length=20)
    """A pack of your own, as its files by name (``scenarios.jsonl``,
    ``turn_configs.yml``, ...): validated before the job is accepted."""
    model: str | None = Field(default=None, min_length=1, max_length=300)
    """Your own model: ``TYPE:MODEL`` with ``model_args`` (its base_url must be under
    the server's allowed prefixes; its api_key is stored encrypted, never shown)."""
    endpoint: str | None = Field(default=None, min_length=1, max_length=100)
    """An endpoint the operator declared, by name; its key is the server's."""
    model_args: dict[str, str] = Field(default_factory=dict, max_length=50)
    """Adapter arguments (no ``*_env``: a job never names the server's variables)."""
    metrics: list[str] | None = Field(default=None, max_length=50)
    limit: int | None = Field(default=None, ge=1, le=1_000_000)
    trials: int = Field(default=1, ge=1, le=1_000)
    """Runs of each scenario (pass^k and spread across trials in the summary)."""
    concurrency: int = Field(default=16, ge=1, le=1024)


class LimitReached(ConvsimError):
    """A key's limit stops the job (answered 429)."""


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


@dataclass
class JobIntake:
    """Checks, stores and starts the jobs tenants ask for."""

    runner: JobRunner
    packs_dir: Path
    _turn: dict[str, anyio.Lock] = field(default_factory=dict)
    _bundled: frozenset[str] = field(default_factory=lambda: frozenset(bundled_packs()))

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
            model = choose_model(
                request.model, request.endpoint, request.model_args, self.runner.settings, limits
            )
            if model.endpoint is None:
                await self._check_egress(model)
            adapter = build_adapter(
                model, self.runner.settings, limits,
                concurrency=request.concurrency, egress=self.runner.egress,
            )  # fmt: skip
            await adapter.aclose()  # built to check its arguments; nothing was opened
            job_id = uuid.uuid4().hex[:16]
            stored, upload = await anyio.to_thread.run_sync(
                self._prepare, job_id, key_name, request, model, limits
            )
            pack_dir = stored["pack_dir"]
            try:
                checked = await load_isolated(check_pack, stored, self.runner.workers)
                if checked.problems:
                    raise Refused(checked.problems)
                if checked.most_turns > limits.turns:
                    why = (
                        f"a conversation of the pack has {counted(checked.most_turns, 'turn')} "
                        f"(repeats included): at most {limits.turns} for this key"
                    )
                    raise Refused([Problem(("body", "pack"), why)])
                conversations = checked.conversations[: request.limit]
                if len(conversations) > limits.conversations:
                    why = (
                        f"the job has {counted(len(conversations), 'conversation')} (trials "
                        f"included): at most {limits.conversations} for this key; set limit"
                    )
                    raise Refused([Problem(("body", "limit"), why)])
                stored["pack"] = request.pack or checked.name
                # the job is these conversations, fixed now: a resumed job runs the rest
                stored["conversations"] = conversations
                sealed = await anyio.to_thread.run_sync(self.store.seal, model.secret)
                await anyio.to_thread.run_sync(
                    lambda: self.store.add_job(
                        job_id, key_name, stored, sealed, upload_bytes=upload
                    )
                )
            except BaseException:
                _remove(Path(pack_dir) if pack_dir else None)
                raise
        self.runner.start(job_id)
        return job_id

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
        model: JobModel,
        limits: KeyLimits,
    ) -> tuple[dict[str, Any], int]:
        """The job as stored, and its upload's size, with the pack written (blocking)."""
        stored: dict[str, Any] = request.model_dump(
            exclude={"model_args", "pack_files", "model", "endpoint"}
        )
        stored.update(model=model.model, endpoint=model.endpoint, model_args=model.plain)
        stored["secret_names"] = sorted(model.secret)
        stored["shown_args"] = model.shown_args()
        upload = 0
        pack_dir: Path | None = None
        if request.pack_files is not None:
            upload = sum(len(t.encode()) for t in request.pack_files.values())
            self._check_uploads(key_name, upload, limits)
            pack_dir = _write_pack(self.packs_dir / job_id, request.pack_files)
        else:
            assert request.pack is not None
            self._check_pack_name(request.pack)
        stored["pack_dir"] = str(pack_dir) if pack_dir is not None else None
        return stored, upload

    def _check_pack_name(self, name: str) -> None:
        """A bundled pack or a source the operator allows: never a path on the server."""
        sourced = name.startswith(_SOURCES)
        source = name.partition(":")[0]
        if sourced and source not in self.runner.settings.pack_sources:
            allowed = ", ".join(f"{s}:" for s in self.runner.settings.pack_sources) or "none"
            raise Refused([Problem(("body", "pack"), f"this server takes no {source}: packs "
                                   f"(sources it takes: {allowed})")])  # fmt: skip
        if not _PACK_NAME.match(name) or (not sourced and name not in self._bundled):
            sources = "".join(f", {s}:NAME" for s in self.runner.settings.pack_sources)
            raise Refused([Problem(("body", "pack"), f"no bundled pack {name!r}; bundled "
                                   f"packs: {', '.join(sorted(self._bundled))} (or upload "
                                   f"pack_files{sources})")])  # fmt: skip

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


def _parse(body: bytes) -> EvaluationRequest:
    try:
        return EvaluationRequest.model_validate_json(body)
    except ValidationError as exc:
        raise Refused(
            [Problem(("body", *err["loc"]), err["msg"]) for err in exc.errors()]
        ) from None


def _check_numbers(request: EvaluationRequest, limits: KeyLimits) -> None:
    problems = []
    if (request.pack is None) == (request.pack_files is None):
        problems.append(Problem(("body",), "give pack or pack_files"))
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
