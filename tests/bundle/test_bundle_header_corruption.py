"""Header and versions (I2) and damaged files (I1): clear errors, never wrong values."""

from __future__ import annotations

import os

import numpy as np
import pytest
from bundle_samples import hand_built

from trackpoint.bundle import BundleReader, BundleWriter, masked_crc32c
from trackpoint.bundle.crc import crc32c, extend, mask
from trackpoint.bundle.dtypes import DataType
from trackpoint.bundle.entries import make_header
from trackpoint.bundle.protos.tensor_bundle_pb2 import BundleHeaderProto
from trackpoint.errors import DataLossError, InvalidArgumentError, NotFoundError
from trackpoint.management import CheckpointReader

# -- I2: header, versions, endianness --------------------------------------------------------


def test_i2_header_records_shards_and_version(prefix):
    with BundleWriter(prefix) as writer:
        writer.add("x", np.ones(2))
    with BundleReader(prefix) as reader:
        header = reader.header
        assert header.num_shards == 1
        assert header.endianness == BundleHeaderProto.LITTLE
        assert (header.version.producer, header.version.min_consumer) == (1, 0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("producer", -1, "producer version -1 below min producer 0"),
        ("min_consumer", 2, "min consumer version 2 above current version 1"),
        ("bad_consumers", 1, "disallows consumer version 1"),
    ],
)
def test_i2_version_checks(prefix, field, value, message):
    header = make_header(1)
    if field == "bad_consumers":
        header.version.bad_consumers.extend([0, value])
    else:
        setattr(header.version, field, value)
    hand_built(prefix, header, [])
    with pytest.raises(InvalidArgumentError, match=message):
        BundleReader(prefix)


def test_i2_tolerated_versions(prefix):
    header = make_header(1)
    header.version.producer = 7
    header.version.min_consumer = 1
    header.version.bad_consumers.append(2)
    hand_built(prefix, header, [])
    BundleReader(prefix).close()


def test_i2_big_endian_file_is_byte_swapped(prefix):
    floats = np.array([[1.5, -2.0], [3.25, 4.0]], dtype=">f4")
    ints = np.array([1, 2, 300], dtype=">i8")
    cplx = np.array([1 + 2j], dtype=">c8")
    halves = np.array([1.0, 2.0], dtype=">f2")
    bf16_raw = np.array([0x3F80, 0x4000], dtype=">u2").tobytes()  # bfloat16 1.0, 2.0
    # String lengths are varints (endian-free); the length checksum covers the lengths as
    # uint32 in the file's byte order and is stored in that order.
    lengths = np.array([2, 0], dtype=">u4").tobytes()
    length_crc = crc32c(lengths)
    checksum = mask(length_crc).to_bytes(4, "big")
    string_raw = b"\x02\x00" + checksum + b"ab"
    string_crc = mask(extend(extend(length_crc, checksum), b"ab"))
    tensors = [
        ("f", DataType.DT_FLOAT, (2, 2), floats.tobytes(), masked_crc32c(floats.tobytes())),
        ("i", DataType.DT_INT64, (3,), ints.tobytes(), masked_crc32c(ints.tobytes())),
        ("c", DataType.DT_COMPLEX64, (1,), cplx.tobytes(), masked_crc32c(cplx.tobytes())),
        ("h", DataType.DT_HALF, (2,), halves.tobytes(), masked_crc32c(halves.tobytes())),
        ("b", DataType.DT_BFLOAT16, (2,), bf16_raw, masked_crc32c(bf16_raw)),
        ("u", DataType.DT_UINT8, (2,), b"\x01\x02", masked_crc32c(b"\x01\x02")),
        ("s", DataType.DT_STRING, (2,), string_raw, string_crc),
    ]
    hand_built(prefix, make_header(1, big_endian=True), tensors)
    with BundleReader(prefix) as reader:
        got = reader.read("f")
        assert got.dtype == np.float32
        assert got.dtype.isnative
        np.testing.assert_array_equal(got, floats)
        np.testing.assert_array_equal(reader.read("i"), ints)
        np.testing.assert_array_equal(reader.read("c"), cplx)
        np.testing.assert_array_equal(reader.read("h"), halves)
        assert reader.read("b").astype(np.float32).tolist() == [1.0, 2.0]
        assert reader.read("u").tolist() == [1, 2]
        np.testing.assert_array_equal(reader.read("f", copy=False), floats)
        out = np.zeros(3, np.int64)
        reader.read_into("i", out)
        assert out.tolist() == [1, 2, 300]
        assert reader.read("s").tolist() == [b"ab", b""]


# -- I1: corruption ------------------------------------------------------------------------


def _write_sample(prefix: str) -> None:
    with BundleWriter(prefix) as writer:
        writer.add("nums", np.arange(6, dtype=np.float32))  # data bytes 0..23
        writer.add("strs", np.array([b"hello", b"world!"], dtype=object))  # 24..
        writer.add_slice("part", (4,), "0,2", np.array([1, 2], np.int32))
        writer.add_slice("part", (4,), "2,2", np.array([3, 4], np.int32))


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes((byte ^ 0x40,)))


