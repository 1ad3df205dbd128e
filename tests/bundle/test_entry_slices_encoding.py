"""The hand-serialized full entry of a partitioned tensor equals protobuf's bytes (§8.1)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trackpoint.bundle import BundleReader, BundleWriter, TensorSlice
from trackpoint.bundle.entries import entry_head, entry_slices, make_entry


@st.composite
def _slices(draw: st.DrawFn) -> tuple[tuple[int, ...], list[TensorSlice]]:
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 2**40), min_size=rank, max_size=rank)))
    extent = st.one_of(st.just((0, -1)), st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)))
    boxes = draw(st.lists(st.lists(extent, min_size=rank, max_size=rank), max_size=4))
    return shape, [TensorSlice(tuple(s for s, _ in box), tuple(n for _, n in box)) for box in boxes]


@settings(max_examples=300, deadline=None)
@given(datatype=st.integers(0, 30), case=_slices())
def test_partitioned_entry_bytes_match_protobuf(datatype, case):
    shape, slices = case
    expected = make_entry(datatype, shape)
    for tensor_slice in slices:
        expected.slices.append(tensor_slice.to_proto())
    assert entry_head(datatype, shape) + entry_slices(slices) == expected.SerializeToString()


def test_partitioned_tensor_entry_reads_back(tmp_path):
    prefix = str(tmp_path / "b")
    whole = np.arange(24, dtype=np.int32).reshape(4, 6)
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (4, 6), "0,2:-", whole[:2])
        writer.add_slice("t", (4, 6), "2,2:0,6", whole[2:])
    with BundleReader(prefix) as reader:
        assert [str(s) for s in reader.slices("t")] == ["0,2:-", "2,2:0,6"]
        entry = reader.entry("t")
        assert (entry.shard_id, entry.offset, entry.size, entry.crc32c) == (0, 0, 0, 0)
        np.testing.assert_array_equal(reader.read("t"), whole)
