"""One writer per directory: the lock a saving process holds on its checkpoint directory.

A process that saves into a directory (a ``CheckpointManager``, ``Checkpoint.save``) first
takes the directory's lock through ``Storage.lock_directory``; a second process doing the same
fails at once with a ``FailedPreconditionError`` naming the holder (host, pid). Three kinds:

- local disks: ``flock(2)`` on ``<dir>/.trackpoint.lock`` (this module). The kernel releases
  it when the holder exits or is killed, so a crashed job needs no cleanup; the file records
  the holder's host, pid and start time for the error message and is removed on release.
- object stores: a best-effort lease object (:mod:`trackpoint.storage.lease`).
- :class:`~trackpoint.storage.MemoryStorage`: an in-process lock (the test double).

Within one process the lock is shared: every ``lock_directory`` call on a directory the process
already holds returns another :class:`DirectoryLock` handle on the same lock, and the lock is
released when the last handle is (``release()``, ``with``, or garbage collection). So a
``CheckpointManager`` and a ``Checkpoint.save`` of one process never fail against each other.
After ``fork`` the child holds nothing (the parent keeps its locks).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trackpoint.errors import CheckpointError, FailedPreconditionError
from trackpoint.storage._errors import map_os_error
from trackpoint.storage._regular import file_kind, not_regular_error, open_regular

try:  # POSIX only; elsewhere local locks are held within this process only (logged)
    import fcntl

    _HAS_FLOCK = True
except ImportError:  # pragma: no cover - Windows
    _HAS_FLOCK = False

__all__ = [
    "LOCK_FILENAME",
    "DirectoryLock",
    "HeldLock",
    "LockHolder",
    "acquire_lock",
    "directory_locked_error",
    "held_in_this_process",
    "local_lock_holder",
    "lock_local_directory",
]

logger = logging.getLogger(__name__)

LOCK_FILENAME = ".trackpoint.lock"
"""Name of the lock file (local disks) or lease object (object stores) in a directory."""

# A failed exclusive attempt is retried only while the blocker is a reader probing the lock
# (``local_lock_holder``, a shared lock held for microseconds) or a holder that has not yet
# recorded its name: a real holder fails the attempt at once.
_ATTEMPTS = 50
_RETRY_SECONDS = 0.002
# A holder record is one short JSON line; a larger lock file is not one of ours.
_MAX_RECORD = 1 << 16


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds a directory's lock, as recorded in the lock file or lease."""

    host: str
    """``socket.gethostname()`` of the holder."""
    pid: int
    """Its process id on ``host``; 0 when the holder could not be identified."""
    started: float
    """When it took the lock, in seconds since the epoch."""

    @classmethod
    def current(cls) -> LockHolder:
        """This process, now."""
        return cls(socket.gethostname(), os.getpid(), time.time())

    @property
    def is_known(self) -> bool:
        return self.pid > 0

    def is_this_process(self) -> bool:
        return self.host == socket.gethostname() and self.pid == os.getpid()

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started}

    @classmethod
    def from_dict(cls, data: Any) -> LockHolder | None:
        """The holder a lock file's JSON names, or None if it names none (empty, garbage)."""
        try:
            return cls(str(data["host"]), int(data["pid"]), float(data["started"]))
        except (KeyError, TypeError, ValueError):
            return None

    def __str__(self) -> str:
        if not self.is_known:
            return "a process that has not recorded its name yet"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"process {self.pid} on host {self.host} (since {since})"


_UNKNOWN = LockHolder("unknown", 0, 0.0)


def directory_locked_error(
    directory: str, lock_path: str, holder: LockHolder, *, detail: str = ""
) -> FailedPreconditionError:
    """The error for a directory whose lock another writer holds; names holder and the fix."""
    return FailedPreconditionError(
        f"Cannot save checkpoints in {directory}: another writer holds its lock {lock_path}: "
        f"{holder}.{detail} Only one process may write checkpoints into a directory: stop the "
        "other writer, or save into another directory. Reading and restoring are not affected.",
        path=directory,
    )


