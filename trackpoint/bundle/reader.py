"""Read a bundle: the whole index up front, tensor bytes on demand through mmap (§3.9, §16).

The index is parsed once with every block checksum verified. Data files are opened lazily via
``Storage.open_range_reader`` (an mmap for local files), so reading a tensor hashes the mapped
bytes in place and either returns a read-only view of them or copies them once into the result.
Every error names the file and the checkpoint key.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from trackpoint import metrics
from trackpoint._types import PathLike, fspath
from trackpoint.bundle.crc import PARALLEL_HASH_BYTES, crc32c, crc32c_in_background, unmask
from trackpoint.bundle.dtypes import DataType, element_size, numpy_dtype_for
from trackpoint.bundle.entries import check_header, entry_shape, parse_entry, parse_header
from trackpoint.bundle.naming import data_filename, index_filename, resolve_storage
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from trackpoint.bundle.slice_spec import TensorSlice, encode_slice_key
from trackpoint.bundle.strings import decode_strings
from trackpoint.bundle.table import read_table
from trackpoint.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from typing_extensions import Self

    from trackpoint.storage.base import RangeReader, Storage

__all__ = ["BundleReader"]

logger = logging.getLogger(__name__)


def _swap_to_native(raw: memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A new native-order array from big-endian bytes (complex: each half swapped)."""
    unit = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    if unit == 1:
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    words = np.frombuffer(raw, dtype=f">u{unit}").astype(f"=u{unit}")
    return words.view(dtype).reshape(shape)


def _count_checksum_failure(exc: DataLossError) -> None:
    """Count ``exc`` in trackpoint_checksum_failures_total if a checksum did not match.

    Table blocks and string tensors are checked in ``table``/``strings``, which report a
    mismatch as a DataLossError saying "checksum does not match".
    """
    if "checksum does not match" in str(exc).lower():
        metrics.increment(metrics.CHECKSUM_FAILURES)


def _array(raw: np.ndarray | memoryview | bytes, layout: _Layout) -> np.ndarray:
    """``raw`` as the array ``layout`` describes, sharing its memory.

    A slice of a mapped file's byte array, or ``np.frombuffer``, keeps the buffer exported
    while the array lives, which keeps the mapping alive after the reader closes
    (``np.ndarray(buffer=raw)`` would not: it keeps only the mmap object, and the memory
    would be unmapped under the array).
    """
    if isinstance(raw, np.ndarray):
        return raw.view(layout.dtype).reshape(layout.shape)
    return np.frombuffer(raw, dtype=layout.dtype).reshape(layout.shape)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


class _Kind(NamedTuple):
    datatype: int
    dtype: np.dtype
    itemsize: int


class _Layout(NamedTuple):
    """Where an unsliced little-endian numeric tensor lies, checked once per key."""

    dtype: np.dtype
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc: int  # unmasked


