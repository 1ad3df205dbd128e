"""Issue 27 finding 6 and what the structured fuzzer found next to it: an index entry's
declared shape or sizes never make the reader allocate beyond what the files' bytes can fill,
and hostile sizes are a DataLossError, never a wrong value or another exception."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest

from trackpoint.bundle.crc import extend, mask
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleEntryProto
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.strings import _encode_varints, _lengths_crc
from trackpoint.bundle.table import read_table
from trackpoint.bundle.table_batch import table_of_pairs
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import DataLossError


def _edit_index(prefix: str, key: bytes, change) -> None:
    """Rewrite ``prefix.index`` with entry ``key`` changed (block checksums stay valid)."""
    path = prefix + ".index"
    rows = dict(read_table(open(path, "rb").read(), path).pairs())
    entry = BundleEntryProto.FromString(rows[key])
    change(entry)
    rows[key] = entry.SerializeToString()
    with open(path, "wb") as f:
        f.write(table_of_pairs(sorted(rows.items())))


def _peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("dims", [[2**40, 2**20], [2**20, 2**10], [2**31, 3]])
def test_huge_partitioned_entry_is_refused_before_allocating(tmp_path, dims):
    prefix = str(tmp_path / "b")
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (4, 3), "0,2:-", np.ones((2, 3), np.float32))
        writer.add_slice("t", (4, 3), "2,2:-", np.zeros((2, 3), np.float32))

    def huge(entry: BundleEntryProto) -> None:
        for dim, size in zip(entry.shape.dim, dims):
            dim.size = size

    _edit_index(prefix, b"t", huge)
    with BundleReader(prefix) as reader:
        assert reader.shape("t") == tuple(dims)

        def read() -> None:
            with pytest.raises(DataLossError, match="do not cover"):
                reader.read("t")
            with pytest.raises(DataLossError):
                reader.read_slice("t", "-:-")

        # Before: np.empty of the declared shape (4 GiB and more) before looking at the slices.
        assert _peak_bytes(read) < 16 << 20


def test_slices_that_claim_more_than_their_file_are_refused_before_allocating(tmp_path):
    prefix = str(tmp_path / "b")
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (4, 3), "0,2:-", np.ones((2, 3), np.float32))
        writer.add_slice("t", (4, 3), "2,2:-", np.zeros((2, 3), np.float32))
    rows = dict(read_table(open(prefix + ".index", "rb").read(), prefix).pairs())
    slice_keys = [key for key in rows if key.startswith(b"\x00")]

    def grow(entry: BundleEntryProto) -> None:
        entry.shape.dim[0].size = 2**40  # the full tensor: 2**40 + 2**40 rows "covered"

    _edit_index(prefix, b"t", grow)
    for key in slice_keys:  # each slice entry consistent with its claim, the file far short
        _edit_index(prefix, key, lambda e: (setattr(e.shape.dim[0], "size", 2**39),
                                            setattr(e, "size", 2**39 * 3 * 4)))
    with BundleReader(prefix) as reader:
        with pytest.raises(DataLossError):
            reader.read("t")


def test_byte_size_overflowing_int64_is_an_invalid_shape(tmp_path):
    prefix = str(tmp_path / "b")
    with BundleWriter(prefix) as writer:
        writer.add("x", np.arange(3, dtype=np.float64))
        writer.add("y", np.arange(2, dtype=np.int32))
    # 2**61 float64 elements: fewer than TF's 2**62, but 2**64 bytes.
    _edit_index(prefix, b"x", lambda e: setattr(e.shape.dim[0], "size", 2**61))
    with BundleReader(prefix) as reader:
        with pytest.raises(DataLossError, match="Invalid tensor shape"):
            reader.shape("x")
        with pytest.raises(DataLossError):
            reader.read("x")
        assert reader.read("y").tolist() == [0, 1]  # (was OverflowError for every key)


def _string_tensor(lengths: list[int], payload: bytes) -> tuple[bytes, int]:
    array = np.array(lengths, dtype=np.uint64)
    crc = _lengths_crc(array)
    checksum = struct.pack("<I", mask(crc))
    return _encode_varints(array) + checksum + payload, mask(extend(extend(crc, checksum),
                                                                    payload))


@pytest.mark.parametrize(("lengths", "payload"), [
    ([2**64 - 1, 1], b""),  # the sum wraps to 0: both elements came back as b""
    ([2**64 - 2, 3], b"a"),
    ([5, 2**64 - 5], b""),
])
def test_string_lengths_whose_sum_wraps_around_are_refused(tmp_path, lengths, payload):
    prefix = str(tmp_path / "b")
    with BundleWriter(prefix) as writer:
        writer.add("s", np.array([b"ab", b"c"], dtype=object))
    raw, crc = _string_tensor(lengths, payload)  # both checksums valid: only lengths lie
    data = prefix + ".data-00000-of-00001"
    offset = len(open(data, "rb").read())
    with open(data, "ab") as f:
        f.write(raw)

    def point(entry: BundleEntryProto) -> None:
        entry.offset, entry.size, entry.crc32c = offset, len(raw), crc

    _edit_index(prefix, b"s", point)
    with BundleReader(prefix) as reader:
        with pytest.raises(DataLossError, match="string length"):
            reader.read("s")
