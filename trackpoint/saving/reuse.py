"""Reusing data files of an earlier checkpoint: its index, read as pieces, and linked bundles.

An incremental save (:mod:`trackpoint.saving.incremental`) keeps a data file of the previous
checkpoint when every tensor stored in it is a value that is unchanged now. The file is not
copied into the new checkpoint but linked (``Storage.link``: a hard link on local disks) into
the save's temporary place as a data file of one *linked bundle* whose index is written fresh
from the previous index's entries (same offsets, sizes and checksums; the shard id of the
linked file). The commit then merges that bundle like any other shard
(tf-checkpoint-format.md §11.2): the new checkpoint's index is always rebuilt, and names every
tensor of every linked file.

A *piece* is one stored tensor of the previous index: a whole tensor, or one stored slice of a
partitioned one (§8).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trackpoint.bundle.dtypes import datatype_for
from trackpoint.bundle.entries import make_entry, make_header, parse_entry, parse_header
from trackpoint.bundle.naming import data_filename, index_filename
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
from trackpoint.bundle.slice_spec import (
    TensorSlice,
    encode_slice_key,
    format_slice_spec,
    parse_slice_spec,
)
from trackpoint.bundle.table import TableBuilder, read_table
from trackpoint.errors import CheckpointError, DataLossError
from trackpoint.saving.sharding import ShardableTensor
from trackpoint.storage import Storage

__all__ = [
    "LinkedFile",
    "Piece",
    "PreviousCheckpoint",
    "link_bundle",
    "piece_tensor",
    "value_box",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class Piece:
    """One tensor stored in the previous checkpoint: a whole tensor or one stored slice."""

    raw_key: bytes
    """Its index key (a slice key, §8.3, for a stored slice)."""
    key: str
    """The checkpoint key of the tensor it belongs to."""
    entry: BundleEntryProto
    """Its entry: shard id, offset, size, crc32c."""
    box: TensorSlice | None
    """The stored slice, or None for a whole tensor."""


@dataclass(slots=True)
class LinkedFile:
    """A data file of the previous checkpoint that the new one reuses, and what it holds."""

    source: str
    """The previous checkpoint's data file."""
    pieces: list[Piece] = field(default_factory=list)
    nbytes: int = 0
    """Its size."""


def value_box(st: ShardableTensor) -> tuple[tuple[int, ...], TensorSlice | None]:
    """(full shape, box) of a value: box None for a whole tensor, else its slice."""
    parsed = parse_slice_spec(st.slice_spec) if st.slice_spec else None
    if parsed is None:
        return tuple(st.shape), None
    return parsed


def _contains(outer: TensorSlice, inner: TensorSlice, full_shape: Sequence[int]) -> bool:
    return all(
        o_start <= i_start and i_stop <= o_stop
        for (o_start, o_stop), (i_start, i_stop) in zip(
            outer.bounds(full_shape), inner.bounds(full_shape)
        )
    )


