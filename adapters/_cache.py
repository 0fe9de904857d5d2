"""The response cache: model answers kept on disk, so that a call made again with the
same request is answered without calling the model.

:class:`ResponseCache` is one SQLite file (WAL, one row per key) that many processes may
read and write at once; each write is one transaction, so a row is there whole or not
at all. A row that cannot be read back (bad JSON, a truncated value, a file that is
not a database) is a miss, never an error: the next answer replaces it, and a corrupt
file is set aside and started afresh. :class:`CachedAdapter` puts a cache in front of
any :class:`~convsim.adapters.ModelAdapter`; the :class:`~convsim.adapters.ModelPool`
does it for every model it hands out when it is given a cache.

A key is the SHA-256 of the request as the model would see it: the adapter's
identity (:meth:`ModelAdapter.cache_identity`: type, provider, model, base URL, never
a key), the messages, the generation settings with the seed, and the call's position
(conversation, scenario, turn and side, from the call's metadata). Failed calls are
not cached. A hit is the stored Completion with ``cached=True``, no attempts and no
timings: nothing was measured, so nothing counts as the model's latency.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from convsim._errors import AdapterError, ConfigError
from convsim._log import get_logger
from convsim._types import (
    CallTimings,
    Completion,
    Cost,
    GenerationParams,
    Message,
    ModelInfo,
    RateLimits,
    Usage,
)

from ._budget import Budgets
from ._guide_shapes import ConfigValidation, ModelInfoDict, RateLimitsDict
from ._protocol import ModelAdapter, PromptLogprobs

__all__ = [
    "ResponseCache",
    "CacheStatistics",
    "CachedAdapter",
    "cache_key",
    "default_cache_dir",
    "parse_duration",
]

log = get_logger("convsim.adapters")

CACHE_FILE = "responses.sqlite3"
"""The database inside a cache folder."""

KEY_VERSION = 1
"""Part of every key: raised when what a key covers changes, so old rows go unused."""

BUSY_TIMEOUT_S = 30.0
BUSY_TRIES = 20
BUSY_PAUSE_S = 0.01  # then 0.02, 0.03, ...: about 2 s in all
"""How long a write waits for another process's write to finish."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS responses ("
    "key TEXT PRIMARY KEY, created REAL NOT NULL, completion TEXT NOT NULL)"
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit, ``s``, ``m``, ``h``, ``d``
    or ``w`` (``3600``, ``3600s``, ``90m``, ``7d``).

    Raises:
        ConfigError: ``text`` is not such a duration, or is 0.
    """
    match = _DURATION.match(text.lower())
    if match is None:
        raise ConfigError(
            f"{text!r} is not a duration: give a number with an optional unit "
            "s, m, h, d or w (3600s, 7d)"
        )
    seconds = float(match[1]) * _UNIT_S[match[2]]
    if seconds <= 0:
        raise ConfigError(f"{text!r}: a duration must be above 0")
    return seconds


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where responses are cached by default: ``convsim/responses`` under the user's
    cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``; ``~/Library/Caches`` on macOS,
    ``%LOCALAPPDATA%`` on Windows)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    elif sys.platform == "win32" and env.get("LOCALAPPDATA"):
        base = Path(env["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path.home() / ".cache"
    return base / "convsim" / "responses"


def cache_key(
    identity: Mapping[str, Any], messages: Sequence[Message], params: GenerationParams
) -> str:
    """The key of one call: a SHA-256 over the adapter's identity, the messages, the
    generation settings (seed included) and the call's position (its metadata)."""
    settings = params.model_dump(mode="json", exclude={"metadata"})
    request = {
        "version": KEY_VERSION,
        "adapter": dict(identity),
        "messages": [_seen(m) for m in messages],
        "settings": settings,
        "position": dict(sorted(params.metadata.items())),
    }
    text = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _seen(message: Message) -> list[Any]:
    """A message as the model sees it: role and content, then (only where there are
    some, so text messages keep their keys) its tool calls or the call it answers.
    Reasoning is never sent to a model, so it is not part of a key."""
    seen: list[Any] = [message.role, message.content]
    if message.tool_calls:
        seen.append([[c.id, c.name, c.arguments] for c in message.tool_calls])
    if message.tool_call_id is not None:
        seen.append(message.tool_call_id)
    return seen


@dataclass(frozen=True)
class CacheStatistics:
    """What a cache did since it was opened."""

    hits: int
    misses: int
    """Lookups that found nothing usable (absent, expired or corrupt)."""
    writes: int
    corrupt: int
    """Rows (or whole files) that could not be read and counted as misses."""


