"""Entries decoded all at once equal entries decoded one by one through protobuf (§5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trackpoint.bundle import BundleReader, BundleWriter
from trackpoint.bundle.entries import entry_head, entry_tail, make_entry, make_header
from trackpoint.bundle.layout import LayoutDecoder
from trackpoint.bundle.layout_batch import common_layouts
from trackpoint.bundle.table import TableColumns
from trackpoint.bundle.table_batch import table_of_pairs
from trackpoint.errors import DataLossError

_DATATYPES = st.sampled_from([0, 1, 2, 7, 9, 14, 19, 20, 21, 29, 33, 100, 127, 128, 300])
_SHAPES = st.lists(st.sampled_from([0, 1, 3, 300, 2**40, 2**62]), max_size=3).map(tuple)


@st.composite
def entries(draw: st.DrawFn) -> bytes:
    datatype, shape = draw(_DATATYPES), draw(_SHAPES)
    kind = draw(st.sampled_from(["ours", "proto", "mutated"]))
    if kind == "ours":
        offset = draw(st.sampled_from([0, 5, 2**40, 2**63 - 1]))
        return entry_head(datatype, shape) + entry_tail(
            offset, draw(st.sampled_from([0, 4, 12, 2**33])), draw(st.integers(0, 2**32 - 1))
        )
    if kind == "proto":
        return make_entry(
            datatype,
            shape,
            shard_id=draw(st.sampled_from([0, 1, 2, 2**31 - 1, -1])),
            offset=draw(st.sampled_from([0, 9, -5])),
            size=draw(st.sampled_from([0, 4, 8])),
            crc32c=draw(st.integers(0, 2**32 - 1)),
        ).SerializeToString()
    value = bytearray(entry_head(datatype, shape) + entry_tail(5, 12, draw(st.integers(0, 99))))
    change = draw(st.sampled_from(["byte", "append", "cut", "prefix"]))
    if change == "byte":
        value[draw(st.integers(0, len(value) - 1))] = draw(st.integers(0, 255))
    elif change == "append":
        value += draw(
            st.sampled_from(
                [
                    b"\x18\x01",
                    b"\x3a\x00",
                    b"\x08\x02",
                    b"\x12\x00",
                    b"\x28\x80",
                    b"\x35\x01",
                    b"\x40\x00",
                ]
            )
        )
    elif change == "cut":
        del value[draw(st.integers(0, len(value) - 1)) :]
    else:
        value[:0] = b"\x18\x00"
    return bytes(value)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(entries(), min_size=1, max_size=20), num_shards=st.integers(1, 3))
def test_batch_layouts_equal_protobuf_layouts(values, num_shards):
    table = TableColumns.of_pairs([(b"k%03d" % i, v) for i, v in enumerate(values)])
    decoded, layouts = common_layouts(
        LayoutDecoder("x", num_shards), table, np.arange(len(values)), num_shards
    )
    by_row = iter(layouts)
    one_by_one = LayoutDecoder("x", num_shards)
    for value, batch in zip(values, decoded.tolist()):
        if not batch:
            continue
        layout = next(by_row)
        expected = one_by_one.decode(value, "k")  # never raises for a batch-decoded entry
        assert layout.value == b""  # the index keeps the entry
        assert layout[:-1] == expected[:-1]


def test_reads_after_batch_decoding_word_errors_with_the_entry(prefix):
    # A tensor whose entry names shard 3 of a one-shard bundle: decoded in the batch, its read
    # still reports what is wrong, from the entry's bytes in the index.
    rows = [
        (b"", make_header(1).SerializeToString()),
        (b"bad", make_entry(1, (1,), shard_id=3, size=4).SerializeToString()),
        (b"good", make_entry(1, (0,), crc32c=0xA282EAD8).SerializeToString()),
    ]
    with open(f"{prefix}.index", "wb") as f:
        f.write(table_of_pairs(rows))
    open(f"{prefix}.data-00000-of-00001", "wb").close()
    with BundleReader(prefix) as reader:
        assert reader.read("good").shape == (0,)
        with pytest.raises(DataLossError, match="names shard 3"):
            reader.read("bad")


def test_readers_of_many_values_decode_them_all(prefix):
    values = {f"layer{i // 8:04d}/w{i % 8}": np.full(i % 7 + 1, i, np.float32) for i in range(3000)}
    values["text"] = np.array([b"a", b"bc"], dtype=object)
    with BundleWriter(prefix) as writer:
        writer.add_many(list(values), list(values.values()))
    with BundleReader(prefix) as reader:
        assert reader.keys() == sorted(values)
        for key, value in values.items():
            got = reader.read(key)
            assert got.dtype == value.dtype and got.tolist() == value.tolist()
