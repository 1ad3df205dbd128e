"""The parsed index of one bundle: header, keys, and each entry decoded once (§3, §4, §5, §8).

:class:`BundleIndex` is the one parser of a ``.index`` file: it reads it once, verifying every
block checksum and the header's version rules, and keeps each entry's serialized value. The
bundle reader, the merge, incremental saves (:mod:`trackpoint.saving.linking`) and the
distributed read plan all take it. An entry is decoded into a
:class:`~trackpoint.bundle.layout.Layout` the first time it is needed and cached: the bundle
reader's verbs start from these layouts, and every reader opened on the same parsed index
shares them.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass, field
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
from trackpoint.bundle.table import read_table, read_table_head
from trackpoint.errors import DataLossError, NotFoundError
from trackpoint.metrics import registry as metrics

if TYPE_CHECKING:
    from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
    from trackpoint.bundle.slice_spec import TensorSlice
    from trackpoint.bundle.table import TableColumns
    from trackpoint.storage.base import Storage

__all__ = ["BundleIndex", "count_checksum_failure"]


def count_checksum_failure(exc: DataLossError) -> None:
    """Count ``exc`` in trackpoint_checksum_failures_total if a checksum did not match.

    Table blocks and string tensors are checked in ``table``/``strings``, which report a
    mismatch as a DataLossError saying "checksum does not match".
    """
    if "checksum does not match" in str(exc).lower():
        metrics.increment(metrics.CHECKSUM_FAILURES)


class _Entries:
    """The entries of an index's table, and what is decoded from them.

    Its caches only ever gain equal entries, so threads may fill them at once.
    """

    __slots__ = ("decoded_all", "decoder", "entries", "layouts", "rows", "slice_layouts",
                 "slice_values", "table")  # fmt: skip

    def __init__(self, table: TableColumns, path: str, num_shards: int) -> None:
        self.table = table
        keys = table.keys
        # Slice keys start with a NUL byte (§8.3), so they sort first, right after the header.
        first = bisect_left(keys, b"\x01", 1)
        self.slice_values = {keys[row]: table.value(row) for row in range(1, first)}
        # Checkpoint key -> its row of the table; values stay spans of the file until needed.
        self.rows: dict[str, int] = dict(zip(_decode_keys(keys[first:]), range(first, len(keys))))
        self.entries: dict[str, BundleEntryProto] = {}
        self.decoder = LayoutDecoder(path, num_shards)
        self.decoded_all = False  # every entry of common form decoded into layouts at once
        self.layouts: dict[str, Layout] = {}
        self.slice_layouts: dict[bytes, Layout] = {}


@dataclass(frozen=True, slots=True, eq=False)
class BundleIndex:
    """The parsed index of the bundle at ``prefix``: its header and its entries, read once.

    The one parser of a ``.index`` (§3, §4): the bundle reader, the merge, incremental saves
    and the distributed read plan all take this value. Build it with :meth:`load` or
    :meth:`parse`. Immutable: its fields never change, and what it decodes on use (entries,
    layouts) is cached, equal whoever asks first. Thread-safe.
    """

    prefix: str
    path: str
    """``prefix.index``."""
    data: bytes
    """The index file's bytes."""
    header: BundleHeaderProto
    has_entries: bool
    """Whether the table holds more than the header entry."""
    _parsed: list[_Entries] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, prefix: str, storage: Storage, *, lazy: bool = False) -> BundleIndex:
        """Read ``prefix.index`` from ``storage`` and :meth:`parse` it.

        Raises:
            NotFoundError: ``prefix.index`` does not exist.
            The errors of :meth:`parse`.
        """
        path = index_filename(prefix)
        try:
            with storage.open_range_reader(path) as index_reader:
                # Indexes are small; a private copy lets the mapping close right away.
                data = bytes(index_reader.read(0, index_reader.size))
        except NotFoundError as exc:
            raise NotFoundError(
                f"Checkpoint not found: no index file {path} for prefix '{prefix}'. "
                "Check the path, or whether the save finished",
                path=prefix,
            ) from exc
        return cls.parse(prefix, data, lazy=lazy)

    @classmethod
    def parse(cls, prefix: str, data: bytes, *, lazy: bool = False) -> BundleIndex:
        """The index of ``prefix`` whose file holds ``data``, every block checked.

        ``lazy``: check the footer, the block index and the header now, and scan the entries
        on first use (a merge that renames one bundle whole never needs them).

        Raises:
            DataLossError: the index is damaged.
            InvalidArgumentError: the bundle's version excludes this reader.
        """
        path = index_filename(prefix)
        table = None
        try:
            if lazy:  # the first block holds the header
                head, blocks = read_table_head(data, path)
                more = len(head) > 1 or blocks > 1
            else:
                table = read_table(data, path)
                head = [(table.keys[0], table.value(0))] if table.keys else []
                more = len(table.keys) > 1
        except DataLossError as exc:
            count_checksum_failure(exc)
            raise
        if not head or head[0][0] != b"":
            raise DataLossError(
                f"Corrupted index file {path}: no header entry (key '')", path=path
            )
        header = parse_header(head[0][1], path)
        check_header(header, path)
        index = cls(prefix, path, data, header, more)
        if table is not None:
            index._parsed.append(_Entries(table, path, header.num_shards))
        return index

    @property
    def nbytes(self) -> int:
        """Size of the index file."""
        return len(self.data)

    @property
    def num_shards(self) -> int:
        return self.header.num_shards

    @property
    def big_endian(self) -> bool:
        return self.header.endianness == BundleHeaderProto.BIG

    @property
    def layouts(self) -> dict[str, Layout]:
        """Decoded entries by checkpoint key, for the reader's per-key loops (filled by
        :meth:`layout`)."""
        return self._entries().layouts

    def _entries(self) -> _Entries:
        if not self._parsed:
            with self._lock:
                if not self._parsed:
                    table = _scan(self.data, self.path)
                    self._parsed.append(_Entries(table, self.path, self.num_shards))
        return self._parsed[0]

    def rows(self) -> list[tuple[bytes, bytes]]:
        """Every ``(index key, serialized entry)`` but the header's, in key order: slice
        entries (§8.3) first, then one per checkpoint key."""
        return self._entries().table.pairs()[1:]

    # -- keys and entries ------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Checkpoint keys in index (UTF-8 byte) order; no header, no slice keys."""
        return list(self._entries().rows)

    def has_tensor(self, key: str) -> bool:
        return key in self._entries().rows

    def entry(self, key: str) -> BundleEntryProto:
        """The ``BundleEntryProto`` of ``key`` (parsed once, then cached)."""
        entries = self._entries().entries
        entry = entries.get(key)
        if entry is None:
            entry = parse_entry(self._value(key), key=key, path=self.path)
            entries[key] = entry
        return entry

    def slice_entry(self, key: str, stored: TensorSlice) -> BundleEntryProto:
        """The ``BundleEntryProto`` of the stored slice ``stored`` of ``key``."""
        _, value = self._slice_value(key, stored)
        return parse_entry(value, key=f"{key} [slice {stored}]", path=self.path)

    def _value(self, key: str) -> bytes:
        return self._entries().table.value(self._row(key))

    def _row(self, key: str) -> int:
        row = self._entries().rows.get(key)
        if row is None:
            raise NotFoundError(
                f"Key '{key}' not found in checkpoint {self.prefix}", path=self.prefix, key=key
            )
        return row

    def _slice_value(self, key: str, stored: TensorSlice) -> tuple[bytes, bytes]:
        """(slice key, serialized entry) of the stored slice ``stored`` of ``key`` (§8.3)."""
        slice_key = encode_slice_key(key, stored)
        value = self._entries().slice_values.get(slice_key)
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
        return self._entries().layouts.get(key) or self.decode_layout(key)

    def decode_layout(self, key: str) -> Layout:
        """Decode ``key``'s entry and cache it, for loops that looked in ``layouts`` already.

        Raises:
            The errors of :meth:`layout`.
        """
        row = self._row(key)
        parsed = self._entries()
        if not parsed.decoded_all:
            self._decode_all(parsed)
            layout = parsed.layouts.get(key)
            if layout is not None:
                return layout
        layout = parsed.decoder.decode(parsed.table.value(row), key)
        parsed.layouts[key] = layout
        return layout

    def _decode_all(self, parsed: _Entries) -> None:
        """Decode every tensor entry of common form at once (the others one by one, on use):
        cheaper per key than any decoding of one entry, for the many keys of a restore."""
        table, names = parsed.table, parsed.rows
        total = len(table.keys)
        rows = np.arange(total - len(names), total)
        decoded, layouts = common_layouts(parsed.decoder, table, rows, self.num_shards)
        parsed.layouts.update(zip(compress(names, decoded.tolist()), layouts))
        parsed.decoded_all = True

    def slice_layout(self, key: str, stored: TensorSlice) -> Layout:
        """The decoded entry of the stored slice ``stored`` of ``key`` (then cached)."""
        parsed = self._entries()
        slice_key = encode_slice_key(key, stored)
        layout = parsed.slice_layouts.get(slice_key)
        if layout is None:
            slice_key, value = self._slice_value(key, stored)
            layout = parsed.decoder.decode(value, f"{key} [slice {stored}]")
            parsed.slice_layouts[slice_key] = layout
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


def _scan(data: bytes, path: str) -> TableColumns:
    """:func:`read_table`, counting a checksum that does not match."""
    try:
        return read_table(data, path)
    except DataLossError as exc:
        count_checksum_failure(exc)
        raise


def _decode_keys(keys: list[bytes]) -> list[str]:
    """Each key as str (undecodable bytes escaped), in one decode for the whole list.

    Joined by NUL, which no UTF-8 sequence contains, the decode equals decoding each key; a
    key holding a NUL itself makes the count differ, and then each is decoded alone.
    """
    names = b"\x00".join(keys).decode("utf-8", "surrogateescape").split("\x00")
    if len(names) != len(keys) or not keys:
        return [key.decode("utf-8", "surrogateescape") for key in keys]
    return names
