"""Where results go: the sink protocol, the run manifest, and the resumable JSONL sink."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import tempfile
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError

from .._errors import ConfigError, ResultsError
from .._log import get_logger
from .._plural import counted
from .._records import ConversationResult, Status, TerminationReason
from ._lock import ResultsLock

__all__ = [
    "ResultSink",
    "RunManifest",
    "JsonlSink",
    "ResultsLock",
    "iter_results",
    "read_results",
    "manifest_path",
    "versions",
]

log = get_logger("convsim.sinks")

#: Settings that change what a conversation's result is: a resumed file must match them.
RESULT_SETTINGS = (
    "seed",
    "metrics",
    "max_turns",
    "max_tokens",
    "user_max_tokens",
    "model_args",
    "user_model_args",
    "judge",
    "judge_args",
    "judge_samples",
    "judge_combine",
    "judge_sees_reasoning",
    "allow_code",
)
"""Settings that change what results say: resuming with others would mix results. A
setting a file's manifest does not record (an older version wrote it) is not compared.
``conversation_timeout`` is not one: it decides whether a conversation finishes, not what
it says, so a resume may raise it for the conversations that timed out (the manifest
records the latest value; each result keeps its own ending)."""

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

#: Endings ``--retry-failed`` runs again: failures outside the model, the ones that
#: count against ``--max-failure-rate`` (each kind on its own): infrastructure errors
#: and conversation timeouts (a slow or stalled server; the retry keeps the deadline
#: it is given, so raise ``--conversation-timeout`` for it).
RETRIED_ON_REQUEST = frozenset(
    {TerminationReason.INFRASTRUCTURE_ERROR, TerminationReason.CONVERSATION_TIMEOUT}
)

_RERUN = frozenset(s.value for s in RERUN_ON_RESUME)
_RETRIED = frozenset(r.value for r in RETRIED_ON_REQUEST)


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
    plugins: list[dict[str, str]] = Field(default_factory=list)
    """The plugins that ran: name and version."""
    stopped: str | None = None
    """What stopped the run before its last conversation (``max_cost``,
    ``circuit_breaker``); None when it ran to its end. ``--resume`` runs the rest."""


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


def _dataset_text(dataset: Any) -> str:
    """A recorded dataset (a manifest's ``pack_options.dataset``) as one phrase."""
    if not isinstance(dataset, dict):
        return repr(dataset)
    parts = [
        f"{k} {dataset[k]}"
        for k in ("format", "path", "name", "config", "split", "revision")
        if dataset.get(k) is not None and not (k == "path" and "name" in dataset)
    ]
    if dataset.get("fingerprint"):
        parts.append(f"fingerprint {str(dataset['fingerprint'])[:16]}")
    if dataset.get("sampled"):
        parts.append(str(dataset["sampled"]))
    return "(" + ", ".join(parts) + ")"


def manifest_path(results: Path) -> Path:
    """``runs/x.jsonl`` -> ``runs/x.manifest.json``."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".manifest.json")


def _atomic_write(path: Path, text: str) -> None:
    data = text.encode("utf-8")
    _atomic_fill(path, lambda fh: fh.write(data))


def _atomic_fill(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through a temporary file beside it that replaces it in one step:
    a failure (a full disk) leaves the old file as it was, and no temporary file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_LINE_BYTES = 256 * 1024 * 1024
"""The longest results line read; a longer one is refused, not read into memory (a
200-turn conversation takes about 0.3 MB)."""

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class ResultLine(NamedTuple):
    """One line of a results file, parsed but not validated."""

    number: int
    """1-based."""
    data: dict[str, Any] | None
    """The JSON object, or None for a torn last line (a crash mid-write)."""


def scan_lines(path: Path) -> Iterator[ResultLine]:
    """The lines of a results file, read one at a time.

    Only the last line may be torn (no newline at its end, and not JSON): a crash
    mid-write leaves that. Any other bad line means the file was damaged some other way:
    ResultsError names the file, the line and what is wrong.
    """
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read results: {exc.strerror or exc}") from None
    with fh:
        number = 0
        while True:
            try:
                raw = fh.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise ResultsError(f"{path}: cannot read results: {exc.strerror or exc}") from None
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise ResultsError(
                    f"{path}:{number}: a line longer than {counted(MAX_LINE_BYTES, 'byte')}; "
                    "the file is damaged"
                )
            if not raw.strip():
                continue
            try:
                data = _parse(raw)
            except _BadLine as bad:
                if raw.endswith(b"\n"):
                    raise ResultsError(f"{path}:{number}: {bad}; the file is damaged") from None
                data = None  # torn: a line without its newline is the file's last
            yield ResultLine(number, data)


class _BadLine(Exception):
    """What is wrong with one line."""


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadLine(f"not a valid result line (invalid UTF-8 at byte {exc.start + 1})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise _BadLine("not a valid result line (JSON nested too deeply)") from None
    except json.JSONDecodeError as exc:
        raise _BadLine(f"not a valid result line ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # an integer longer than Python converts (4300 digits)
        what = "an integer with too many digits" if "digits" in str(exc) else str(exc)
        raise _BadLine(f"not a valid result line ({what})") from None
    if not isinstance(data, dict):
        raise _BadLine(f"not a convsim result (a JSON {type(data).__name__}, not an object)")
    if _SURROGATE_ESCAPE.search(raw):  # "\ud83d", as another tool may write it
        try:
            data = _repaired(data)
        except RecursionError:
            raise _BadLine("not a valid result line (JSON nested too deeply)") from None
    return data


def _repaired(value: Any) -> Any:
    """``value`` with every string made encodable: a surrogate pair split into two
    characters is joined, a lone surrogate becomes U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    return value


def validate_line(path: Path, line: ResultLine) -> ConversationResult:
    """The result on ``line``; ResultsError names the file, line and fields if it is not
    one."""
    try:
        return ConversationResult.model_validate(line.data)
    except ValidationError as exc:
        errors = exc.errors()
        fields = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: "
            f"{err['msg'].removeprefix('Value error, ')}"
            for err in errors[:3]
        )
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ResultsError(f"{path}:{line.number}: not a convsim result: {fields}{more}") from None
    except RecursionError:
        raise ResultsError(f"{path}:{line.number}: JSON nested too deeply") from None


