"""The data files of one bundle: stored bytes without copying, verified into arrays (§6).

Each ``prefix.data-SSSSS-of-NNNNN`` file is opened through ``Storage.open_range_reader`` the
first time a tensor in it is read. A file the storage maps into memory (local disks: an mmap) is
kept as one byte array, and a tensor's bytes are a slice of it: cheaper per tensor than a
``read()`` and a new buffer, which matters for models of many small tensors. Other storages
serve each tensor with one ``read()``. Once their checksum matches, numeric bytes of a
little-endian file become a read-only view; strings are decoded (§6.2) and big-endian files
converted (§4), each into a new array.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING

import numpy as np

from trackpoint.bundle.crc import crc32c, crc32c_extend, mask
from trackpoint.bundle.index import count_checksum_failure
from trackpoint.bundle.naming import data_filename
from trackpoint.bundle.strings import decode_strings
from trackpoint.errors import DataLossError, FailedPreconditionError, NotFoundError
from trackpoint.metrics import registry as metrics

if TYPE_CHECKING:
    from trackpoint.bundle.layout import Layout
    from trackpoint.storage.base import RangeReader, Storage

__all__ = ["DataFiles"]

_SHARD_ID = attrgetter("shard_id")
_OFFSET = attrgetter("offset")
_SIZE = attrgetter("size")
_CRC = attrgetter("crc")
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_NDARRAY_SIZE = attrgetter("size")

logger = logging.getLogger(__name__)


def _swap_to_native(raw: memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A new native-order array from big-endian bytes (complex: each half swapped)."""
    unit = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    if unit == 1:
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    words = np.frombuffer(raw, dtype=f">u{unit}").astype(f"=u{unit}")
    return words.view(dtype).reshape(shape)


