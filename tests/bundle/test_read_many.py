"""BundleReader.read_many: the same arrays and errors as read(), key by key."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from bundle_samples import hand_built

from trackpoint.bundle import BundleReader, BundleWriter, masked_crc32c
from trackpoint.bundle.dtypes import DataType
from trackpoint.bundle.entries import make_header
from trackpoint.bundle.slice_spec import TensorSlice
from trackpoint.errors import DataLossError, NotFoundError


def _write(prefix: str) -> dict[str, np.ndarray]:
    values = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.arange(6, 12, dtype=np.float32).reshape(2, 3),  # same dtype and shape as "a"
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "text": np.array([b"x", b"yz"], dtype=object),
    }
    whole = np.arange(8, dtype=np.float64).reshape(2, 4)
    with BundleWriter(prefix) as writer:
        for key, value in values.items():
            writer.add(key, value)
        writer.add_slice("sliced", (2, 4), TensorSlice.parse("-:0,2"), whole[:, :2])
        writer.add_slice("sliced", (2, 4), TensorSlice.parse("-:2,2"), whole[:, 2:])
    values["sliced"] = whole
    return values


@pytest.mark.parametrize("copy", [True, False])
def test_read_many_equals_read(prefix, copy):
    values = _write(prefix)
    keys = ["b", "sliced", "a", "text", "scalar", "empty", "a"]
    with BundleReader(prefix) as reader:
        start = reader.bytes_read  # the index
        expected = [reader.read(key) for key in keys]
        by_read = reader.bytes_read - start
        arrays = reader.read_many(keys, copy=copy)
        by_read_many = reader.bytes_read - start - by_read
    assert len(arrays) == len(keys)
    for key, array, one in zip(keys, arrays, expected):
        assert array.dtype == one.dtype and array.shape == one.shape
        assert np.array_equal(array, one) and np.array_equal(array, values[key])
    numeric = arrays[0]
    assert numeric.flags.writeable is copy  # copy=False: read-only views of the file
    # Every key's bytes are counted, as by read() (a sliced key's stored slices included).
    assert by_read_many == by_read > 0


def test_read_many_missing_key_raises(prefix):
    _write(prefix)
    with BundleReader(prefix) as reader, pytest.raises(NotFoundError, match="nope"):
        reader.read_many(["a", "nope"])


def test_read_many_checks_each_entry_of_a_shared_shape(prefix):
    """Entries with the same dtype and shape share decoding; each size and crc is still checked."""
    good = np.arange(4, dtype=np.float32).tobytes()
    other = np.arange(4, 8, dtype=np.float32).tobytes()
    hand_built(
        prefix,
        make_header(1),
        [
            ("good", DataType.DT_FLOAT, (4,), good, masked_crc32c(good)),
            ("bad_crc", DataType.DT_FLOAT, (4,), other, masked_crc32c(good)),
            ("bad_size", DataType.DT_FLOAT, (4,), good[:12], masked_crc32c(good[:12])),
        ],
    )
    with BundleReader(prefix) as reader:
        assert np.array_equal(reader.read_many(["good"])[0], np.arange(4, dtype=np.float32))
        with pytest.raises(DataLossError, match="bad_crc"):
            reader.read_many(["good", "bad_crc"])
        with pytest.raises(DataLossError, match="Invalid size in bundle entry"):
            reader.read_many(["bad_size"])


def test_views_stay_valid_after_close(prefix):
    """A zero-copy view keeps its mapping: reading it after close() is safe (no unmapped memory)."""
    big = np.arange(2 << 20, dtype=np.float32)  # 8 MiB: checksummed on a helper thread
    with BundleWriter(prefix) as writer:
        writer.add("big", big)
        writer.add("small", big[:10])
    reader = BundleReader(prefix)
    views = reader.read_many(["big", "small"], copy=False) + [reader.read("small", copy=False)]
    reader.close()
    del reader
    gc.collect()
    assert np.array_equal(views[0], big)
    assert np.array_equal(views[1], big[:10]) and np.array_equal(views[2], big[:10])


def test_a_corrupt_large_tensor_is_reported_after_parallel_checks(prefix):
    big = np.arange(2 << 20, dtype=np.float32)
    with BundleWriter(prefix) as writer:
        writer.add("a", big)
        writer.add("b", big + 1)
    with BundleReader(prefix) as reader:
        offset = reader.entry("b").offset
    with open(f"{prefix}.data-00000-of-00001", "r+b") as f:
        f.seek(offset + 100)
        f.write(b"\xff\xff")
    with BundleReader(prefix) as reader, pytest.raises(DataLossError, match="'b'"):
        reader.read_many(["a", "b"], copy=False)