class PreviousCheckpoint:
    """The index of the checkpoint an incremental save compares against, as pieces.

    Raises (constructor):
        NotFoundError: the checkpoint is gone.
        DataLossError: its index is damaged.
    """

    def __init__(self, prefix: str, storage: Storage, index: bytes) -> None:
        self.prefix = prefix
        self.storage = storage
        path = index_filename(prefix)
        pairs = read_table(index, path)
        if not pairs or pairs[0][0] != b"":
            raise DataLossError(f"Index {path} has no header entry", path=path)
        self.num_shards = parse_header(pairs[0][1], path).num_shards
        values = dict(pairs[1:])
        self.full: dict[str, BundleEntryProto] = {}
        self.pieces_by_key: dict[str, list[Piece]] = {}
        self.pieces_by_shard: dict[int, list[Piece]] = {}
        self._datatypes: dict[Any, int] = {}  # numpy dtype -> DataType, looked up once
        for raw_key, value in pairs[1:]:
            if raw_key[:1] == b"\x00":
                continue  # slice entries are reached from their full entry
            key = raw_key.decode("utf-8", "surrogateescape")
            entry = parse_entry(value, key=key, path=path)
            self.full[key] = entry
            pieces = self.pieces_by_key.setdefault(key, [])
            if not entry.slices:
                pieces.append(Piece(raw_key, key, entry, None))
            for proto in entry.slices:
                box = TensorSlice.from_proto(proto)
                slice_key = encode_slice_key(key, box)
                stored = values.get(slice_key)
                if stored is None:
                    raise DataLossError(
                        f"Index {path} lists slice {box} of {key!r} without its entry",
                        path=path,
                        key=key,
                    )
                pieces.append(Piece(slice_key, key, parse_entry(stored, key=key, path=path), box))
        for pieces in self.pieces_by_key.values():
            for piece in pieces:
                self.pieces_by_shard.setdefault(piece.entry.shard_id, []).append(piece)

    def data_file(self, shard_id: int) -> str:
        return data_filename(self.prefix, shard_id, self.num_shards)

    def pieces_of(self, st: ShardableTensor) -> list[Piece] | None:
        """The stored pieces that together hold exactly ``st``'s value, or None.

        None when the checkpoint has no tensor under its key, or one of another dtype or
        full shape, or when its stored slices do not tile the value's box.
        """
        stored = self.full.get(st.checkpoint_key)
        if stored is None:
            return None
        full_shape, box = value_box(st) if st.slice_spec else (tuple(st.shape), None)
        datatype = self._datatypes.get(st.dtype)
        if datatype is None:
            try:
                datatype = self._datatypes[st.dtype] = datatype_for(st.dtype)
            except CheckpointError:
                return None
        if int(stored.dtype) != int(datatype) or tuple(d.size for d in stored.shape.dim) != tuple(
            full_shape
        ):
            return None
        pieces = self.pieces_by_key[st.checkpoint_key]
        if box is None:
            return pieces
        inside = [p for p in pieces if p.box is not None and _contains(box, p.box, full_shape)]
        covered = sum(p.box.num_elements(full_shape) for p in inside if p.box is not None)
        return inside if inside and covered == box.num_elements(full_shape) else None

    def file_size(self, shard_id: int) -> int | None:
        """The size of data file ``shard_id``, or None if it cannot be read."""
        try:
            return self.storage.size(self.data_file(shard_id))
        except CheckpointError:
            return None


def piece_tensor(st: ShardableTensor, piece: Piece) -> ShardableTensor:
    """The part of value ``st`` that ``piece`` stores, as a value of its own (a slice)."""
    full_shape, box = value_box(st)
    assert piece.box is not None
    index = (
        piece.box.numpy_index(full_shape) if box is None else piece.box.relative_to(box, full_shape)
    )
    view = st.tensor[index]
    spec = format_slice_spec(full_shape, piece.box)
    return ShardableTensor(
        view, view.dtype, st.device, st.checkpoint_key, view.shape, spec, st.checkpoint_key,
        st.trackable,
    )  # fmt: skip


def _index_bytes(files: Sequence[LinkedFile], full: dict[str, BundleEntryProto]) -> bytes:
    """The index of a bundle whose data file ``i`` is ``files[i]`` (offsets unchanged)."""
    entries: dict[bytes, bytes] = {}
    partitioned: dict[str, list[TensorSlice]] = {}
    pieces = [(shard_id, p) for shard_id, f in enumerate(files) for p in f.pieces]
    for shard_id, piece in pieces:
        entry = BundleEntryProto()
        entry.CopyFrom(piece.entry)
        entry.shard_id = shard_id
        entries[piece.raw_key] = entry.SerializeToString()
        if piece.box is not None:
            partitioned.setdefault(piece.key, []).append(piece.box)
    for key, boxes in partitioned.items():
        stored = full[key]
        whole = make_entry(int(stored.dtype), [d.size for d in stored.shape.dim])
        for box in boxes:
            whole.slices.add().CopyFrom(box.to_proto())
        entries[key.encode("utf-8", "surrogateescape")] = whole.SerializeToString()
    builder = TableBuilder()
    builder.add(b"", make_header(len(files)).SerializeToString())
    for raw_key in sorted(entries):
        builder.add(raw_key, entries[raw_key])
    return builder.finish()


def link_bundle(
    files: Sequence[LinkedFile], prefix: str, storage: Storage, full: dict[str, BundleEntryProto]
) -> int:
    """Make ``files`` the data files of one bundle at ``prefix``; return the bytes linked.

    Each data file is ``storage.link``-ed (no bytes copied on local disks); then the one index
    is written, like a shard's: one index per save however many files are reused (the linked
    bytes are durable already: their checkpoint was committed).

    Raises:
        CheckpointError: a data file of the previous checkpoint vanished or cannot be linked.
    """
    count = len(files)
    for shard_id, linked_file in enumerate(files):
        how = storage.link(linked_file.source, data_filename(prefix, shard_id, count))
        if how == "copy":
            logger.debug("Copied %s (no link possible)", linked_file.source)
    with storage.open_atomic(index_filename(prefix)) as out:
        out.write(_index_bytes(files, full))
    return sum(f.nbytes for f in files)
