"""The parsed index of one bundle: header, keys, and each entry decoded once (§3, §4, §5, §8).

:class:`BundleIndex` reads ``prefix.index`` once, verifying every block checksum and the
header's version rules, and keeps each entry's serialized value. An entry is decoded into a
:class:`~trackpoint.bundle.layout.Layout` the first time it is needed and cached: the bundle
reader's verbs start from these layouts, and readers reopened on the same checkpoint share
them.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import compress
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from trackpoint.bundle.dtypes import DataType, numpy_dtype_for
from trackpoint.bundle.entries import check_header, entry_shape, parse_entry, parse_header
from trackpoint.bundle.layout import Layout, LayoutDecoder, check_entry
from trackpoint.bundle.layout_batch import common_layouts
from trackpoint.bundle.naming import index_filename
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleHeaderProto
from trackpoint.bundle.slice_spec import encode_slice_key
from trackpoint.bundle.table_scan import scan_table
from trackpoint.errors import DataLossError, NotFoundError
from trackpoint.metrics import registry as metrics

if TYPE_CHECKING:
    from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
    from trackpoint.bundle.slice_spec import TensorSlice
    from trackpoint.storage.base import Storage

__all__ = ["BundleIndex", "count_checksum_failure"]


def count_checksum_failure(exc: DataLossError) -> None:
    """Count ``exc`` in trackpoint_checksum_failures_total if a checksum did not match.

    Table blocks and string tensors are checked in ``table``/``strings``, which report a
    mismatch as a DataLossError saying "checksum does not match".
    """
    if "checksum does not match" in str(exc).lower():
        metrics.increment(metrics.CHECKSUM_FAILURES)


class BundleIndex:
    """The index of the bundle at ``prefix``, read and checked on construction.

    Thread-safe: its caches only ever gain equal entries. ``layouts`` is the cache of decoded
    entries by checkpoint key, for the reader's per-key loops (:meth:`layout` fills it).

    Raises (constructor):
        NotFoundError: ``prefix.index`` does not exist.
        DataLossError: the index is damaged.
        InvalidArgumentError: the bundle's version excludes this reader.
    """

    def __init__(self, prefix: str, storage: Storage) -> None:
        self.prefix = prefix
        self.path = index_filename(prefix)
        try:
            with storage.open_range_reader(self.path) as index_reader:
                # Indexes are small; a private copy lets the mapping close right away.
                data = bytes(index_reader.read(0, index_reader.size))
        except NotFoundError as exc:
            raise NotFoundError(
                f"Checkpoint not found: no index file {self.path} for prefix '{prefix}'. "
                "Check the path, or whether the save finished",
                path=prefix,
            ) from exc
        self.nbytes = len(data)
        try:
            table = scan_table(data, self.path)
        except DataLossError as exc:
            count_checksum_failure(exc)
            raise
        keys = table.keys
        if not keys or keys[0] != b"":
            raise DataLossError(
                f"Corrupted index file {self.path}: no header entry (key '')", path=self.path
            )
        self.header = parse_header(table.value(0), self.path)
        check_header(self.header, self.path)
        self.num_shards: int = self.header.num_shards
        self.big_endian = self.header.endianness == BundleHeaderProto.BIG
        # Slice keys start with a NUL byte (§8.3), so they sort first, right after the header.
        first = bisect_left(keys, b"\x01", 1)
        self._slice_values = {keys[row]: table.value(row) for row in range(1, first)}
        # Checkpoint key -> its row of the table; values stay spans of the file until needed.
        names = _decode_keys(keys[first:])
        self._rows: dict[str, int] = dict(zip(names, range(first, len(keys))))
        self._table = table
        self._entries: dict[str, BundleEntryProto] = {}
        self._decoder = LayoutDecoder(self.path, self.num_shards)
        self._decoded_all = False  # every entry of common form decoded into layouts at once
        self.layouts: dict[str, Layout] = {}
        self._slice_layouts: dict[bytes, Layout] = {}

    # -- keys and entries ------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Checkpoint keys in index (UTF-8 byte) order; no header, no slice keys."""
        return list(self._rows)

    def has_tensor(self, key: str) -> bool:
        return key in self._rows

    def entry(self, key: str) -> BundleEntryProto:
        """The ``BundleEntryProto`` of ``key`` (parsed once, then cached)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = parse_entry(self._value(key), key=key, path=self.path)
            self._entries[key] = entry
        return entry

    def slice_entry(self, key: str, stored: TensorSlice) -> BundleEntryProto:
        """The ``BundleEntryProto`` of the stored slice ``stored`` of ``key``."""
        _, value = self._slice_value(key, stored)
        return parse_entry(value, key=f"{key} [slice {stored}]", path=self.path)

    def _value(self, key: str) -> bytes:
        return self._table.value(self._row(key))

    def _row(self, key: str) -> int:
        row = self._rows.get(key)
        if row is None:
            raise NotFoundError(
                f"Key '{key}' not found in checkpoint {self.prefix}", path=self.prefix, key=key
            )
        return row

    def _slice_value(self, key: str, stored: TensorSlice) -> tuple[bytes, bytes]:
        """(slice key, serialized entry) of the stored slice ``stored`` of ``key`` (§8.3)."""
        slice_key = encode_slice_key(key, stored)
        value = self._slice_values.get(slice_key)
        if value is None:
            raise DataLossError(
                f"Checkpoint {self.prefix} lists slice '{stored}' of key '{key}' but has no "
                "entry for it",
                path=self.path,
                key=key,
            )
        return slice_key, value

    # -- decoded entries -------------------------------------------------------------------
    def layout(self, key: str) -> Layout:
        """``key``'s entry, decoded on first use (then cached in ``layouts``).

        Raises:
            NotFoundError: no tensor ``key``.
            DataLossError: its entry does not parse.
        """
        return self.layouts.get(key) or self.decode_layout(key)

    def decode_layout(self, key: str) -> Layout:
        """Decode ``key``'s entry and cache it, for loops that looked in ``layouts`` already.

        Raises:
            The errors of :meth:`layout`.
        """
        row = self._row(key)
        if not self._decoded_all:
            self._decode_all()
            layout = self.layouts.get(key)
            if layout is not None:
                return layout
        layout = self._decoder.decode(self._table.value(row), key)
        self.layouts[key] = layout
        return layout

    def _decode_all(self) -> None:
        """Decode every tensor entry of common form at once (the others one by one, on use):
        cheaper per key than any decoding of one entry, for the many keys of a restore."""
        total = len(self._table.keys)
        rows = np.arange(total - len(self._rows), total)
        decoded, layouts = common_layouts(self._decoder, self._table, rows, self.num_shards)
        self.layouts.update(zip(compress(self._rows, decoded.tolist()), layouts))
        self._decoded_all = True

    def slice_layout(self, key: str, stored: TensorSlice) -> Layout:
        """The decoded entry of the stored slice ``stored`` of ``key`` (then cached)."""
        slice_key = encode_slice_key(key, stored)
        layout = self._slice_layouts.get(slice_key)
        if layout is None:
            slice_key, value = self._slice_value(key, stored)
            layout = self._decoder.decode(value, f"{key} [slice {stored}]")
            self._slice_layouts[slice_key] = layout
        return layout

    def part_layout(
        self, key: str, layout: Layout, stored: TensorSlice, full_shape: tuple[int, ...]
    ) -> Layout:
        """The layout of stored slice ``stored`` of ``key``, checked against the full tensor's.

        Raises:
            DataLossError: the slice has no entry, or its dtype or shape disagrees.
        """
        part = self.slice_layout(key, stored)
        shape = part.shape
        if shape is None:  # raises the error that says why
            entry = parse_entry(part.value, key=key, path=self.path)
            shape = entry_shape(entry, key=key, path=self.path)
        if part.datatype != layout.datatype or shape != stored.shape_in(full_shape):
            raise DataLossError(
                f"Slice '{stored}' of key '{key}' has a dtype or shape that disagrees "
                f"with the full tensor in {self.path}",
                path=self.path,
                key=key,
            )
        return part

    def raise_unreadable(self, key: str, layout: Layout) -> NoReturn:
        """Raise what makes ``layout``, a stored tensor of ``key``, unreadable."""
        # Layouts decoded in a batch leave the entry's bytes here, in the table.
        entry = parse_entry(layout.value or self._value(key), key=key, path=self.path)
        check_entry(entry, key=key, path=self.path, num_shards=self.num_shards)
        raise AssertionError(
            f"the entry of '{key}' in {self.path} decoded as unreadable, yet passes every check"
        )

    # -- what a read returns ---------------------------------------------------------------
    def datatype(self, key: str) -> DataType:
        """The stored ``DataType`` of ``key``.

        Raises:
            DataLossError: a value this reader does not know.
        """
        value = self.layout(key).datatype
        try:
            return DataType(value)
        except ValueError:
            raise DataLossError(
                f"Unknown dtype {value} for key '{key}' in {self.path}", path=self.path, key=key
            ) from None

    def dtype(self, key: str) -> np.dtype:
        """The numpy dtype a read of ``key`` returns (object for strings).

        Raises:
            InvalidArgumentError: the dtype has no numpy equivalent (e.g. DT_VARIANT).
            DataLossError: an unknown dtype value.
        """
        dtype = self.layout(key).dtype
        if dtype is None:  # raises the error that says why
            return numpy_dtype_for(self.datatype(key), key=key, path=self.path)
        return dtype

    def shape(self, key: str) -> tuple[int, ...]:
        """The full shape of tensor ``key``.

        Raises:
            DataLossError: the entry's shape is invalid (unknown rank, negative, too large).
        """
        shape = self.layout(key).shape
        if shape is None:  # raises the error that says why
            return entry_shape(self.entry(key), key=key, path=self.path)
        return shape


def _decode_keys(keys: list[bytes]) -> list[str]:
    """Each key as str (undecodable bytes escaped), in one decode for the whole list.

    Joined by NUL, which no UTF-8 sequence contains, the decode equals decoding each key; a
    key holding a NUL itself makes the count differ, and then each is decoded alone.
    """
    names = b"\x00".join(keys).decode("utf-8", "surrogateescape").split("\x00")
    if len(names) != len(keys) or not keys:
        return [key.decode("utf-8", "surrogateescape") for key in keys]
    return names
