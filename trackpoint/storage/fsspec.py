"""Storage on any fsspec filesystem: ``s3://``, ``gs://``, ``memory://``, ...

Object stores have no atomic rename, so ``supports_atomic_rename`` is false and the saver
commits by writing data objects first and the ``.index`` object last; ``replace`` is a copy
plus delete. An object becomes visible, whole, when the file from ``open_write`` is closed.

``fsspec`` is imported only here, and only when a URL is resolved (``from_url``), so
``import trackpoint`` never needs it.
"""

from __future__ import annotations

import io
import posixpath
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from trackpoint.errors import CheckpointError, DataLossError, InvalidArgumentError, NotFoundError
from trackpoint.storage._errors import map_os_error
from trackpoint.storage._regular import not_regular_error
from trackpoint.storage.base import RangeReader, Storage, write_view
from trackpoint.storage.url import split_scheme

if TYPE_CHECKING:
    from collections.abc import Buffer

    from fsspec import AbstractFileSystem

__all__ = ["FsspecFile", "FsspecRangeReader", "FsspecStorage"]


class FsspecFile(io.BufferedIOBase):
    """A write-only fsspec file that maps ``OSError`` to ``CheckpointError`` naming the path.

    The object is committed (uploaded) by ``close()``; fsspec buffers the bytes it uploads, so
    writes here copy, unlike :class:`~trackpoint.storage.local.LocalFile`.
    """

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        super().__init__()
        self.name = path
        try:
            self._file = fs.open(path, "wb")
        except OSError as exc:
            raise map_os_error(exc, path, "opening for write") from exc

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return int(self._file.tell())

    def write(self, data: Buffer) -> int:
        view = write_view(data, self.name, closed=self.closed)
        try:
            self._file.write(view)
        except OSError as exc:
            raise map_os_error(exc, self.name, "writing") from exc
        return view.nbytes

    def flush(self) -> None:
        # IOBase.close() calls flush() after our close() has closed the fsspec file.
        if self.closed or self._file.closed:
            return
        try:
            self._file.flush()
        except OSError as exc:
            raise map_os_error(exc, self.name, "writing") from exc

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._file.close()
        except OSError as exc:
            raise map_os_error(exc, self.name, "committing") from exc
        finally:
            super().close()


class FsspecRangeReader(RangeReader):
    """Byte-range reads with ``fs.cat_file(path, start, end)``: one request per ``read``.

    Thread-safe as far as the filesystem's ``cat_file`` is (fsspec's are). Views returned by
    ``read`` own their bytes and stay valid after ``close()``.
    """

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.path = path
        self._fs = fs
        try:
            info = fs.info(path)
        except OSError as exc:
            raise map_os_error(exc, path, "opening for read") from exc
        kind = info.get("type")
        if kind not in (None, "file"):  # a directory; "other": a FIFO or device (local fs)
            what = "a directory" if kind == "directory" else f"of fsspec type {kind!r}"
            raise not_regular_error(path, what, "opening for read")
        self._size = int(info["size"])

    @property
    def size(self) -> int:
        # docstring inherited
        return self._size

    def read(self, offset: int, length: int) -> memoryview:
        # docstring inherited
        self.check_range(offset, length)
        if length == 0:
            return memoryview(b"")
        try:
            data = self._fs.cat_file(self.path, start=offset, end=offset + length)
        except OSError as exc:
            raise map_os_error(exc, self.path, "reading") from exc
        if len(data) != length:  # the object changed under us since open
            raise DataLossError(
                f"Requested {length} bytes but read {len(data)} at offset {offset} in "
                f"{self.path}; the object was truncated or replaced while reading",
                path=self.path,
            )
        return memoryview(data)


