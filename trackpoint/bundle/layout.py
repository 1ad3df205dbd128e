"""Where each stored tensor of a bundle lies: index entries decoded once into layouts (§5, §8).

A read needs a tensor's dtype, shape, data file, offset, size and checksum, and the checks of
§5.1 that need no data file. :class:`LayoutDecoder` decodes an entry into a :class:`Layout`
holding all of these; the reader caches it per key, so every read of a tensor is a lookup, a
checksum and a view of the mapped file. Models of many small tensors repeat a few dtypes and
shapes, so the dtype and shape (the ``08 <dtype> 12 <len> <shape>`` that starts every entry
TensorFlow or trackpoint writes) are decoded and checked once per distinct leading bytes, and
only the scalar fields are read from each parsed entry.

A damaged or unsupported entry still decodes, with ``readable`` False: keys, dtypes and shapes
stay available (``tp inspect``), and a read raises the precise error of :func:`check_entry`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from trackpoint.bundle.crc import unmask
from trackpoint.bundle.dtypes import DataType, element_size, numpy_dtype_for
from trackpoint.bundle.entries import entry_shape, parse_entry
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
from trackpoint.bundle.slice_spec import TensorSlice
from trackpoint.errors import DataLossError, InvalidArgumentError

__all__ = ["Layout", "LayoutDecoder", "check_entry"]

# Shapes whose element count reaches this are rejected, as TensorFlow does ("Invalid tensor
# shape"): sizes in bytes must stay within int64.
_MAX_ELEMENTS = 1 << 62
# A numeric tensor's byte size must fit an int64 too (a stored size never reaches it); the
# index decodes sizes of many entries at once in int64 arrays (layout_batch.py).
_MAX_BYTES = 1 << 63


class Layout(NamedTuple):
    """One stored tensor, a whole tensor or one slice of a partitioned one, as its entry says.

    A NamedTuple rather than a frozen dataclass: one is built per key, for up to hundreds of
    thousands of keys, and a frozen dataclass costs several times as much to build.
    """

    datatype: int  # the stored DataType value (possibly one this reader does not know)
    dtype: np.dtype | None  # what a read returns (object for strings); None: no numpy equivalent
    shape: tuple[int, ...] | None  # None: unknown rank, a negative or an overflowing size
    shard_id: int
    offset: int
    size: int  # stored bytes (§6), without padding
    crc: int  # unmasked CRC32C of the stored bytes (§6.1; the entry checksum of §6.2)
    is_string: bool  # DT_STRING (with a valid shape), stored as lengths, checksum, bytes (§6.2)
    readable: bool  # every check of check_entry() passes: a read needs only the data file
    slices: tuple[TensorSlice, ...]  # the stored slices of a partitioned tensor (§8.1), else ()
    value: bytes  # the serialized entry, parsed again only to word an error (b"": see index)


class _Kind(NamedTuple):
    """What an entry's dtype and shape fields say, shared by every entry with the same head."""

    datatype: int
    dtype: np.dtype | None
    shape: tuple[int, ...] | None
    elements: int  # 0 for an invalid shape
    nbytes: int  # exact stored size of a numeric tensor; -1 for strings and unreadable kinds
    strings: bool  # a valid DT_STRING tensor, whose size only has a lower bound (§5.1)


