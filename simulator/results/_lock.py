"""One writer per results file, whatever name the file is reached by.

A results file can be reached by more than one name: a symlink to it, a symlink to its
folder, a hard link. A lock keyed on the name as written lets two runs append to one
file, so :class:`ResultsLock` holds two operating-system locks:

- ``REAL.lock``, beside the file's resolved real path: every symlink leads to it, it
  exists before the results file does, and it records the holder's pid;
- an ``flock`` on the results file itself, its (device, inode): every hard link shares
  it. A file replaced in one step (a resume that rewrites it) is a new inode, so the
  writer locks the new one again (:meth:`ResultsLock.refresh`).

Both are released by the operating system when their process ends, even by SIGKILL,
so neither is ever stale.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from pathlib import Path
from typing import NamedTuple

from filelock import FileLock, Timeout

from convsim._errors import ResultsError
from convsim._log import get_logger

__all__ = ["ResultsLock", "lock_path"]

log = get_logger("convsim.results")

_CONTENTION = frozenset({errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK})


def lock_path(results: Path) -> Path:
    """``runs/x.jsonl`` -> ``runs/x.jsonl.lock`` beside its real path (symlinks
    resolved): what the one writer of a file holds."""
    real = Path(os.path.realpath(results))
    return real.with_name(real.name + ".lock")


class _FileId(NamedTuple):
    """Which file a name leads to: equal for every link to one file."""

    device: int
    inode: int


class _Pinned(NamedTuple):
    fd: int
    file: _FileId


if sys.platform == "win32":  # pragma: no cover - Windows keeps the lock by name only

    def _flock(fd: int) -> bool:
        raise OSError(errno.ENOSYS, "no flock on this platform")

else:
    import fcntl

    def _flock(fd: int) -> bool:
        """Lock ``fd`` exclusively at once; False if another open file holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _CONTENTION:
                return False
            raise
        return True


class ResultsLock:
    """One writer per results file: an exclusive lock on its identity (see the module).

    Two instances exclude each other, in one process as in two, through any symlink or
    hard link; one instance may be acquired again (it counts). The lock file stays after
    release (removing it would let two writers lock two files of one name).
    """

    def __init__(self, results: str | Path, *, required: bool = True) -> None:
        self.results = Path(results)
        self.path = lock_path(self.results)
        """The lock file; resolved again on each first acquire (a symlink may change)."""
        self.required = required
        """False: where no lock file can be made (a read-only folder) go on without one."""
        self._lock: FileLock | None = None
        self._pinned: _Pinned | None = None
        self._holds = 0

    @property
    def held(self) -> bool:
        return self._holds > 0

    def acquire(self) -> None:
        """Take the lock at once, or raise ResultsError saying who holds it."""
        if self._holds:
            self._holds += 1
            return
        self.path = lock_path(self.results)
        self._lock = self._lock_by_name()
        try:
            self._pin()
        except BaseException:
            self._release_name()
            raise
        self._holds = 1
        if self._lock is not None:
            with contextlib.suppress(OSError):  # who holds it is a courtesy, not the lock
                self.path.write_text(f"{os.getpid()}\n", encoding="ascii")

    def refresh(self) -> None:
        """Lock the file the results path leads to now, while the lock is held: after
        the file is created, or replaced by a rewrite (a new inode)."""
        if not self._holds:
            raise ResultsError(f"{self.results}: ResultsLock.refresh() before acquire()")
        self._pin()

    def _pin(self) -> None:
        """Lock the file itself; nothing to lock while there is no file."""
        try:
            # non-blocking: a FIFO named as the results file must not hang the open
            fd = os.open(self.results, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return  # no file yet, or one that cannot be read: what uses it next says so
        info = os.fstat(fd)
        file = _FileId(info.st_dev, info.st_ino)
        if not stat.S_ISREG(info.st_mode) or (
            self._pinned is not None and self._pinned.file == file
        ):
            os.close(fd)  # not a file of its own (a device), or the one held already
            return
        try:
            free = _flock(fd)
        except OSError as exc:
            os.close(fd)
            # a platform or file system without flock: the lock by name still holds
            log.warning(
                "results_lock_by_name_only",
                path=str(self.results),
                reason=exc.strerror or str(exc),
                unguarded="hard links to the results file",
            )
            return
        if not free:
            os.close(fd)
            raise ResultsError(
                f"{self.results}: is being written by another convsim run through another "
                "name of the same file (a hard link); wait for it to finish, or use another file"
            )
        self._unpin()
        self._pinned = _Pinned(fd, file)

    def release(self) -> None:
        if self._holds == 0:
            return
        self._holds -= 1
        if self._holds == 0:
            self._unpin()
            self._release_name()

    def _lock_by_name(self) -> FileLock | None:
        lock = FileLock(self.path, blocking=False, thread_local=False)
        try:
            lock.acquire()
        except Timeout:
            raise ResultsError(
                f"{self.results}: is being written by another convsim run "
                f"(pid {self._holder()}?); wait for it to finish, or use another file"
            ) from None
        except OSError as exc:
            if not self.required:
                return None
            raise ResultsError(
                f"{self.results}: cannot write results: cannot make its lock file "
                f"{self.path}: {exc.strerror or exc}"
            ) from None
        return lock

    def _release_name(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _unpin(self) -> None:
        if self._pinned is not None:
            os.close(self._pinned.fd)  # closing the last descriptor releases its flock
            self._pinned = None

    def _holder(self) -> str:
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return "unknown"
        return text if text.isdigit() else "unknown"

    def __del__(self) -> None:
        # dropped while held: free the file, as FileLock frees the lock file
        if getattr(self, "_pinned", None) is not None:
            self._unpin()

    def __enter__(self) -> ResultsLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