class DataFiles:
    """Byte ranges of the data files of the bundle at ``prefix``, for the bundle reader.

    Thread-safe. Bytes returned by :meth:`read` are views into the files' mappings: valid until
    :meth:`close`, and for as long as an array made from them lives (the array keeps the
    mapping exported, so it is unmapped only when the last view goes).

    Args:
        prefix: the bundle's prefix.
        storage: where its files live.
        num_shards: the number of data files (the header's ``num_shards``).
        big_endian: the files' byte order (the header's ``endianness``).
    """

    def __init__(
        self, prefix: str, storage: Storage, num_shards: int, *, big_endian: bool = False
    ) -> None:
        self._prefix = prefix
        self._storage = storage
        self._num_shards = num_shards
        self._big_endian = big_endian
        self._lock = threading.Lock()
        self._readers: dict[int, RangeReader] = {}
        # shard id -> the whole file as a uint8 array, for files mapped into memory, and as a
        # memoryview (slicing and hashing one costs less than a numpy slice, per tensor).
        self._mapped: dict[int, np.ndarray] = {}
        self._views: dict[int, memoryview] = {}
        self._closed = False

    def path(self, shard_id: int) -> str:
        """The name of data file ``shard_id``."""
        return data_filename(self._prefix, shard_id, self._num_shards)

    def read(self, key: str, layout: Layout) -> np.ndarray | memoryview:
        """The stored bytes of ``layout`` (a readable layout of ``key``), not copied.

        Raises:
            NotFoundError: the data file is missing.
            DataLossError: the file ends before the tensor does (it is truncated).
            FailedPreconditionError: the reader was closed.
        """
        shard_id, offset, size = layout.shard_id, layout.offset, layout.size
        mapped = self._mapped.get(shard_id)
        if mapped is None:
            reader = self._readers.get(shard_id) or self._open(shard_id, key)
            mapped = self._mapped.get(shard_id)
            if mapped is None:
                if offset + size > reader.size:
                    raise self._truncated(key, shard_id, offset, size, reader.size)
                return reader.read(offset, size) if size else memoryview(b"")
        end = offset + size
        if end > mapped.size:
            raise self._truncated(key, shard_id, offset, size, mapped.size)
        return mapped[offset:end]

    def check_extent(self, key: str, layout: Layout) -> None:
        """Check that the bytes of ``layout`` (readable) lie within its data file, reading
        none of them: what an entry declares is checked before anything is sized by it.

        Raises:
            NotFoundError: the data file is missing.
            DataLossError: the file ends before the tensor does (it is truncated).
            FailedPreconditionError: the reader was closed.
        """
        shard_id, offset, size = layout.shard_id, layout.offset, layout.size
        mapped = self._mapped.get(shard_id)
        if mapped is None:
            file_size = (self._readers.get(shard_id) or self._open(shard_id, key)).size
        else:
            file_size = mapped.size
        if offset + size > file_size:
            raise self._truncated(key, shard_id, offset, size, file_size)

    def copy_into(self, layout: Layout, out: np.ndarray) -> bool:
        """Copy the bytes of ``layout`` (readable, numeric, of a little-endian file) into
        ``out`` (its shape and dtype) if their checksum matches; True if done.

        The short way for the many small tensors of a restore: a slice of a mapped file, its
        CRC and one copy, no intermediate array. False, with ``out`` untouched, whenever
        :meth:`read` and :meth:`verified` must decide (a file not mapped or not opened yet,
        a truncated file, a checksum that does not match) or ``out`` is not C-contiguous.
        """
        view = self._views.get(layout.shard_id)
        if view is None:
            return False
        offset = layout.offset
        raw = view[offset : offset + layout.size]
        if raw.nbytes != layout.size or crc32c_extend(raw) != layout.crc:
            return False
        try:
            out.data.cast("B")[:] = raw
        except (TypeError, ValueError):  # not C-contiguous, or no buffer format (bfloat16)
            return False
        return True

    def view(self, layout: Layout) -> np.ndarray | None:
        """A read-only view of ``layout`` (readable, numeric, of a little-endian file) in its
        mapped file if the checksum matches, else None for :meth:`read` and :meth:`verified`
        to decide (a file not mapped or not opened yet, truncated, or damaged)."""
        whole = self._mapped.get(layout.shard_id)
        if whole is None or layout.dtype is None:
            return None
        offset = layout.offset
        raw = whole[offset : offset + layout.size]
        if raw.size != layout.size or crc32c_extend(raw) != layout.crc:
            return None
        return raw.view(layout.dtype).reshape(layout.shape)

    def views(self, keys: Sequence[str], layouts: Sequence[Layout]) -> list[np.ndarray] | None:
        """:meth:`view` of every layout at once, or None unless all of them can be viewed.

        For the many small tensors of a restore: the slicing, checksums and views run in C
        through ``map``. The layouts are readable, numeric and of a little-endian file; their
        files are opened here. None, with nothing read, if a file is missing, not mapped,
        truncated or damaged: :meth:`read` and :meth:`verified` then decide, value by value,
        and raise the error that says why.

        Raises:
            FailedPreconditionError: the reader was closed.
        """
        shard_ids = list(map(_SHARD_ID, layouts))
        mapped = self._mapped
        for shard_id in set(shard_ids):
            if shard_id not in mapped and shard_id not in self._readers:
                try:
                    self._open(shard_id, keys[shard_ids.index(shard_id)])
                except NotFoundError:
                    return None  # raised by read(), in the order of the keys
            if shard_id not in mapped:
                return None
        n = len(layouts)
        starts = np.fromiter(map(_OFFSET, layouts), np.int64, n)
        ends = starts + np.fromiter(map(_SIZE, layouts), np.int64, n)
        crcs = list(map(_CRC, layouts))
        dtypes = list(map(_DTYPE, layouts))
        shapes = list(map(_SHAPE, layouts))
        if any(map(is_, dtypes, repeat(None))):  # not `None in`: float64 == None
            return None
        if len(set(shard_ids)) == 1 and len(set(dtypes)) == 1:
            # One file, one dtype (the usual restore): slices of the file viewed as that
            # dtype once, so each value costs one slice instead of a slice and a view.
            whole = mapped[shard_ids[0]]
            item = dtypes[0].itemsize
            if n and int(ends.max()) > whole.size:
                return None  # truncated
            if item and not (starts % item).any() and not (ends % item).any():
                typed = whole[: whole.size - whole.size % item].view(dtypes[0])
                ranges = map(slice, (starts // item).tolist(), (ends // item).tolist())
                arrays = list(map(typed.__getitem__, ranges))
                if list(map(crc32c_extend, arrays)) != crcs:
                    return None  # damaged
                if set(map(len, shapes)) != {1}:  # 1-D slices already have their shape
                    arrays = list(map(np.ndarray.reshape, arrays, shapes))
                return arrays
        wholes = map(mapped.__getitem__, shard_ids)
        raws = list(map(np.ndarray.__getitem__, wholes, map(slice, starts.tolist(), ends.tolist())))
        if list(map(_NDARRAY_SIZE, raws)) != (ends - starts).tolist():
            return None  # truncated
        if list(map(crc32c_extend, raws)) != crcs:
            return None  # damaged
        return list(map(np.ndarray.reshape, map(np.ndarray.view, raws, dtypes), shapes))

    def verified(
        self, key: str, layout: Layout, raw: np.ndarray | memoryview, crc: int | None = None
    ) -> np.ndarray:
        """``raw``, the stored bytes of ``layout``, as its array once the checksum matches.

        A read-only view of ``raw`` for numeric tensors of a little-endian file, else a new
        array. ``crc`` is the CRC32C of ``raw`` when it was computed already (on a helper
        thread).

        Raises:
            DataLossError: a checksum does not match, or string lengths are corrupt.
        """
        dtype, shape = layout.dtype, layout.shape
        assert dtype is not None and shape is not None  # a readable layout has both
        if layout.is_string:
            return self._strings(key, layout, raw, shape)
        if crc is None:
            crc = crc32c(raw)
        if crc != layout.crc:
            metrics.increment(metrics.CHECKSUM_FAILURES)
            path = self.path(layout.shard_id)
            raise DataLossError(
                f"Checksum does not match: stored {layout.crc} vs. calculated {crc} "
                f"for key '{key}' in {path}. The data file is corrupt",
                path=path,
                key=key,
            )
        if self._big_endian:
            return _swap_to_native(memoryview(raw), dtype, shape)
        # A slice of a mapped file's byte array, or np.frombuffer, keeps the buffer exported
        # while the array lives, which keeps the mapping alive after the reader closes
        # (np.ndarray(buffer=raw) would not: it keeps only the mmap object, and the memory
        # would be unmapped under the array).
        if isinstance(raw, np.ndarray):  # a slice of a mapped file, read-only (see _open)
            return raw.view(dtype).reshape(shape)
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if not raw.readonly:  # a storage that hands out writable buffers
            array.flags.writeable = False
        return array

    def _strings(
        self, key: str, layout: Layout, raw: np.ndarray | memoryview, shape: tuple[int, ...]
    ) -> np.ndarray:
        """Decode a string tensor's stored bytes (§6.2), both checksums verified."""
        count = math.prod(shape)
        result = np.empty(count, dtype=object)
        try:
            result[:] = decode_strings(
                memoryview(raw),
                count,
                mask(layout.crc),
                key=key,
                path=self.path(layout.shard_id),
                big_endian=self._big_endian,
            )
        except DataLossError as exc:
            count_checksum_failure(exc)
            raise
        return result.reshape(shape)

    def _truncated(
        self, key: str, shard_id: int, offset: int, size: int, file_size: int
    ) -> DataLossError:
        path = self.path(shard_id)
        available = max(0, min(size, file_size - offset))
        return DataLossError(
            f"Requested {size} bytes but read {available} for key '{key}' at offset {offset} "
            f"of {path}: the data file is truncated",
            path=path,
            key=key,
        )

    def _open(self, shard_id: int, key: str) -> RangeReader:
        path = self.path(shard_id)
        with self._lock:
            if self._closed:
                raise FailedPreconditionError(
                    f"BundleReader for {self._prefix} is closed; open a new one to read '{key}'",
                    path=self._prefix,
                    key=key,
                )
            reader = self._readers.get(shard_id)
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
                self._readers[shard_id] = reader
                mapped = reader.mapped()
                if mapped is not None:
                    # Read-only once here, so every tensor sliced from it is (setting the
                    # flag per tensor costs more than slicing it).
                    whole = np.frombuffer(mapped, dtype=np.uint8)
                    whole.flags.writeable = False
                    self._mapped[shard_id] = whole
                    self._views[shard_id] = memoryview(whole)
        return reader

    def close(self) -> bool:
        """Close every open file; True the first time (views handed out stay valid).

        Reads after this raise FailedPreconditionError.
        """
        with self._lock:
            already_closed, self._closed = self._closed, True
            readers, self._readers = list(self._readers.values()), {}
            self._mapped = {}  # views handed out keep their own reference
            self._views = {}
        for reader in readers:
            try:
                reader.close()
            except BufferError:
                # Zero-copy views still reference the mapping; it is unmapped when they go.
                logger.debug("data file %s still has live views at close", reader.path)
        return not already_closed
