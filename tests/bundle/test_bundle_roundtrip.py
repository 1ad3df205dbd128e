"""BundleWriter -> BundleReader round trips: dtypes (I3), shapes (I4), strings (I5), keys (I6)."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from bundle_samples import NUMERIC_DTYPES, sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trackpoint.bundle import BundleReader, BundleWriter, DataType
from trackpoint.bundle.table import read_table
from trackpoint.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from trackpoint.storage import MemoryStorage


def write(prefix: str, tensors: dict, **kwargs) -> None:
    with BundleWriter(prefix, **kwargs) as writer:
        for key, value in tensors.items():
            writer.add(key, value)


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


@pytest.mark.parametrize(("name", "dtype"), NUMERIC_DTYPES, ids=[n for n, _ in NUMERIC_DTYPES])
def test_i3_every_numeric_dtype(prefix, name, dtype):
    tensors = {"m": sample(dtype, (3, 4)), "s": sample(dtype, ())}
    write(prefix, tensors)
    with BundleReader(prefix) as reader:
        assert reader.datatype("m") == DataType[name]
        for key, value in tensors.items():
            assert reader.dtype(key) == dtype
            assert reader.shape(key) == value.shape
            assert_same(reader.read(key), value)
            assert_same(reader.read(key, copy=False), value)


def test_i3_data_bytes_and_entry_fields(prefix):
    value = np.array([1.0, 2.0], np.float32)
    write(prefix, {"v": value, "n": np.int64(1)})
    data = open(f"{prefix}.data-00000-of-00001", "rb").read()
    assert data == value.tobytes() + np.int64(1).tobytes()
    with BundleReader(prefix) as reader:
        entry = reader.entry("v")
        assert (entry.offset, entry.size, entry.crc32c) == (0, 8, 0x35E53C59)
        assert reader.entry("n").offset == 8
        assert reader.header.SerializeToString() == bytes.fromhex("08011a020801")


@pytest.mark.parametrize(
    "shape", [(), (0,), (0, 1618), (16, 0, 18), (1,), (2, 1, 3, 1, 2, 1, 2, 1, 1, 2)]
)
def test_i4_shapes(prefix, shape):
    value = sample(np.dtype(np.float32), shape)
    strings = np.full(shape, b"ab", dtype=object)
    write(prefix, {"x": value, "s": strings})
    with BundleReader(prefix) as reader:
        assert_same(reader.read("x"), value)
        got = reader.read("s")
        assert got.shape == shape
        assert got.dtype == object
        assert (got == strings).all()


def test_i4_zero_size_entry_fields(prefix):
    write(prefix, {"a": np.ones(4, np.int8), "z": np.zeros((0, 3), np.float32)})
    with BundleReader(prefix) as reader:
        entry = reader.entry("z")
        assert (entry.offset, entry.size, entry.crc32c) == (4, 0, 0xA282EAD8)


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[::2, 1::3],
        lambda a: np.asfortranarray(a),
        lambda a: a.T,
        lambda a: a.astype(a.dtype.newbyteorder(">")),
        lambda a: np.broadcast_to(a[:1], a.shape),
        lambda a: a[:, :, None][..., ::-1],
    ],
    ids=["strided", "fortran", "transposed", "big-endian", "broadcast", "reversed"],
)
def test_i4_non_contiguous_inputs(prefix, make):
    base = np.arange(6 * 9, dtype=np.float64).reshape(6, 9)
    value = make(base)
    write(prefix, {"x": value})
    with BundleReader(prefix) as reader:
        got = reader.read("x")
        assert got.dtype == np.float64
        assert got.dtype.isnative
        np.testing.assert_array_equal(got, value)


def test_i4_large_fortran_array_is_chunked(prefix, monkeypatch):
    from trackpoint.bundle import c_order

    monkeypatch.setattr(c_order, "CHUNK_BYTES", 1000)
    value = np.asfortranarray(np.arange(3 * 50 * 40, dtype=np.int32).reshape(3, 50, 40))
    write(prefix, {"x": value, "y": value[:, ::3, ::-2]})
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read("x"), value)
        np.testing.assert_array_equal(reader.read("y"), value[:, ::3, ::-2])


def test_strings_bytes_str_and_unicode(prefix):
    tensors = {
        "obj": np.array([b"ab", "über", b"", "日本"], dtype=object).reshape(2, 2),
        "S": np.array([b"x", b"yz"]),
        "U": np.array(["ключ", ""]),
        "scalar": np.array(b"\x00\xffbinary", dtype=object),
    }
    write(prefix, tensors)
    with BundleReader(prefix) as reader:
        assert reader.read("obj").tolist() == [[b"ab", "über".encode()], [b"", "日本".encode()]]
        assert reader.read("S").tolist() == [b"x", b"yz"]
        assert reader.read("U").tolist() == ["ключ".encode(), b""]
        assert reader.read("scalar")[()] == b"\x00\xffbinary"


def test_string_worked_example_bytes(prefix):
    write(prefix, {"s": np.array([b"ab", b"", b"xyz"], dtype=object)})
    data = open(f"{prefix}.data-00000-of-00001", "rb").read()
    assert data == bytes.fromhex("020003 1b428bca 6162 78797a".replace(" ", ""))
    with BundleReader(prefix) as reader:
        assert reader.entry("s").size == 12
        assert reader.entry("s").crc32c == 0x3FC4AD10


def test_empty_string_tensor_bytes(prefix):
    write(prefix, {"s": np.zeros((0,), dtype=object)})
    assert open(f"{prefix}.data-00000-of-00001", "rb").read() == bytes.fromhex("d8ea82a2")
    with BundleReader(prefix) as reader:
        assert reader.entry("s").crc32c == 0x640CC1F6
        assert reader.read("s").shape == (0,)


def test_i5_string_element_of_32_mib(prefix):
    big = os.urandom(1 << 20) * 32
    value = np.array([b"head", big, b"tail"], dtype=object)
    write(prefix, {"s": value})
    with BundleReader(prefix) as reader:
        got = reader.read("s")
        assert got[0] == b"head"
        assert got[1] == big
        assert got[2] == b"tail"


def test_long_lengths_use_multibyte_varints(prefix):
    value = np.array([b"a" * 200, b"b" * 20000, b"", b"c"], dtype=object)
    write(prefix, {"s": value})
    data = open(f"{prefix}.data-00000-of-00001", "rb").read()
    assert data[:6] == bytes.fromhex("c801a09c0100")
    with BundleReader(prefix) as reader:
        assert reader.read("s").tolist() == value.tolist()


@pytest.mark.parametrize(
    "value",
    [
        np.array([b"a", 3], dtype=object),
        np.array([None], dtype=object),
        np.array(["2020-01-01"], dtype="M8[D]"),
        np.zeros(2, dtype=[("a", "i4")]),
    ],
)
def test_unsupported_values_name_key_and_write_nothing(prefix, value):
    with BundleWriter(prefix) as writer:
        with pytest.raises(InvalidArgumentError, match="key 'bad'"):
            writer.add("bad", value)
        writer.add("ok", np.ones(2))
    with BundleReader(prefix) as reader:
        assert reader.keys() == ["ok"]


def test_i6_keys_sorted_by_utf8_bytes_and_unicode(prefix):
    keys = ["zeta", "über/ключ", "_CHECKPOINTABLE_OBJECT_GRAPH", "Zed", "a/b", "a.b", "😀", "é"]
    write(prefix, {k: np.array([i], np.int32) for i, k in enumerate(keys)})
    expected = sorted(keys, key=lambda k: k.encode("utf-8"))
    with BundleReader(prefix) as reader:
        assert reader.keys() == expected
        for i, key in enumerate(keys):
            assert reader.read(key).tolist() == [i]
    table = read_table(open(f"{prefix}.index", "rb").read(), "x")
    assert table.keys == [b""] + [k.encode() for k in expected]


def test_i6_data_order_is_add_order(prefix):
    write(prefix, {"b": np.int8(1), "a": np.int8(2)})
    assert open(f"{prefix}.data-00000-of-00001", "rb").read() == b"\x01\x02"


def test_i6_duplicate_key_and_bad_keys(prefix):
    with BundleWriter(prefix) as writer:
        writer.add("k", np.ones(1))
        with pytest.raises(InvalidArgumentError, match="duplicate key"):
            writer.add("k", np.ones(1))
        for bad in ["", "\x00x", b"bytes", "\udcff"]:
            with pytest.raises(InvalidArgumentError):
                writer.add(bad, np.ones(1))


def test_i6_double_finish_and_add_after_finish(prefix):
    writer = BundleWriter(prefix)
    writer.add("k", np.ones(1))
    writer.finish()
    with pytest.raises(FailedPreconditionError):
        writer.finish()
    with pytest.raises(FailedPreconditionError):
        writer.add("j", np.ones(1))


def test_i6_missing_prefix_is_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="nothing_here"):
        BundleReader(str(tmp_path / "nothing_here"))
    with pytest.raises(FileNotFoundError):
        BundleReader(str(tmp_path / "nothing_here"))


def test_unknown_key_is_not_found(prefix):
    write(prefix, {"a": np.ones(1)})
    with BundleReader(prefix) as reader:
        assert not reader.has_tensor("b")
        with pytest.raises(NotFoundError, match="Key 'b' not found"):
            reader.read("b")


def test_empty_bundle(prefix):
    write(prefix, {})
    with BundleReader(prefix) as reader:
        assert reader.keys() == []
        reader.verify()


def test_context_manager_aborts_on_error(prefix):
    def fail() -> None:
        with BundleWriter(prefix) as writer:
            writer.add("a", np.ones(3))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert not os.path.exists(f"{prefix}.index")
    assert not os.path.exists(f"{prefix}.data-00000-of-00001")


def test_creates_parent_directory(tmp_path):
    prefix = str(tmp_path / "new" / "dir" / "ckpt")
    write(prefix, {"a": np.ones(1)})
    assert os.path.exists(prefix + ".index")


def test_memory_storage(tmp_path):
    storage = MemoryStorage()
    write("mem/ckpt", {"a": np.arange(3.0), "s": np.array([b"x"], object)}, storage=storage)
    with BundleReader("mem/ckpt", storage=storage) as reader:
        assert reader.read("a").tolist() == [0.0, 1.0, 2.0]
        assert reader.read("s").tolist() == [b"x"]


def test_copy_false_is_read_only_view_and_read_into(prefix):
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    write(prefix, {"x": value, "s": np.array([b"q"], object)})
    with BundleReader(prefix) as reader:
        view = reader.read("x", copy=False)
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            view[0, 0] = 1
        owned = reader.read("x")
        assert owned.flags.writeable
        assert owned.flags.owndata
        out = np.zeros((3, 4), np.float32)
        reader.read_into("x", out)
        np.testing.assert_array_equal(out, value)
        strings = np.empty(1, object)
        reader.read_into("s", strings)
        assert strings[0] == b"q"
        with pytest.raises(InvalidArgumentError, match="float32"):
            reader.read_into("x", np.zeros((3, 4), np.float64))
        with pytest.raises(InvalidArgumentError):
            reader.read_into("x", np.zeros((4, 3), np.float32))
        with pytest.raises(InvalidArgumentError, match="read-only"):
            reader.read_into("x", view)


def test_read_slice_of_unsliced_tensor(prefix):
    value = np.arange(30).reshape(5, 6)
    write(prefix, {"x": value})
    with BundleReader(prefix) as reader:
        np.testing.assert_array_equal(reader.read_slice("x", "1,2:-"), value[1:3])
        with pytest.raises(InvalidArgumentError):
            reader.read_slice("x", "4,2:-")


_dtypes = st.sampled_from([d for _, d in NUMERIC_DTYPES] + [np.dtype(object)])
_shapes = st.lists(st.integers(0, 4), max_size=4).map(tuple)
_keys = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(_keys, st.tuples(_dtypes, _shapes), max_size=6), st.integers(0, 99))
def test_property_round_trip(tmp_path, spec, seed):
    prefix = str(tmp_path / f"p{seed}")
    tensors = {}
    for i, (key, (dtype, shape)) in enumerate(spec.items()):
        if dtype.kind == "O":
            count = int(np.prod(shape))
            tensors[key] = np.array(
                [bytes([i % 256]) * (j % 5) for j in range(count)] + [None], dtype=object
            )[:-1].reshape(shape)
        else:
            tensors[key] = sample(dtype, shape, seed + i)
    write(prefix, tensors)
    with BundleReader(prefix) as reader:
        assert reader.keys() == sorted(tensors, key=lambda k: k.encode())
        for key, value in tensors.items():
            got = reader.read(key)
            if value.dtype == object:
                assert got.shape == value.shape
                assert got.tolist() == value.tolist()
            else:
                assert_same(got, value)
        reader.verify()


def test_ml_dtypes_bfloat16_bytes(prefix):
    write(prefix, {"b": np.array([1.0], ml_dtypes.bfloat16)})
    assert open(f"{prefix}.data-00000-of-00001", "rb").read() == b"\x80\x3f"


def test_read_after_close_is_failed_precondition(prefix):
    write(prefix, {"a": np.ones(2)})
    reader = BundleReader(prefix)
    reader.close()
    with pytest.raises(FailedPreconditionError, match="closed"):
        reader.read("a")


def test_public_names():
    import trackpoint.bundle as bundle

    for name in bundle.__all__:
        assert getattr(bundle, name) is not None
    assert {
        "BundleWriter",
        "BundleReader",
        "merge_bundles",
        "TensorSlice",
    } <= set(bundle.__all__)
