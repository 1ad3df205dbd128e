"""Local-disk storage: unbuffered large writes, fsync on close, mmap range reads.

Durability follows the ``Storage`` contract: a file from ``open_write`` is on stable storage
when ``close()`` returns (``fsync=True``), ``replace`` is ``os.replace`` (atomic on POSIX), and
``sync_dir`` fsyncs the directory so the rename itself survives a crash.
"""

from __future__ import annotations

import errno
import io
import logging
import mmap
import os
import shutil
from typing import TYPE_CHECKING, BinaryIO, cast

from trackpoint.storage._errors import map_os_error
from trackpoint.storage._regular import describe_local_path, open_regular
from trackpoint.storage.base import RangeReader, Storage, write_view
from trackpoint.storage.lock import (
    DirectoryLock,
    LockHolder,
    local_lock_holder,
    lock_local_directory,
)
from trackpoint.storage.url import local_path

if TYPE_CHECKING:
    from collections.abc import Buffer

__all__ = ["LocalFile", "LocalRangeReader", "LocalStorage"]

logger = logging.getLogger(__name__)

# os.link fails with these where the bytes can still be copied: another filesystem, a
# filesystem without hard links, or an inode at its link limit.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}

# Writes smaller than this are gathered in memory (many small tensors, index blocks); larger
# ones go straight from the caller's buffer to write(2), so a multi-GB array is never copied.
_BUFFER_SIZE = 1 << 20


class LocalFile(io.BufferedIOBase):
    """A write-only local file whose ``close()`` flushes and (optionally) fsyncs.

    Small writes are buffered; a write of ``_BUFFER_SIZE`` bytes or more flushes the buffer and
    is written directly from the caller's memory (zero-copy). Not thread-safe: one writer per
    file. ``OSError`` (e.g. ENOSPC) surfaces as a ``CheckpointError`` naming the path.
    """

    def __init__(self, path: str, *, fsync: bool) -> None:
        super().__init__()
        self.name = path
        self._fsync = fsync
        self._buffer = bytearray()
        self._position = 0
        self._failed = False  # a write failed: the contents are undefined, close() only releases
        try:
            self._raw = io.FileIO(path, "wb")
        except OSError as exc:
            raise map_os_error(exc, path, "opening for write") from exc

    # -- io protocol ------------------------------------------------------------------
    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def tell(self) -> int:
        return self._position

    def write(self, data: Buffer) -> int:
        view = write_view(data, self.name, closed=self.closed)
        n = view.nbytes
        if len(self._buffer) + n <= _BUFFER_SIZE:
            self._buffer += view
        else:
            self._flush_buffer()
            if n >= _BUFFER_SIZE:
                self._write_all(view)
            else:
                self._buffer += view
        self._position += n
        return n

    def flush(self) -> None:
        if not self.closed:
            self._flush_buffer()

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._failed:
                return
            self._flush_buffer()
            if self._fsync:
                try:
                    os.fsync(self._raw.fileno())
                except OSError as exc:
                    raise map_os_error(exc, self.name, "syncing") from exc
        finally:
            self._buffer = bytearray()  # unwritable after a failure; IOBase.close() flushes
            self._raw.close()
            super().close()

    # -- helpers ------------------------------------------------------------------------
    def _flush_buffer(self) -> None:
        if self._buffer:
            self._write_all(memoryview(self._buffer))
            self._buffer = bytearray()

    def _write_all(self, view: memoryview) -> None:
        # write(2) may write fewer bytes than asked (Linux caps one call near 2 GiB).
        try:
            while view.nbytes:
                written = self._raw.write(view)
                if written is None:  # only for non-blocking files, which this is not
                    continue
                view = view[written:]
        except OSError as exc:
            self._failed = True
            self._buffer = bytearray()
            raise map_os_error(exc, self.name, "writing") from exc


