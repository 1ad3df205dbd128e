"""Partitioned tensors in storage (I7) and merging bundles (I6, §11.2)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trackpoint.bundle import (
    BundleReader,
    BundleWriter,
    TensorSlice,
    encode_slice_key,
    merge_bundles,
)
from trackpoint.bundle.table import read_table
from trackpoint.errors import DataLossError, InvalidArgumentError, NotFoundError
from trackpoint.management import CheckpointReader

FULL = np.arange(50, dtype=np.float32).reshape(5, 10)


def test_i7_two_slices_of_5x10(prefix):
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
        writer.add_slice("t", (5, 10), TensorSlice.parse("2,3:-"), FULL[2:])
    with BundleReader(prefix) as reader:
        assert reader.keys() == ["t"]
        assert reader.shape("t") == (5, 10)
        assert reader.slices("t") == [TensorSlice.parse("0,2:-"), TensorSlice.parse("2,3:-")]
        np.testing.assert_array_equal(reader.read("t"), FULL)
        # Sub-slice reads that span both stored slices.
        for text in ["1,2:3,4", "0,5:9,1", "1,1:-", "-:-", "1,4:0,10"]:
            tensor_slice = TensorSlice.parse(text)
            np.testing.assert_array_equal(
                reader.read_slice("t", text), FULL[tensor_slice.numpy_index((5, 10))]
            )
        out = np.zeros((5, 10), np.float32)
        reader.read_into("t", out)
        np.testing.assert_array_equal(out, FULL)
        reader.verify("t")


def test_i7_full_extent_spec_is_stored_plain(prefix):
    with BundleWriter(prefix) as writer:
        writer.add_slice("a", (5, 10), "0,5:0,10", FULL)
        writer.add_slice("b", (5, 10), "-:-", FULL)
        writer.add("c", FULL)
    with BundleReader(prefix) as reader:
        assert reader.slices("a") == reader.slices("b") == []
        for key in "bc":
            entry = reader.entry(key)
            assert (entry.dtype, entry.shape, entry.size, entry.crc32c) == (
                reader.entry("a").dtype,
                reader.entry("a").shape,
                200,
                reader.entry("a").crc32c,
            )
        for key in "abc":
            np.testing.assert_array_equal(reader.read(key), FULL)
    keys = read_table(open(f"{prefix}.index", "rb").read(), "x").keys
    assert keys == [b"", b"a", b"b", b"c"]


def test_i7_slice_entries_under_ordered_code_keys(prefix):
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
        writer.add_slice("t", (5, 10), "2,3:-", FULL[2:])
    keys = read_table(open(f"{prefix}.index", "rb").read(), "x").keys
    assert keys == sorted(
        [
            b"",
            b"t",
            encode_slice_key("t", TensorSlice.parse("0,2:-")),
            encode_slice_key("t", TensorSlice.parse("2,3:-")),
        ]
    )
    with CheckpointReader(prefix) as reader:
        assert reader.get_variable_to_shape_map() == {"t": [5, 10]}


def test_i7_string_slices(prefix):
    full = np.array([[b"a", b"bb"], [b"", b"dddd"], [b"e", b"f"]], dtype=object)
    with BundleWriter(prefix) as writer:
        writer.add_slice("s", (3, 2), "-:0,1", full[:, :1])
        writer.add_slice("s", (3, 2), "-:1,1", full[:, 1:])
    with BundleReader(prefix) as reader:
        assert reader.read("s").tolist() == full.tolist()
        assert reader.read_slice("s", "1,2:-").tolist() == full[1:].tolist()


def test_slice_errors(prefix):
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
        with pytest.raises(InvalidArgumentError, match="overlaps"):
            writer.add_slice("t", (5, 10), "1,2:-", FULL[1:3])
        with pytest.raises(InvalidArgumentError, match="disagree"):
            writer.add_slice("t", (5, 10), "3,2:-", FULL[3:].astype(np.float64))
        with pytest.raises(InvalidArgumentError, match="disagree"):
            writer.add_slice("t", (6, 10), "3,2:-", FULL[3:])
        with pytest.raises(InvalidArgumentError, match="has shape"):
            writer.add_slice("t", (5, 10), "3,2:-", FULL[3:, :5])
        with pytest.raises(InvalidArgumentError, match="does not fit"):
            writer.add_slice("t", (5, 10), "4,2:-", FULL[3:])
        with pytest.raises(InvalidArgumentError, match="duplicate key"):
            writer.add("t", FULL)
        writer.add("plain", FULL)
        with pytest.raises(InvalidArgumentError, match="duplicate key"):
            writer.add_slice("plain", (5, 10), "0,1:-", FULL[:1])


def test_uncovered_region_is_an_error(prefix):
    with BundleWriter(prefix) as writer:
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read_slice("t", "0,1:-"), FULL[:1])
        with pytest.raises(DataLossError, match="do not cover"):
            reader.read("t")


# -- merge ---------------------------------------------------------------------------------


def _shards(tmp_path):
    a, b = str(tmp_path / "tmp" / "part-0"), str(tmp_path / "tmp" / "part-1")
    with BundleWriter(a) as writer:
        writer.add("x", np.arange(3))
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
    with BundleWriter(b) as writer:
        writer.add("s", np.array([b"str"], object))
        writer.add_slice("t", (5, 10), "2,3:-", FULL[2:])
    return a, b


def test_i6_merge_two_bundles(tmp_path):
    a, b = _shards(tmp_path)
    out = str(tmp_path / "final" / "ckpt")
    merge_bundles([a, b], out)
    assert sorted(os.listdir(tmp_path / "final")) == [
        "ckpt.data-00000-of-00002",
        "ckpt.data-00001-of-00002",
        "ckpt.index",
    ]
    assert sorted(os.listdir(tmp_path / "tmp")) == []
    with BundleReader(out) as reader:
        assert reader.num_shards == 2
        assert reader.keys() == ["s", "t", "x"]
        assert reader.entry("x").shard_id == 0
        assert reader.entry("s").shard_id == 1
        assert reader.slices("t") == [TensorSlice.parse("0,2:-"), TensorSlice.parse("2,3:-")]
        np.testing.assert_array_equal(reader.read("t"), FULL)
        assert reader.read("s").tolist() == [b"str"]
        np.testing.assert_array_equal(reader.read("x"), np.arange(3))


def test_i6_merge_one_bundle_is_a_rename(tmp_path):
    src, out = str(tmp_path / "a" / "tmp"), str(tmp_path / "b" / "ckpt")
    with BundleWriter(src) as writer:
        writer.add("x", np.arange(3.0))
    index_before = open(f"{src}.index", "rb").read()
    merge_bundles([src], out)
    assert open(f"{out}.index", "rb").read() == index_before
    assert not os.path.exists(f"{src}.index")
    assert not os.path.exists(f"{src}.data-00000-of-00001")
    with BundleReader(out) as reader:
        assert reader.read("x").tolist() == [0.0, 1.0, 2.0]


def test_merge_duplicate_key_fails_without_output(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for p in (a, b):
        with BundleWriter(p) as writer:
            writer.add("x", np.arange(3))
    with pytest.raises(InvalidArgumentError, match="Duplicate tensor keyed by 'x'"):
        merge_bundles([a, b], str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out.index")


def test_merge_missing_inputs(tmp_path):
    a, _ = _shards(tmp_path)
    missing = str(tmp_path / "nope")
    with pytest.raises(NotFoundError, match="nope"):
        merge_bundles([a, missing], str(tmp_path / "out"))
    merge_bundles([missing, a], str(tmp_path / "out"), allow_missing_files=True)
    with BundleReader(str(tmp_path / "out")) as reader:
        assert reader.keys() == ["t", "x"]
    with pytest.raises(NotFoundError):
        merge_bundles([missing], str(tmp_path / "out2"), allow_missing_files=True)


def test_merge_version_mismatch(tmp_path):
    from trackpoint.bundle.entries import make_header
    from trackpoint.bundle.table_batch import table_of_pairs

    a, b = _shards(tmp_path)
    header = make_header(1)
    header.version.bad_consumers.append(7)
    pairs = read_table(open(f"{b}.index", "rb").read(), "b").pairs()
    rows = [(b"", header.SerializeToString()), *pairs[1:]]
    open(f"{b}.index", "wb").write(table_of_pairs(rows))
    with pytest.raises(InvalidArgumentError, match="version"):
        merge_bundles([a, b], str(tmp_path / "out"))


@pytest.mark.parametrize(
    ("box", "is_view"),
    [
        ("-:0,4", True),  # exactly the first stored slice
        ("0,5:4,6", True),  # the second, spelled with explicit extents
        ("-:2,4", False),  # straddles both: assembled
        ("1,2:0,4", False),  # part of one slice: assembled
    ],
)
def test_read_slice_without_copy_views_one_whole_stored_slice(prefix, box, is_view):
    with BundleWriter(prefix) as writer:
        writer.add_slice("w", (5, 10), TensorSlice.parse("-:0,4"), FULL[:, :4])
        writer.add_slice("w", (5, 10), TensorSlice.parse("-:4,6"), FULL[:, 4:])
        writer.add("plain", FULL)
    target = TensorSlice.parse(box)
    expected = FULL[target.numpy_index(FULL.shape)]
    with BundleReader(prefix) as reader:
        copied = reader.read_slice("w", box)
        viewed = reader.read_slice("w", box, copy=False)
        region = reader.read_slice("plain", box, copy=False)
        assert np.array_equal(copied, expected) and copied.flags.writeable
        assert np.array_equal(viewed, expected) and viewed.shape == expected.shape
        assert viewed.flags.writeable is not is_view  # a view of the file is read-only
        assert np.array_equal(region, expected) and not region.flags.writeable
