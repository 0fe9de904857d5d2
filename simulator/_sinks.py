"""Where results go: the sink protocol, the run manifest, and the resumable JSONL sink."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._errors import ResultsError
from ._records import ConversationResult, Status

__all__ = ["ResultSink", "RunManifest", "JsonlSink", "read_results", "manifest_path", "versions"]

#: Settings that change what a conversation's result is: a resumed file must match them.
RESULT_SETTINGS = (
    "seed",
    "metrics",
    "max_turns",
    "conversation_timeout",
    "model_args",
    "user_model_args",
    "judge",
    "judge_args",
    "judge_samples",
    "judge_combine",
)
"""Settings that change what results say: resuming with others would mix results. A
setting a file's manifest does not record (an older version wrote it) is not compared."""

#: Adapter arguments that change how fast or how politely calls go, not what comes back.
OPERATIONAL_ARGS = frozenset(
    {"latency", "rpm", "tpm", "concurrency", "timeout", "max_retries", "stream", "api_key_env"}
)


def _shaping(value: Any) -> Any:
    """A setting as resume compares it: adapter arguments without the operational ones."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in OPERATIONAL_ARGS}
    return value


#: Statuses whose conversations ``--resume`` runs again (they never finished).
RERUN_ON_RESUME = frozenset({Status.CANCELLED})


def versions() -> dict[str, str]:
    """Versions of convsim, Python and the libraries that shape results."""
    found = {"python": platform.python_version()}
    for dist in ("convsim", "anyio", "pydantic", "httpx", "structlog"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "unknown"
    return found


class RunManifest(BaseModel):
    """What a results file was produced from; written beside it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    pack: str
    pack_path: str
    pack_hash: str
    pack_options: dict[str, Any] = Field(default_factory=dict)
    """What the pack was loaded with besides its name (num_fewshot, context_mode,
    include_path): what loads it again the same way."""
    model: str
    user_model: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=versions)
    started_at: float
    finished_at: float | None = None
    statistics: dict[str, Any] | None = None
    previous_run_ids: list[str] = Field(default_factory=list)
    """Runs that wrote earlier lines of a resumed file."""


@runtime_checkable
class ResultSink(Protocol):
    """Receives each finished conversation of a run."""

    async def open(self, manifest: RunManifest) -> set[str]:
        """Prepare to write; return conversation ids already recorded (skipped on resume)."""
        ...

    async def write(self, result: ConversationResult) -> None:
        """Record one finished conversation durably before returning."""
        ...

    async def close(self, manifest: RunManifest) -> None:
        """Finish the run; ``manifest`` carries the final statistics."""
        ...


def manifest_path(results: Path) -> Path:
    """``runs/x.jsonl`` -> ``runs/x.manifest.json``."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".manifest.json")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _scan(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | None]]:
    """(line number, raw line, parsed object or None if torn) for each line.

    Only the last line may be torn (no newline, or not JSON): a crash mid-write leaves
    that. Any other bad line means the file was damaged some other way.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    for i, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            yield i, raw.decode("utf-8"), json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            if i == len(complete) and not tail:
                yield i, "", None
                return
            raise ResultsError(
                f"{path}:{i}: not a valid result line; the file is damaged"
            ) from None
    if tail.strip():
        yield len(complete) + 1, "", None


