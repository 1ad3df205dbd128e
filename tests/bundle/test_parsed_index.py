"""The one parsed index (§3, §4): readers opened from it, and what merges and saves take from it."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from trackpoint.bundle import BundleReader, BundleWriter
from trackpoint.bundle.index import BundleIndex
from trackpoint.bundle.naming import index_filename
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.storage import LocalStorage

FULL = np.arange(50, dtype=np.float32).reshape(5, 10)


@pytest.fixture
def prefix(tmp_path) -> str:
    path = str(tmp_path / "ckpt")
    with BundleWriter(path) as writer:
        writer.add("a", np.arange(3, dtype=np.int64))
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
        writer.add_slice("t", (5, 10), "2,3:-", FULL[2:])
    return path


def test_readers_opened_from_one_parsed_index_never_read_the_index_again(prefix):
    index = BundleIndex.load(prefix, LocalStorage())
    os.remove(index_filename(prefix))  # only the data file is left
    with BundleReader(prefix, index=index) as reader:
        assert reader.index is index and reader.keys() == ["a", "t"]
        np.testing.assert_array_equal(reader.read("t"), FULL)
        assert reader.bytes_read == FULL.nbytes  # no index bytes: it was not read
    with BundleReader(prefix, index=index) as again:  # a second reader shares the layouts
        np.testing.assert_array_equal(again.read("a"), np.arange(3))


def test_reopen_reads_after_close_with_the_same_index(prefix):
    reader = BundleReader(prefix)
    reader.read("a")
    reader.close()
    os.remove(index_filename(prefix))
    with reader.reopen() as reopened:
        assert reopened.index is reader.index
        np.testing.assert_array_equal(reopened.read("a"), np.arange(3))
        assert reopened.bytes_read == 3 * 8
    assert reader.bytes_read == reader.index.nbytes + 3 * 8  # the closed one keeps its count


def test_a_reader_refuses_the_index_of_another_prefix(prefix, tmp_path):
    other = str(tmp_path / "other")
    with BundleWriter(other) as writer:
        writer.add("a", np.zeros(1))
    with pytest.raises(InvalidArgumentError, match="index of"):
        BundleReader(prefix, index=BundleIndex.load(other, LocalStorage()))


def test_the_parsed_index_is_immutable_and_lists_rows_in_key_order(prefix):
    index = BundleIndex.load(prefix, LocalStorage())
    with pytest.raises(dataclasses.FrozenInstanceError):
        index.data = b""  # type: ignore[misc]
    rows = index.rows()
    assert [key for key, _ in rows][-2:] == [b"a", b"t"]
    assert len(rows) == 4 and all(key.startswith(b"\x00") for key, _ in rows[:2])  # 2 slices
    assert index.has_entries and index.num_shards == 1 and not index.big_endian


def test_a_lazy_index_checks_its_entries_on_first_use(prefix):
    data = bytearray(open(index_filename(prefix), "rb").read())
    data[3] ^= 0xFF  # inside the only data block: the header entry and its checksum
    with pytest.raises(DataLossError, match="checksum does not match"):
        BundleIndex.parse(prefix, bytes(data), lazy=True)
    index = BundleIndex.parse(prefix, open(index_filename(prefix), "rb").read(), lazy=True)
    assert index.keys() == ["a", "t"]


def test_a_damaged_index_counts_one_checksum_failure(prefix):
    from trackpoint import metrics

    data = bytearray(open(index_filename(prefix), "rb").read())
    data[3] ^= 0xFF  # inside the only data block: its trailer checksum fails
    metrics.reset()
    try:
        for lazy in (False, True):
            with pytest.raises(DataLossError, match="checksum does not match"):
                BundleIndex.parse(prefix, bytes(data), lazy=lazy)
        assert metrics.snapshot()[metrics.CHECKSUM_FAILURES] == {(): 2}  # once per parse
    finally:
        metrics.reset()
