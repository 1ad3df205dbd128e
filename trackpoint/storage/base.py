"""The byte-backend interface every storage implements.

Call order during a save (all calls come from trackpoint/saving and trackpoint/bundle):
``makedirs`` → ``open_write`` (one writer per file, possibly from several threads, each on its
own file) → ``replace`` (local) → ``sync_dir`` → ``remove``/``remove_tree`` for temporaries.
During a read: ``exists``/``size`` → ``open_range_reader`` → ``RangeReader.read`` many times
(thread-safe) → ``RangeReader.close``. A process that saves into a directory first takes its
writer lock with ``lock_directory`` (management and checkpoint layers) and holds it while it
saves there (one writer per directory, :mod:`trackpoint.storage.lock`).

Paths are plain strings in the storage's own syntax (a local path, or a URL for fsspec
backends); ``join``/``dirname``/``basename`` build them so callers never hard-code ``/``.
Implementations map backend errors to :mod:`trackpoint.errors` types at this boundary.
"""

from __future__ import annotations

import posixpath
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.storage.lease import lease_holder, lock_with_lease
from trackpoint.storage.lock import DirectoryLock, LockHolder

__all__ = ["RangeReader", "Storage", "write_view"]


class RangeReader(ABC):
    """Random-access reads of one file. ``read`` is thread-safe.

    For local files this is an mmap and ``read`` returns a zero-copy ``memoryview`` into it.
    The view is valid until ``close()``.
    """

    path: str

    @property
    @abstractmethod
    def size(self) -> int:
        """Size of the file in bytes."""

    @abstractmethod
    def read(self, offset: int, length: int) -> memoryview:
        """Return exactly ``length`` bytes at ``offset``.

        Raises:
            DataLossError: the file is shorter than ``offset + length``
                (message: "Requested N bytes but read M").
        """

    def mapped(self) -> memoryview | None:
        """The whole file as one zero-copy view if it is already in memory (an mmap), else None.

        Readers of many small tensors slice this instead of calling :meth:`read` per tensor.
        Valid until ``close()``, like the views ``read`` returns.
        """
        return None

    def check_range(self, offset: int, length: int) -> None:
        """Raise the errors ``read`` documents for a request outside ``[0, size)``.

        Raises:
            InvalidArgumentError: a negative offset or length.
            DataLossError: the file ends before ``offset + length`` (it is truncated).
        """
        if offset < 0 or length < 0:
            raise InvalidArgumentError(
                f"invalid read of {length} bytes at offset {offset} in {self.path}", path=self.path
            )
        if offset + length > self.size:
            got = max(0, self.size - offset)
            raise DataLossError(
                f"Requested {length} bytes but read {got} at offset {offset} in {self.path} "
                f"(file size {self.size}); the file is truncated",
                path=self.path,
            )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the file (unmap, close handles)."""

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Storage(ABC):
    """Where checkpoint bytes live: local disk, an fsspec URL, or memory (tests).

    Durability: when ``fsync`` is true, a file returned by ``open_write`` is flushed to stable
    storage by ``close()``, and ``sync_dir`` makes renames and creations in a directory durable.
    Thread-safety: methods may be called concurrently on different paths.

    Note for implementers: ``supports_atomic_rename`` selects the commit protocol. When it is
    false (object stores) the saver writes shards under ``.part`` names next to the final files
    and writes the index object last; ``replace`` may then be a copy + delete.
    """

    fsync: bool = True

    # -- capabilities ---------------------------------------------------------------------
    @property
    @abstractmethod
    def supports_atomic_rename(self) -> bool:
        """True when ``replace`` is atomic (local POSIX filesystems)."""

    # -- abstract operations ------------------------------------------------------------
    @abstractmethod
    def open_write(self, path: str) -> BinaryIO:
        """Open ``path`` for writing, truncating it; parent directories must exist."""

    @abstractmethod
    def open_range_reader(self, path: str) -> RangeReader:
        """Open ``path`` for random-access reads.

        Raises:
            NotFoundError: ``path`` does not exist.
        """

    @abstractmethod
    def exists(self, path: str) -> bool:
        """True if a file or directory exists at ``path``."""

    @abstractmethod
    def size(self, path: str) -> int:
        """Size of the file at ``path`` in bytes (``NotFoundError`` if missing)."""

    @abstractmethod
    def replace(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, replacing ``dst``; atomic where supported."""

    @abstractmethod
    def remove(self, path: str, *, missing_ok: bool = True) -> None:
        """Delete the file ``path``."""

    @abstractmethod
    def remove_tree(self, path: str) -> None:
        """Delete the directory ``path`` and everything below it; no error if missing."""

    @abstractmethod
    def list(self, path: str) -> list[str]:
        """Names (not paths) of the entries directly under directory ``path``; [] if missing."""

    @abstractmethod
    def makedirs(self, path: str) -> None:
        """Create directory ``path`` and its parents; no error if it exists."""

    # -- derived operations -------------------------------------------------------------
    def lock_directory(self, path: str) -> DirectoryLock:
        """Take the writer lock of directory ``path`` (creating the directory if needed).

        One writer per directory: a second process asking for the lock of a directory another
        live process holds fails at once. Within a process the lock is shared: every call
        returns a new handle and the lock goes with the last handle released. By default this
        is a best-effort lease object (:mod:`trackpoint.storage.lease`, for object stores);
        ``LocalStorage`` overrides it with ``flock``, which the OS releases when the holder dies.

        Raises:
            FailedPreconditionError: another process holds the lock; the message names its
                host and pid.

        Note for implementers: override both this and :meth:`lock_holder` where the backend
        has a real lock; the lease needs only ``read_bytes``/``write_bytes``/``remove``.
        """
        return lock_with_lease(self, path)

    def lock_holder(self, path: str) -> LockHolder | None:
        """Who holds directory ``path``'s writer lock, if a live process other than this one."""
        return lease_holder(self, path)

    def sync_dir(self, path: str) -> None:  # noqa: B027 - no-op unless the backend has dirs
        """Make creations and renames inside directory ``path`` durable (no-op by default)."""

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def dirname(self, path: str) -> str:
        return posixpath.dirname(path)

    def basename(self, path: str) -> str:
        return posixpath.basename(path)

    def describe(self, path: str) -> str:
        """What ``path`` is, with its article, for messages: ``"a regular file"``, ``"a
        directory"``, ``"a missing path"``, ... (local disks also tell FIFOs, sockets,
        devices and dangling symbolic links apart). Never opens ``path``.
        """
        return "an existing path" if self.exists(path) else "a missing path"

    def read_bytes(self, path: str) -> bytes:
        """The whole file at ``path``."""
        with self.open_range_reader(path) as reader:
            return bytes(reader.read(0, reader.size))

    def write_bytes(self, path: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``path`` (durable on return when ``fsync`` is set)."""
        with self.open_write(path) as f:
            f.write(data)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` so readers see the old or the new file, never half."""
        with self.open_atomic(path) as out:
            out.write(data)

    def link(self, src: str, dst: str) -> str:
        """Make ``dst`` a file with the bytes of ``src``, sharing them where the backend can.

        Incremental saves (docs/incremental.md) reuse a data file of an earlier checkpoint this
        way: ``LocalStorage`` makes a hard link (both names then share one inode, and deleting
        either name leaves the other intact), object stores copy on the server. This default
        copies the bytes through this process. ``dst`` is replaced if it exists; it is durable
        on return when ``fsync`` is set. Neither file may be written in place afterwards (no
        trackpoint code does: saves write new files and rename them).

        Returns:
            How: ``"link"`` (shared, no bytes copied), ``"server-copy"`` (copied by the
            backend) or ``"copy"`` (copied through this process).

        Raises:
            NotFoundError: ``src`` does not exist.
        """
        with self.open_range_reader(src) as reader, self.open_write(dst) as out:
            step = 64 << 20
            for offset in range(0, reader.size, step):
                out.write(reader.read(offset, min(step, reader.size - offset)))
        return "copy"

    def link_count(self, path: str) -> int:
        """How many names share the bytes of ``path`` (hard links); 1 where nothing is shared.

        Raises:
            NotFoundError: ``path`` does not exist.
        """
        self.size(path)  # raises NotFoundError for a missing file
        return 1

    @contextmanager
    def open_atomic(self, path: str) -> Iterator[BinaryIO]:
        """A file to stream into that appears at ``path`` whole, or not at all.

        Uses a temporary name and ``replace`` where renames are atomic (the temporary file is
        removed if the block raises). Object stores upload whole objects already; there an
        object cut short by an error is removed (an older object at ``path`` goes with it).
        """
        if not self.supports_atomic_rename:
            try:
                with self.open_write(path) as out:
                    yield out
            except BaseException:
                self.remove(path, missing_ok=True)
                raise
            return
        tmp = f"{path}.tmp{uuid.uuid4().hex}"
        try:
            with self.open_write(tmp) as out:
                yield out
            self.replace(tmp, path)
        except BaseException:
            self.remove(tmp, missing_ok=True)
            raise
        self.sync_dir(self.dirname(path) or ".")


class DelegatingStorage(Storage):
    """A storage that passes every call to ``inner``; subclasses override what they watch.

    For wrappers that observe or redirect a few operations of a real backend (the atomic
    commit's index write, a restore's prefetched reads) and must forward everything else.
    """

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.fsync = inner.fsync

    @property
    def supports_atomic_rename(self) -> bool:
        # docstring inherited
        return self.inner.supports_atomic_rename

    def open_write(self, path: str) -> BinaryIO:
        # docstring inherited
        return self.inner.open_write(path)

    def open_range_reader(self, path: str) -> RangeReader:
        # docstring inherited
        return self.inner.open_range_reader(path)

    def exists(self, path: str) -> bool:
        # docstring inherited
        return self.inner.exists(path)

    def size(self, path: str) -> int:
        # docstring inherited
        return self.inner.size(path)

    def replace(self, src: str, dst: str) -> None:
        # docstring inherited
        self.inner.replace(src, dst)

    def remove(self, path: str, *, missing_ok: bool = True) -> None:
        # docstring inherited
        self.inner.remove(path, missing_ok=missing_ok)

    def remove_tree(self, path: str) -> None:
        # docstring inherited
        self.inner.remove_tree(path)

    def list(self, path: str) -> list[str]:
        # docstring inherited
        return self.inner.list(path)

    def makedirs(self, path: str) -> None:
        # docstring inherited
        self.inner.makedirs(path)

    def sync_dir(self, path: str) -> None:
        # docstring inherited
        self.inner.sync_dir(path)

    def describe(self, path: str) -> str:
        # docstring inherited
        return self.inner.describe(path)

    def link(self, src: str, dst: str) -> str:
        # docstring inherited
        return self.inner.link(src, dst)

    def link_count(self, path: str) -> int:
        # docstring inherited
        return self.inner.link_count(path)

    def lock_directory(self, path: str) -> DirectoryLock:
        # docstring inherited
        return self.inner.lock_directory(path)

    def lock_holder(self, path: str) -> LockHolder | None:
        # docstring inherited
        return self.inner.lock_holder(path)

    def join(self, *parts: str) -> str:
        # docstring inherited
        return self.inner.join(*parts)

    def dirname(self, path: str) -> str:
        # docstring inherited
        return self.inner.dirname(path)

    def basename(self, path: str) -> str:
        # docstring inherited
        return self.inner.basename(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


def write_view(data: Any, name: str, *, closed: bool) -> memoryview:
    """The bytes of ``data`` as a flat memoryview, without a copy, for a file's ``write``.

    Every backend's file object checks its input here, so they all refuse the same things.

    Raises:
        ValueError: the file is closed (as ``io`` files do).
        InvalidArgumentError: ``data`` is not C-contiguous (copying it silently would hide a
            needless copy of a large tensor).
    """
    if closed:
        raise ValueError(f"write to closed file {name}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise InvalidArgumentError(
            f"write to {name} needs a C-contiguous buffer; make the array contiguous",
            path=name,
        )
    return view.cast("B")
