"""Where checkpoint bytes live: local disk, fsspec URLs, or memory (tests).

``storage_for(path)`` picks the backend from the path's syntax; every layer above talks to the
:class:`Storage` interface only. ``fsspec`` is imported only when a URL needs it.
"""

from __future__ import annotations

from trackpoint.storage.base import RangeReader, Storage
from trackpoint.storage.fsspec import FsspecStorage
from trackpoint.storage.local import LocalStorage
from trackpoint.storage.lock import DirectoryLock, LockHolder
from trackpoint.storage.memory import MemoryStorage

__all__ = [
    "DirectoryLock",
    "FsspecStorage",
    "LocalStorage",
    "LockHolder",
    "MemoryStorage",
    "RangeReader",
    "Storage",
    "is_url",
    "storage_for",
]


def is_url(path: str) -> bool:
    """True if ``path`` names a non-local location (``s3://…``, ``memory://…``, ``a::b://…``).

    ``file://`` URLs count as local: they are served by :class:`LocalStorage`.
    """
    if path.startswith("file://"):
        return False
    return "://" in path or "::" in path


def storage_for(path: str, *, fsync: bool = True) -> Storage:
    """Return the storage that serves ``path``.

    Plain paths and ``file://`` URLs get a :class:`LocalStorage`; other URLs get an
    :class:`FsspecStorage` for the filesystem ``fsspec`` resolves from the URL (credentials and
    options come from fsspec's own configuration). Paths handed to the returned storage keep
    their URL form.

    Args:
        path: a local path or URL; only its scheme matters.
        fsync: passed to the backend (see ``Storage.fsync``).

    Raises:
        CheckpointError: the URL needs fsspec (or one of its plugins, e.g. ``s3fs``) and it is
            not installed.

    Example::

        storage = storage_for("/tmp/ckpt")          # LocalStorage
        storage = storage_for("memory://ckpt")      # FsspecStorage over fsspec's memory fs
    """
    if not is_url(path):
        return LocalStorage(fsync=fsync)
    return FsspecStorage.from_url(path, fsync=fsync)