class HeldLock(ABC):
    """A directory lock this process holds; shared by all of its :class:`DirectoryLock` handles.

    Note for implementers: ``release`` and ``forget`` are called with the process-wide registry
    lock held, exactly once, after the last handle is gone (``forget`` instead of ``release`` in
    a forked child, which must not release the parent's lock).
    """

    exclusive: bool = True
    """True where the system enforces the lock (flock); False for a best-effort lease."""

    def __init__(self, directory: str, holder: LockHolder) -> None:
        self.directory = directory
        self.holder = holder
        self.handles = 0
        self.forgotten = False

    def check(self) -> None:  # noqa: B027 - nothing to verify unless the lock can be lost
        """Raise ``FailedPreconditionError`` if the lock was lost (a lease taken over)."""

    @abstractmethod
    def release(self) -> None:
        """Give the lock up."""

    def forget(self) -> None:  # noqa: B027 - most locks have nothing to drop
        """In a forked child: drop what the child inherited, leaving the parent's lock held."""


_registry: dict[tuple[str, ...], HeldLock] = {}
_registry_lock = threading.RLock()


def _drop(key: tuple[str, ...], held: HeldLock) -> None:
    """One handle fewer; the last one releases the lock (a finalizer: never raises)."""
    with _registry_lock:
        if held.forgotten:
            return
        held.handles -= 1
        if held.handles > 0:
            return
        if _registry.get(key) is held:
            del _registry[key]
        try:
            held.release()
        except Exception as exc:  # a finalizer, possibly at exit: log, do not raise
            logger.error("could not release the lock of %s: %s", held.directory, exc)


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.RLock()  # another thread may have held it at the fork
    for held in _registry.values():
        held.forgotten = True
        held.forget()
    _registry.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class DirectoryLock:
    """A handle on the writer lock of one directory, from ``Storage.lock_directory``.

    Several handles of one process share the lock, which is released with the last handle:
    call :meth:`release` (idempotent) or use the handle as a context manager; a handle that is
    garbage collected, or still open at interpreter exit, is released then. Thread-safe.

    Example::

        with LocalStorage().lock_directory("/ckpts"):
            ...  # no other process can take /ckpts' lock meanwhile
    """

    def __init__(self, key: tuple[str, ...], held: HeldLock) -> None:
        self._held = held
        self._key = key
        self._finalizer = weakref.finalize(self, _drop, key, held)

    @property
    def directory(self) -> str:
        return self._held.directory

    @property
    def key(self) -> tuple[str, ...]:
        """Identifies the lock process-wide: handles with equal keys share one lock."""
        return self._key

    @property
    def holder(self) -> LockHolder:
        """This process, as recorded in the lock."""
        return self._held.holder

    @property
    def exclusive(self) -> bool:
        """True where the system enforces the lock; False for a best-effort object-store lease."""
        return self._held.exclusive

    @property
    def released(self) -> bool:
        return not self._finalizer.alive or self._held.forgotten

    def check(self) -> None:
        """Make sure this handle still holds the lock; call before writing.

        Raises:
            FailedPreconditionError: the handle was released, this is a forked child, or the
                lock was lost (a lease that another writer took over; a lock file deleted).
        """
        if self.released:
            raise FailedPreconditionError(
                f"the lock of {self.directory} is released (or was inherited by a forked "
                "process); take it again with lock_directory before writing",
                path=self.directory,
            )
        self._held.check()

    def release(self) -> None:
        """Give up this handle; the lock itself goes with the process's last handle."""
        self._finalizer()

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __copy__(self) -> DirectoryLock:
        """Another handle on the same lock (a copied owner holds the lock too)."""
        if self.released:
            raise FailedPreconditionError(
                f"cannot copy a released lock of {self.directory}", path=self.directory
            )
        return acquire_lock(self._key, lambda: self._held)

    def __deepcopy__(self, memo: dict[int, Any]) -> DirectoryLock:
        return self.__copy__()

    def __repr__(self) -> str:
        state = "released" if self.released else f"held by {self.holder}"
        return f"DirectoryLock({self.directory!r}, {state})"


def acquire_lock(key: tuple[str, ...], take: Callable[[], HeldLock]) -> DirectoryLock:
    """A new handle on the lock registered under ``key``, calling ``take()`` if there is none.

    ``key`` identifies the directory process-wide (e.g. ``("local", realpath)``); ``take``
    acquires the real lock and raises ``FailedPreconditionError`` if another process holds it.
    """
    with _registry_lock:
        held = _registry.get(key)
        if held is None:
            held = take()
            _registry[key] = held
        held.handles += 1
        return DirectoryLock(key, held)


def held_in_this_process(key: tuple[str, ...]) -> bool:
    """True if this process holds the lock registered under ``key``."""
    with _registry_lock:
        return key in _registry


# -- local disks: flock(2) -----------------------------------------------------------------