def read_results(path: str | Path) -> list[ConversationResult]:
    """Every complete result in a JSONL results file (a torn last line is ignored)."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"{path}: no such results file")
    results = []
    for lineno, _raw, obj in _scan(path):
        if obj is None:
            continue
        try:
            results.append(ConversationResult.model_validate(obj))
        except ValidationError as exc:
            raise ResultsError(
                f"{path}:{lineno}: not a convsim result ({exc.error_count()} errors)"
            ) from None
    return results


class JsonlSink:
    """Appends one JSON line per finished conversation, flushed as it is written.

    Each line is written with a single write and flushed, so a killed process leaves at
    most one torn last line. With ``resume=True`` an existing file is continued: the
    torn line and CANCELLED conversations are dropped (they run again), everything else
    is kept and its conversation ids skipped, so no conversation is recorded twice.
    """

    def __init__(self, path: str | Path, *, resume: bool = False, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.resume = resume
        self.overwrite = overwrite
        self._fh: Any = None
        self._prepared = False
        self.written = 0

    @property
    def manifest_path(self) -> Path:
        return manifest_path(self.path)

    def prepare(self) -> None:
        """Check the output can be written; raise ResultsError early if not."""
        if self._prepared:
            return
        if self.path.exists() and self.path.is_dir():
            raise ResultsError(f"{self.path}: is a folder; --out needs a file path")
        if self.path.exists() and not (self.resume or self.overwrite):
            raise ResultsError(
                f"{self.path}: already exists; pass --resume to continue it, "
                "or choose another --out"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab"):
                pass
        except OSError as exc:
            raise ResultsError(f"{self.path}: cannot write results: {exc.strerror}") from None
        self._prepared = True

    async def open(self, manifest: RunManifest) -> set[str]:
        # resuming reads (and may rewrite) the whole file: keep that off the event loop
        return await anyio.to_thread.run_sync(self._open, manifest)

    def _open(self, manifest: RunManifest) -> set[str]:
        self.prepare()
        done: set[str] = set()
        if self.resume and self.path.stat().st_size:
            done = self._compact(manifest)
        elif self.overwrite or not self.resume:
            self.path.write_bytes(b"")
        self._write_manifest(manifest)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._prepared = False  # a later run with this sink checks the file again
        return done

    def _compact(self, manifest: RunManifest) -> set[str]:
        old = self._read_manifest()
        if old is not None:
            if old.pack_hash != manifest.pack_hash:
                raise ResultsError(
                    f"{self.path}: was written for pack {old.pack!r} "
                    f"with hash {old.pack_hash[:12]}, "
                    f"but this pack's hash is {manifest.pack_hash[:12]}; the pack changed, so "
                    "resuming would mix results. Use another --out."
                )
            checks = [
                ("model", old.model, manifest.model),
                ("user model", old.user_model, manifest.user_model),
            ]
            checks += [
                (key, _shaping(old.settings.get(key)), _shaping(manifest.settings.get(key)))
                for key in RESULT_SETTINGS
                if key in old.settings
            ]
            for what, before, now in checks:
                if before != now:
                    raise ResultsError(
                        f"{self.path}: was written with {what} {before!r}, not {now!r}; resuming "
                        "would mix results. Use the same settings or another --out."
                    )
            manifest.previous_run_ids = [*old.previous_run_ids, old.run_id]
        keep: list[str] = []
        done: set[str] = set()
        dropped = False
        for lineno, raw, obj in _scan(self.path):
            if obj is None:
                dropped = True
                continue
            cid, status = obj.get("conversation_id"), obj.get("status")
            if not isinstance(cid, str):
                raise ResultsError(
                    f"{self.path}:{lineno}: not a convsim result (no conversation_id)"
                )
            if obj.get("pack_hash") != manifest.pack_hash:
                raise ResultsError(
                    f"{self.path}:{lineno}: result of another pack version; use another --out"
                )
            if cid in done or status in {s.value for s in RERUN_ON_RESUME}:
                dropped = True
                continue
            done.add(cid)
            keep.append(raw)
        if dropped:
            _atomic_write(self.path, "".join(line + "\n" for line in keep))
        return done

    def _read_manifest(self) -> RunManifest | None:
        path = self.manifest_path
        if not path.exists():
            return None
        try:
            return RunManifest.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as exc:
            raise ResultsError(f"{path}: unreadable run manifest: {exc}") from None

    def _write_manifest(self, manifest: RunManifest) -> None:
        try:
            _atomic_write(self.manifest_path, manifest.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            raise ResultsError(
                f"{self.manifest_path}: cannot write the run manifest: {exc.strerror}"
            ) from None

    async def write(self, result: ConversationResult) -> None:
        if self._fh is None:
            raise ResultsError("JsonlSink.write() before open()")
        try:
            self._fh.write(result.model_dump_json() + "\n")
            self._fh.flush()
        except OSError as exc:
            raise ResultsError(f"{self.path}: cannot write results: {exc.strerror}") from None
        self.written += 1

    async def close(self, manifest: RunManifest) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._write_manifest(manifest)
