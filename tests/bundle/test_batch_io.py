"""BundleWriter.add_many and BundleReader.read_many_into: the bytes and errors of the one-at-a-time
verbs, and large tensors checksummed piece by piece (§6)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trackpoint.bundle import BundleReader, BundleWriter, crc
from trackpoint.errors import DataLossError, FailedPreconditionError, InvalidArgumentError
from trackpoint.storage import MemoryStorage


def mixed_values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    big = rng.random((1000, 700), dtype=np.float32)  # 2.7 MiB: three hashed pieces
    return {
        "z/last": np.arange(5, dtype=np.int64),
        "a/scalar": np.array(2.5),
        "m/empty": np.zeros((0, 3), np.float32),
        "m/text": np.array([b"ab", b""], dtype=object),
        "m/strided": np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2],
        "m/big_endian": np.arange(6, dtype=">f8"),
        "m/bf16": np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "m/big": big,
        "m/big_strided": big[:, ::3],
        **{
            f"layer{i:03d}/kernel/.ATTRIBUTES/VARIABLE_VALUE": np.full(i % 9, i, np.float16)
            for i in range(300)
        },
    }


def files(prefix: str) -> tuple[bytes, bytes]:
    return tuple(Path(prefix + s).read_bytes() for s in (".index", ".data-00000-of-00001"))


def test_add_many_writes_the_bytes_of_add(tmp_path):
    values = mixed_values()
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    with BundleWriter(many) as writer:
        writer.add_many(list(values)[:5], list(values.values())[:5])
        writer.add("extra", np.ones(3))
        writer.add_many(list(values)[5:], list(values.values())[5:])
    with BundleWriter(one) as writer:  # the same order as the add_many bundle
        for key, value in [
            *list(values.items())[:5],
            ("extra", np.ones(3)),
            *list(values.items())[5:],
        ]:
            writer.add(key, value)
    assert files(many) == files(one)
    with BundleReader(many) as reader:
        for key, value in values.items():
            got = reader.read(key)
            assert got.dtype.newbyteorder("=") == value.dtype.newbyteorder("=")
            assert got.tolist() == value.tolist()


def batched_values() -> dict[str, object]:
    """Runs of small values broken by every kind of value that is written on its own."""
    rng = np.random.default_rng(1)
    values: dict[str, object] = {}
    for i in range(6000):  # about 2.4 MiB: several gathered chunks
        values[f"run/{i:05d}"] = rng.random(64 + i % 131, dtype=np.float32)
        if i % 997 == 0:
            values[f"big/{i}"] = rng.random(20_000)  # over the gather size: a run of its own
        if i % 1201 == 0:
            values[f"int/{i}"] = np.arange(i % 7, dtype=np.int16)  # a dtype change
        if i % 1500 == 0:
            values[f"strided/{i}"] = np.arange(30.0)[::3]
            values[f"list/{i}"] = [1.0, 2.0]  # not an ndarray
            values[f"text/{i}"] = np.array([b"x"], dtype=object)
    return values


def test_add_many_in_runs_writes_the_bytes_of_add(tmp_path):
    values = batched_values()
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    with BundleWriter(many) as writer:
        writer.add_many(list(values), list(values.values()))
    with BundleWriter(one) as writer:
        for key, value in values.items():
            writer.add(key, value)
    assert files(many) == files(one)
    with BundleReader(many) as reader:
        assert reader.read("run/05999").tolist() == values["run/05999"].tolist()


def test_add_many_in_runs_fails_at_the_pair_that_fails(prefix):
    keys = [f"v{i:03d}" for i in range(100)]
    arrays = [np.full(3, i, np.float32) for i in range(100)]
    with BundleWriter(prefix) as writer:
        with pytest.raises(InvalidArgumentError, match="duplicate key 'v010'"):
            writer.add_many(
                [*keys[:50], "v010", *keys[50:]], [*arrays[:50], arrays[0], *arrays[50:]]
            )
        with pytest.raises(InvalidArgumentError, match="reserved for slice entries"):
            writer.add_many(["w1", "w2", "\x00w", *[f"w{i}" for i in range(3, 40)]], arrays[:40])
    with BundleReader(prefix) as reader:
        assert reader.keys() == sorted([*keys[:50], "w1", "w2"])
        assert reader.read("v049").tolist() == [49.0] * 3


def test_add_many_errors_keep_the_pairs_before(prefix):
    with BundleWriter(prefix) as writer:
        with pytest.raises(InvalidArgumentError, match="2 keys but 1 arrays"):
            writer.add_many(["a", "b"], [np.ones(1)])
        writer.add("b", np.ones(1))
        with pytest.raises(InvalidArgumentError, match="duplicate key 'b'"):
            writer.add_many(["a", "b", "c"], [np.zeros(2), np.zeros(2), np.zeros(2)])
        with pytest.raises(InvalidArgumentError, match="reserved for slice entries"):
            writer.add_many(["\x00x"], [np.zeros(2)])
        writer.add("d", np.full(2, 7.0))
    with BundleReader(prefix) as reader:
        assert reader.keys() == ["a", "b", "d"]
        assert reader.read("d").tolist() == [7.0, 7.0]  # offsets stayed right
    with pytest.raises(FailedPreconditionError, match="already finished"):
        writer.add_many(["e"], [np.zeros(1)])


def test_read_many_into_equals_read(prefix):
    values = mixed_values()
    keys = [k for k in values if k != "m/text"]
    for storage in (None, MemoryStorage()):  # a mapped file, and one read() per tensor
        with BundleWriter(prefix, storage=storage) as writer:
            writer.add_many(list(values), list(values.values()))
        with BundleReader(prefix, storage=storage) as reader:
            outs = [np.empty(reader.shape(k), reader.dtype(k)) for k in keys]
            start = reader.bytes_read
            reader.read_many_into(keys, outs)
            counted = reader.bytes_read - start
            for key, out in zip(keys, outs):
                assert out.tobytes() == reader.read(key).tobytes(), key
            assert counted == sum(reader.stored_bytes(k) for k in keys)


def test_read_many_into_refuses_what_read_into_refuses(prefix):
    with BundleWriter(prefix) as writer:
        writer.add_many(["a", "b"], [np.ones((2, 3), np.float32), np.ones(2, np.int64)])
    with BundleReader(prefix) as reader:
        with pytest.raises(InvalidArgumentError, match="2 keys but 1 arrays"):
            reader.read_many_into(["a", "b"], [np.empty((2, 3), np.float32)])
        with pytest.raises(InvalidArgumentError, match="checkpoint holds int64"):
            reader.read_many_into(["a", "b"], [np.empty((2, 3), np.float32), np.empty(2)])
        frozen = np.zeros(2, np.int64)
        frozen.flags.writeable = False
        with pytest.raises(InvalidArgumentError, match="read-only"):
            reader.read_many_into(["b"], [frozen])
        strided = np.zeros((2, 6), np.float32)[:, ::2]
        reader.read_many_into(["a"], [strided])  # not C-contiguous: the general copy
        assert strided.tolist() == [[1.0] * 3] * 2


def test_damage_raises_and_leaves_the_targets_alone(prefix):
    rng = np.random.default_rng(1)
    small, big = rng.random(10, np.float32), rng.random(600_000, np.float32)
    with BundleWriter(prefix) as writer:
        writer.add_many(["small", "big"], [small, big])
    data = bytearray(Path(prefix + ".data-00000-of-00001").read_bytes())
    data[-5] ^= 1  # inside "big", past its first hashed piece
    data[3] ^= 1  # inside "small"
    Path(prefix + ".data-00000-of-00001").write_bytes(bytes(data))
    with BundleReader(prefix) as reader:
        for key in ("small", "big"):
            out = np.full(reader.shape(key), 5.0, np.float32)
            with pytest.raises(DataLossError, match="Checksum does not match"):
                reader.read_many_into([key], [out])
            assert (out == 5.0).all()
            with pytest.raises(DataLossError, match="Checksum does not match"):
                reader.read_many([key], copy=True)


def views_cases() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    one_dtype = {f"v/{i:04d}": rng.random(1 + i % 40, np.float32) for i in range(300)}
    shaped = {
        **one_dtype,
        "v/matrix": rng.random((3, 5), np.float32),
        "v/scalar": np.array(1.5, np.float32),
        "v/empty": np.zeros((0, 2), np.float32),
    }
    unaligned = {"a/byte": np.arange(3, dtype=np.int8), **one_dtype}  # float32 at odd offsets
    mixed = {**one_dtype, "z/ints": np.arange(7, dtype=np.int64), "z/half": np.ones(3, np.float16)}
    return {"one dtype": one_dtype, "shaped": shaped, "unaligned": unaligned, "mixed": mixed}


@pytest.mark.parametrize("case", ["one dtype", "shaped", "unaligned", "mixed"])
def test_read_many_views_equal_read(prefix, case):
    values = views_cases()[case]
    with BundleWriter(prefix) as writer:
        writer.add_many(list(values), list(values.values()))
    if case == "unaligned":  # only the float32 values, which start at odd offsets
        del values["a/byte"]
    with BundleReader(prefix) as reader:
        got = reader.read_many(list(values), copy=False)
        for (key, value), array in zip(values.items(), got):
            expected = reader.read(key)
            assert array.dtype == value.dtype and array.shape == value.shape, key
            assert array.tobytes() == expected.tobytes() == value.tobytes(), key
            assert not array.flags.writeable


@pytest.mark.parametrize("case", ["one dtype", "mixed"])
def test_read_many_views_refuse_damage_and_truncation(prefix, case):
    values = views_cases()[case]
    with BundleWriter(prefix) as writer:
        writer.add_many(list(values), list(values.values()))
    path = Path(prefix + ".data-00000-of-00001")
    data = bytearray(path.read_bytes())
    data[5] ^= 1  # inside the second value (bytes 4-11)
    path.write_bytes(bytes(data))
    with BundleReader(prefix) as reader:
        with pytest.raises(DataLossError, match="Checksum does not match.*'v/0001'"):
            reader.read_many(list(values), copy=False)
    data[5] ^= 1
    path.write_bytes(bytes(data[:-4]))  # undamaged, but the last value cut short
    with BundleReader(prefix) as reader:
        with pytest.raises(DataLossError, match="truncated"):
            reader.read_many(list(values), copy=False)


def test_large_values_hashed_beside_their_write(prefix):
    # Around the size from which a helper thread hashes while the bytes are written, whole or
    # as pieces whose CRC runs on from the one before (add_chunks).
    edge = crc.PARALLEL_HASH_BYTES
    values = {f"v{n}": np.arange(n, dtype=np.uint8) for n in (edge - 1, edge, 2 * edge + 3)}
    with BundleWriter(prefix) as writer:
        writer.add_many(list(values), list(values.values()))
        big = values[f"v{2 * edge + 3}"]
        pieces = [big[i : i + edge + 5] for i in range(0, big.size, edge + 5)]
        writer.add_chunks("chunked", np.dtype(np.uint8), big.shape, pieces)
    with BundleReader(prefix) as reader:
        for key, value in values.items():
            assert reader.entry(key).crc32c == crc.masked_crc32c(value)
        assert reader.entry("chunked").crc32c == crc.masked_crc32c(big)
        for got, value in zip(reader.read_many(list(values), copy=True), values.values()):
            assert got.flags.writeable and np.array_equal(got, value)


@pytest.mark.interop
def test_tf_reads_many_values_added_at_once(tf, tmp_path):
    keys = [f"model/layer{i // 8:04d}/w{i % 8}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(4000)]
    arrays = [np.full(64 + i % 128, i, np.float32) for i in range(len(keys))]
    tf_prefix, our_prefix = str(tmp_path / "tf"), str(tmp_path / "ours")
    tf.raw_ops.SaveV2(
        prefix=tf_prefix,
        tensor_names=keys,
        shape_and_slices=[""] * len(keys),
        tensors=[tf.constant(a) for a in arrays],
    )
    with BundleWriter(our_prefix) as writer:
        writer.add_many(keys, arrays)
    assert files(our_prefix) == files(tf_prefix)
    reader = tf.train.load_checkpoint(our_prefix)
    for i in (0, 1999, 3999):
        np.testing.assert_array_equal(reader.get_tensor(keys[i]), arrays[i])
    with BundleReader(tf_prefix) as ours:
        outs = [np.empty_like(a) for a in arrays]
        ours.read_many_into(keys, outs)
        assert all(np.array_equal(o, a) for o, a in zip(outs, arrays))
