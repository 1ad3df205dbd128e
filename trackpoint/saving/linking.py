"""Linking data files of an earlier checkpoint: its parsed index as pieces, and linked bundles.

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

A file is linked only once its bytes are known good: :func:`verify_files` reads it and checks
every piece, by the content digest of the value it stores when one was taken (XXH3-128, twice
crc32c's speed here, and it proves the bytes equal the value in memory), else by the crc32c of
its entry (§4), which the index, pinned by its digest since this process wrote it, holds as
written from memory. A file damaged in place — same size, same mtime, bit rot or a hostile
edit — would otherwise be carried into every later checkpoint.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trackpoint.bundle.crc import crc32c, unmask
from trackpoint.bundle.dtypes import DataType, datatype_for
from trackpoint.bundle.entries import make_entry, make_header
from trackpoint.bundle.index import BundleIndex
from trackpoint.bundle.naming import data_filename, index_filename
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
from trackpoint.bundle.slice_spec import (
    TensorSlice,
    encode_slice_key,
    format_slice_spec,
    parse_slice_spec,
)
from trackpoint.bundle.strings import decode_strings
from trackpoint.bundle.table_batch import table_of_pairs
from trackpoint.errors import CheckpointError, DataLossError
from trackpoint.saving.change_tracking import Token, content_digests, run_shared
from trackpoint.saving.sharding import ShardableTensor
from trackpoint.storage import Storage
from trackpoint.storage.base import RangeReader

__all__ = [
    "Expected",
    "LinkedFile",
    "Piece",
    "PreviousCheckpoint",
    "crc32c_combine",
    "expected_digests",
    "link_bundle",
    "piece_tensor",
    "value_box",
    "verify_files",
]

logger = logging.getLogger(__name__)

# A piece this large is checksummed as runs of this size on several threads, their CRCs combined.
_RUN_BYTES = 32 << 20
_CRC32C_POLY = 0x82F63B78  # Castagnoli, bit-reversed
_PARALLEL_BYTES = 16 << 20  # below this, checksumming on one thread beats handing work out
_SMALL_BYTES = 1 << 20  # tensors below this are checksummed as they are met


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
    """A data file of the previous checkpoint that the new one links, and what it holds."""

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
    """The checkpoint an incremental save compares against: its parsed index, as pieces.

    Raises (constructor):
        DataLossError: an entry of its index is damaged, or a partitioned tensor lists a
            slice without its entry.
    """

    def __init__(self, index: BundleIndex, storage: Storage) -> None:
        self.index = index
        self.prefix = index.prefix
        self.storage = storage
        self.num_shards = index.num_shards
        self.big_endian = index.big_endian
        self.full: dict[str, BundleEntryProto] = {}
        self.pieces_by_key: dict[str, list[Piece]] = {}
        self.pieces_by_shard: dict[int, list[Piece]] = {}
        self._datatypes: dict[Any, int] = {}  # numpy dtype -> DataType, looked up once
        for key in index.keys():
            entry = index.entry(key)
            self.full[key] = entry
            pieces = self.pieces_by_key.setdefault(key, [])
            if not entry.slices:
                pieces.append(Piece(key.encode("utf-8", "surrogateescape"), key, entry, None))
            for proto in entry.slices:
                box = TensorSlice.from_proto(proto)
                stored = index.slice_entry(key, box)
                pieces.append(Piece(encode_slice_key(key, box), key, stored, box))
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
    rows = [(raw_key, entries[raw_key]) for raw_key in sorted(entries)]
    return table_of_pairs([(b"", make_header(len(files)).SerializeToString()), *rows])


def link_bundle(
    files: Sequence[LinkedFile], prefix: str, storage: Storage, full: dict[str, BundleEntryProto]
) -> int:
    """Make ``files`` the data files of one bundle at ``prefix``; return the bytes linked.

    Each data file is ``storage.link``-ed (no bytes copied on local disks); then the one index
    is written, like a shard's: one index per save however many files are linked (the linked
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


def _times(matrix: Sequence[int], vector: int) -> int:
    """GF(2) matrix (``matrix[n]``: the image of bit ``n``) times a 32-bit vector."""
    out, n = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[n]
        vector >>= 1
        n += 1
    return out


def _square(matrix: Sequence[int]) -> list[int]:
    return [_times(matrix, column) for column in matrix]


