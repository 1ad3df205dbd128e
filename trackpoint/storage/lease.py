"""Best-effort writer leases for storages without locks (object stores: s3://, gs://, ...).

Object stores offer no lock a dead process gives back, so a writer records a *lease* instead:
the object ``<dir>/.trackpoint.lock`` holding its host, pid, start time, a random token and an
expiry time, renewed by a background thread every third of ``ttl`` while the lease is held and
deleted on release. Another writer refuses to start while a lease it finds is live, naming the
holder; it takes the lease over once it has expired (the holder died without releasing it; at
most ``ttl`` seconds after its last renewal), or at once if the holder ran on this host and its
process is gone.

What it does not guarantee, unlike the local ``flock``: two writers that start within the same
moment can both see no lease, both write theirs and both read their own back (object stores
have no compare-and-swap through fsspec), and a holder stalled for longer than ``ttl`` (a
suspended VM, a network partition) can lose its lease to another writer. A holder that loses
its lease finds out at its next save (``DirectoryLock.check`` raises), not before. The lease
thus stops the common mistake — a second job started on a directory a live job writes — not
every race. Deleting the lease object breaks it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from trackpoint.errors import FailedPreconditionError, NotFoundError
from trackpoint.storage.lock import (
    LOCK_FILENAME,
    DirectoryLock,
    HeldLock,
    LockHolder,
    acquire_lock,
    directory_locked_error,
    held_in_this_process,
)


class Storage(Protocol):
    """What a lease needs of a storage (``trackpoint.storage.base.Storage`` has it all); a
    Protocol, so this module does not import the one that uses it."""

    def join(self, *parts: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def read_bytes(self, path: str) -> bytes: ...
    def write_bytes(self, path: str, data: bytes | memoryview) -> None: ...
    def remove(self, path: str, *, missing_ok: bool = True) -> None: ...

__all__ = ["DEFAULT_LEASE_TTL", "lease_holder", "lock_with_lease"]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_TTL = 60.0
"""Seconds a lease stays live without renewal: how long a crashed holder blocks a successor."""


@dataclass(frozen=True, slots=True)
class _Lease:
    """The lease object's contents."""

    holder: LockHolder
    token: str
    expires: float


def _lease_path(storage: Storage, directory: str) -> str:
    return storage.join(directory, LOCK_FILENAME)


def _read(storage: Storage, path: str) -> _Lease | None:
    try:
        data = json.loads(storage.read_bytes(path) or b"null")
    except NotFoundError:
        return None
    except ValueError:
        logger.warning("ignoring the unreadable lease %s", path)
        return None
    holder = LockHolder.from_dict(data)
    try:
        token, expires = str(data["token"]), float(data["expires"])
    except (KeyError, TypeError, ValueError):
        holder = None
    if holder is None:
        logger.warning("ignoring the malformed lease %s", path)
        return None
    return _Lease(holder, token, expires)


def _write(storage: Storage, path: str, lease: _Lease) -> None:
    record = {**lease.holder.to_dict(), "token": lease.token, "expires": lease.expires}
    storage.write_bytes(path, json.dumps(record).encode("utf-8"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _is_live(lease: _Lease, now: float) -> bool:
    """True if ``lease``'s holder may still be writing."""
    if lease.expires <= now:
        return False
    if lease.holder.host == socket.gethostname():
        if lease.holder.pid == os.getpid():
            return False  # an earlier incarnation of this pid (a restarted container)
        return _pid_alive(lease.holder.pid)
    return True


def _held_detail(lease: _Lease) -> str:
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease.expires))
    return (
        f" Its lease is renewed while it runs and expires at {until} if it has died (leases "
        "on object stores are best effort; deleting the lease object breaks it)."
    )


class _LeaseLock(HeldLock):
    """A lease renewed by a daemon thread until released."""

    exclusive = False

    def __init__(
        self, storage: Storage, directory: str, path: str, lease: _Lease, ttl: float
    ) -> None:
        super().__init__(directory, lease.holder)
        self._storage = storage
        self._path = path
        self._lease = lease
        self._ttl = ttl
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_until_stopped, name="trackpoint-lease", daemon=True
        )
        self._thread.start()

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            try:
                current = _read(self._storage, self._path)
                if current is None or current.token != self._lease.token:
                    taken = f"by {current.holder}" if current else "(the lease object is gone)"
                    self._lost = f"another writer took the lease over {taken}"
                    return
                renewed = _Lease(self._lease.holder, self._lease.token, time.time() + self._ttl)
                _write(self._storage, self._path, renewed)
                self._lease = renewed
            except Exception as exc:  # keep trying until the lease runs out
                logger.warning("could not renew the lease %s: %s", self._path, exc)
                if time.time() > self._lease.expires:
                    self._lost = f"it could not be renewed before it expired ({exc})"
                    return

    def check(self) -> None:
        # docstring inherited
        if self._lost is not None:
            raise FailedPreconditionError(
                f"this process lost its lease {self._path} on {self.directory}: {self._lost}. "
                "Another writer may be saving into the directory; stop one of them.",
                path=self.directory,
            )

    def release(self) -> None:
        # docstring inherited
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)
        current = _read(self._storage, self._path)
        if current is not None and current.token == self._lease.token:
            self._storage.remove(self._path, missing_ok=True)

    def forget(self) -> None:
        # docstring inherited; the renewing thread does not exist in a forked child
        self._stop.set()


def _take(storage: Storage, directory: str, path: str, ttl: float) -> _LeaseLock:
    current = _read(storage, path)
    if current is not None and _is_live(current, time.time()):
        raise directory_locked_error(directory, path, current.holder, detail=_held_detail(current))
    holder = LockHolder.current()
    ours = _Lease(holder, uuid.uuid4().hex, holder.started + ttl)
    storage.makedirs(directory)
    _write(storage, path, ours)
    winner = _read(storage, path)
    if winner is None or winner.token != ours.token:  # another writer wrote after us
        if winner is None:
            raise FailedPreconditionError(
                f"Cannot save checkpoints in {directory}: its lease {path} vanished right after "
                "this process wrote it; another writer may be starting there",
                path=directory,
            )
        raise directory_locked_error(directory, path, winner.holder, detail=_held_detail(winner))
    return _LeaseLock(storage, directory, path, ours, ttl)


def lock_with_lease(
    storage: Storage, directory: str, *, ttl: float = DEFAULT_LEASE_TTL
) -> DirectoryLock:
    """Take a best-effort lease on ``directory`` in ``storage`` (see the module doc).

    Raises:
        FailedPreconditionError: a live lease of another writer exists (names its holder).
        CheckpointError: the lease object cannot be read or written.
    """
    path = _lease_path(storage, directory)
    return acquire_lock(("lease", path), lambda: _take(storage, directory, path, ttl))


def lease_holder(storage: Storage, directory: str) -> LockHolder | None:
    """The holder of a live lease on ``directory`` other than this process, or None."""
    path = _lease_path(storage, directory)
    if held_in_this_process(("lease", path)):
        return None
    current = _read(storage, path)
    if current is None or not _is_live(current, time.time()):
        return None
    return current.holder
