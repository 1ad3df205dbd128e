"""More mutators for the structured fuzzer, and the draw of one case's ops (:func:`generate`).

``fuzz_mutate`` holds the file model and the first mutators; these reach the bytes behind
valid checksums: string tensors whose lengths lie, entries whose huge shape and size agree,
partitioned entries declaring huge tensors (issue 27 finding 6), a second data file, a
checkpoint without its object graph (the name-based restore).
"""

from __future__ import annotations

import random
import struct

import numpy as np

from tests.adversary.fuzz_mutate import (
    GRAPH_KEY,
    Files,
    Info,
    Op,
    Skip,
    _entry_op,
    _first_data,
    _graph_op,
    _header_op,
    _raw_op,
    _state_file_op,
    _state_value_op,
    _table_op,
    edit_entry,
    entries,
    set_entries,
)
from trackpoint.bundle.crc import extend as crc_extend
from trackpoint.bundle.crc import mask as crc_mask
from trackpoint.bundle.dtypes import element_size
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from trackpoint.bundle.strings import _encode_varints, _lengths_crc

__all__ = ["generate"]


def _string_bytes(lengths: list[int], payload: bytes) -> tuple[bytes, int]:
    """A string tensor's stored bytes claiming ``lengths``, with both checksums valid (§6.2):
    only the lengths themselves are hostile. Returns the bytes and the entry's masked crc."""
    array = np.array(lengths, dtype=np.uint64)
    crc = _lengths_crc(array)
    checksum = struct.pack("<I", crc_mask(crc))
    raw = _encode_varints(array) + checksum + payload
    return raw, crc_mask(crc_extend(crc_extend(crc, checksum), payload))


HOSTILE_LENGTHS = [
    ([2**64 - 1, 1], b""),  # the lengths' sum wraps to 0 in uint64
    ([2**63, 2**63], b""),
    ([2**64 - 2, 3], b"a"),
    ([2**62] * 4, b"abc"),
    ([2**40], b"xy"),
    ([5, 2**64 - 5], b""),
    ([0, 0, 7], b"abc"),
]


def _string_op(rng: random.Random, info: Info) -> Op:
    keys: list[bytes] = info["string_keys"]
    key = rng.choice(keys)
    lengths, payload = rng.choice(HOSTILE_LENGTHS)
    reshape = rng.random() < 0.5

    def change(files: Files) -> None:
        rows = dict(entries(files))
        if key not in rows:
            raise Skip
        entry = BundleEntryProto.FromString(rows[key])
        raw, crc = _string_bytes(lengths, payload)
        name = _first_data(files)
        entry.shard_id, entry.offset, entry.size, entry.crc32c = 0, len(files.data[name]), \
            len(raw), crc
        files.data[name] += raw
        if reshape or not entry.shape.dim:
            del entry.shape.dim[:]
            entry.shape.dim.add(size=len(lengths))
        rows[key] = entry.SerializeToString()
        set_entries(files, list(rows.items()))
        files.hostile |= {key.decode("utf-8", "surrogateescape")}

    return Op(f"string {key!r}: lengths {lengths} payload {payload!r} reshape {reshape}",
              change, False, ["strings"])


def _shape_size_op(rng: random.Random, info: Info) -> Op:
    """A huge shape with the size that matches it: the entry is consistent, the file short."""
    key = rng.choice(info["entry_keys"])
    dim = rng.choice([2**31, 2**40, 2**50, 2**58])
    pick = rng.random()

    def change(entry: BundleEntryProto) -> None:
        itemsize = element_size(entry.dtype)
        if not itemsize:
            raise Skip
        if entry.shape.dim:
            entry.shape.dim[int(pick * len(entry.shape.dim))].size = dim
        else:
            entry.shape.dim.add(size=dim)
        count = 1
        for d in entry.shape.dim:
            count *= d.size
        if count * itemsize >= 1 << 63 or not count:
            raise Skip
        entry.size = count * itemsize

    return Op(f"entry {key!r}: dim := {dim}, size to match", lambda files: edit_entry(
        files, key, change), False, ["entry"])


def _huge_partition_op(rng: random.Random, info: Info) -> Op:
    """Issue 27 finding 6: a partitioned entry declaring a huge full shape."""
    keys = info["slice_keys"] or info["entry_keys"]
    key = rng.choice(keys)
    dims = rng.choice([[2**40, 2**20], [2**31, 2**31], [2**61, 1], [2**20] * 3])
    keep = rng.random() < 0.5

    def change(entry: BundleEntryProto) -> None:
        rank = len(entry.shape.dim)
        del entry.shape.dim[:]
        for d in dims[:rank] if keep and rank else dims:
            entry.shape.dim.add(size=d)
        if not keep or not entry.slices:
            del entry.slices[:]
            added = entry.slices.add()
            for _ in entry.shape.dim:
                added.extent.add()  # whole extent in every dimension
        entry.size = entry.offset = entry.crc32c = entry.shard_id = 0

    return Op(f"entry {key!r}: partitioned, full shape {dims}, keep slices {keep}",
              lambda files: edit_entry(files, key, change), False, ["entry", "slices"])


def _reshard_op(rng: random.Random, info: Info) -> Op:
    """Two data files: the header says so, the entries of some keys point at the second."""
    moved = [k for k in info["entry_keys"] if rng.random() < 0.5]
    second = rng.choice(["copy", "empty", "missing"])

    def change(files: Files) -> None:
        rows = dict(entries(files))
        header = BundleHeaderProto.FromString(rows[b""])
        if header.num_shards != 1 or len(files.data) != 1:
            raise Skip
        header.num_shards = 2
        rows[b""] = header.SerializeToString()
        (only,) = files.data.values()
        files.data = {".data-00000-of-00002": only}
        if second != "missing":
            files.data[".data-00001-of-00002"] = only if second == "copy" else b""
        for key in moved:
            if key in rows:
                entry = BundleEntryProto.FromString(rows[key])
                entry.shard_id = 1
                rows[key] = entry.SerializeToString()
        set_entries(files, list(rows.items()))

    return Op(f"reshard: 2 files, second {second}, moved {len(moved)} keys", change,
              second == "copy", ["header"])


def _drop_graph_op(rng: random.Random, info: Info) -> Op:
    """No object graph: a TF1-style checkpoint, restored by name."""

    def change(files: Files) -> None:
        rows = dict(entries(files))
        if rows.pop(GRAPH_KEY, None) is None:
            raise Skip
        set_entries(files, list(rows.items()))

    return Op("drop the object graph (name-based restore)", change, True, ["graph"])


GENERATORS = [
    (_graph_op, 5), (_entry_op, 5), (_header_op, 1), (_table_op, 2), (_state_value_op, 2),
    (_raw_op, 4), (_string_op, 2), (_shape_size_op, 1), (_huge_partition_op, 1),
    (_reshard_op, 1), (_drop_graph_op, 1), (_state_file_op, 1),
]


def generate(rng: random.Random, info: Info) -> list[Op]:
    """1-3 ops for one case (most cases: one, so a finding names one cause)."""
    count = rng.choices([1, 2, 3], weights=[6, 3, 1])[0]
    makers = [maker for maker, _ in GENERATORS]
    weights = [weight for _, weight in GENERATORS]
    if info["has_state"] is False:
        weights[-1] = 0
    return [rng.choices(makers, weights=weights)[0](rng, info) for _ in range(count)]