def test_i1a_numeric_payload_flip(prefix):
    _write_sample(prefix)
    _flip(f"{prefix}.data-00000-of-00001", 5)
    with BundleReader(prefix) as reader:
        with pytest.raises(DataLossError, match="Checksum does not match") as info:
            reader.read("nums")
        assert info.value.key == "nums"
        assert "nums" in str(info.value)
        assert "data-00000-of-00001" in str(info.value)
        with pytest.raises(DataLossError, match="Checksum does not match"):
            reader.read("nums", copy=False)
        with pytest.raises(DataLossError, match="Checksum does not match"):
            reader.read_into("nums", np.zeros(6, np.float32))
        with pytest.raises(DataLossError, match="Checksum does not match"):
            reader.verify()
        assert reader.read("strs").tolist() == [b"hello", b"world!"]


def test_i1b_string_length_and_payload_flips(prefix):
    _write_sample(prefix)
    data = f"{prefix}.data-00000-of-00001"
    _flip(data, 24)  # first varint length
    with (
        BundleReader(prefix) as reader,
        pytest.raises(DataLossError, match="length checksum does not match"),
    ):
        reader.read("strs")
    _flip(data, 24)
    _flip(data, 24 + 2 + 4 + 3)  # inside "hello"
    with (
        BundleReader(prefix) as reader,
        pytest.raises(DataLossError, match="Checksum does not match"),
    ):
        reader.read("strs")


def test_i1b_flip_in_slice_data(prefix):
    _write_sample(prefix)
    with BundleReader(prefix) as reader:
        offset = reader._slice_entry("part", reader.slices("part")[1]).offset
    _flip(f"{prefix}.data-00000-of-00001", offset)
    with BundleReader(prefix) as reader:
        assert reader.read_slice("part", "0,2").tolist() == [1, 2]
        with pytest.raises(DataLossError, match="Checksum does not match"):
            reader.read("part")


def test_i1c_data_file_one_byte_short(prefix):
    with BundleWriter(prefix) as writer:
        writer.add("x", np.arange(6, dtype=np.float32))
    data = f"{prefix}.data-00000-of-00001"
    os.truncate(data, 23)
    with (
        BundleReader(prefix) as reader,
        pytest.raises(DataLossError, match="Requested 24 bytes but read 23") as info,
    ):
        reader.read("x")
    assert info.value.key == "x"


def test_i1d_missing_data_file(prefix):
    _write_sample(prefix)
    os.remove(f"{prefix}.data-00000-of-00001")
    with BundleReader(prefix) as reader:
        assert reader.shape("nums") == (6,)
        with pytest.raises(NotFoundError, match=r"data-00000-of-00001.*'nums'"):
            reader.read("nums")


def test_i1d_every_index_byte_flip_raises_or_is_harmless(prefix):
    _write_sample(prefix)
    index = f"{prefix}.index"
    original = open(index, "rb").read()
    with BundleReader(prefix) as reader:
        expected = {k: reader.read(k) for k in reader.keys()}
    for pos in range(len(original)):
        broken = bytearray(original)
        broken[pos] ^= 0x10
        open(index, "wb").write(bytes(broken))
        try:
            with BundleReader(prefix) as reader:
                for key, value in expected.items():
                    got = reader.read(key)
                    assert got.tolist() == value.tolist(), (pos, key)
        except DataLossError as exc:
            assert "ckpt" in str(exc)  # noqa: PT017 - most flips raise, the rest must be harmless


@pytest.mark.parametrize("keep", [0, 1, 20, 47, 48, 60, -1])
def test_i1d_truncated_index(prefix, keep):
    _write_sample(prefix)
    index = f"{prefix}.index"
    data = open(index, "rb").read()
    open(index, "wb").write(data[: keep if keep >= 0 else len(data) + keep])
    with pytest.raises(DataLossError, match=r"ckpt\.index"):
        BundleReader(prefix)


def test_i1d_garbage_index(prefix):
    open(f"{prefix}.index", "wb").write(os.urandom(300))
    with pytest.raises(DataLossError, match="not an sstable"):
        CheckpointReader(prefix)


def test_inconsistent_entry_size_is_data_loss(prefix):
    raw = np.arange(4, dtype=np.float32).tobytes()
    hand_built(
        prefix,
        make_header(1),
        [("x", DataType.DT_FLOAT, (5,), raw, masked_crc32c(raw))],
    )
    with (
        BundleReader(prefix) as reader,
        pytest.raises(DataLossError, match="Invalid size in bundle entry"),
    ):
        reader.read("x")


def test_bad_shard_id_and_variant(prefix):
    header = make_header(1)
    hand_built(
        prefix,
        header,
        [("v", DataType.DT_VARIANT, (1,), b"\x00", masked_crc32c(b"\x00"))],
    )
    with BundleReader(prefix) as reader, pytest.raises(InvalidArgumentError, match="variant"):
        reader.read("v")
