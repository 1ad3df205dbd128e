"""Merge bundles into one checkpoint (TensorFlow's ``MergeBundles``, §11.2).

The saver writes each shard as its own one-file bundle under a temporary prefix, then merges
them: data files are renamed into place (no bytes copied), the entries of all inputs are
combined into one index, and that index is written last. The final ``prefix.index`` is the
commit point, so a crash before it leaves no checkpoint rather than a broken one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trackpoint._types import PathLike, fspath
from trackpoint.bundle.entries import parse_entry
from trackpoint.bundle.index import BundleIndex
from trackpoint.bundle.naming import data_filename, index_filename, resolve_storage
from trackpoint.bundle.table_batch import table_of_pairs
from trackpoint.errors import CheckpointError, InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
    from trackpoint.storage.base import Storage

__all__ = ["merge_bundles"]

logger = logging.getLogger(__name__)


def _key_text(raw_key: bytes) -> str:
    return raw_key.decode("utf-8", "backslashreplace")


class _Merger:
    """State of one merge: entries by key and data files in first-seen order."""

    def __init__(self, storage: Storage, out_prefix: str) -> None:
        self.storage = storage
        self.out_prefix = out_prefix
        self.entries: dict[bytes, BundleEntryProto] = {}
        self.files: dict[str, int] = {}  # input data file -> new shard id
        self.header: BundleHeaderProto | None = None
        self.inputs: list[BundleIndex] = []  # in order
        self.total_shards = 0

    def add_bundle(self, prefix: str) -> None:
        index_path = index_filename(prefix)
        # The entries are scanned only if they are merged (one bundle is renamed whole, see
        # _commit_single).
        index = BundleIndex.load(prefix, self.storage, lazy=True)
        header = index.header
        if self.header is None:
            self.header = header
        elif header.endianness != self.header.endianness:
            raise InvalidArgumentError(
                f"Cannot merge {prefix}: its endianness differs from the first bundle's",
                path=index_path,
            )
        elif header.version.SerializeToString() != self.header.version.SerializeToString():
            raise InvalidArgumentError(
                f"Cannot merge {prefix}: its version {header.version} differs from the first "
                f"bundle's {self.header.version}",
                path=index_path,
            )
        self.total_shards += header.num_shards
        self.inputs.append(index)

    def _add_entries(self, index: BundleIndex) -> None:
        prefix, index_path, num_shards = index.prefix, index.path, index.num_shards
        sources: dict[int, str] = {}  # shard id in the input -> its data file
        for raw_key, value in index.rows():
            entry = parse_entry(value, key=_key_text(raw_key), path=index_path)
            earlier = self.entries.get(raw_key)
            if earlier is None:
                source = sources.get(entry.shard_id)
                if source is None:
                    source = sources[entry.shard_id] = data_filename(
                        prefix, entry.shard_id, num_shards
                    )
                entry.shard_id = self.files.setdefault(source, len(self.files))
                self.entries[raw_key] = entry
            else:
                self._merge_slices(prefix, raw_key, earlier, entry)

    def _merge_slices(
        self, prefix: str, raw_key: bytes, earlier: BundleEntryProto, entry: BundleEntryProto
    ) -> None:
        key = _key_text(raw_key)
        if not earlier.slices or not entry.slices:
            raise InvalidArgumentError(
                f"Duplicate tensor keyed by '{key}' encountered when merging {prefix} into "
                f"{self.out_prefix}",
                path=prefix,
                key=key,
            )
        if earlier.dtype != entry.dtype or earlier.shape != entry.shape:
            raise InvalidArgumentError(
                f"Slices of '{key}' disagree on dtype or full shape between the merged "
                f"bundles (in {prefix})",
                path=prefix,
                key=key,
            )
        earlier.slices.extend(entry.slices)

    def _commit_single(self) -> bool:
        """One input bundle with one data file and entries: rename it, keep its index bytes.

        Its entries already name shard 0 of 1 and the merged index would be built from the
        same sorted entries, so the bytes are the same; parsing and re-encoding every entry
        is what a checkpoint of many small tensors would otherwise spend its time on.
        """
        if len(self.inputs) != 1:
            return False
        index = self.inputs[0]
        if index.num_shards != 1 or not index.has_entries:
            return False
        source = data_filename(index.prefix, 0, 1)
        target = data_filename(self.out_prefix, 0, 1)
        if source != target:
            self.storage.replace(source, target)
        self.storage.write_atomic(index_filename(self.out_prefix), index.data)
        return True

    def commit(self) -> None:
        assert self.header is not None
        if self._commit_single():
            return
        for index in self.inputs:
            self._add_entries(index)
        count = len(self.files)
        for source, shard_id in self.files.items():
            target = data_filename(self.out_prefix, shard_id, count)
            if source != target:
                self.storage.replace(source, target)
        header = type(self.header)()
        header.CopyFrom(self.header)
        # TF writes the sum of the inputs' num_shards; that equals the number of renamed data
        # files unless an input had no entries (§17.4), where TF's file would be unreadable.
        header.num_shards = count or self.total_shards
        rows = [(key, self.entries[key].SerializeToString()) for key in sorted(self.entries)]
        table = table_of_pairs([(b"", header.SerializeToString()), *rows])
        self.storage.write_atomic(index_filename(self.out_prefix), table)


def merge_bundles(
    prefixes: Sequence[PathLike],
    out_prefix: PathLike,
    *,
    storage: Storage | None = None,
    allow_missing_files: bool = False,
) -> None:
    """Merge the bundles at ``prefixes`` (in order) into ``out_prefix``.

    Data files are moved with ``storage.replace`` and numbered in first-seen order; slices of
    the same tensor from different bundles are combined. ``out_prefix.index`` is written last
    and atomically; then the input indexes are deleted (best effort). With one input this is
    a rename of a whole bundle.

    Raises:
        NotFoundError: an input index is missing (unless ``allow_missing_files``), or no
            input exists.
        InvalidArgumentError: a key appears in two bundles (unless both are slices of it),
            or versions / endianness differ.
        DataLossError: an input index is damaged.
    """
    out = fspath(out_prefix)
    store = resolve_storage(out, storage)
    parent = store.dirname(out)
    if parent:
        store.makedirs(parent)
    merger = _Merger(store, out)
    merged: list[str] = []
    for prefix in map(fspath, prefixes):
        if not store.exists(index_filename(prefix)):
            if allow_missing_files:
                logger.info("merge into %s: skipping missing bundle %s", out, prefix)
                continue
            raise NotFoundError(
                f"Cannot merge into {out}: bundle {prefix} has no index file "
                f"{index_filename(prefix)}",
                path=prefix,
            )
        merger.add_bundle(prefix)
        merged.append(prefix)
    if not merged:
        raise NotFoundError(
            f"Cannot merge into {out}: none of the {len(prefixes)} input bundles exist",
            path=out,
        )
    merger.commit()
    out_index = index_filename(out)
    for prefix in merged:
        if index_filename(prefix) != out_index:
            try:
                store.remove(index_filename(prefix), missing_ok=True)
            except CheckpointError as exc:
                logger.warning("could not delete merged index %s: %s", prefix, exc)
