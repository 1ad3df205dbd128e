"""Where checkpoint bytes live: local disk, fsspec URLs, or memory (tests).

``is_url(path)`` is the one rule for local versus remote paths; ``locate(path)`` pairs a prefix
with the backend ``storage_for(path)`` picks from its syntax, once, at the API edge. Every layer
above talks to the :class:`Storage` interface only. ``fsspec`` is imported only when a URL needs
it.
"""

from __future__ import annotations

from trackpoint.storage.base import RangeReader, Storage
from trackpoint.storage.fsspec import FsspecStorage
from trackpoint.storage.local import LocalStorage
from trackpoint.storage.location import CheckpointLocation, locate, storage_for
from trackpoint.storage.lock import DirectoryLock, LockHolder
from trackpoint.storage.memory import MemoryStorage
from trackpoint.storage.url import is_url

__all__ = [
    "CheckpointLocation",
    "DirectoryLock",
    "FsspecStorage",
    "LocalStorage",
    "LockHolder",
    "MemoryStorage",
    "RangeReader",
    "Storage",
    "is_url",
    "locate",
    "storage_for",
]
