"""An in-memory storage with fault injection: the test double shipped with the library.

Like httpx's ``MockTransport``, it lets tests (ours and users') run the whole save/restore
path without a disk and provoke failures on purpose: a full disk after N bytes
(:meth:`MemoryStorage.fail_writes_after`), any error before any operation
(:meth:`MemoryStorage.set_fault_hook`), or another process holding a directory's writer lock
(:meth:`MemoryStorage.set_lock_holder`). It behaves like a local filesystem by default
(directories must exist, renames are atomic, a file being written is visible as it grows) or
like an object store with ``supports_atomic_rename=False`` (a file appears whole on close).
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, cast

from trackpoint.errors import InvalidArgumentError, NotFoundError
from trackpoint.storage._errors import map_os_error
from trackpoint.storage.base import RangeReader, Storage, write_view
from trackpoint.storage.lock import (
    LOCK_FILENAME,
    DirectoryLock,
    HeldLock,
    LockHolder,
    acquire_lock,
    directory_locked_error,
)

if TYPE_CHECKING:
    from collections.abc import Buffer

__all__ = ["FaultHook", "MemoryStorage"]

FaultHook = Callable[[str, str], None]
"""Called as ``hook(operation, path)`` before each operation; raise to make it fail.

Operations: ``open_write``, ``write``, ``close``, ``open_range_reader``, ``read``, ``exists``,
``size``, ``replace``, ``link``, ``remove``, ``remove_tree``, ``list``, ``makedirs``, ``sync_dir``,
``lock_directory``.
"""

_ROOTS = {"", ".", "/"}
_VERBS = {
    "open_write": "opening for write",
    "write": "writing",
    "close": "closing",
    "open_range_reader": "opening for read",
    "read": "reading",
    "exists": "checking for",
    "size": "reading the size of",
    "replace": "renaming",
    "link": "copying",
    "remove": "removing",
    "remove_tree": "removing the directory",
    "list": "listing",
    "makedirs": "creating the directory",
    "sync_dir": "syncing the directory",
    "lock_directory": "locking the directory",
}


def _norm(path: str) -> str:
    normal = posixpath.normpath(path) if path else ""
    return "" if normal in _ROOTS else normal


class _MemoryFile(io.BufferedIOBase):
    def __init__(self, storage: MemoryStorage, path: str, content: bytearray) -> None:
        super().__init__()
        self.name = path
        self._storage = storage
        self._content = content

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return len(self._content)

    def write(self, data: Buffer) -> int:
        view = write_view(data, self.name, closed=self.closed)
        self._storage._fault("write", self.name)
        self._storage._append(self.name, self._content, view)
        return view.nbytes

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._storage._fault("close", self.name)
            self._storage._commit(self.name, self._content)
        finally:
            super().close()


class _MemoryRangeReader(RangeReader):
    def __init__(self, storage: MemoryStorage, path: str, content: bytes) -> None:
        self.path = path
        self._storage = storage
        self._view = memoryview(content)

    @property
    def size(self) -> int:
        return self._view.nbytes

    def read(self, offset: int, length: int) -> memoryview:
        self._storage._fault("read", self.path)
        self.check_range(offset, length)
        return self._view[offset : offset + length]


class _MemoryLock(HeldLock):
    """A directory lock of one ``MemoryStorage``: exclusive within this process only."""

    def __init__(self, storage: MemoryStorage, directory: str) -> None:
        super().__init__(directory, LockHolder.current())
        self.storage = storage  # keeps the storage (whose id is in the registry key) alive

    def release(self) -> None:
        # docstring inherited; nothing outside this process to give back
        pass


class MemoryStorage(Storage):
    """Files and directories in a dict; thread-safe; with fault injection for tests.

    Args:
        supports_atomic_rename: true (default) behaves like a local disk; false like an
            object store (files appear on close, the saver uses its ``.part`` scheme).
        fsync: recorded only; ``fsync_count`` counts file closes and ``sync_dir`` calls that
            would have synced, so tests can check the flag is honoured.

    A reader sees the file as it was when ``open_range_reader`` was called. Every method takes
    one lock, so concurrent calls from saver threads are safe.
    """

    def __init__(self, *, supports_atomic_rename: bool = True, fsync: bool = True) -> None:
        self.fsync = fsync
        self.fsync_count = 0
        self.bytes_written = 0
        self.bytes_copied = 0  # by link(): what an incremental save reused
        self._atomic_rename = supports_atomic_rename
        self._files: dict[str, bytearray] = {}
        self._dirs: set[str] = set()
        self._lock = threading.RLock()
        self._hook: FaultHook | None = None
        self._write_budget: int | None = None
        self._write_error: OSError | None = None
        self._foreign_locks: dict[str, LockHolder] = {}

    def __repr__(self) -> str:
        return f"MemoryStorage({len(self._files)} files, fsync={self.fsync})"

    # -- fault injection ------------------------------------------------------------------
    def fail_writes_after(self, n_bytes: int, exc: OSError | None = None) -> None:
        """Accept ``n_bytes`` more bytes across all files, then fail writes with ``exc``.

        The write that crosses the limit stores the bytes that fit, then raises, as a full disk
        does. ``exc`` defaults to ``OSError(ENOSPC)``; it reaches callers mapped to a
        ``CheckpointError`` naming the path ("No space left on device while writing ...").
        """
        with self._lock:
            self._write_budget = n_bytes
            self._write_error = exc or OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        """Call ``hook(operation, path)`` before every operation (see ``FaultHook``)."""
        with self._lock:
            self._hook = hook

    def set_lock_holder(self, path: str, holder: LockHolder | None) -> None:
        """Pretend ``holder`` (another process) holds directory ``path``'s lock; None frees it.

        While set, ``lock_directory(path)`` fails as it would against a live other writer and
        ``lock_holder(path)`` names ``holder``.
        """
        with self._lock:
            if holder is None:
                self._foreign_locks.pop(_norm(path), None)
            else:
                self._foreign_locks[_norm(path)] = holder

    def clear_faults(self) -> None:
        """Remove the write limit and the fault hook."""
        with self._lock:
            self._write_budget = None
            self._write_error = None
            self._hook = None

    def _fault(self, operation: str, path: str) -> None:
        hook = self._hook
        if hook is None:
            return
        try:
            hook(operation, path)
        except OSError as exc:
            raise map_os_error(exc, path, _VERBS.get(operation, operation)) from exc

    # -- file internals -------------------------------------------------------------------
    def _append(self, path: str, content: bytearray, view: memoryview) -> None:
        with self._lock:
            budget = self._write_budget
            if budget is not None and view.nbytes > budget:
                content += view[:budget]
                self.bytes_written += budget
                self._write_budget = 0
                error = self._write_error or OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                raise map_os_error(error, path, "writing") from error
            content += view
            self.bytes_written += view.nbytes
            if budget is not None:
                self._write_budget = budget - view.nbytes

    def _commit(self, path: str, content: bytearray) -> None:
        with self._lock:
            if self.fsync:
                self.fsync_count += 1
            if not self._atomic_rename:
                self._files[_norm(path)] = content

    def _check_parent(self, path: str, action: str) -> None:
        # Object stores have no directories; a local disk needs the parent to exist.
        parent = _norm(posixpath.dirname(_norm(path)))
        if self._atomic_rename and parent and parent not in self._dirs:
            raise NotFoundError(
                f"No such directory {parent} while {action} {path}; call makedirs first",
                path=path,
            )

    # -- Storage --------------------------------------------------------------------------
    @property
    def supports_atomic_rename(self) -> bool:
        # docstring inherited
        return self._atomic_rename

    def open_write(self, path: str) -> BinaryIO:
        # docstring inherited
        self._fault("open_write", path)
        key = _norm(path)
        with self._lock:
            self._check_parent(path, "opening for write")
            if key in self._dirs or not key:
                raise InvalidArgumentError(f"{path} is a directory, not a file", path=path)
            content = bytearray()
            if self._atomic_rename:  # local-disk behaviour: truncated now, grows as written
                self._files[key] = content
        return cast(BinaryIO, _MemoryFile(self, path, content))

    def open_range_reader(self, path: str) -> RangeReader:
        # docstring inherited
        self._fault("open_range_reader", path)
        with self._lock:
            content = self._files.get(_norm(path))
            if content is None:
                raise NotFoundError(f"No such file while opening for read {path}", path=path)
            return _MemoryRangeReader(self, path, bytes(content))

    def exists(self, path: str) -> bool:
        # docstring inherited
        self._fault("exists", path)
        key = _norm(path)
        with self._lock:
            if not key or key in self._files or key in self._dirs:
                return True
            return any(f.startswith(key + "/") for f in self._files)  # implied by its files

    def describe(self, path: str) -> str:
        # docstring inherited
        with self._lock:
            if _norm(path) in self._files:
                return "a regular file"
        return "a directory" if self.exists(path) else "a missing path"

    def size(self, path: str) -> int:
        # docstring inherited
        self._fault("size", path)
        with self._lock:
            content = self._files.get(_norm(path))
            if content is None:
                raise NotFoundError(f"No such file while reading the size of {path}", path=path)
            return len(content)

    def replace(self, src: str, dst: str) -> None:
        # docstring inherited
        self._fault("replace", src)
        with self._lock:
            content = self._files.get(_norm(src))
            if content is None:
                raise NotFoundError(f"No such file while renaming {src} to {dst}", path=src)
            self._check_parent(dst, "renaming to")
            if _norm(dst) in self._dirs:
                raise InvalidArgumentError(f"cannot replace directory {dst} with a file", path=dst)
            self._files[_norm(dst)] = self._files.pop(_norm(src))

    def link(self, src: str, dst: str) -> str:
        """Copy ``src`` to ``dst`` (the ``"link"`` operation of the fault hook). See
        ``Storage.link``."""
        self._fault("link", src)
        with self._lock:
            content = self._files.get(_norm(src))
            if content is None:
                raise NotFoundError(f"No such file while copying {src} to {dst}", path=src)
            self._check_parent(dst, "copying to")
            self._files[_norm(dst)] = bytearray(content)
            self.bytes_copied += len(content)
        return "copy"

    def remove(self, path: str, *, missing_ok: bool = True) -> None:
        # docstring inherited
        self._fault("remove", path)
        with self._lock:
            if self._files.pop(_norm(path), None) is None and not missing_ok:
                raise NotFoundError(f"No such file while removing {path}", path=path)

    def remove_tree(self, path: str) -> None:
        # docstring inherited
        self._fault("remove_tree", path)
        key = _norm(path)
        prefix = key + "/" if key else ""
        with self._lock:
            for name in [f for f in self._files if f == key or f.startswith(prefix)]:
                del self._files[name]
            self._dirs = {d for d in self._dirs if d != key and not d.startswith(prefix)}

    def list(self, path: str) -> list[str]:
        # docstring inherited
        self._fault("list", path)
        key = _norm(path)
        prefix = key + "/" if key else ""
        with self._lock:
            entries = [*self._files, *self._dirs]
        names = set()
        for entry in entries:
            if key and not entry.startswith(prefix):
                continue
            # Directories implied by deeper files count as entries, as on object stores.
            names.add(entry[len(prefix) :].lstrip("/").split("/", 1)[0])
        names.discard("")
        return sorted(names)

    def makedirs(self, path: str) -> None:
        # docstring inherited
        self._fault("makedirs", path)
        key = _norm(path)
        with self._lock:
            if key in self._files:
                raise InvalidArgumentError(f"{path} exists and is a file", path=path)
            while key and key not in _ROOTS:
                self._dirs.add(key)
                key = posixpath.dirname(key)

    def sync_dir(self, path: str) -> None:
        # docstring inherited
        self._fault("sync_dir", path)
        if self.fsync:
            with self._lock:
                self.fsync_count += 1

    def lock_directory(self, path: str) -> DirectoryLock:
        """Take directory ``path``'s writer lock: shared within this process, as on disk.

        Nothing outside this process can hold it, except as set by :meth:`set_lock_holder`.
        """
        self._fault("lock_directory", path)
        holder = self.lock_holder(path)
        if holder is not None:
            raise directory_locked_error(path, posixpath.join(path, LOCK_FILENAME), holder)
        self.makedirs(path)
        key = ("memory", str(id(self)), _norm(path))
        return acquire_lock(key, lambda: _MemoryLock(self, path))

    def lock_holder(self, path: str) -> LockHolder | None:
        # docstring inherited
        with self._lock:
            return self._foreign_locks.get(_norm(path))
