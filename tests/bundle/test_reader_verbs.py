"""Every BundleReader verb reads a stored tensor one way, with the same checks and errors.

A damaged entry keeps its metadata readable (keys, shape, dtype: what ``tp inspect`` shows)
while every verb that reads its bytes raises the same error, naming the key and the file.
"""

from __future__ import annotations

import numpy as np
import pytest
from bundle_samples import hand_built

from trackpoint.bundle import BundleReader, BundleWriter, masked_crc32c
from trackpoint.bundle.dtypes import DataType
from trackpoint.bundle.entries import make_entry, make_header
from trackpoint.bundle.table_batch import table_of_pairs
from trackpoint.errors import DataLossError, InvalidArgumentError

_GOOD = np.arange(4, dtype=np.float32)


def _damaged(prefix: str) -> None:
    good = _GOOD.tobytes()
    hand_built(
        prefix,
        make_header(1),
        [
            ("good", DataType.DT_FLOAT, (4,), good, masked_crc32c(good)),
            ("same_head_bad_size", DataType.DT_FLOAT, (4,), good[:12], masked_crc32c(good[:12])),
            ("variant", DataType.DT_VARIANT, (1,), b"\x00", masked_crc32c(b"\x00")),
            ("strings_too_small", DataType.DT_STRING, (3,), b"\x00", masked_crc32c(b"\x00")),
        ],
    )


def _every_read(reader: BundleReader, key: str) -> list:
    shape = reader.shape(key)
    return [
        lambda: reader.read(key),
        lambda: reader.read(key, copy=False),
        lambda: reader.read_many(["good", key]),
        lambda: reader.read_into(key, np.zeros(shape, reader.dtype(key))),
        lambda: reader.read_slice(key, ":".join("-" for _ in shape)),
        lambda: reader.verify(key),
    ]


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        ("same_head_bad_size", DataLossError, "Invalid size in bundle entry.*stored size 12"),
        ("strings_too_small", DataLossError, "Invalid size in bundle entry.*too small"),
    ],
)
def test_damaged_entry_metadata_stays_readable_and_every_read_raises(prefix, key, error, match):
    _damaged(prefix)
    with BundleReader(prefix) as reader:
        assert reader.has_tensor(key)
        assert reader.shape(key) in {(4,), (3,)}
        assert reader.stored_bytes(key) in {12, 1}
        for read in _every_read(reader, key):
            with pytest.raises(error, match=match) as info:
                read()
            assert info.value.key == key
            assert info.value.path.endswith("ckpt.index")
        np.testing.assert_array_equal(reader.read("good"), _GOOD)


def test_unrepresentable_dtype_is_refused_by_metadata_and_reads(prefix):
    _damaged(prefix)
    with BundleReader(prefix) as reader:
        assert reader.datatype("variant") == DataType.DT_VARIANT
        assert reader.shape("variant") == (1,)
        with pytest.raises(InvalidArgumentError, match="variant"):
            reader.dtype("variant")
        for read in (
            lambda: reader.read("variant"),
            lambda: reader.read_many(["variant"]),
            lambda: reader.verify("variant"),
        ):
            with pytest.raises(InvalidArgumentError, match="variant"):
                read()


def test_bad_shard_id_is_data_loss_for_reads_only(prefix):
    raw = _GOOD.tobytes()
    hand_built(prefix, make_header(1), [("x", DataType.DT_FLOAT, (4,), raw, masked_crc32c(raw))])
    # The index again, with the entry naming shard 3 of 1.
    entry = make_entry(DataType.DT_FLOAT, (4,), shard_id=3, size=16, crc32c=masked_crc32c(raw))
    rows = [(b"", make_header(1).SerializeToString()), (b"x", entry.SerializeToString())]
    with open(f"{prefix}.index", "wb") as f:
        f.write(table_of_pairs(rows))
    with BundleReader(prefix) as reader:
        assert reader.shape("x") == (4,) and reader.dtype("x") == np.float32
        with pytest.raises(DataLossError, match="names shard 3"):
            reader.read("x")
        with pytest.raises(DataLossError, match="names shard 3"):
            reader.read_many(["x"])


def test_verbs_agree_on_values_and_bytes_counted(prefix):
    values = {
        "a": np.arange(12, dtype=np.float64).reshape(3, 4),
        "s": np.array([b"x", b"", b"yz"], dtype=object),
    }
    with BundleWriter(prefix) as writer:
        for key, value in values.items():
            writer.add(key, value)
        writer.add_slice("p", (4,), "0,2", np.array([1, 2], np.int16))
        writer.add_slice("p", (4,), "2,2", np.array([3, 4], np.int16))
    values["p"] = np.array([1, 2, 3, 4], np.int16)
    for key, value in values.items():
        counts = []
        with BundleReader(prefix) as reader:
            start = reader.bytes_read
            got = [reader.read(key), reader.read_many([key])[0]]
            out = np.empty(value.shape, value.dtype)
            reader.read_into(key, out)
            got.append(out)
            got.append(reader.read_slice(key, ":".join("-" for _ in value.shape)))
            counts.append(reader.bytes_read - start)
            reader.verify(key)
            counts.append(reader.bytes_read - start - counts[0])
        for array in got:
            assert array.dtype == value.dtype and array.tolist() == value.tolist(), key
        assert counts[0] == 4 * counts[1] == 4 * reader.stored_bytes(key)
