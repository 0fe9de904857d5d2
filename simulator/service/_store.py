"""The service's durable state in SQLite: API keys (hashed), jobs and their pairs.

Keys are random tokens shown once (or an operator's own, imported); only their SHA-256
is stored. A job's model arguments may hold a provider key: they are stored encrypted
(Fernet, with a secret kept in a file beside the database, readable by its owner only),
never in plain text. A job runs one or more (model, task) pairs; each pair has a row of
its own (state, counts, cost), and the job's counts and cost are their sums.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._plural import counted

__all__ = ["Store", "JobRow", "JobProgress", "KeyRow", "PairRow", "hash_key", "MIN_KEY_CHARS"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    key_name TEXT NOT NULL,
    state TEXT NOT NULL,
    request TEXT NOT NULL,
    secret_args BLOB,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (key_name, created);
"""

TENANCY = """
ALTER TABLE keys ADD COLUMN limits TEXT NOT NULL DEFAULT '{}';
ALTER TABLE keys ADD COLUMN spent_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cost_usd REAL;
ALTER TABLE jobs ADD COLUMN upload_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN upload_removed REAL;
ALTER TABLE jobs ADD COLUMN done INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN starts INTEGER NOT NULL DEFAULT 0;
"""

TOTALS = """
ALTER TABLE jobs ADD COLUMN total INTEGER;
"""

PAIRS = """
CREATE TABLE IF NOT EXISTS pairs (
    job_id TEXT NOT NULL,
    pair INTEGER NOT NULL,
    state TEXT NOT NULL,
    total INTEGER,
    done INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL,
    started REAL,
    finished REAL,
    error TEXT,
    PRIMARY KEY (job_id, pair)
);
"""

SCHEMA_VERSION = 4
MIGRATIONS = [SCHEMA, TENANCY, TOTALS, PAIRS]
"""``MIGRATIONS[n]`` takes a database from schema ``n`` to ``n + 1`` (SQLite's
``user_version``); a change of schema appends a step, never edits one."""

ACTIVE = ("queued", "running")
MIN_KEY_CHARS = 8
"""The shortest key an operator may import (a made key has 47 characters)."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class JobProgress:
    """What a job's results file holds so far."""

    done: int = 0
    failed: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class PairRow:
    """One (model, task) pair of a job: its state and what its results file holds."""

    job_id: str
    pair: int
    state: str
    total: int | None
    """The conversations the pair runs (trials included), fixed when the job was taken."""
    done: int
    failed: int
    cost_usd: float | None
    started: float | None
    finished: float | None
    error: str | None


@dataclass(frozen=True)
class KeyRow:
    name: str
    created: float
    revoked: float | None
    limits: dict[str, int]
    """This key's own limits (the rest are the server's)."""
    spent_usd: float
    """What this key's jobs cost, as priced by their adapters."""


@dataclass(frozen=True)
class JobRow:
    id: str
    key_name: str
    state: str
    request: dict[str, Any]
    """The job as asked, secrets left out (they are in ``secret_args``, encrypted)."""
    secret_args: bytes | None
    created: float
    started: float | None
    finished: float | None
    error: str | None
    cost_usd: float | None = None
    done: int = 0
    """Conversations finished DONE so far (as last recorded)."""
    failed: int = 0
    """Conversations FAILED or TIMED_OUT so far."""
    starts: int = 0
    """How many times the job was started (a restarted server starts it again)."""
    upload_bytes: int = 0
    """The size of the job's uploaded pack (0: a bundled pack)."""
    upload_removed: float | None = None
    total: int | None = None
    """The conversations the job runs, as its run counted them (recorded results
    included); None before its run began."""