class LocalRangeReader(RangeReader):
    """mmap-backed reads of one local file; ``read`` returns zero-copy views.

    ``read`` is thread-safe. Views handed out keep the mapping alive: if any are still
    referenced at ``close()``, the unmap is left to the garbage collector instead of
    invalidating memory a caller still uses.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # Regular files only, opened without blocking: a FIFO or device in a checkpoint's place
        # is refused here instead of hanging the reader (see trackpoint.storage._regular).
        fd = open_regular(local_path(path), name=path)
        try:
            self._size = os.fstat(fd).st_size
            # mmap cannot map an empty file; a zero-length read needs no mapping.
            self._mmap: mmap.mmap | None = (
                mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self._size else None
            )
        except OSError as exc:
            raise map_os_error(exc, path, "opening for read") from exc
        finally:
            os.close(fd)
        self._view = memoryview(self._mmap) if self._mmap is not None else memoryview(b"")

    @property
    def size(self) -> int:
        # docstring inherited
        return self._size

    def read(self, offset: int, length: int) -> memoryview:
        # docstring inherited
        self.check_range(offset, length)
        end = offset + length
        return self._view[offset:end]

    def mapped(self) -> memoryview:
        # docstring inherited
        return self._view

    def close(self) -> None:
        # docstring inherited
        self._view.release()
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # views still referenced: the mapping goes away with the last of them
            self._mmap = None


class LocalStorage(Storage):
    """Files on a local (POSIX) filesystem.

    Args:
        fsync: when true, ``open_write(...).close()`` fsyncs the file and ``sync_dir`` fsyncs
            the directory. Turn off only for scratch data.

    Thread-safe: every method works on its own file descriptors. Paths may carry a
    ``file://`` scheme, which is stripped.
    """

    def __init__(self, *, fsync: bool = True) -> None:
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"LocalStorage(fsync={self.fsync})"

    @property
    def supports_atomic_rename(self) -> bool:
        # docstring inherited
        return True

    def open_write(self, path: str) -> BinaryIO:
        """Open ``path`` for writing, truncating it; parent directories must exist.

        A file whose bytes are shared with other names (a hard link made by :meth:`link`) is
        unlinked first, so writing it never changes another checkpoint's data file.
        """
        local = local_path(path)
        try:
            if os.stat(local).st_nlink > 1:
                os.remove(local)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise map_os_error(exc, path, "opening for write") from exc
        return cast(BinaryIO, LocalFile(local, fsync=self.fsync))

    def open_range_reader(self, path: str) -> RangeReader:
        # docstring inherited
        return LocalRangeReader(path)

    def exists(self, path: str) -> bool:
        # docstring inherited
        return os.path.exists(local_path(path))

    def describe(self, path: str) -> str:
        # docstring inherited
        return describe_local_path(local_path(path))

    def size(self, path: str) -> int:
        # docstring inherited
        try:
            return os.stat(local_path(path)).st_size
        except OSError as exc:
            raise map_os_error(exc, path, "reading the size of") from exc

    def replace(self, src: str, dst: str) -> None:
        # docstring inherited
        try:
            os.replace(local_path(src), local_path(dst))
        except OSError as exc:
            raise map_os_error(exc, src, "renaming", target=dst) from exc

    def link(self, src: str, dst: str) -> str:
        """A hard link ``dst`` to ``src``; a copy where linking is impossible.

        Linking fails across filesystems, on filesystems without hard links and at an inode's
        link limit; the bytes are then copied in the kernel (``copy_file_range``, which shares
        extents on filesystems that support reflinks, e.g. btrfs and XFS) and fsynced when
        ``fsync`` is set. See ``Storage.link``.
        """
        source, target = local_path(src), local_path(dst)
        try:
            if os.path.lexists(target):
                os.remove(target)  # link() refuses an existing name
            os.link(source, target)
            return "link"
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise map_os_error(exc, src, "linking", target=dst) from exc
            logger.debug("Cannot hard-link %s to %s (%s); copying", src, dst, exc.strerror)
        try:
            self._copy(source, target)
        except OSError as exc:
            raise map_os_error(exc, src, "copying", target=dst) from exc
        return "copy"

    def _copy(self, source: str, target: str) -> None:
        with open(open_regular(source, "copying"), "rb") as src, open(target, "wb") as dst:
            remaining = os.fstat(src.fileno()).st_size
            try:
                while remaining > 0:
                    copied = os.copy_file_range(src.fileno(), dst.fileno(), remaining)
                    if copied == 0:
                        break
                    remaining -= copied
            except (AttributeError, OSError):  # no copy_file_range here: copy in user space
                src.seek(0)
                dst.seek(0)
                dst.truncate()
                shutil.copyfileobj(src, dst, 16 << 20)
            if self.fsync:
                os.fsync(dst.fileno())

    def link_count(self, path: str) -> int:
        # docstring inherited
        try:
            return os.stat(local_path(path)).st_nlink
        except OSError as exc:
            raise map_os_error(exc, path, "reading the link count of") from exc

    def remove(self, path: str, *, missing_ok: bool = True) -> None:
        # docstring inherited
        try:
            os.remove(local_path(path))
        except FileNotFoundError as exc:
            if not missing_ok:
                raise map_os_error(exc, path, "removing") from exc
        except OSError as exc:
            raise map_os_error(exc, path, "removing") from exc

    def remove_tree(self, path: str) -> None:
        # docstring inherited
        try:
            shutil.rmtree(local_path(path))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise map_os_error(exc, path, "removing the directory") from exc

    def list(self, path: str) -> list[str]:
        # docstring inherited
        try:
            return sorted(os.listdir(local_path(path)))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise map_os_error(exc, path, "listing") from exc

    def makedirs(self, path: str) -> None:
        # docstring inherited
        try:
            os.makedirs(local_path(path), exist_ok=True)
        except OSError as exc:
            raise map_os_error(exc, path, "creating the directory") from exc

    def sync_dir(self, path: str) -> None:
        """fsync directory ``path`` so renames and new entries in it survive a crash.

        A no-op when ``fsync`` is off or the platform cannot open directories (Windows).
        """
        if not self.fsync or not hasattr(os, "O_DIRECTORY"):
            return
        try:
            fd = os.open(local_path(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise map_os_error(exc, path, "syncing the directory") from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            raise map_os_error(exc, path, "syncing the directory") from exc
        finally:
            os.close(fd)

    def lock_directory(self, path: str) -> DirectoryLock:
        """Take ``flock`` on ``<path>/.trackpoint.lock``; see ``Storage.lock_directory``.

        The kernel enforces it between processes (NFS included where its locking works) and
        releases it when the holder exits or is killed: a crashed job needs no cleanup.
        """
        return lock_local_directory(local_path(path))

    def lock_holder(self, path: str) -> LockHolder | None:
        # docstring inherited
        return local_lock_holder(local_path(path))

    def join(self, *parts: str) -> str:
        # docstring inherited
        return os.path.join(*parts)

    def dirname(self, path: str) -> str:
        # docstring inherited
        return os.path.dirname(path)

    def basename(self, path: str) -> str:
        # docstring inherited
        return os.path.basename(path)
