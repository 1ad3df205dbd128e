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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.bundle.crc import crc32c, extend, mask
from trackpoint.bundle.dtypes import DataType, datatype_for
from trackpoint.bundle.entries import make_entry, make_header
from trackpoint.bundle.naming import data_filename, index_filename, resolve_storage
from trackpoint.bundle.slice_spec import TensorSlice, encode_slice_key
from trackpoint.bundle.strings import encode_strings, string_elements
from trackpoint.bundle.table import TableBuilder
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError

if TYPE_CHECKING:
    from typing_extensions import Self

    from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
    from trackpoint.storage.base import Storage

__all__ = ["BundleWriter"]

logger = logging.getLogger(__name__)

# Copies of non-contiguous arrays are made this many bytes at a time.
_CHUNK_BYTES = 8 << 20


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
    when the block raises.

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
        self._entries: dict[bytes, BundleEntryProto] = {}
        self._slices: dict[str, list[TensorSlice]] = {}
        self._finished = False

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
        if key.startswith("\x00"):
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

    def add(self, key: str, array: np.ndarray) -> None:
        """Append ``array`` under ``key``.

        C-contiguous little-endian arrays are written from their own buffer without a copy.

        Raises:
            InvalidArgumentError: empty or duplicate key ("duplicate key"), unsupported dtype.
            FailedPreconditionError: the writer is finished or aborted.
        """
        self._check_open()
        raw_key = self._key_bytes(key)
        if raw_key in self._entries:
            raise InvalidArgumentError(
                f"Adding duplicate key '{key}' to bundle {self._prefix}; each checkpoint key "
                "may be written once",
                path=self._prefix,
                key=key,
            )
        array = np.asarray(array)
        self._entries[raw_key] = self._write_tensor(key, array)

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
        self._check_open()
        if isinstance(tensor_slice, str):
            tensor_slice = TensorSlice.parse(tensor_slice)
        full_shape = tuple(int(d) for d in full_shape)
        raw_key = self._key_bytes(key)
        array = np.asarray(array)
        expected = tensor_slice.shape_in(full_shape)
        if array.shape != expected:
            raise InvalidArgumentError(
                f"Slice '{tensor_slice}' of key '{key}' (full shape {list(full_shape)}) has "
                f"shape {list(expected)}, but the array has shape {list(array.shape)}",
                path=self._prefix,
                key=key,
            )
        if tensor_slice.is_full(full_shape):
            self.add(key, array)
            return
        datatype = datatype_for(array.dtype, key=key)
        full = self._entries.get(raw_key)
        if full is None:
            full = make_entry(datatype, full_shape)
        else:
            self._check_compatible_slice(key, full, datatype, full_shape, tensor_slice)
        slice_key = encode_slice_key(key, tensor_slice)
        self._entries[slice_key] = self._write_tensor(key, array)
        full.slices.append(tensor_slice.to_proto())
        self._entries[raw_key] = full
        self._slices.setdefault(key, []).append(tensor_slice)

    def _check_compatible_slice(
        self,
        key: str,
        full: BundleEntryProto,
        datatype: DataType,
        full_shape: tuple[int, ...],
        tensor_slice: TensorSlice,
    ) -> None:
        if not full.slices:
            raise InvalidArgumentError(
                f"Adding duplicate key '{key}' to bundle {self._prefix}: it already holds an "
                "unsliced tensor",
                path=self._prefix,
                key=key,
            )
        old_shape = tuple(d.size for d in full.shape.dim)
        if full.dtype != datatype or old_shape != full_shape:
            raise InvalidArgumentError(
                f"Slices of key '{key}' disagree: earlier slices have dtype "
                f"{DataType(full.dtype).name} and shape {list(old_shape)}, this one "
                f"{datatype.name} and {list(full_shape)}",
                path=self._prefix,
                key=key,
            )
        for other in self._slices[key]:
            if other.intersect(tensor_slice) is not None:
                raise InvalidArgumentError(
                    f"Slice '{tensor_slice}' of key '{key}' overlaps slice '{other}' already "
                    "added; slices of one tensor must be disjoint",
                    path=self._prefix,
                    key=key,
                )

    def _write_tensor(self, key: str, array: np.ndarray) -> BundleEntryProto:
        """Append the bytes of ``array`` and return its entry (§6)."""
        datatype = datatype_for(array.dtype, key=key)
        offset = self._offset
        if datatype == DataType.DT_STRING:
            encoded = encode_strings(string_elements(array, key))
            self._write(encoded.header)
            self._write(encoded.payload)
            size, masked = encoded.size, encoded.masked_crc
        else:
            size, crc = self._write_numeric(array)
            masked = mask(crc)
        return make_entry(datatype, array.shape, offset=offset, size=size, crc32c=masked)

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

    def _write(self, data: bytes | np.ndarray) -> None:
        file = self._check_open()
        view = memoryview(data)
        if view.nbytes:
            file.write(view)
            self._offset += view.nbytes

    # -- finishing -------------------------------------------------------------------------
    def finish(self) -> None:
        """Close the data file, then write ``prefix.index`` atomically.

        Raises:
            FailedPreconditionError: called twice, or after :meth:`abort`.
        """
        file = self._check_open()
        self._file = None
        self._finished = True
        file.close()
        builder = TableBuilder()
        builder.add(b"", make_header(1).SerializeToString())
        for raw_key in sorted(self._entries):
            builder.add(raw_key, self._entries[raw_key].SerializeToString())
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