def result_line(result: ConversationResult) -> bytes:
    """``result`` as one UTF-8 JSON line. Text that cannot be encoded (a lone surrogate:
    half an emoji) is repaired, never a reason to lose the result."""
    try:
        return result.model_dump_json().encode("utf-8") + b"\n"
    except (PydanticSerializationError, UnicodeEncodeError):
        log.warning("result_text_repaired", conversation_id=result.conversation_id)
        data = _repaired(result.model_dump(mode="json"))
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def iter_results(path: str | Path) -> Iterator[ConversationResult]:
    """Every complete result of a JSONL results file in file order, one at a time,
    superseded ones included (:func:`read_results` gives the ones that count)."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"{path}: no such results file")
    for line in scan_lines(path):
        if line.data is not None:
            yield validate_line(path, line)


def read_results(path: str | Path) -> list[ConversationResult]:
    """The results of a JSONL results file that count: a conversation recorded more
    than once (retried with ``--retry-failed``) by its last line, in the order of those
    lines. A torn last line is ignored."""
    latest: dict[str, ConversationResult] = {}
    for result in iter_results(path):
        latest.pop(result.conversation_id, None)
        latest[result.conversation_id] = result
    return list(latest.values())


class _Latest(NamedTuple):
    """The line that counts for one conversation, as resuming sorts it."""

    number: int
    status: object
    termination_reason: object


class JsonlSink:
    """Appends one JSON line per finished conversation, written as it finishes.

    Each line is written whole, and a write that fails part-way (a full disk) is cut
    back off, so a file only ever ends in at most one torn line (a killed process). The
    file is locked (:class:`ResultsLock`) from :meth:`prepare` or :meth:`open` until
    :meth:`close`: a second run on it is refused.

    With ``resume=True`` an existing file is continued: a conversation's last line is
    the one that counts; CANCELLED conversations run again, and with
    ``retry_failed=True`` so do those that failed for infrastructure reasons
    (``termination_reason`` ``infrastructure_error``; a conversation timeout is a
    result, not retried). Superseded lines, the torn line and CANCELLED lines are
    dropped by rewriting the file atomically; a retried conversation's failed line is
    kept until its new line supersedes it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        retry_failed: bool = False,
    ) -> None:
        if retry_failed and not resume:
            raise ConfigError("retry_failed=True needs resume=True (it continues a file)")
        self.path = Path(path)
        self.resume = resume
        self.overwrite = overwrite
        self.retry_failed = retry_failed
        self.lock = ResultsLock(self.path)
        """Held while the sink writes; a caller may hold it longer (``with sink.lock:``)."""
        self._fh: Any = None
        self._prepared = False
        self._broken: str | None = None
        self.written = 0

    @property
    def manifest_path(self) -> Path:
        return manifest_path(self.path)

    def prepare(self) -> None:
        """Lock the file and check it can be written; raise ResultsError early if not."""
        if self._prepared:
            return
        if self.path.exists() and self.path.is_dir():
            raise ResultsError(f"{self.path}: is a folder; --out needs a file path")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsError(f"{self.path}: cannot write results: {exc.strerror}") from None
        self.lock.acquire()
        try:
            if self.path.exists() and not (self.resume or self.overwrite):
                raise ResultsError(
                    f"{self.path}: already exists; pass --resume to continue it, "
                    "or choose another --out"
                )
            try:
                with open(self.path, "ab"):
                    pass
            except OSError as exc:
                raise ResultsError(f"{self.path}: cannot write results: {exc.strerror}") from None
            self.lock.refresh()  # the file exists now: lock it by its identity too
        except BaseException:
            self.lock.release()
            raise
        self._prepared = True

    async def open(self, manifest: RunManifest) -> set[str]:
        # resuming reads (and may rewrite) the whole file: keep that off the event loop
        return await anyio.to_thread.run_sync(self._open, manifest)

    def _open(self, manifest: RunManifest) -> set[str]:
        self.prepare()
        self._prepared = False  # a later run with this sink checks the file again
        try:
            done: set[str] = set()
            if self.resume and self.path.stat().st_size:
                done = self._compact(manifest)
                self.lock.refresh()  # a rewrite replaced the file: a new inode
            elif self.overwrite or not self.resume:
                self.path.write_bytes(b"")
            self._write_manifest(manifest)
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed in close())
        except OSError as exc:
            self.lock.release()
            raise ResultsError(f"{self.path}: cannot write results: {exc.strerror}") from None
        except BaseException:
            self.lock.release()
            raise
        self._broken = None
        return done

    def _check_manifest(self, manifest: RunManifest) -> None:
        old = self._read_manifest()
        if old is None:
            return
        before, now = old.pack_options.get("dataset"), manifest.pack_options.get("dataset")
        if before and now and before != now:
            raise ResultsError(
                f"{self.path}: was written from dataset {_dataset_text(before)}, but this "
                f"run reads {_dataset_text(now)}; resuming would mix results. Use the same "
                "dataset (and --seed) or another --out."
            )
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

    def _compact(self, manifest: RunManifest) -> set[str]:
        """The ids to skip; drops what no longer counts, streaming the file twice (ids
        and statuses in memory, never the results)."""
        self._check_manifest(manifest)
        latest: dict[str, _Latest] = {}
        lines = 0
        for line in scan_lines(self.path):
            lines += 1
            obj = line.data
            if obj is None:
                continue
            cid = obj.get("conversation_id")
            if not isinstance(cid, str):
                raise ResultsError(
                    f"{self.path}:{line.number}: not a convsim result (no conversation_id)"
                )
            if obj.get("pack_hash") != manifest.pack_hash:
                raise ResultsError(
                    f"{self.path}:{line.number}: result of another pack version; use another --out"
                )
            latest.pop(cid, None)  # the last line of a conversation is the one that counts
            latest[cid] = _Latest(line.number, obj.get("status"), obj.get("termination_reason"))
        keep = {entry.number for entry in latest.values() if entry.status not in _RERUN}
        retried = (
            {e.number for e in latest.values() if e.termination_reason in _RETRIED}
            if self.retry_failed
            else set()
        )
        done = {cid for cid, e in latest.items() if e.number in keep and e.number not in retried}
        if len(keep) < lines:
            self._rewrite(keep)
        return done

    def _rewrite(self, keep: set[int]) -> None:
        """Keep only the lines numbered ``keep``, replacing the file in one step."""

        def fill(out: BinaryIO) -> None:
            with self.path.open("rb") as src:
                for number, raw in enumerate(src, start=1):
                    if number in keep:
                        out.write(raw)

        try:
            # the file itself, not a symlink to it: a link stays a link
            _atomic_fill(Path(os.path.realpath(self.path)), fill)
        except OSError as exc:
            raise ResultsError(
                f"{self.path}: cannot rewrite the results file to resume it: "
                f"{exc.strerror or exc}; it is unchanged"
            ) from None

    def _read_manifest(self) -> RunManifest | None:
        path = self.manifest_path
        if not path.exists():
            return None
        try:
            return RunManifest.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValidationError, RecursionError) as exc:
            what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise ResultsError(f"{path}: unreadable run manifest: {what}") from None

    def _write_manifest(self, manifest: RunManifest) -> None:
        try:
            _atomic_write(self.manifest_path, manifest.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            raise ResultsError(
                f"{self.manifest_path}: cannot write the run manifest: {exc.strerror}; "
                "the previous one is unchanged"
            ) from None

    async def write(self, result: ConversationResult) -> None:
        if self._fh is None:
            raise ResultsError("JsonlSink.write() before open()")
        if self._broken is not None:
            raise ResultsError(f"{self.path}: cannot write results: {self._broken}")
        data = result_line(result)
        fd = self._fh.fileno()
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[self._fh.write(view) :]
        except OSError as exc:
            # cut off what did get written, so that a later line cannot follow a torn one
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            self._broken = exc.strerror or str(exc)
            raise ResultsError(
                f"{self.path}: cannot write results: {self._broken}; "
                "the results written before are kept"
            ) from None
        self.written += 1

    async def close(self, manifest: RunManifest) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
                self._fh = None
                self._write_manifest(manifest)
            finally:
                self.lock.release()