class LayoutDecoder:
    """Decodes the index values of one bundle into :class:`Layout` s.

    Thread-safe: its caches only ever gain equal entries.

    Args:
        path: the ``.index`` file, for error messages.
        num_shards: the header's shard count, which every entry's ``shard_id`` must be below.
    """

    def __init__(self, path: str, num_shards: int) -> None:
        self._path = path
        self._num_shards = num_shards
        # Leading bytes of entries (fields 1-2: dtype and shape) -> their decoded kind.
        self._heads: dict[bytes, _Kind] = {}
        # DataType value -> (numpy dtype or None, bytes per element or None).
        self._dtypes: dict[int, tuple[np.dtype | None, int | None]] = {}

    def decode(self, value: bytes, key: str) -> Layout:
        """The layout of the serialized entry ``value`` of ``key``.

        Raises:
            DataLossError: ``value`` does not parse as a ``BundleEntryProto``. Every other
                problem leaves the layout unreadable, for :func:`check_entry` to report.
        """
        entry = BundleEntryProto()
        try:
            entry.ParseFromString(value)
        except DecodeError:
            parse_entry(value, key=key, path=self._path)  # raises the DataLossError
            raise
        head = None
        if (
            len(value) > 3
            and value[0] == 0x08
            and value[1] < 0x80
            and value[2] == 0x12
            and value[3] < 0x80
        ):
            head = value[: 4 + value[3]]
        kind = self._heads.get(head) if head is not None else None
        # A later duplicate field 1 would override the head's dtype: decode such an entry whole.
        if kind is None or entry.dtype != kind.datatype:
            kind = self._kind(entry)
            if head is not None:
                self._heads[head] = kind
        size, shard_id, offset, nbytes = entry.size, entry.shard_id, entry.offset, kind.nbytes
        if nbytes >= 0:
            fits = size == nbytes
        else:  # each string length takes at least one byte, plus the 4-byte checksum
            fits = kind.strings and size >= kind.elements + (4 if size else 0)
        # Field 7 (slices) starts with the byte 0x3a: without one, asking the message is moot.
        stored = entry.slices if 0x3A in value else ()
        return Layout(
            kind.datatype,
            kind.dtype,
            kind.shape,
            shard_id,
            offset,
            size,
            unmask(entry.crc32c),
            kind.strings,
            fits and 0 <= shard_id < self._num_shards and offset >= 0,
            tuple([TensorSlice.from_proto(proto) for proto in stored]) if stored else (),
            value,
        )

    def head_kind(self, head: bytes) -> _Kind | None:
        """What the dtype and shape fields ``head`` (``08 <dtype> 12 <n> <shape>``) say,
        cached; None if they do not parse.

        Protobuf reads these two fields alone as it reads them at the start of an entry that
        has no other field 1 or 2: for :mod:`~trackpoint.bundle.layout_batch`.
        """
        kind = self._heads.get(head)
        if kind is None:
            entry = BundleEntryProto()
            try:
                entry.ParseFromString(head)
            except DecodeError:
                return None
            kind = self._heads[head] = self._kind(entry)
        return kind

    def _kind(self, entry: BundleEntryProto) -> _Kind:
        datatype = int(entry.dtype)
        known = self._dtypes.get(datatype)
        if known is None:
            try:
                dtype: np.dtype | None = numpy_dtype_for(datatype)
            except InvalidArgumentError:
                dtype = None
            known = self._dtypes[datatype] = (dtype, element_size(datatype))
        dtype, itemsize = known
        proto = entry.shape
        dims = tuple([dim.size for dim in proto.dim])
        count = math.prod(dims)
        if proto.unknown_rank or (dims and min(dims) < 0) or count >= _MAX_ELEMENTS:
            return _Kind(datatype, dtype, None, 0, -1, False)
        if dtype is None:
            return _Kind(datatype, dtype, dims, count, -1, False)
        if itemsize is None:
            return _Kind(datatype, dtype, dims, count, -1, datatype == DataType.DT_STRING)
        if count * itemsize >= _MAX_BYTES:  # an invalid shape, as for too many elements
            return _Kind(datatype, dtype, None, 0, -1, False)
        return _Kind(datatype, dtype, dims, count, count * itemsize, False)


def check_entry(entry: BundleEntryProto, *, key: str, path: str, num_shards: int) -> None:
    """Raise what is wrong with ``entry`` for reading, in the order TensorFlow checks it (§5.1).

    The layout of an entry that passes every check is readable; this words the error for one
    that is not.

    Raises:
        InvalidArgumentError: the dtype has no numpy equivalent (variant, resource, unknown).
        DataLossError: an invalid shape, a size that disagrees with dtype and shape, a shard
            beyond the header's count, a negative offset or size.
    """
    datatype = entry.dtype
    dtype = numpy_dtype_for(datatype, key=key, path=path)
    shape = entry_shape(entry, key=key, path=path)
    count = math.prod(shape)
    itemsize = element_size(datatype)
    if itemsize is not None and entry.size != count * itemsize:
        raise DataLossError(
            f"Invalid size in bundle entry: key '{key}', stored size {entry.size}, "
            f"expected {count * itemsize} for {dtype} {list(shape)} in {path}",
            path=path,
            key=key,
        )
    if itemsize is None and entry.size < count + (4 if entry.size else 0):
        raise DataLossError(
            f"Invalid size in bundle entry: key '{key}', size {entry.size} is too small "
            f"for {count} strings in {path}",
            path=path,
            key=key,
        )
    if not 0 <= entry.shard_id < num_shards:
        raise DataLossError(
            f"Entry for key '{key}' names shard {entry.shard_id} but {path} has "
            f"{num_shards} shard(s)",
            path=path,
            key=key,
        )
    if entry.offset < 0 or entry.size < 0:
        raise DataLossError(
            f"Invalid offset {entry.offset} / size {entry.size} for key '{key}' in {path}",
            path=path,
            key=key,
        )