class FsspecStorage(Storage):
    """Storage on an fsspec filesystem; paths are URLs (``s3://bucket/dir/ckpt-1.index``).

    Args:
        fs: the filesystem, e.g. from ``fsspec.filesystem("s3", ...)``.
        fsync: kept for interface symmetry; an object is durable once its upload completes,
            which ``close()`` waits for, so there is nothing further to sync.

    Thread-safe for concurrent calls on different paths. Listings bypass fsspec's directory
    cache so files written by other processes (other ranks) are seen.
    """

    def __init__(self, fs: AbstractFileSystem, *, fsync: bool = True) -> None:
        self.fs = fs
        self.fsync = fsync

    @classmethod
    def from_url(cls, url: str, *, fsync: bool = True, **storage_options: Any) -> FsspecStorage:
        """The storage for ``url``'s filesystem, resolved by ``fsspec.core.url_to_fs``.

        Raises:
            CheckpointError: fsspec, or the plugin for the URL's scheme, is not installed.
            InvalidArgumentError: fsspec does not know the URL's scheme.
        """
        try:
            import fsspec.core
        except ImportError as exc:
            raise CheckpointError(
                f"{url} needs fsspec: pip install 'trackpoint[fsspec]'", path=url
            ) from exc
        try:
            fs, _ = fsspec.core.url_to_fs(url, **storage_options)
        except ImportError as exc:
            raise CheckpointError(
                f"fsspec cannot open {url}: {exc} (install the fsspec plugin for this scheme)",
                path=url,
            ) from exc
        except ValueError as exc:
            raise InvalidArgumentError(f"fsspec cannot open {url}: {exc}", path=url) from exc
        return cls(fs, fsync=fsync)

    def __repr__(self) -> str:
        return f"FsspecStorage({type(self.fs).__name__}, fsync={self.fsync})"

    @property
    def supports_atomic_rename(self) -> bool:
        # docstring inherited
        return False

    def open_write(self, path: str) -> BinaryIO:
        # docstring inherited
        return cast(BinaryIO, FsspecFile(self.fs, path))

    def open_range_reader(self, path: str) -> RangeReader:
        # docstring inherited
        self.fs.invalidate_cache(path)
        return FsspecRangeReader(self.fs, path)

    def exists(self, path: str) -> bool:
        # docstring inherited
        self.fs.invalidate_cache(path)
        try:
            return bool(self.fs.exists(path))
        except OSError as exc:
            raise map_os_error(exc, path, "checking for") from exc

    def describe(self, path: str) -> str:
        # docstring inherited
        self.fs.invalidate_cache(path)
        try:
            kind = self.fs.info(path).get("type")
        except FileNotFoundError:
            return "a missing path"
        except OSError as exc:
            return f"a path that cannot be examined ({exc})"
        return {"file": "a regular file", "directory": "a directory"}.get(
            str(kind), f"not a regular file (fsspec type {kind!r})"
        )

    def size(self, path: str) -> int:
        # docstring inherited
        self.fs.invalidate_cache(path)
        try:
            return int(self.fs.info(path)["size"])
        except OSError as exc:
            raise map_os_error(exc, path, "reading the size of") from exc

    def replace(self, src: str, dst: str) -> None:
        # docstring inherited
        try:
            if not self.fs.isfile(src):
                raise NotFoundError(f"No such file while renaming {src} to {dst}", path=src)
            self.fs.mv(src, dst)
        except OSError as exc:
            raise map_os_error(exc, src, "renaming", target=dst) from exc

    def link(self, src: str, dst: str) -> str:
        """Copy ``src`` to ``dst`` on the server (``fs.copy``: S3 ``CopyObject`` and the like).

        Object stores have no hard links; a server-side copy moves no bytes through this
        process. See ``Storage.link``.
        """
        try:
            if not self.fs.isfile(src):
                raise NotFoundError(f"No such file while copying {src} to {dst}", path=src)
            self.fs.copy(src, dst)
        except OSError as exc:
            raise map_os_error(exc, src, "copying", target=dst) from exc
        return "server-copy"

    def remove(self, path: str, *, missing_ok: bool = True) -> None:
        # docstring inherited
        try:
            # Object stores delete missing keys silently; check only when the caller cares.
            if not missing_ok and not self.fs.exists(path):
                raise NotFoundError(f"No such file while removing {path}", path=path)
            self.fs.rm_file(path)
        except FileNotFoundError as exc:
            if not missing_ok:
                raise map_os_error(exc, path, "removing") from exc
        except OSError as exc:
            raise map_os_error(exc, path, "removing") from exc

    def remove_tree(self, path: str) -> None:
        # docstring inherited
        self.fs.invalidate_cache(path)
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise map_os_error(exc, path, "removing the directory") from exc

    def list(self, path: str) -> list[str]:
        # docstring inherited
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise map_os_error(exc, path, "listing") from exc
        own = self.fs._strip_protocol(path).rstrip("/")
        names = {posixpath.basename(e.rstrip("/")) for e in entries if e.rstrip("/") != own}
        return sorted(names)

    def makedirs(self, path: str) -> None:
        # docstring inherited
        try:
            self.fs.makedirs(path, exist_ok=True)
        except FileExistsError:
            pass
        except OSError as exc:
            raise map_os_error(exc, path, "creating the directory") from exc

    def dirname(self, path: str) -> str:
        # docstring inherited; "s3://bucket" -> "s3://", never "s3:"
        scheme, rest = split_scheme(path)
        return scheme + posixpath.dirname(rest)

    def basename(self, path: str) -> str:
        # docstring inherited
        return posixpath.basename(split_scheme(path)[1])