class ResponseCache:
    """Model answers by request, in one SQLite file under ``directory``.

    Safe to share among tasks, threads and processes. Lookups and writes run in a
    worker thread (:meth:`get`, :meth:`put`), never on the event loop.

    Args:
        directory: the cache folder (made if missing); default :func:`default_cache_dir`.
        expiry: seconds an answer stays usable (None: forever); older rows are misses.
        clock: the time in seconds (Unix), injectable for tests.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        expiry: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if expiry is not None and not expiry > 0:
            raise ConfigError(f"cache expiry must be above 0 seconds, not {expiry!r}")
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.path = self.directory / CACHE_FILE
        self.expiry = expiry
        self._clock = clock
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._hits = self._misses = self._writes = self._corrupt = 0

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.directory)!r}, expiry={self.expiry!r})"

    # -- the database -------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cache folder {self.directory}: {exc}") from exc
            db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            try:
                _while_busy(lambda: _prepare(db))
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _reset(self) -> None:
        """Set a file that is not a database aside and start a new one."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        self._corrupt += 1
        log.warning("response_cache_corrupt", path=str(self.path))
        aside = self.path.with_name(f"{CACHE_FILE}.corrupt-{os.getpid()}")
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(f"{self.path}{suffix}")
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)

    def _with_db(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """``work`` on the database; a corrupt file is set aside and ``work`` tried
        once more on a fresh one."""
        with self._lock:
            for attempt in range(2):
                try:
                    return work(self._connect())
                except sqlite3.DatabaseError as exc:
                    if attempt or not _corrupt_file(exc):
                        raise
                    self._reset()
            raise AssertionError("unreachable")  # pragma: no cover

    # -- lookups and writes ---------------------------------------------------------

    def lookup(self, key: str) -> Completion | None:
        """The answer stored for ``key``, or None (absent, expired or unreadable).
        Blocking: use :meth:`get` from async code."""

        def read(db: sqlite3.Connection) -> Any:
            return db.execute(
                "SELECT created, completion FROM responses WHERE key = ?", (key,)
            ).fetchone()

        try:
            row = self._with_db(read)
        except sqlite3.Error as exc:  # locked for too long, disk errors: a miss
            log.warning("response_cache_unreadable", path=str(self.path), error=str(exc))
            row = None
        completion = self._decode(key, row)
        with self._lock:
            if completion is None:
                self._misses += 1
            else:
                self._hits += 1
        return completion

    def _decode(self, key: str, row: Any) -> Completion | None:
        if row is None:
            return None
        created, stored = row
        if not isinstance(created, (int, float)) or not isinstance(stored, (str, bytes)):
            self._count_corrupt(key)
            return None
        if self.expiry is not None and self._clock() - created > self.expiry:
            return None
        try:
            return Completion.model_validate_json(stored)
        except (ValidationError, ValueError):
            self._count_corrupt(key)
            return None

    def _count_corrupt(self, key: str) -> None:
        with self._lock:
            self._corrupt += 1
        log.warning("response_cache_bad_row", key=key)

    def store(self, key: str, completion: Completion) -> None:
        """Keep ``completion`` under ``key``, replacing what was there, in one
        transaction. Blocking: use :meth:`put` from async code. A write that fails
        (a full disk, a lock held too long) is logged and dropped: the cache is an
        optimisation, never a reason for a call to fail."""
        stored = completion.model_copy(
            # no ids: a replay makes no call, and the ids were those of another run's
            update={"cached": False, "timings": CallTimings(), "attempts": 1, "request_ids": ()}
        ).model_dump_json()
        created = self._clock()

        def write(db: sqlite3.Connection) -> None:
            def once() -> None:
                # the write lock before anything is read: a write that read first may be
                # refused at once, without waiting, when another process wrote meanwhile
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.execute(
                        "INSERT OR REPLACE INTO responses (key, created, completion) "
                        "VALUES (?, ?, ?)",
                        (key, created, stored),
                    )
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")

            _while_busy(once)

        try:
            self._with_db(write)
        except sqlite3.Error as exc:
            log.warning("response_cache_write_failed", path=str(self.path), error=str(exc))
            return
        with self._lock:
            self._writes += 1

    async def get(self, key: str) -> Completion | None:
        """:meth:`lookup` in a worker thread."""
        return await anyio.to_thread.run_sync(self.lookup, key)

    async def put(self, key: str, completion: Completion) -> None:
        """:meth:`store` in a worker thread."""
        await anyio.to_thread.run_sync(self.store, key, completion)

    def statistics(self) -> CacheStatistics:
        """Hits, misses, writes and corrupt entries since the cache was opened."""
        with self._lock:
            return CacheStatistics(self._hits, self._misses, self._writes, self._corrupt)

    def close(self) -> None:
        """Close the database (it reopens on the next use)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _prepare(db: sqlite3.Connection) -> None:
    """WAL mode and the table, the table under the write lock (two processes creating
    the file at once would otherwise both read, then both ask to write)."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(_SCHEMA)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _while_busy(work: Callable[[], None], *, tries: int = BUSY_TRIES) -> None:
    """``work``, again while SQLite says the file is locked by another connection in a
    way its own busy wait does not cover (changing the journal mode, a stale read)."""
    for attempt in range(tries):
        try:
            work()
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if attempt == tries - 1 or not ("locked" in text or "busy" in text):
                raise
            time.sleep(BUSY_PAUSE_S * (attempt + 1))


def _corrupt_file(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file itself is damaged (not merely busy)."""
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text or "corrupt" in text


class CachedAdapter(ModelAdapter):
    """``inner`` behind a :class:`ResponseCache`: a request answered before is answered
    from the cache; everything else is the inner adapter's. Errors are not cached."""

    def __init__(self, inner: ModelAdapter, cache: ResponseCache) -> None:
        self.inner = inner
        self.cache = cache
        self.supports_streaming = inner.supports_streaming  # type: ignore[misc]
        self._identity: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"CachedAdapter({self.inner!r})"

    def _key(self, messages: Sequence[Message], params: GenerationParams) -> str:
        if self._identity is None:
            self._identity = dict(self.inner.cache_identity())
        return cache_key(self._identity, messages, params)

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        key = self._key(messages, params)
        hit = await self.cache.get(key)
        if hit is not None:
            return _replayed(hit)
        completion = await self.inner.generate(messages, params)
        await self._keep(key, completion)
        return completion

    async def stream(
        self,
        messages: Sequence[Message],
        params: GenerationParams,
        on_text: Callable[[str], None],
    ) -> Completion:
        """A hit is handed to ``on_text`` whole, as one piece."""
        key = self._key(messages, params)
        hit = await self.cache.get(key)
        if hit is not None:
            if hit.text:
                on_text(hit.text)
            return _replayed(hit)
        completion = await self.inner.stream(messages, params, on_text)
        await self._keep(key, completion)
        return completion

    async def _keep(self, key: str, completion: Completion) -> None:
        if isinstance(completion, Completion):  # anything else fails the call above us
            with anyio.CancelScope(shield=True):  # an answer paid for is kept
                await self.cache.put(key, completion)

    # -- everything else is the inner adapter's ----------------------------------------

    def cache_identity(self) -> Mapping[str, Any]:
        return self.inner.cache_identity()

    def model_info(self) -> ModelInfo:
        return self.inner.model_info()

    def default_config(self) -> GenerationParams:
        return self.inner.default_config()

    def check_config(self, config: Mapping[str, Any]) -> GenerationParams:
        return self.inner.check_config(config)

    def validate_config(self, config: Mapping[str, Any]) -> ConfigValidation:
        return self.inner.validate_config(config)

    def check_configuration(self) -> None:
        self.inner.check_configuration()

    def usage_cost(self, usage: Usage) -> Cost | None:
        return self.inner.usage_cost(usage)

    def get_model_info(self) -> ModelInfoDict:
        return self.inner.get_model_info()

    def get_default_config(self) -> dict[str, Any]:
        return self.inner.get_default_config()

    def get_rate_limits(self) -> RateLimitsDict:
        return self.inner.get_rate_limits()

    async def count_tokens(self, text: str) -> int | None:
        return await self.inner.count_tokens(text)

    def rate_limits(self) -> RateLimits:
        return self.inner.rate_limits()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def connection_key(self) -> str | None:
        return self.inner.connection_key()

    def share_budgets(self, budgets: Budgets) -> None:
        self.inner.share_budgets(budgets)

    def size_pool(self, concurrency: int) -> None:
        self.inner.size_pool(concurrency)

    async def preflight(self) -> None:
        await self.inner.preflight()

    def should_retry(self, error: AdapterError) -> bool:
        return self.inner.should_retry(error)

    @property
    def supports_prompt_logprobs(self) -> bool:
        return self.inner.supports_prompt_logprobs

    def no_prompt_logprobs_reason(self) -> str:
        return self.inner.no_prompt_logprobs_reason()

    async def prompt_logprobs(self, prompt: str) -> PromptLogprobs:
        return await self.inner.prompt_logprobs(prompt)

    def __getattr__(self, name: str) -> Any:
        # what a backend offers beyond the contract (a tokenizer, its budget)
        if name.startswith("__") or name in ("inner", "cache", "_identity"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def _replayed(stored: Completion) -> Completion:
    """A stored answer as a call's result: cached, no attempt made, nothing timed."""
    return stored.model_copy(
        update={"cached": True, "attempts": 0, "timings": CallTimings(), "request_ids": ()}
    )
