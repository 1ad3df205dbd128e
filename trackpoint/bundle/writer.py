"""Write one bundle: ``prefix.data-00000-of-00001`` and then ``prefix.index`` (§6, §16).

Tensor bytes go to the data file in the order of ``add`` calls, straight from each array's
buffer: a C-contiguous little-endian array is hashed and written without a copy; anything else
(strided, Fortran-ordered, big-endian) is converted in chunks of a few MiB so memory stays
bounded. ``finish`` writes the sorted index last, through ``Storage.write_atomic``: the index
is what makes the bundle exist.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.bundle.crc import PARALLEL_HASH_BYTES, crc32c, crc32c_in_background, extend, mask
from trackpoint.bundle.dtypes import DataType, datatype_for
from trackpoint.bundle.entries import entry_head, entry_slices, entry_tail, make_header
from trackpoint.bundle.naming import data_filename, index_filename, resolve_storage
from trackpoint.bundle.slice_spec import TensorSlice, encode_slice_key
from trackpoint.bundle.strings import encode_strings, string_elements
from trackpoint.bundle.table import TableBuilder
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError

if TYPE_CHECKING:
    from typing_extensions import Buffer, Self

    from trackpoint.storage.base import Storage

__all__ = ["BundleWriter"]

logger = logging.getLogger(__name__)

# Copies of non-contiguous arrays are made this many bytes at a time.
_CHUNK_BYTES = 8 << 20
# Tensors below this size are gathered into one buffer and written together: one storage
# write per tensor costs more than the copy for the many small tensors of a real model.
_GATHER_BYTES = 64 << 10
_GATHER_FLUSH = 1 << 20


@dataclass(slots=True)
class _Partitioned:
    """The full-tensor entry of a partitioned tensor while its slices are added (§8.1)."""

    datatype: DataType
    shape: tuple[int, ...]
    slices: list[TensorSlice] = field(default_factory=list)


def _is_little_endian(dtype: np.dtype) -> bool:
    order = dtype.byteorder
    return order in "<|" or (order == "=" and sys.byteorder == "little")


def _c_chunks(array: np.ndarray, dtype: np.dtype) -> Iterator[np.ndarray]:
    """Yield C-order, ``dtype`` copies of consecutive row-major pieces of ``array``.

    Splits along the first axis whose trailing block fits in ``_CHUNK_BYTES``, so the number
    of pieces is about ``nbytes / _CHUNK_BYTES`` and each piece is at most that size.
    """
    if array.ndim == 0:
        yield np.ascontiguousarray(array.reshape(1), dtype=dtype)
        return
    shape = array.shape
    itemsize = dtype.itemsize
    axis = 0
    while axis < len(shape) - 1 and math.prod(shape[axis + 1 :]) * itemsize > _CHUNK_BYTES:
        axis += 1
    row_bytes = math.prod(shape[axis + 1 :]) * itemsize
    step = max(1, _CHUNK_BYTES // max(row_bytes, 1))
    for outer in np.ndindex(*shape[:axis]):
        sub = array[outer]
        for start in range(0, shape[axis], step):
            yield np.ascontiguousarray(sub[start : start + step], dtype=dtype)


class BundleWriter:
    """Writes tensors into a one-data-file bundle at ``prefix``.

    The data file is opened (and the prefix's parent directory created) on construction.
    Nothing exists as a checkpoint until :meth:`finish` writes ``prefix.index``. Used as a
    context manager, the bundle is finished on a clean exit and aborted (data file removed)
    when the block raises. Not thread-safe: one thread adds to one writer.

    Example::

        with BundleWriter("/tmp/ckpt") as writer:
            writer.add("w", np.ones((2, 3), np.float32))
    """

    def __init__(self, prefix: PathLike, *, storage: Storage | None = None) -> None:
        self._prefix = fspath(prefix)
        self._storage = resolve_storage(self._prefix, storage)
        self._data_path = data_filename(self._prefix, 0, 1)
        self._index_path = index_filename(self._prefix)
        parent = self._storage.dirname(self._prefix)
        if parent:
            self._storage.makedirs(parent)
        self._file: BinaryIO | None = self._storage.open_write(self._data_path)
        self._offset = 0
        # Serialized entries by index key; a partitioned tensor's full entry is serialized at
        # finish(), once all its slices are known.
        self._entries: dict[bytes, bytes | _Partitioned] = {}
        self._finished = False
        self._gathered = bytearray()  # small tensors not yet handed to the file
        # Per-dtype (DataType, writable from its buffer) and per-(DataType, shape) entry heads: the
        # same few dtypes and shapes recur across a model's tensors.
        self._kinds: dict[np.dtype, tuple[DataType, bool]] = {}
        self._heads: dict[tuple[int, tuple[int, ...]], bytes] = {}

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def bytes_written(self) -> int:
        """Bytes appended to the data file so far."""
        return self._offset

    # -- adding tensors --------------------------------------------------------------------
    def _check_open(self) -> BinaryIO:
        if self._file is None:
            state = "finished" if self._finished else "aborted"
            raise FailedPreconditionError(
                f"BundleWriter for {self._prefix} is already {state}; create a new writer",
                path=self._prefix,
            )
        return self._file

    def _key_bytes(self, key: str) -> bytes:
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(
                f"Invalid checkpoint key {key!r} for {self._prefix}: keys are non-empty str "
                "(the empty key holds the bundle header)",
                path=self._prefix,
                key=str(key),
            )
        if key[0] == "\x00":
            raise InvalidArgumentError(
                f"Invalid checkpoint key {key!r}: keys starting with NUL are reserved for "
                "slice entries",
                path=self._prefix,
                key=key,
            )
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"Invalid checkpoint key {key!r}: not encodable as UTF-8 ({exc})",
                path=self._prefix,
                key=key,
            ) from exc

    def _new_key(self, key: str) -> bytes:
        """``key`` as index bytes, after checking the writer is open and the key is new."""
        if self._file is None:
            self._check_open()
        raw_key = self._key_bytes(key)
        if raw_key in self._entries:
            raise InvalidArgumentError(
                f"Adding duplicate key '{key}' to bundle {self._prefix}; each checkpoint key "
                "may be written once",
                path=self._prefix,
                key=key,
            )
        return raw_key

    def add(self, key: str, array: np.ndarray) -> None:
        """Append ``array`` under ``key``.

        C-contiguous little-endian arrays are written from their own buffer without a copy
        (tensors under 64 KiB are gathered and written together).

        Raises:
            InvalidArgumentError: empty or duplicate key ("duplicate key"), unsupported dtype.
            FailedPreconditionError: the writer is finished or aborted.
        """
        raw_key = self._new_key(key)
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        self._entries[raw_key] = self._write_tensor(key, array)

    def add_chunks(
        self,
        key: str,
        dtype: np.dtype,
        shape: Sequence[int],
        chunks: Iterable[Buffer],
        *,
        full_shape: Sequence[int] | None = None,
        tensor_slice: TensorSlice | str | None = None,
    ) -> None:
        """Append a numeric tensor (or one slice of one) whose bytes arrive in pieces.

        For values that are never whole in memory (a bounded async snapshot streams them
        through a staging buffer): ``chunks`` yields the tensor's C-order little-endian bytes
        in order, each piece (bytes or a uint8 array) hashed and written before the next is
        requested, so a piece's memory may be reused once the iterator is resumed. The result
        is byte-identical to :meth:`add` (or :meth:`add_slice` when ``tensor_slice`` and
        ``full_shape`` are given) of the assembled array.

        Raises:
            InvalidArgumentError: duplicate key, a string or unsupported ``dtype``, a slice
                that does not match ``shape``, or pieces that do not add up to the size.
        """
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        datatype = datatype_for(dtype, key=key)
        if datatype == DataType.DT_STRING:
            raise InvalidArgumentError(
                f"add_chunks cannot write string tensor '{key}'; use add()", key=key
            )

        def write() -> bytes:
            return self._write_chunks(key, datatype, dtype, shape, chunks)

        if tensor_slice is None:
            raw_key = self._new_key(key)
            self._entries[raw_key] = write()
        else:
            if full_shape is None:
                raise InvalidArgumentError(
                    f"add_chunks for slice '{tensor_slice}' of '{key}' needs full_shape",
                    path=self._prefix,
                    key=key,
                )
            self._add_slice(key, full_shape, tensor_slice, shape, datatype, write)

    def _write_chunks(
        self,
        key: str,
        datatype: DataType,
        dtype: np.dtype,
        shape: tuple[int, ...],
        chunks: Iterable[Buffer],
    ) -> bytes:
        expected = math.prod(shape) * dtype.itemsize
        offset, crc = self._offset, 0
        for chunk in chunks:
            crc = extend(crc, chunk)
            self._write(chunk)
        size = self._offset - offset
        if size != expected:
            raise InvalidArgumentError(
                f"add_chunks for '{key}' got {size} bytes, expected {expected} for {dtype} "
                f"{list(shape)}",
                path=self._prefix,
                key=key,
            )
        return self._encode(datatype, shape, offset, size, mask(crc))

    def add_slice(
        self,
        key: str,
        full_shape: Sequence[int],
        tensor_slice: TensorSlice | str,
        array: np.ndarray,
    ) -> None:
        """Append one slice of a partitioned tensor of ``full_shape`` (§8.1).

        ``tensor_slice`` is a :class:`TensorSlice` or its C++ text form (``"0,2:-"``). A slice
        covering the whole tensor is stored as a plain entry, as SaveV2 does (§7).

        Raises:
            InvalidArgumentError: the array's shape does not match the slice, the slice does
                not fit, dtype or full shape differ from earlier slices of ``key``, the slice
                overlaps one already added, or ``key`` holds an unsliced tensor.
        """
        array = np.asarray(array)
        self._add_slice(
            key,
            full_shape,
            tensor_slice,
            array.shape,
            None,
            lambda: self._write_tensor(key, array),
            array,
        )

    def _add_slice(
        self,
        key: str,
        full_shape: Sequence[int],
        tensor_slice: TensorSlice | str,
        shape: tuple[int, ...],
        datatype: DataType | None,
        write: Callable[[], bytes],
        array: np.ndarray | None = None,
    ) -> None:
        """Register slice ``tensor_slice`` of ``key`` whose bytes ``write`` appends.

        ``datatype`` None means ``array``'s; a slice covering the whole tensor becomes a plain
        entry (``add(key, array)``, or ``write()`` under the plain key).
        """
        self._check_open()
        if isinstance(tensor_slice, str):
            tensor_slice = TensorSlice.parse(tensor_slice)
        full_shape = tuple(int(d) for d in full_shape)
        raw_key = self._key_bytes(key)
        expected = tensor_slice.shape_in(full_shape)
        if shape != expected:
            raise InvalidArgumentError(
                f"Slice '{tensor_slice}' of key '{key}' (full shape {list(full_shape)}) has "
                f"shape {list(expected)}, but the array has shape {list(shape)}",
                path=self._prefix,
                key=key,
            )
        if tensor_slice.is_full(full_shape):
            if array is not None:
                self.add(key, array)
            else:
                self._entries[self._new_key(key)] = write()
            return
        if datatype is None:
            assert array is not None
            datatype = datatype_for(array.dtype, key=key)
        full = self._entries.get(raw_key)
        if full is None:
            full = _Partitioned(datatype, full_shape)
        else:
            full = self._check_compatible_slice(key, full, datatype, full_shape, tensor_slice)
        slice_key = encode_slice_key(key, tensor_slice)
        self._entries[slice_key] = write()
        full.slices.append(tensor_slice)
        self._entries[raw_key] = full

    def _check_compatible_slice(
        self,
        key: str,
        full: bytes | _Partitioned,
        datatype: DataType,
        full_shape: tuple[int, ...],
        tensor_slice: TensorSlice,
    ) -> _Partitioned:
        """``full``, once it is shown to take ``tensor_slice`` of ``datatype``/``full_shape``."""
        if isinstance(full, bytes):
            raise InvalidArgumentError(
                f"Adding duplicate key '{key}' to bundle {self._prefix}: it already holds an "
                "unsliced tensor",
                path=self._prefix,
                key=key,
            )
        if full.datatype != datatype or full.shape != full_shape:
            raise InvalidArgumentError(
                f"Slices of key '{key}' disagree: earlier slices have dtype "
                f"{DataType(full.datatype).name} and shape {list(full.shape)}, this one "
                f"{datatype.name} and {list(full_shape)}",
                path=self._prefix,
                key=key,
            )
        for other in full.slices:
            if other.intersect(tensor_slice) is not None:
                raise InvalidArgumentError(
                    f"Slice '{tensor_slice}' of key '{key}' overlaps slice '{other}' already "
                    "added; slices of one tensor must be disjoint",
                    path=self._prefix,
                    key=key,
                )
        return full

    def _kind(self, dtype: np.dtype, key: str) -> tuple[DataType, bool]:
        """(DataType, whether arrays of ``dtype`` can be written from their own buffer).

        True for little-endian numeric dtypes that export a buffer; cached per writer.
        """
        kind = self._kinds.get(dtype)
        if kind is None:
            datatype = datatype_for(dtype, key=key)
            try:
                memoryview(np.empty(0, dtype))
            except (ValueError, TypeError):  # bfloat16 & co. have no buffer format
                exports = False
            else:
                exports = datatype != DataType.DT_STRING and _is_little_endian(dtype)
            kind = self._kinds[dtype] = (datatype, exports)
        return kind

    def _encode(
        self, datatype: int, shape: tuple[int, ...], offset: int, size: int, masked: int
    ) -> bytes:
        """The serialized ``BundleEntryProto`` of a tensor in this one-file bundle."""
        head = self._heads.get((datatype, shape))
        if head is None:
            head = self._heads[(datatype, shape)] = entry_head(datatype, shape)
        return head + entry_tail(offset, size, masked)

    def _write_tensor(self, key: str, array: np.ndarray) -> bytes:
        """Append the bytes of ``array`` and return its serialized entry (§6)."""
        datatype, exports = self._kind(array.dtype, key)
        offset = self._offset
        if exports and array.flags.c_contiguous:
            # The common case, kept short: hash and write from the array's own buffer.
            size = array.nbytes
            if size >= PARALLEL_HASH_BYTES:
                masked = mask(self._hash_and_write(array.reshape(-1).view(np.uint8)))
                return self._encode(datatype, array.shape, offset, size, masked)
            masked = mask(crc32c(array))
            if size < _GATHER_BYTES:
                self._gathered += memoryview(array)  # any C-contiguous buffer, as bytes
                self._offset += size
                if len(self._gathered) >= _GATHER_FLUSH:
                    self._flush_gathered()
            else:
                self._write(array.reshape(-1).view(np.uint8))
        elif datatype == DataType.DT_STRING:
            encoded = encode_strings(string_elements(array, key))
            self._write(encoded.header)
            self._write(encoded.payload)
            size, masked = encoded.size, encoded.masked_crc
        else:
            size, crc = self._write_numeric(array)
            masked = mask(crc)
        return self._encode(datatype, array.shape, offset, size, masked)

    def _write_numeric(self, array: np.ndarray) -> tuple[int, int]:
        dtype = array.dtype
        if array.flags.c_contiguous and _is_little_endian(dtype):
            buf = array.reshape(-1).view(np.uint8)
            self._write(buf)
            return buf.size, crc32c(buf)
        target = dtype if _is_little_endian(dtype) else dtype.newbyteorder("<")
        crc = 0
        size = 0
        for chunk in _c_chunks(array, target):
            buf = chunk.reshape(-1).view(np.uint8)
            self._write(buf)
            crc = extend(crc, buf)
            size += buf.size
        return size, crc

    def _hash_and_write(self, data: np.ndarray) -> int:
        """Write ``data`` (the bytes of a large tensor) and return its CRC32C.

        The checksum (§6) is computed on a helper thread while this one writes: both release
        the GIL, so the hash pass over memory overlaps the write instead of adding to it.
        """
        self._flush_gathered()
        file = self._check_open()
        view = memoryview(data)
        future = crc32c_in_background(view)
        try:
            file.write(view)
        finally:
            crc = future.result()
        self._offset += view.nbytes
        return crc

    def _write(self, data: Buffer) -> None:
        file = self._check_open()
        view = memoryview(data)
        nbytes = view.nbytes
        if not nbytes:
            return
        if nbytes < _GATHER_BYTES:
            self._gathered += view
            self._offset += nbytes
            if len(self._gathered) >= _GATHER_FLUSH:
                self._flush_gathered()
            return
        self._flush_gathered()
        file.write(view)
        self._offset += nbytes

    def _flush_gathered(self) -> None:
        if self._gathered:
            file = self._check_open()
            file.write(self._gathered)
            self._gathered = bytearray()

    # -- finishing -------------------------------------------------------------------------
    def finish(self) -> None:
        """Close the data file, then write ``prefix.index`` atomically.

        Raises:
            FailedPreconditionError: called twice, or after :meth:`abort`.
        """
        self._flush_gathered()
        file = self._check_open()
        self._file = None
        self._finished = True
        file.close()
        builder = TableBuilder()
        builder.add(b"", make_header(1).SerializeToString())
        entries = self._entries
        for raw_key in sorted(entries):
            value = entries[raw_key]
            if not isinstance(value, bytes):  # a partitioned tensor: head and its slices (§8.1)
                value = entry_head(value.datatype, value.shape) + entry_slices(value.slices)
            builder.add(raw_key, value)
        self._storage.write_atomic(self._index_path, builder.finish())
        logger.debug(
            "wrote bundle %s: %d entries, %d data bytes",
            self._prefix,
            len(self._entries),
            self._offset,
        )

    def abort(self) -> None:
        """Stop writing and delete the data file; no index is written. Idempotent."""
        file, self._file = self._file, None
        self._gathered = bytearray()
        if file is None:
            return
        try:
            file.close()
        finally:
            self._storage.remove(self._data_path, missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif self._file is not None:
            self.finish()