@functools.lru_cache(maxsize=4)
def _shift_operator(nbytes: int) -> tuple[int, ...]:
    """The operator taking ``crc32c(a)`` to its part of ``crc32c(a + b)`` for ``len(b) ==
    nbytes`` (zlib's ``crc32_combine``, as a matrix: cached, since runs share one length)."""
    power = [_CRC32C_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        power = _square(power)  # one zero byte
    operator = [1 << n for n in range(32)]
    while nbytes:
        if nbytes & 1:
            operator = [_times(power, column) for column in operator]
        nbytes >>= 1
        if nbytes:
            power = _square(power)
    return tuple(operator)


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """``crc32c(a + b)`` from ``crc32c(a)``, ``crc32c(b)`` and ``len(b)``."""
    return _times(_shift_operator(length_b), crc_a) ^ crc_b if length_b else crc_a


def _elements(piece: Piece, full: BundleEntryProto) -> int:
    shape = [d.size for d in full.shape.dim]
    if piece.box is not None:
        return piece.box.num_elements(shape)
    count = 1
    for size in shape:
        count *= size
    return count


Expected = Mapping[int, tuple[bytes, np.dtype[Any], tuple[int, ...]]]
"""id(piece) -> (content digest of the value it alone stores, its little-endian dtype, shape)."""


def expected_digests(
    values: Sequence[ShardableTensor],
    unchanged: Mapping[tuple[str, str], list[Piece]],
    tokens: Mapping[tuple[str, str], Token],
) -> Expected:
    """The pieces :func:`verify_files` checks by digest: each numeric value stored whole in one
    piece, with a digest token. The file then holds exactly the value as hashed now (not only
    the bytes once written), and XXH3 runs at twice crc32c's speed."""
    expected = {}
    for st in values:
        key = (st.checkpoint_key, st.slice_spec)
        stored, token = unchanged.get(key), tokens.get(key)
        dtype = st.tensor.dtype
        if stored and len(stored) == 1 and isinstance(token, bytes) and dtype.kind in "biufc":
            expected[id(stored[0])] = (token, dtype.newbyteorder("<"), tuple(st.tensor.shape))
    return expected


def verify_files(
    files: Sequence[LinkedFile],
    storage: Storage,
    full: dict[str, BundleEntryProto],
    *,
    big_endian: bool = False,
    expected: Expected | None = None,
) -> list[str | None]:
    """For each file: None if every piece's bytes are good, else why not.

    A piece in ``expected`` is good when the content digest of its bytes (read as an array of
    the value's dtype and shape) is the expected one, or else (a representation this check
    does not know) when they match its entry's crc32c; any other piece when they match the
    crc32c. Reads every byte the pieces cover (an mmap on local disks, so from the page cache
    when the file was written or read recently; from a cold disk at the disk's speed), hashed
    on the calling thread and the hashing threads at once (both hashes release the GIL):
    digests as :func:`content_digests` does, crc32c in runs of at most 32 MiB, combined.
    A damaged, truncated, replaced or vanished file is the answer, never an error.
    """
    reasons: list[str | None] = [None] * len(files)
    readers: list[RangeReader] = []
    runs: list[memoryview] = []
    pieces: list[tuple[int, Piece, list[int]]] = []  # (file, piece, its runs)
    hashed: list[tuple[int, Piece, memoryview, np.ndarray, bytes]] = []
    expected = expected if expected is not None and not big_endian else {}
    try:
        for i, linked_file in enumerate(files):
            try:
                reader = storage.open_range_reader(linked_file.source)
                readers.append(reader)
                for piece in linked_file.pieces:
                    entry = piece.entry
                    data = reader.read(int(entry.offset), int(entry.size))
                    known = expected.get(id(piece))
                    view = _as_array(data, known) if known is not None else None
                    if view is not None and known is not None:
                        hashed.append((i, piece, data, view, known[0]))
                        continue
                    if int(full[piece.key].dtype) == DataType.DT_STRING:
                        decode_strings(
                            data, _elements(piece, full[piece.key]), entry.crc32c,
                            key=piece.key, path=linked_file.source, big_endian=big_endian,
                        )  # fmt: skip
                        continue
                    if len(data) < _SMALL_BYTES:  # at once: no bookkeeping per small tensor
                        if crc32c(data) != unmask(entry.crc32c):
                            raise DataLossError(_mismatch(piece), path=linked_file.source)
                        continue
                    # A head shorter than a run (maybe empty), then whole runs: every combine
                    # then shifts by the one length whose operator is cached.
                    head = len(data) % _RUN_BYTES
                    starts = range(head, len(data), _RUN_BYTES)
                    cuts = [(0, head), *((a, a + _RUN_BYTES) for a in starts)]
                    ids = list(range(len(runs), len(runs) + len(cuts)))
                    runs.extend(data[a:b] for a, b in cuts)
                    pieces.append((i, piece, ids))
            except CheckpointError as exc:
                reasons[i] = str(exc)
        digests = content_digests([view for _, _, _, view, _ in hashed])
        for (i, piece, data, _, digest), got in zip(hashed, digests):
            if got != digest and reasons[i] is None and crc32c(data) != unmask(piece.entry.crc32c):
                reasons[i] = _mismatch(piece)
        crcs = _crcs(runs)
        for i, piece, ids in pieces:
            crc = crcs[ids[0]]
            for run in ids[1:]:
                crc = crc32c_combine(crc, crcs[run], _RUN_BYTES)
            if reasons[i] is None and crc != unmask(piece.entry.crc32c):
                reasons[i] = _mismatch(piece)
    finally:
        runs.clear()  # no view into a mapping outlives its reader
        hashed.clear()
        for reader in readers:
            reader.close()
    return reasons


def _as_array(
    data: memoryview, known: tuple[bytes, np.dtype[Any], tuple[int, ...]]
) -> np.ndarray | None:
    """``data`` as the array whose digest is expected, or None if it cannot be one."""
    _, dtype, shape = known
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except (ValueError, TypeError):
        return None  # another size than the value's: the crc32c decides


def _mismatch(piece: Piece) -> str:
    entry = piece.entry
    return (
        f"the {entry.size} bytes of {piece.key!r} at offset {entry.offset} do not match their "
        "crc32c"
    )


def _crcs(runs: Sequence[memoryview]) -> list[int]:
    """crc32c of each run: on several threads when there are enough bytes to share."""
    crcs = [0] * len(runs)
    order = iter(sorted(range(len(runs)), key=lambda r: -len(runs[r])))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                run = next(order, None)
            if run is None:
                return
            crcs[run] = crc32c(runs[run])

    if sum(map(len, runs)) < _PARALLEL_BYTES:
        work()
    else:
        run_shared(work)
    return crcs
