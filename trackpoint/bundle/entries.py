"""Index values: the header (key ``""``) and tensor entries (tf-checkpoint-format.md §4, §5).

Builds them as TensorFlow serializes them and checks them on read, so that the writer,
reader and merge agree on one set of rules. The writer serializes entries with
:func:`entry_head`, :func:`entry_tail` and :func:`entry_slices`, by hand: building a message per
tensor costs more than the tensor's I/O for models of many small tensors.
``tests/bundle/test_entry_encoding.py`` pins their bytes to protobuf's serialization of
:func:`make_entry`.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from trackpoint.bundle.dtypes import element_size
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from trackpoint.bundle.slice_spec import TensorSlice
from trackpoint.bundle.table import encode_varint
from trackpoint.errors import DataLossError, InvalidArgumentError

__all__ = [
    "MIN_CONSUMER",
    "MIN_PRODUCER",
    "VERSION",
    "check_header",
    "entry_head",
    "entry_shape",
    "entry_slices",
    "entry_tail",
    "make_entry",
    "make_header",
    "parse_entry",
    "parse_header",
]

# tensor_bundle.cc: kTensorBundleVersion, kTensorBundleMinConsumer, kTensorBundleMinProducer.
VERSION = 1
MIN_CONSUMER = 0
MIN_PRODUCER = 0


def make_header(num_shards: int, *, big_endian: bool = False) -> BundleHeaderProto:
    """The header TF writes: ``num_shards``, endianness, version {producer 1}."""
    header = BundleHeaderProto(num_shards=num_shards)
    if big_endian:
        header.endianness = BundleHeaderProto.BIG
    header.version.producer = VERSION
    header.version.min_consumer = MIN_CONSUMER
    return header


def make_entry(
    datatype: int,
    shape: Sequence[int],
    *,
    shard_id: int = 0,
    offset: int = 0,
    size: int = 0,
    crc32c: int = 0,
) -> BundleEntryProto:
    """A tensor entry; the shape is always present, even for scalars (``12 00``)."""
    entry = BundleEntryProto(
        # The generated stub types proto enums as a class of their own; on the wire and at
        # runtime a DataType is the int that trackpoint.bundle.dtypes.DataType holds.
        dtype=datatype,  # type: ignore[arg-type]
        shard_id=shard_id,
        offset=offset,
        size=size,
        crc32c=crc32c,
    )
    entry.shape.SetInParent()
    for dim in shape:
        entry.shape.dim.add(size=int(dim))
    return entry


def _varint_field(tag: bytes, value: int) -> bytes:
    """A varint field of a proto3 message; zero is the default and is left out."""
    if not value:
        return b""
    if value < 0:  # int32/int64 negatives are 10-byte two's complement varints
        value &= (1 << 64) - 1
    return tag + encode_varint(value)


def entry_head(datatype: int, shape: Sequence[int]) -> bytes:
    """Fields 1-2 of a serialized ``BundleEntryProto``: dtype and shape (always present, §5).

    As protobuf writes them: field order, defaults omitted, ``12 00`` for a scalar's empty
    shape, an empty ``Dim`` for a dimension of size 0. The same few heads recur across a
    model's tensors, so callers cache them per (dtype, shape).
    """
    dims = b"".join(
        b"\x12" + encode_varint(len(dim)) + dim
        for dim in (_varint_field(b"\x08", int(size)) for size in shape)
    )
    return _varint_field(b"\x08", datatype) + b"\x12" + encode_varint(len(dims)) + dims


def entry_tail(offset: int, size: int, masked_crc: int) -> bytes:
    """Fields 4-6 of a serialized ``BundleEntryProto`` of a one-file bundle (shard_id 0).

    ``entry_head(...) + entry_tail(...)`` is a whole entry. Written out without helpers (one
    call per tensor); offset and size are never negative.
    """
    tail = b"\x20" + encode_varint(offset) if offset else b""
    if size:
        tail += b"\x28" + encode_varint(size)
    if masked_crc:
        tail += b"\x35" + masked_crc.to_bytes(4, "little")
    return tail


def entry_slices(slices: Sequence[TensorSlice]) -> bytes:
    """Field 7 of a serialized ``BundleEntryProto``: the slices of a partitioned tensor (§8.1).

    ``entry_head(...) + entry_slices(...)`` is the full-tensor entry of a partitioned tensor
    (fields 3-6 stay 0). Each ``TensorSliceProto`` holds one ``Extent`` per dimension, as
    :meth:`TensorSlice.to_proto` builds it: empty for a whole dimension, else ``start``
    (omitted if 0) and ``length`` (in a oneof, so written even when 0).
    """
    out = bytearray()
    for tensor_slice in slices:
        extents = bytearray()
        for start, length in zip(tensor_slice.starts, tensor_slice.lengths):
            extent = b""
            if length != -1:
                extent = _varint_field(b"\x08", start) + b"\x10" + encode_varint(length)
            extents += b"\x0a" + encode_varint(len(extent)) + extent
        out += b"\x3a" + encode_varint(len(extents)) + extents
    return bytes(out)


def parse_header(value: bytes, path: str) -> BundleHeaderProto:
    """Decode the header value; malformed bytes are data loss."""
    header = BundleHeaderProto()
    try:
        header.ParseFromString(value)
    except DecodeError as exc:
        raise DataLossError(
            f"Corrupted index file {path}: the header entry does not parse ({exc})", path=path
        ) from exc
    return header


def check_header(header: BundleHeaderProto, path: str) -> None:
    """Apply TF's version rules (CheckVersions) and sanity-check ``num_shards``.

    Raises:
        InvalidArgumentError: the checkpoint needs a newer reader, was made by a producer
            below the minimum, or disallows this reader.
        DataLossError: ``num_shards`` is not positive or the endianness is unknown.
    """
    version = header.version
    if version.producer < MIN_PRODUCER:
        raise InvalidArgumentError(
            f"Checkpoint producer version {version.producer} below min producer "
            f"{MIN_PRODUCER} supported by trackpoint (reading {path}). "
            "Please regenerate your checkpoint",
            path=path,
        )
    if version.min_consumer > VERSION:
        raise InvalidArgumentError(
            f"Checkpoint min consumer version {version.min_consumer} above current version "
            f"{VERSION} for trackpoint (reading {path}). Please upgrade trackpoint",
            path=path,
        )
    if VERSION in version.bad_consumers:
        raise InvalidArgumentError(
            f"Checkpoint disallows consumer version {VERSION} (reading {path}). "
            "Please upgrade trackpoint: this version is likely buggy",
            path=path,
        )
    if header.num_shards <= 0:
        raise DataLossError(
            f"Corrupted index file {path}: header has num_shards {header.num_shards}", path=path
        )
    if header.endianness not in (BundleHeaderProto.LITTLE, BundleHeaderProto.BIG):
        raise DataLossError(
            f"Corrupted index file {path}: unknown endianness {header.endianness}", path=path
        )


def parse_entry(value: bytes, *, key: str, path: str) -> BundleEntryProto:
    """Decode one tensor entry; malformed bytes are data loss."""
    entry = BundleEntryProto()
    try:
        entry.ParseFromString(value)
    except DecodeError as exc:
        raise DataLossError(
            f"Corrupted index file {path}: the entry for key '{key}' does not parse ({exc})",
            path=path,
            key=key,
        ) from exc
    return entry


def entry_shape(entry: BundleEntryProto, *, key: str, path: str) -> tuple[int, ...]:
    """The entry's shape, rejecting unknown rank, negative or overflowing sizes."""
    shape = entry.shape
    dims = tuple(dim.size for dim in shape.dim)
    count = 1
    for dim in dims:
        count *= max(dim, 0)
    # Elements below 2**62 and, for fixed-size dtypes, bytes below 2**63 (int64 sizes).
    nbytes = count * (element_size(entry.dtype) or 1)
    if shape.unknown_rank or any(d < 0 for d in dims) or count >= 1 << 62 or nbytes >= 1 << 63:
        raise DataLossError(
            f"Invalid tensor shape {list(dims)} for key '{key}' in {path}"
            + (" (unknown rank)" if shape.unknown_rank else ""),
            path=path,
            key=key,
        )
    return dims
