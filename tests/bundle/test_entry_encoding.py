"""Hand-serialized index entries (the writer's fast path) equal protobuf's bytes exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trackpoint.bundle import BundleReader, BundleWriter
from trackpoint.bundle.entries import entry_head as _entry_head
from trackpoint.bundle.entries import entry_tail as _entry_tail
from trackpoint.bundle.entries import make_entry

_U32 = st.integers(0, 2**32 - 1)


@settings(max_examples=300, deadline=None)
@given(
    datatype=st.integers(0, 30),
    shape=st.lists(st.integers(0, 2**40), max_size=6).map(tuple),
    offset=st.integers(0, 2**45),
    size=st.integers(0, 2**45),
    masked=_U32,
)
def test_entry_bytes_match_protobuf(datatype, shape, offset, size, masked):
    expected = make_entry(datatype, shape, offset=offset, size=size, crc32c=masked)
    assert _entry_head(datatype, shape) + _entry_tail(offset, size, masked) == (
        expected.SerializeToString()
    )


def test_scalar_and_zero_dims_keep_their_shape_fields():
    # A scalar's shape is the empty message "12 00"; a zero dimension is an empty Dim.
    assert _entry_head(1, ()) == bytes.fromhex("0801 1200")
    assert _entry_head(1, (0, 3)) == bytes.fromhex("0801 1206 1200 12020803")


def test_gathered_small_tensors_and_direct_large_ones_read_back(tmp_path):
    prefix = str(tmp_path / "b")
    rng = np.random.default_rng(0)
    tensors = {f"t{i:04d}": rng.random(n, dtype=np.float32) for i, n in
               enumerate([1, 300, 20_000, 5, 70_000, 2, 400_000, 3])}
    with BundleWriter(prefix) as writer:
        for key, value in tensors.items():
            writer.add(key, value)
    with BundleReader(prefix) as reader:
        offset = 0
        for key, value in tensors.items():
            assert reader.entry(key).offset == offset
            offset += value.nbytes
            np.testing.assert_array_equal(reader.read(key), value)