class Store:
    """One SQLite database; every call opens its own connection (WAL: readers and the
    one writer do not block each other), so the store can be used from any thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.parent.exists():
            raise ConfigError(f"{self.path}: its folder does not exist")
        # keys' hashes and sealed arguments: the owner's alone (SQLite gives its -wal and
        # -shm files the database's mode)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(self.path, 0o600)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ConfigError(
                    f"{self.path} was written by a newer convsim (schema {version}; this one "
                    f"knows {SCHEMA_VERSION}): upgrade convsim"
                )
            for step in range(version, SCHEMA_VERSION):  # migrations, in order, each whole
                db.executescript(
                    f"BEGIN; {MIGRATIONS[step]} PRAGMA user_version = {step + 1}; COMMIT;"
                )

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        return db

    # -- secrets ------------------------------------------------------------------------

    def _fernet(self) -> Any:
        with needs_extra("service", "the service's sealed job arguments"):
            from cryptography.fernet import Fernet

        secret = self.path.with_name(self.path.name + ".secret")
        if not secret.exists():
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(Fernet.generate_key())
        return Fernet(secret.read_bytes())

    def seal(self, values: Mapping[str, Any]) -> bytes | None:
        """``values`` (JSON) encrypted; None for nothing to hide."""
        return self._fernet().encrypt(json.dumps(values).encode()) if values else None

    def unseal(self, blob: bytes | None) -> dict[str, Any]:
        if not blob:
            return {}
        data: dict[str, Any] = json.loads(self._fernet().decrypt(blob))
        return data

    # -- keys ---------------------------------------------------------------------------

    def create_key(self, name: str, key: str | None = None) -> str:
        """A new key for ``name``, returned once (only its hash is kept); ``key`` imports
        one the operator chose or another system issued instead of making one.

        Raises:
            ConfigError: the name is taken, or ``key`` is too short or holds spaces.
        """
        if key is None:
            key = "csk_" + secrets.token_urlsafe(32)
        elif len(key) < MIN_KEY_CHARS or not key.isprintable() or any(c.isspace() for c in key):
            raise ConfigError(
                f"a key must have at least {counted(MIN_KEY_CHARS, 'character')}, printable, "
                "without spaces"
            )
        with self._connect() as db:
            try:
                db.execute(
                    "INSERT INTO keys (name, hash, created) VALUES (?, ?, ?)",
                    (name, hash_key(key), time.time()),
                )
            except sqlite3.IntegrityError as exc:
                what = f"a key named {name!r}" if "keys.name" in str(exc) else "that key"
                raise ConfigError(f"{what} exists already") from None
        return key

    def revoke_key(self, name: str) -> None:
        with self._connect() as db:
            done = db.execute(
                "UPDATE keys SET revoked = ? WHERE name = ? AND revoked IS NULL",
                (time.time(), name),
            )
            if done.rowcount == 0:
                raise ConfigError(f"no active key named {name!r}")

    def list_keys(self) -> list[KeyRow]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM keys ORDER BY created").fetchall()
        return [_key(r) for r in rows]

    def key(self, name: str) -> KeyRow | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM keys WHERE name = ?", (name,)).fetchone()
        return None if row is None else _key(row)

    def set_limits(self, name: str, limits: dict[str, int]) -> None:
        """Replace the key's own limits (an empty dict: the server's apply)."""
        with self._connect() as db:
            done = db.execute(
                "UPDATE keys SET limits = ? WHERE name = ?", (json.dumps(limits), name)
            )
            if done.rowcount == 0:
                raise ConfigError(f"no key named {name!r}")

    def revoked_since(self, names: set[str]) -> set[str]:
        """Which of ``names`` are revoked (or gone)."""
        if not names:
            return set()
        with self._connect() as db:
            rows = db.execute(
                f"SELECT name FROM keys WHERE revoked IS NULL AND name IN "
                f"({', '.join('?' * len(names))})",
                sorted(names),
            ).fetchall()
        return names - {r["name"] for r in rows}

    def key_name(self, key: str) -> str | None:
        """The name of an active key, or None."""
        with self._connect() as db:
            row = db.execute(
                "SELECT name FROM keys WHERE hash = ? AND revoked IS NULL", (hash_key(key),)
            ).fetchone()
        return None if row is None else str(row["name"])

    # -- jobs ---------------------------------------------------------------------------

    def add_job(
        self,
        job_id: str,
        key_name: str,
        request: dict[str, Any],
        secret: bytes | None,
        *,
        upload_bytes: int = 0,
        pair_totals: Sequence[int] = (),
    ) -> None:
        """Store a queued job and its pairs (one row per ``pair_totals`` entry, each with
        the conversations it runs), in one transaction."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO jobs (id, key_name, state, request, secret_args, created, "
                "upload_bytes, total) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
                (job_id, key_name, json.dumps(request), secret, time.time(), upload_bytes,
                 sum(pair_totals) if pair_totals else None),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO pairs (job_id, pair, state, total) VALUES (?, ?, 'queued', ?)",
                [(job_id, index, total) for index, total in enumerate(pair_totals)],
            )
            db.execute("COMMIT")

    def record_progress(self, job_id: str, progress: JobProgress, *, pair: int = 0) -> None:
        """Set the counts and cost so far of the job's ``pair`` (a job stored before
        pairs existed: of the job), the job's as the sums of its pairs'; add the cost's
        change to its key's spending."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT key_name, cost_usd FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
            if row is not None:
                updated = db.execute(
                    "UPDATE pairs SET cost_usd = ?, done = ?, failed = ? "
                    "WHERE job_id = ? AND pair = ?",
                    (progress.cost_usd, progress.done, progress.failed, job_id, pair),
                )
                if updated.rowcount:
                    sums = db.execute(
                        "SELECT SUM(done), SUM(failed), SUM(COALESCE(cost_usd, 0)) FROM pairs "
                        "WHERE job_id = ?",
                        (job_id,),
                    ).fetchone()
                    progress = JobProgress(int(sums[0]), int(sums[1]), float(sums[2]))
                added = progress.cost_usd - (row["cost_usd"] or 0.0)
                db.execute(
                    "UPDATE jobs SET cost_usd = ?, done = ?, failed = ? WHERE id = ?",
                    (progress.cost_usd, progress.done, progress.failed, job_id),
                )
                db.execute(
                    "UPDATE keys SET spent_usd = spent_usd + ? WHERE name = ?",
                    (added, row["key_name"]),
                )
            db.execute("COMMIT")

    def set_total(self, job_id: str, total: int, *, pair: int = 0) -> None:
        """Record how many conversations the job's ``pair`` runs, once its run has
        counted them; the job's total is its pairs' sum (a job stored before pairs
        existed: ``total``)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            updated = db.execute(
                "UPDATE pairs SET total = ? WHERE job_id = ? AND pair = ?", (total, job_id, pair)
            )
            if updated.rowcount:
                total = db.execute(
                    "SELECT SUM(total) FROM pairs WHERE job_id = ?", (job_id,)
                ).fetchone()[0]
            db.execute("UPDATE jobs SET total = ? WHERE id = ?", (total, job_id))
            db.execute("COMMIT")

    def set_pair_state(
        self, job_id: str, pair: int, state: str, *, error: str | None = None
    ) -> None:
        """The pair's new state (running: its start time is kept from its first start)."""
        now = time.time()
        with self._connect() as db:
            if state == "running":
                db.execute(
                    "UPDATE pairs SET state = ?, started = COALESCE(started, ?) "
                    "WHERE job_id = ? AND pair = ?",
                    (state, now, job_id, pair),
                )
            else:
                db.execute(
                    "UPDATE pairs SET state = ?, finished = ?, error = ? "
                    "WHERE job_id = ? AND pair = ?",
                    (state, now, error, job_id, pair),
                )

    def end_pairs(self, job_id: str, state: str) -> None:
        """Set every pair of the job not yet finished to ``state`` (a cancelled job's)."""
        with self._connect() as db:
            db.execute(
                "UPDATE pairs SET state = ?, finished = ? WHERE job_id = ? "
                "AND state IN ('queued', 'running')",
                (state, time.time(), job_id),
            )

    def pairs(self, job_ids: Sequence[str]) -> dict[str, list[PairRow]]:
        """The pairs of each job, in order (a job stored before pairs existed has none)."""
        found: dict[str, list[PairRow]] = {job_id: [] for job_id in job_ids}
        with self._connect() as db:
            for start in range(0, len(job_ids), 500):  # SQLite's bound on parameters
                chunk = list(job_ids[start : start + 500])
                rows = db.execute(
                    f"SELECT * FROM pairs WHERE job_id IN ({', '.join('?' * len(chunk))}) "
                    "ORDER BY job_id, pair",
                    chunk,
                ).fetchall()
                for r in rows:
                    found[r["job_id"]].append(_pair(r))
        return found

    def started(self, job_id: str) -> int:
        """Mark the job running and count the start; return how many starts it had."""
        with self._connect() as db:
            db.execute(
                "UPDATE jobs SET state = 'running', started = COALESCE(started, ?), "
                "starts = starts + 1 WHERE id = ?",
                (time.time(), job_id),
            )
            row = db.execute("SELECT starts FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return 0 if row is None else int(row["starts"])

    def uploads(self, key_name: str | None = None) -> list[JobRow]:
        """Jobs whose uploaded pack is still kept (of one key, or of all)."""
        query = "SELECT * FROM jobs WHERE upload_bytes > 0 AND upload_removed IS NULL"
        args: list[Any] = []
        if key_name is not None:
            query += " AND key_name = ?"
            args.append(key_name)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY created", args).fetchall()
        return [_job(r) for r in rows]

    def upload_removed(self, job_id: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET upload_removed = ? WHERE id = ?", (time.time(), job_id))

    def set_state(self, job_id: str, state: str, *, error: str | None = None) -> None:
        now = time.time()
        with self._connect() as db:
            if state == "running":
                db.execute(
                    "UPDATE jobs SET state = ?, started = COALESCE(started, ?) WHERE id = ?",
                    (state, now, job_id),
                )
            else:
                db.execute(
                    "UPDATE jobs SET state = ?, finished = ?, error = ? WHERE id = ?",
                    (state, now, error, job_id),
                )

    def job(self, job_id: str) -> JobRow | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def jobs(
        self,
        key_name: str | None = None,
        states: tuple[str, ...] | None = None,
        *,
        newest: int | None = None,
    ) -> list[JobRow]:
        """Jobs in the order they were created (only the ``newest`` ones, if given)."""
        query = "SELECT * FROM jobs WHERE 1 = 1"
        args: list[Any] = []
        if key_name is not None:
            query += " AND key_name = ?"
            args.append(key_name)
        if states:
            query += f" AND state IN ({', '.join('?' * len(states))})"
            args.extend(states)
        query += " ORDER BY created DESC, rowid DESC"
        if newest is not None:
            query += " LIMIT ?"
            args.append(newest)
        with self._connect() as db:
            rows = db.execute(query, args).fetchall()
        return [_job(r) for r in reversed(rows)]


def _job(row: sqlite3.Row) -> JobRow:
    return JobRow(
        id=row["id"],
        key_name=row["key_name"],
        state=row["state"],
        request=json.loads(row["request"]),
        secret_args=row["secret_args"],
        created=row["created"],
        started=row["started"],
        finished=row["finished"],
        error=row["error"],
        cost_usd=row["cost_usd"],
        done=row["done"],
        failed=row["failed"],
        starts=row["starts"],
        upload_bytes=row["upload_bytes"],
        upload_removed=row["upload_removed"],
        total=row["total"],
    )


def _pair(row: sqlite3.Row) -> PairRow:
    return PairRow(
        job_id=row["job_id"],
        pair=row["pair"],
        state=row["state"],
        total=row["total"],
        done=row["done"],
        failed=row["failed"],
        cost_usd=row["cost_usd"],
        started=row["started"],
        finished=row["finished"],
        error=row["error"],
    )


def _key(row: sqlite3.Row) -> KeyRow:
    return KeyRow(
        name=row["name"],
        created=row["created"],
        revoked=row["revoked"],
        limits=json.loads(row["limits"]),
        spent_usd=row["spent_usd"],
    )
