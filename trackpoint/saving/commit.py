"""Atomic commit of a sharded save: the checkpoint exists iff its ``.index`` exists.

One :class:`AtomicCommit` drives one save to ``prefix`` (tf-checkpoint-format.md §11, made
crash-safe as §11.3 suggests):

1. ``prepare()``: create the directory, remove stale temporaries of crashed saves, and pick
   where shards go. Local disk (``storage.supports_atomic_rename``): a private folder
   ``<prefix>_temp_<hex>/`` holding ``part-SSSSS-of-NNNNN`` bundles. Object stores:
   ``<prefix>.part-SSSSS-of-NNNNN`` bundles next to the final files (S3 and friends gain nothing
   from a folder, and their "rename" is a copy).
2. The saver writes each shard as a one-data-file bundle at ``shard_prefix(i, n)``; with
   ``fsync`` each file is durable when closed.
3. ``commit(inputs)`` merges the bundles into ``prefix``: data files are renamed into place,
   the directory is synced, and the merged index is written under a temporary name, synced and
   renamed over ``prefix.index`` last. That rename is the commit point. The directory is synced
   again, the temporary folder removed, and data files of an overwritten checkpoint with another
   shard count deleted.
4. ``abort()`` after any failure before the commit point removes everything this save wrote, so
   the previous checkpoint stays intact and nothing incomplete looks like a checkpoint.

Overwriting an existing prefix: if the new data files have the old ones' names (same shard
count), the old ``prefix.index`` is deleted before the first of them is replaced. Until the new
index lands the prefix then has *no* checkpoint: absent, never a mix of old and new files.

Stale temporaries: readers only look at ``prefix.index`` and ignore them. ``prepare()`` removes
``*_temp_<hex>`` folders in the same directory whose owner is a dead process on this host, and
the ``.part`` files of earlier saves to the same prefix on object stores. The owner is encoded in
the folder's name (24 hex digits: a hash of the host name, the pid, a random part), so it is
known from the instant the folder exists, even if the process dies right after creating it.
Folders of live processes and of other hosts are left alone, so concurrent saves into one
directory do not disturb each other.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trackpoint.bundle.merge import merge_bundles
from trackpoint.errors import CheckpointError, NotFoundError
from trackpoint.storage import Storage
from trackpoint.storage.base import DelegatingStorage

__all__ = ["AtomicCommit"]

logger = logging.getLogger(__name__)

_TEMP_DIR = re.compile(r"^(?P<base>.+)_temp_(?P<host>[0-9a-f]{8})(?P<pid>[0-9a-f]{8})[0-9a-f]{8}$")
_INDEX_TMP = "index.tmp"
_T = TypeVar("_T")


def _host_tag() -> str:
    """8 hex digits naming this host in temporary folder names."""
    return f"{zlib.crc32(socket.gethostname().encode('utf-8')):08x}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class _CommitStorage(DelegatingStorage):
    """The real storage, watched: records data files moved into place and owns the index commit.

    ``merge_bundles`` renames data files and writes the merged index through this object; the
    index write is where the commit point is implemented.
    """

    def __init__(self, inner: Storage, commit: AtomicCommit) -> None:
        super().__init__(inner)
        # A proxy: the commit owns this storage, and a strong reference back would make every
        # save leave a cycle for the collector. Used only while the commit runs.
        self._commit = weakref.proxy(commit)

    def replace(self, src: str, dst: str) -> None:
        # docstring inherited
        if dst == self._commit.index_path:
            self.inner.replace(src, dst)
            self._commit.committed = True
            return
        if self._commit.is_final_data_file(dst):
            self._commit.before_placing(dst)
            self._commit.placed.append(dst)
        self.inner.replace(src, dst)

    def write_bytes(self, path: str, data: bytes | memoryview) -> None:
        # docstring inherited
        if path == self._commit.index_path:
            self._commit.write_index(bytes(data))
        else:
            self.inner.write_bytes(path, data)

    def write_atomic(self, path: str, data: bytes) -> None:
        # docstring inherited
        if path == self._commit.index_path:
            self._commit.write_index(data)
        else:
            self.inner.write_atomic(path, data)


class AtomicCommit:
    """The write-then-commit protocol of one save to ``prefix`` (see the module docstring).

    Call order: ``prepare()`` -> ``shard_prefix()`` for every shard (the caller writes them,
    from any thread) -> ``commit(inputs)`` -> on any exception ``abort()``. Not reusable.

    Args:
        storage: where the checkpoint lives; its ``fsync`` setting decides durability.
        prefix: the checkpoint prefix, e.g. ``/ckpts/ckpt-3``.
    """

    def __init__(self, storage: Storage, prefix: str) -> None:
        self.prefix = prefix
        self.index_path = f"{prefix}.index"
        self.directory = storage.dirname(prefix) or "."
        self.base = storage.basename(prefix)
        self.atomic = storage.supports_atomic_rename
        self.storage: Storage = _CommitStorage(storage, self)
        self._inner = storage
        self.temp_dir: str | None = None
        self.committed = False
        self.placed: list[str] = []  # final data files this save moved into place
        self._shard_prefixes: list[str] = []
        self._foreign_prefixes: list[str] = []  # registered savers' bundles
        self._old_index_removed = False
        self._data_name = re.compile(re.escape(self.base) + r"\.data-\d{5,}-of-\d{5,}$")

    # -- protocol --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the directory, clean stale temporaries, create this save's temporary place."""
        self._inner.makedirs(self.directory)
        self._clean_stale()
        if self.atomic:
            token = f"{_host_tag()}{os.getpid():08x}{secrets.token_hex(4)}"
            self.temp_dir = f"{self.prefix}_temp_{token}"
            self._inner.makedirs(self.temp_dir)

    def shard_prefix(self, shard_id: int, num_shards: int) -> str:
        """Where shard ``shard_id`` of ``num_shards`` is written as a one-file bundle."""
        name = f"part-{shard_id:05d}-of-{num_shards:05d}"
        if self.temp_dir is not None:
            path = self._inner.join(self.temp_dir, name)
        else:
            path = f"{self.prefix}.{name}"
        self._shard_prefixes.append(path)
        return path

    @property
    def foreign_prefixes(self) -> list[str]:
        """Bundles written by registered savers, merged before the shards."""
        return list(self._foreign_prefixes)

    def add_foreign_prefixes(self, prefixes: Sequence[str]) -> None:
        """Bundles written by registered savers: merged too, and removed on abort."""
        self._foreign_prefixes.extend(prefixes)

    def commit(self, inputs: Sequence[str]) -> None:
        """Merge the bundles ``inputs`` (in order) into ``prefix`` and commit.

        Raises:
            CheckpointError: the merge failed (call ``abort()``), or did not write the index.
        """
        merge_bundles(list(inputs), self.prefix, storage=self.storage)
        if not self.committed:
            raise CheckpointError(
                f"merging the shards of {self.prefix!r} did not write {self.index_path!r}",
                path=self.index_path,
            )
        self._finish()

    def abort(self) -> None:
        """Remove what this save wrote (best effort; errors are logged, never raised)."""
        if self.committed:
            return
        for path in self.placed:
            self._quietly(self._inner.remove, path)
        if self.temp_dir is not None:
            self._quietly(self._inner.remove_tree, self.temp_dir)
        for bundle in [*self._shard_prefixes, *self._foreign_prefixes]:
            self._remove_bundle(bundle)
        if self.placed or self._old_index_removed:
            self._quietly(self._inner.sync_dir, self.directory)

    # -- hooks used by _CommitStorage ---------------------------------------------------
    def is_final_data_file(self, path: str) -> bool:
        return self._inner.dirname(path) == self._inner.dirname(self.prefix) and bool(
            self._data_name.match(self._inner.basename(path))
        )

    def before_placing(self, dst: str) -> None:
        """Invalidate the old checkpoint before one of its data files is overwritten."""
        if self._old_index_removed or not self._inner.exists(dst):
            return
        if self._inner.exists(self.index_path):
            logger.info(
                "Overwriting checkpoint %s: its index is removed first so that old and new files "
                "are never mixed", self.prefix,
            )
            self._inner.remove(self.index_path)
            self._inner.sync_dir(self.directory)
        self._old_index_removed = True

    def write_index(self, data: bytes) -> None:
        """Write the merged index; the rename (or the object upload) is the commit point."""
        if not self.atomic or self.temp_dir is None:
            try:
                self._inner.write_bytes(self.index_path, data)
            except BaseException:
                # Some object stores publish whatever was uploaded when the failed file is
                # closed; a torn index must not stay behind looking like a checkpoint.
                self._quietly(self._inner.remove, self.index_path)
                raise
            self.committed = True
            return
        # Data files were renamed into this directory: make that durable before the index
        # can name them.
        self._inner.sync_dir(self.directory)
        tmp = self._inner.join(self.temp_dir, _INDEX_TMP)
        self._inner.write_bytes(tmp, data)
        self._inner.replace(tmp, self.index_path)
        self.committed = True

    # -- internals -----------------------------------------------------------------------
    def _finish(self) -> None:
        """After the commit point: make it durable and clean up. Failures here are logged."""
        self._quietly(self._inner.sync_dir, self.directory)
        if self.temp_dir is not None:
            self._quietly(self._inner.remove_tree, self.temp_dir)
        else:
            for bundle in self._shard_prefixes:
                self._remove_bundle(bundle)
        placed = {self._inner.basename(path) for path in self.placed}
        for name in self._quietly(self._inner.list, self.directory) or []:
            if self._data_name.match(name) and name not in placed:
                path = self._inner.join(self.directory, name)
                # A data file of the checkpoint this save replaced (another shard count).
                self._quietly(self._inner.remove, path)

    def _clean_stale(self) -> None:
        host = _host_tag()
        for name in self._quietly(self._inner.list, self.directory) or []:
            path = self._inner.join(self.directory, name)
            if self.atomic:
                if self._is_stale(name, host):
                    logger.info("Removing %s, left behind by a crashed save", path)
                    self._quietly(self._inner.remove_tree, path)
            elif name.startswith(f"{self.base}.part-"):
                self._quietly(self._inner.remove, path)

    @staticmethod
    def _is_stale(name: str, host: str) -> bool:
        match = _TEMP_DIR.match(name)
        if match is None or match.group("host") != host:
            return False  # not a temporary folder, or another host's: leave it
        pid = int(match.group("pid"), 16)
        return pid != os.getpid() and not _pid_alive(pid)

    def _remove_bundle(self, bundle: str) -> None:
        directory = self._inner.dirname(bundle) or "."
        base = self._inner.basename(bundle)
        for name in self._quietly(self._inner.list, directory) or []:
            if name == f"{base}.index" or name.startswith(f"{base}.data-"):
                self._quietly(self._inner.remove, self._inner.join(directory, name))

    @staticmethod
    def _quietly(fn: Callable[..., _T], *args: Any) -> _T | None:
        """``fn(*args)``, or None after logging its error: cleanup must not mask the cause."""
        try:
            return fn(*args)
        except (CheckpointError, OSError, NotFoundError) as exc:
            logger.warning("Cleanup step %s%r failed: %s", getattr(fn, "__name__", fn), args, exc)
            return None
