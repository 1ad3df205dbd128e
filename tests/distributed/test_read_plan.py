"""The read plan (tf-checkpoint-format.md §8.4) from the checkpoint's one parsed index."""

from __future__ import annotations

import numpy as np

from trackpoint.bundle import BundleWriter, TensorSlice
from trackpoint.bundle.index import BundleIndex
from trackpoint.bundle.naming import data_filename, index_filename
from trackpoint.distributed.read_plan import ByteRange, IndexView, PrefetchedStorage
from trackpoint.storage import LocalStorage

FULL = np.arange(50, dtype=np.float32).reshape(5, 10)


def test_ranges_are_the_stored_parts_a_region_touches(tmp_path):
    prefix = str(tmp_path / "ckpt")
    with BundleWriter(prefix) as writer:
        writer.add("a/.OPTIMIZER_SLOT/m", np.arange(3, dtype=np.int64))
        writer.add_slice("t", (5, 10), "0,2:-", FULL[:2])
        writer.add_slice("t", (5, 10), "2,3:-", FULL[2:])
    view = IndexView(BundleIndex.load(prefix, LocalStorage()))
    data = data_filename(prefix, 0, 1)
    assert view.keys() == ["a/.OPTIMIZER_SLOT/m", "t"] and view.has_slot_variables()
    assert view.ranges("a/.OPTIMIZER_SLOT/m") == [ByteRange(data, 0, 24)]
    assert view.ranges("t") == [ByteRange(data, 24, 80), ByteRange(data, 104, 120)]
    assert view.ranges("t", TensorSlice.parse("3,1:-")) == [ByteRange(data, 104, 120)]
    assert view.ranges("missing") == []
    with PrefetchedStorage(LocalStorage(), view) as storage:  # serves the parsed index's bytes
        with storage.open_range_reader(index_filename(prefix)) as reader:
            assert bytes(reader.read(0, reader.size)) == view.index.data