class _LocalLock(HeldLock):
    """An exclusive ``flock`` on ``<dir>/.trackpoint.lock``, through one file descriptor."""

    def __init__(self, directory: str, holder: LockHolder, path: str, fd: int | None) -> None:
        super().__init__(directory, holder)
        self.path = path
        self.fd = fd
        self.identity = _file_identity(fd) if fd is not None else None

    def check(self) -> None:
        # docstring inherited
        if self.identity is None:
            return
        try:
            now = _path_identity(self.path)
        except OSError:
            now = None
        if now != self.identity:
            raise FailedPreconditionError(
                f"the lock file {self.path} was deleted or replaced while this process held "
                "it, so another process may be writing into the directory too; stop the other "
                "writer and create the CheckpointManager again",
                path=self.path,
            )

    def release(self) -> None:
        # docstring inherited
        if self.fd is None:
            return
        try:
            # Remove the file while still holding it: a process that opened it meanwhile
            # notices (its inode is no longer at the path) and opens the path again.
            if _path_identity(self.path) == self.identity:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None

    def forget(self) -> None:
        # docstring inherited; the parent's descriptor keeps the lock of the shared file
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _file_identity(fd: int) -> tuple[int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


def _path_identity(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _read_holder(path: str) -> LockHolder | None:
    try:
        with open(open_regular(path, "reading the lock file"), "rb") as f:
            return LockHolder.from_dict(json.loads(f.read(_MAX_RECORD) or b"null"))
    except (OSError, ValueError, CheckpointError):  # not a regular file: no record to show
        return None


def _exclusive_holder(fd: int, path: str) -> LockHolder | None:
    """Who holds ``fd``'s file exclusively, or None if only shared (probing) locks block it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    # The holder writes its name right after locking; give it a moment to appear.
    for _ in range(_ATTEMPTS):
        holder = _read_holder(path)
        if holder is not None:
            return holder
        time.sleep(_RETRY_SECONDS)
    return _UNKNOWN


def _take_local(directory: str, path: str) -> _LocalLock:
    holder = LockHolder.current()
    if not _HAS_FLOCK:  # pragma: no cover - Windows
        logger.warning("no flock on this platform: %s is locked within this process only", path)
        return _LocalLock(directory, holder, path, None)
    for _ in range(_ATTEMPTS):
        try:
            # O_NONBLOCK: a FIFO planted under the lock file's name cannot make this wait.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
        except OSError as exc:
            raise map_os_error(exc, path, "opening the lock file") from exc
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise not_regular_error(path, file_kind(mode), "opening the lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _exclusive_holder(fd, path)
            os.close(fd)
            if other is not None:
                raise directory_locked_error(directory, path, other) from None
            time.sleep(_RETRY_SECONDS)  # only probed by a reader: try again
            continue
        except OSError as exc:
            os.close(fd)
            raise map_os_error(exc, path, "locking") from exc
        try:
            same = _path_identity(path) == _file_identity(fd)
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it on release after we opened it: open it again
            os.close(fd)
            continue
        record = json.dumps(holder.to_dict()).encode("utf-8")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except OSError as exc:
            os.close(fd)
            raise map_os_error(exc, path, "writing the lock file") from exc
        return _LocalLock(directory, holder, path, fd)
    raise FailedPreconditionError(
        f"Cannot take the lock {path}: it kept being replaced by other processes", path=path
    )


def lock_local_directory(directory: str) -> DirectoryLock:
    """Take the writer lock of local ``directory`` (created if missing); see the module doc.

    Raises:
        FailedPreconditionError: another process holds it (names host, pid and the fix).
        CheckpointError: the directory or lock file cannot be created (permissions, space).
    """
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise map_os_error(exc, directory, "creating the directory") from exc
    real = os.path.realpath(directory)
    path = os.path.join(real, LOCK_FILENAME)
    return acquire_lock(("local", real), lambda: _take_local(directory, path))


def local_lock_holder(directory: str) -> LockHolder | None:
    """The other process holding local ``directory``'s lock, or None (free, or held by us).

    Probes with a shared lock held for an instant, so it never blocks the holder.
    """
    real = os.path.realpath(directory)
    if not _HAS_FLOCK or held_in_this_process(("local", real)):
        return None
    path = os.path.join(real, LOCK_FILENAME)
    try:
        fd = open_regular(path, "probing the lock file")
    except CheckpointError:
        return None  # no lock file: nobody holds it (a file we cannot read: cannot tell)
    try:
        holder = _exclusive_holder(fd, path)
    finally:
        os.close(fd)
    if holder is not None and holder.is_this_process():
        return None  # taken by another thread of this process since we looked
    return holder