class BundleReader:
    """Random access to the tensors of the bundle at ``prefix``.

    Thread-safe for concurrent reads. Arrays returned with ``copy=False`` are read-only views
    into the mapped data file and stay valid until :meth:`close`.

    Raises (constructor):
        NotFoundError: ``prefix.index`` does not exist.
        DataLossError: the index is damaged.
        InvalidArgumentError: the bundle's version excludes this reader.
    """

    def __init__(self, prefix: PathLike, *, storage: Storage | None = None) -> None:
        self._prefix = fspath(prefix)
        self._storage = resolve_storage(self._prefix, storage)
        self._index_path = index_filename(self._prefix)
        try:
            with self._storage.open_range_reader(self._index_path) as index_reader:
                # Indexes are small; a private copy lets the mapping close right away.
                data = bytes(index_reader.read(0, index_reader.size))
        except NotFoundError as exc:
            raise NotFoundError(
                f"Checkpoint not found: no index file {self._index_path} for prefix "
                f"'{self._prefix}'. Check the path, or whether the save finished",
                path=self._prefix,
            ) from exc
        # Bytes read from storage, added into trackpoint_bytes_read_total once, at close().
        self._index_bytes = len(data)
        self._bytes_read = len(data)
        self._count_lock = threading.Lock()
        try:
            pairs = read_table(data, self._index_path)
        except DataLossError as exc:
            _count_checksum_failure(exc)
            raise
        if not pairs or pairs[0][0] != b"":
            raise DataLossError(
                f"Corrupted index file {self._index_path}: no header entry (key '')",
                path=self._index_path,
            )
        self._header = parse_header(pairs[0][1], self._index_path)
        check_header(self._header, self._index_path)
        self._big_endian = self._header.endianness == BundleHeaderProto.BIG
        self._values: dict[str, bytes] = {}
        self._slice_values: dict[bytes, bytes] = {}
        for raw_key, value in pairs[1:]:
            if raw_key[:1] == b"\x00":
                self._slice_values[raw_key] = value
            else:
                self._values[raw_key.decode("utf-8", "surrogateescape")] = value
        self._entries: dict[str, BundleEntryProto] = {}
        # key -> _Layout, or None for a tensor the plain fast path does not handle (strings,
        # slices, big-endian files).
        self._layouts: dict[str, _Layout | None] = {}
        # DataType -> its numpy dtype and element size; None for strings and unreadable types.
        self._kinds: dict[int, _Kind | None] = {}
        # Leading bytes of entries (dtype and shape) -> what _entry_kind made of them.
        self._heads: dict[bytes, tuple[_Kind, tuple[int, ...], int] | bool] = {}
        self._lock = threading.Lock()
        self._data: dict[int, RangeReader] = {}
        # shard id -> the whole data file as bytes, for files that are mapped into memory:
        # tensors are sliced from it (cheaper per tensor than a read() and a new buffer).
        self._mapped: dict[int, np.ndarray] = {}
        self._closed = False

    # -- metadata --------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def header(self) -> BundleHeaderProto:
        """The header entry (num_shards, endianness, version)."""
        return self._header

    @property
    def num_shards(self) -> int:
        return self._header.num_shards

    def keys(self) -> list[str]:
        """Checkpoint keys in index (UTF-8 byte) order; no header, no slice keys."""
        return list(self._values)

    def has_tensor(self, key: str) -> bool:
        return key in self._values

    def entry(self, key: str) -> BundleEntryProto:
        """The ``BundleEntryProto`` of ``key`` (parsed once, then cached)."""
        entry = self._entries.get(key)
        if entry is None:
            value = self._values.get(key)
            if value is None:
                raise NotFoundError(
                    f"Key '{key}' not found in checkpoint {self._prefix}",
                    path=self._prefix,
                    key=key,
                )
            entry = parse_entry(value, key=key, path=self._index_path)
            self._entries[key] = entry
        return entry

    def datatype(self, key: str) -> DataType:
        value = self.entry(key).dtype
        try:
            return DataType(value)
        except ValueError:
            raise DataLossError(
                f"Unknown dtype {value} for key '{key}' in {self._index_path}",
                path=self._index_path,
                key=key,
            ) from None

    def dtype(self, key: str) -> np.dtype:
        """The numpy dtype ``read(key)`` returns (object for strings)."""
        layout = self._layouts.get(key)
        if layout is not None:
            return layout.dtype
        return numpy_dtype_for(self.datatype(key), key=key, path=self._index_path)

    def shape(self, key: str) -> tuple[int, ...]:
        layout = self._layouts.get(key)
        if layout is not None:
            return layout.shape
        return entry_shape(self.entry(key), key=key, path=self._index_path)

    def slices(self, key: str) -> list[TensorSlice]:
        """The stored slices of a partitioned tensor, in order; ``[]`` if unsliced."""
        return [TensorSlice.from_proto(p) for p in self.entry(key).slices]

    # -- reading ---------------------------------------------------------------------------
    def read(self, key: str, *, copy: bool = True) -> np.ndarray:
        """The whole tensor ``key``, after verifying its checksum(s).

        With ``copy=False`` an unsliced numeric tensor comes back as a read-only zero-copy
        view of the mapped file, valid until :meth:`close`. Sliced and string tensors are
        always assembled into a new array.

        Raises:
            NotFoundError: unknown key, or its data file is missing.
            DataLossError: checksum mismatch, truncated file, inconsistent entry.
        """
        layout = self._layouts.get(key) if key in self._layouts else self._layout(key)
        if layout is not None:
            array = self._read_layout(key, layout)
            if copy:
                return array.copy()
            array.flags.writeable = False
            return array
        entry = self.entry(key)
        if entry.slices:
            shape = self.shape(key)
            out = np.empty(shape, dtype=self.dtype(key))
            self._assemble(key, entry, TensorSlice.full(len(shape)), out)
            return out
        return self._read_entry(key, entry, copy=copy)

    def read_many(self, keys: Iterable[str], *, copy: bool = True) -> list[np.ndarray]:
        """``[self.read(key, copy=copy) for key in keys]`` at a lower cost per key.

        For checkpoints of many small tensors, where per-read bookkeeping outweighs the bytes.

        Raises:
            The errors of :meth:`read`, for the first key that fails.
        """
        arrays: list[np.ndarray | None] = []
        # Large tensors are checksummed on helper threads while this one goes on.
        hashing: list[tuple[int, str, _Layout, np.ndarray | memoryview | bytes, Future[int]]] = []
        counted = 0
        layouts = self._layouts
        try:
            for key in keys:
                layout = layouts.get(key) if key in layouts else self._layout(key)
                if layout is None:
                    arrays.append(self.read(key, copy=copy))
                    continue
                counted += layout.size
                if layout.size >= PARALLEL_HASH_BYTES:
                    raw = self._layout_bytes(key, layout)
                    hashing.append((len(arrays), key, layout, raw, crc32c_in_background(raw)))
                    arrays.append(None)
                    continue
                array = self._view_layout(key, layout)
                arrays.append(array.copy() if copy else _read_only(array))
            for index, key, layout, raw, future in hashing:
                self._check_crc(key, layout, future.result())
                array = _array(raw, layout)
                arrays[index] = array.copy() if copy else _read_only(array)
        finally:
            wait([future for *_, future in hashing])  # none still reads the file
            self._count_read(counted)
        return arrays  # type: ignore[return-value]

    def read_into(self, key: str, out: np.ndarray) -> None:
        """Copy tensor ``key`` into ``out`` (same shape and dtype) with one copy.

        Raises:
            InvalidArgumentError: ``out`` has another shape or dtype, or is read-only.
        """
        layout = self._layouts.get(key) if key in self._layouts else self._layout(key)
        if (
            layout is not None
            and type(out) is np.ndarray
            and out.shape == layout.shape
            and out.dtype == layout.dtype
            and out.flags.writeable
        ):
            np.copyto(out, self._read_layout(key, layout))
            return
        shape, dtype = self.shape(key), self.dtype(key)
        if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dtype:
            got = f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray) else type(out)
            raise InvalidArgumentError(
                f"Cannot read key '{key}' of {self._prefix} into an array of {got}: the "
                f"checkpoint holds {dtype} {list(shape)}",
                path=self._prefix,
                key=key,
            )
        if not out.flags.writeable:
            raise InvalidArgumentError(
                f"Cannot read key '{key}' into a read-only array", path=self._prefix, key=key
            )
        entry = self.entry(key)
        if entry.slices:
            self._assemble(key, entry, TensorSlice.full(len(shape)), out)
        else:
            out[...] = self._read_entry(key, entry, copy=False)

    def read_slice(
        self, key: str, tensor_slice: TensorSlice | str, *, copy: bool = True
    ) -> np.ndarray:
        """The sub-box ``tensor_slice`` of tensor ``key``, as a new array by default.

        For a partitioned tensor only the stored slices that intersect the box are read. With
        ``copy=False`` a box that is a region of an unsliced numeric tensor, or exactly one
        stored slice, comes back as a read-only view of the file (valid until :meth:`close`);
        other boxes are assembled into a new array.

        Raises:
            InvalidArgumentError: the slice does not fit the tensor's shape.
            DataLossError: stored slices do not cover the box, or a checksum fails.
        """
        if isinstance(tensor_slice, str):
            tensor_slice = TensorSlice.parse(tensor_slice)
        full_shape = self.shape(key)
        index = tensor_slice.numpy_index(full_shape)  # validates rank and fit
        entry = self.entry(key)
        if not entry.slices:
            region = self._read_entry(key, entry, copy=False)[index]
            return np.array(region, copy=True) if copy else _read_only(region)
        if not copy:
            needed = tensor_slice.num_elements(full_shape)
            for proto in entry.slices:
                stored = TensorSlice.from_proto(proto)
                common = stored.intersect(tensor_slice) if stored.rank == len(full_shape) else None
                if (
                    needed
                    and common is not None
                    and common.num_elements(full_shape) == needed
                    and stored.num_elements(full_shape) == needed
                ):  # the box is this stored slice
                    slice_entry = self._checked_slice_entry(key, entry, stored, full_shape)
                    return _read_only(self._read_entry(key, slice_entry, copy=False))
        out = np.empty(tensor_slice.shape_in(full_shape), dtype=self.dtype(key))
        self._assemble(key, entry, tensor_slice, out)
        return out

    def verify(self, key: str | None = None) -> None:
        """Check the checksums of ``key`` (or of every tensor); raise DataLossError on damage."""
        for name in self.keys() if key is None else [key]:
            entry = self.entry(name)
            if entry.slices:
                for stored in self.slices(name):
                    self._read_entry(name, self._slice_entry(name, stored), copy=False)
            else:
                self._read_entry(name, entry, copy=False)

    def file_sizes(self) -> dict[str, int]:
        """``{path: bytes}`` of the index, then of every data file in shard order.

        One stat per data file (a HEAD request on object stores), for statistics.

        Raises:
            NotFoundError: a data file is missing.
        """
        sizes = {self._index_path: self._index_bytes}
        for shard_id in range(self.num_shards):
            path = data_filename(self._prefix, shard_id, self.num_shards)
            sizes[path] = self._storage.size(path)
        return sizes

    @property
    def bytes_read(self) -> int:
        """Bytes read from storage so far: the index and the tensors' stored bytes."""
        return self._bytes_read

    def _count_read(self, nbytes: int) -> None:
        with self._count_lock:  # += is not atomic across threads
            self._bytes_read += nbytes

    def stored_bytes(self, key: str) -> int:
        """Bytes ``key`` occupies in the data files (the sum over its slices if sliced)."""
        entry = self.entry(key)
        if entry.slices:
            return sum(int(self._slice_entry(key, s).size) for s in self.slices(key))
        return int(entry.size)

    # -- internals -------------------------------------------------------------------------
    def _layout(self, key: str) -> _Layout | None:
        """Check ``key``'s entry once and remember where its bytes are (None: no fast path).

        Every check of :meth:`_read_entry` and :meth:`_tensor_bytes` that does not need the
        data file is done here, so a read is a lookup, a checksum and a view. The common case (a
        valid unsliced numeric entry) is decided by :meth:`_plain_layout`; anything else goes
        through :meth:`entry` and the full checks, which raise the errors.
        """
        value = self._values.get(key)
        if value is not None and not self._big_endian:
            layout = self._plain_layout(value)
            if layout is not None:
                self._layouts[key] = layout
                return layout
        entry = self.entry(key)
        layout = None
        if not entry.slices and not self._big_endian:
            itemsize = element_size(entry.dtype)
            if itemsize is not None:
                dtype = numpy_dtype_for(entry.dtype, key=key, path=self._index_path)
                shape = entry_shape(entry, key=key, path=self._index_path)
                if entry.size != math.prod(shape) * itemsize:
                    self._read_entry(key, entry, copy=False)  # raises the size error
                if not 0 <= entry.shard_id < self.num_shards or entry.offset < 0:
                    self._tensor_bytes(key, entry)  # raises the shard or offset error
                layout = _Layout(
                    dtype, shape, entry.shard_id, entry.offset, entry.size, unmask(entry.crc32c)
                )
        self._layouts[key] = layout
        return layout

    def _plain_layout(self, value: bytes) -> _Layout | None:
        """The layout of the entry ``value`` if it is a valid unsliced numeric one.

        None sends the key down the full path, which raises the errors (a damaged entry
        included). Per-key cost matters for models of many small
        tensors, so the dtype and shape (fields 1-2, the ``08 <dtype> 12 <len> <shape>`` that
        starts the bytes of every entry TensorFlow or trackpoint writes) are decoded and checked
        once per distinct prefix, and only the scalar fields are read from the parsed message.
        """
        entry = BundleEntryProto()
        try:
            entry.ParseFromString(value)
        except DecodeError:
            return None
        head = None
        if len(value) > 3 and value[0] == 0x08 and value[2] == 0x12 and value[3] < 0x80:
            head = value[: 4 + value[3]]
        kind = self._heads.get(head) if head is not None else None
        if kind is None:
            kind = self._entry_kind(entry)
            if head is not None:
                self._heads[head] = kind
        if not kind or entry.slices or entry.dtype != kind[0].datatype:
            return None
        size, shard_id, offset = entry.size, entry.shard_id, entry.offset
        if size != kind[2] or not 0 <= shard_id < self._header.num_shards or offset < 0:
            return None
        return _Layout(kind[0].dtype, kind[1], shard_id, offset, size, unmask(entry.crc32c))

    def _entry_kind(self, entry: BundleEntryProto) -> tuple[_Kind, tuple[int, ...], int] | bool:
        """(dtype, shape, byte size) of a readable numeric ``entry``; False: the full path."""
        datatype = entry.dtype
        kind = self._kinds.get(datatype)
        if kind is None:
            if datatype in self._kinds:
                return False
            itemsize = element_size(datatype)
            if itemsize is not None:
                kind = _Kind(datatype, numpy_dtype_for(datatype), itemsize)
            self._kinds[datatype] = kind
            if kind is None:
                return False
        shape_proto = entry.shape
        shape = tuple([dim.size for dim in shape_proto.dim])
        count = math.prod(shape)
        if shape_proto.unknown_rank or (shape and min(shape) < 0) or count >= 1 << 62:
            return False
        return kind, shape, count * kind.itemsize

    def _read_layout(self, key: str, layout: _Layout) -> np.ndarray:
        """The tensor at ``layout`` as a view of the mapped file, checksum verified, counted."""
        array = self._view_layout(key, layout)
        self._count_read(layout.size)
        return array

    def _view_layout(self, key: str, layout: _Layout) -> np.ndarray:
        """The tensor at ``layout`` as a view of the mapped file, checksum verified."""
        raw = self._layout_bytes(key, layout)
        self._check_crc(key, layout, crc32c(raw))
        return _array(raw, layout)

    def _layout_bytes(self, key: str, layout: _Layout) -> np.ndarray | memoryview | bytes:
        """The stored bytes at ``layout`` (not yet checksummed), without copying them."""
        shard_id, offset, size = layout.shard_id, layout.offset, layout.size
        mapped = self._mapped.get(shard_id)
        if mapped is None:
            reader = self._data.get(shard_id) or self._data_reader(shard_id, key)
            mapped = self._mapped.get(shard_id)
            if mapped is None:
                if offset + size > reader.size:
                    self._tensor_bytes(key, self.entry(key))  # raises the truncation error
                return reader.read(offset, size) if size else memoryview(b"")
        end = offset + size
        if end > mapped.size:
            self._tensor_bytes(key, self.entry(key))  # raises the truncation error
        return mapped[offset:end]

    def _check_crc(self, key: str, layout: _Layout, crc: int) -> None:
        if crc != layout.crc:
            metrics.increment(metrics.CHECKSUM_FAILURES)
            path = data_filename(self._prefix, layout.shard_id, self.num_shards)
            raise DataLossError(
                f"Checksum does not match: stored {layout.crc} vs. calculated {crc} "
                f"for key '{key}' in {path}. The data file is corrupt",
                path=path,
                key=key,
            )

    def _checked_slice_entry(
        self, key: str, entry: BundleEntryProto, stored: TensorSlice, full_shape: tuple[int, ...]
    ) -> BundleEntryProto:
        """The entry of the stored slice ``stored``, checked against the full tensor's."""
        slice_entry = self._slice_entry(key, stored)
        if slice_entry.dtype != entry.dtype or entry_shape(
            slice_entry, key=key, path=self._index_path
        ) != stored.shape_in(full_shape):
            raise DataLossError(
                f"Slice '{stored}' of key '{key}' has a dtype or shape that disagrees "
                f"with the full tensor in {self._index_path}",
                path=self._index_path,
                key=key,
            )
        return slice_entry

    def _slice_entry(self, key: str, stored: TensorSlice) -> BundleEntryProto:
        value = self._slice_values.get(encode_slice_key(key, stored))
        if value is None:
            raise DataLossError(
                f"Checkpoint {self._prefix} lists slice '{stored}' of key '{key}' but has no "
                "entry for it",
                path=self._index_path,
                key=key,
            )
        return parse_entry(value, key=f"{key} [slice {stored}]", path=self._index_path)

    def _assemble(
        self, key: str, entry: BundleEntryProto, target: TensorSlice, out: np.ndarray
    ) -> None:
        """Fill ``out`` (the box ``target``) from the stored slices that intersect it (§8.4)."""
        full_shape = self.shape(key)
        covered = 0
        parts: list[TensorSlice] = []
        for proto in entry.slices:
            stored = TensorSlice.from_proto(proto)
            if stored.rank != len(full_shape):
                raise DataLossError(
                    f"Slice '{stored}' of key '{key}' has the wrong rank for shape "
                    f"{list(full_shape)} in {self._index_path}",
                    path=self._index_path,
                    key=key,
                )
            common = stored.intersect(target)
            if common is None:
                continue
            slice_entry = self._checked_slice_entry(key, entry, stored, full_shape)
            data = self._read_entry(key, slice_entry, copy=False)
            out[common.relative_to(target, full_shape)] = data[
                common.relative_to(stored, full_shape)
            ]
            covered += common.num_elements(full_shape)
            parts.append(common)
        needed = target.num_elements(full_shape)
        if covered != needed and not self._covers(parts, target, full_shape):
            raise DataLossError(
                f"The stored slices of key '{key}' in {self._prefix} do not cover the "
                f"requested region '{target}' of shape {list(full_shape)}",
                path=self._prefix,
                key=key,
            )

    @staticmethod
    def _covers(parts: list[TensorSlice], target: TensorSlice, full_shape: tuple[int, ...]) -> bool:
        """Exact coverage test, needed only when stored slices overlap."""
        mask = np.zeros(target.shape_in(full_shape), dtype=bool)
        for part in parts:
            mask[part.relative_to(target, full_shape)] = True
        return bool(mask.all())

    def _data_reader(self, shard_id: int, key: str) -> RangeReader:
        reader = self._data.get(shard_id)
        if reader is not None:
            return reader
        path = data_filename(self._prefix, shard_id, self.num_shards)
        with self._lock:
            if self._closed:
                raise FailedPreconditionError(
                    f"BundleReader for {self._prefix} is closed; open a new one to read '{key}'",
                    path=self._prefix,
                    key=key,
                )
            reader = self._data.get(shard_id)
            if reader is None:
                try:
                    reader = self._storage.open_range_reader(path)
                except NotFoundError as exc:
                    raise NotFoundError(
                        f"Data file {path} of checkpoint {self._prefix} not found (needed for "
                        f"key '{key}'); the checkpoint is incomplete",
                        path=path,
                        key=key,
                    ) from exc
                self._data[shard_id] = reader
                mapped = reader.mapped()
                if mapped is not None:
                    self._mapped[shard_id] = np.frombuffer(mapped, dtype=np.uint8)
        return reader

    def _tensor_bytes(self, key: str, entry: BundleEntryProto) -> tuple[memoryview, str]:
        """The entry's ``size`` bytes from its data file (not yet checksummed)."""
        shard_id = entry.shard_id
        if not 0 <= shard_id < self.num_shards:
            raise DataLossError(
                f"Entry for key '{key}' names shard {shard_id} but {self._index_path} has "
                f"{self.num_shards} shard(s)",
                path=self._index_path,
                key=key,
            )
        path = data_filename(self._prefix, shard_id, self.num_shards)
        if entry.offset < 0 or entry.size < 0:
            raise DataLossError(
                f"Invalid offset {entry.offset} / size {entry.size} for key '{key}' in "
                f"{self._index_path}",
                path=self._index_path,
                key=key,
            )
        reader = self._data_reader(shard_id, key)
        available = max(0, min(entry.size, reader.size - entry.offset))
        if available < entry.size:
            raise DataLossError(
                f"Requested {entry.size} bytes but read {available} for key '{key}' at "
                f"offset {entry.offset} of {path}: the data file is truncated",
                path=path,
                key=key,
            )
        if entry.size == 0:
            return memoryview(b""), path
        data = reader.read(entry.offset, entry.size)
        self._count_read(entry.size)
        return data, path

    def _read_entry(self, key: str, entry: BundleEntryProto, *, copy: bool) -> np.ndarray:
        """Read an unsliced entry (a tensor or one slice of one), checksum verified."""
        datatype = entry.dtype
        dtype = numpy_dtype_for(datatype, key=key, path=self._index_path)
        shape = entry_shape(entry, key=key, path=self._index_path)
        count = math.prod(shape)
        itemsize = element_size(datatype)
        if itemsize is not None and entry.size != count * itemsize:
            raise DataLossError(
                f"Invalid size in bundle entry: key '{key}', stored size {entry.size}, "
                f"expected {count * itemsize} for {dtype} {list(shape)} in {self._index_path}",
                path=self._index_path,
                key=key,
            )
        if itemsize is None and entry.size < count + (4 if entry.size else 0):
            raise DataLossError(
                f"Invalid size in bundle entry: key '{key}', size {entry.size} is too small "
                f"for {count} strings in {self._index_path}",
                path=self._index_path,
                key=key,
            )
        raw, path = self._tensor_bytes(key, entry)
        if itemsize is None:
            result = np.empty(count, dtype=object)
            try:
                result[:] = decode_strings(
                    raw, count, entry.crc32c, key=key, path=path, big_endian=self._big_endian
                )
            except DataLossError as exc:
                _count_checksum_failure(exc)
                raise
            return result.reshape(shape)
        actual = crc32c(raw)
        if actual != unmask(entry.crc32c):
            metrics.increment(metrics.CHECKSUM_FAILURES)
            raise DataLossError(
                f"Checksum does not match: stored {unmask(entry.crc32c)} vs. calculated "
                f"{actual} for key '{key}' in {path}. The data file is corrupt",
                path=path,
                key=key,
            )
        if self._big_endian:
            return _swap_to_native(raw, dtype, shape)
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if copy:
            return array.copy()
        array.flags.writeable = False
        return array

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Release the data files; views returned with ``copy=False`` become invalid."""
        with self._lock:
            already_closed, self._closed = self._closed, True
            readers, self._data = list(self._data.values()), {}
            self._mapped = {}  # views handed out keep their own reference
        if not already_closed:
            metrics.increment(metrics.BYTES_READ, self.bytes_read)
        for reader in readers:
            try:
                reader.close()
            except BufferError:
                # Zero-copy views still reference the mapping; it is unmapped when they go.
                logger.debug("data file %s still has live views at close", reader.path)

    def reopen(self) -> BundleReader:
        """A new reader of the same checkpoint that reuses this one's parsed index.

        For reading again after :meth:`close` (a deferred restore) without reading and
        checking the index a second time; data files are opened anew, on first use.
        """
        other = copy.copy(self)
        other._bytes_read = 0
        other._count_lock = threading.Lock()
        other._lock = threading.Lock()
        other._data = {}
        other._mapped = {}
        other._closed = False
        return other

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
