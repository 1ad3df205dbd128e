"""Where a checkpoint lives: its prefix and the storage that holds it, decided once.

The public API takes paths (and an optional ``storage=``); the entry point turns them into a
:class:`CheckpointLocation` with :func:`locate` (or, for a checkpoint that must exist,
``trackpoint.management.paths.resolve_location``), and the layers below take that value instead
of picking a backend from the path string again.
"""

from __future__ import annotations

from dataclasses import dataclass

from trackpoint.storage.base import Storage
from trackpoint.storage.fsspec import FsspecStorage
from trackpoint.storage.local import LocalStorage
from trackpoint.storage.url import is_url

__all__ = ["CheckpointLocation", "locate", "storage_for"]


@dataclass(frozen=True, slots=True)
class CheckpointLocation:
    """A checkpoint prefix (``dir/ckpt-3``, ``s3://b/ckpt-3``) and the storage that serves it.

    Frozen: the backend is decided once, at the API edge, and every layer below reads the same
    one (a URL is not resolved through fsspec again by each of them).
    """

    storage: Storage
    prefix: str


def storage_for(path: str, *, fsync: bool = True) -> Storage:
    """Return the storage that serves ``path``.

    Plain paths and ``file://`` URLs get a :class:`LocalStorage`; other URLs (see
    :func:`~trackpoint.storage.url.is_url`) get an :class:`FsspecStorage` for the filesystem
    ``fsspec`` resolves from the URL (credentials and options come from fsspec's own
    configuration). Paths handed to the returned storage keep their URL form.

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


def locate(
    prefix: str, *, storage: Storage | None = None, fsync: bool = True
) -> CheckpointLocation:
    """``prefix`` with ``storage``, or with the backend :func:`storage_for` picks for it.

    Nothing is read: a location for a checkpoint that is still to be written is fine.

    Example::

        location = locate("memory://run/ckpt-1")
        location.storage.exists(location.prefix + ".index")
    """
    return CheckpointLocation(
        storage if storage is not None else storage_for(prefix, fsync=fsync), prefix
    )
