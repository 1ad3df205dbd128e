"""Index values: the header (key ``""``) and tensor entries (tf-checkpoint-format.md §4, §5).

Builds them as TensorFlow serializes them and checks them on read, so that the writer,
reader and merge agree on one set of rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from trackpoint.errors import DataLossError, InvalidArgumentError

__all__ = [
    "MIN_CONSUMER",
    "MIN_PRODUCER",
    "VERSION",
    "check_header",
    "entry_shape",
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
        dtype=datatype, shard_id=shard_id, offset=offset, size=size, crc32c=crc32c
    )
    entry.shape.SetInParent()
    for dim in shape:
        entry.shape.dim.add(size=int(dim))
    return entry


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
    if shape.unknown_rank or any(d < 0 for d in dims) or count >= 1 << 62:
        raise DataLossError(
            f"Invalid tensor shape {list(dims)} for key '{key}' in {path}"
            + (" (unknown rank)" if shape.unknown_rank else ""),
            path=path,
            key=key,
        )
    return dims
