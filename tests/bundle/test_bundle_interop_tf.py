"""Live interoperability with real TensorFlow (the ``tf`` fixture): both directions, bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from bundle_samples import NUMERIC_DTYPES, sample

from trackpoint.bundle import BundleReader, BundleWriter, merge_bundles
from trackpoint.management import CheckpointReader

pytestmark = pytest.mark.interop

STRINGS = np.array([[b"ab", b""], ["\u00fcber".encode(), b"\x00\xff"]], dtype=object)


def all_tensors() -> dict[str, np.ndarray]:
    tensors = {
        f"dt/{name}": sample(dtype, (2, 3), i) for i, (name, dtype) in enumerate(NUMERIC_DTYPES)
    }
    tensors["scalar"] = np.array(3.5, np.float64)
    tensors["empty"] = np.zeros((0, 1618), np.float32)
    tensors["empty3"] = np.zeros((16, 0, 18), np.int32)
    tensors["strings"] = STRINGS
    tensors["über/ключ"] = np.arange(4, dtype=np.int16)
    return tensors


def same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if b.dtype == object:
        return a.shape == b.shape and a.tolist() == b.tolist()
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_tf_reads_what_we_wrote(tf, prefix):
    tensors = all_tensors()
    with BundleWriter(prefix) as writer:
        for key, value in tensors.items():
            writer.add(key, value)
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    assert set(shapes) == set(tensors)
    for key, value in tensors.items():
        assert shapes[key] == list(value.shape)
        assert same(reader.get_tensor(key), value), key


def test_tf_reads_our_sliced_tensor_two_shards_merged(tf, tmp_path):
    full = np.arange(50, dtype=np.float32).reshape(5, 10)
    part0, part1 = str(tmp_path / "t" / "p0"), str(tmp_path / "t" / "p1")
    with BundleWriter(part0) as writer:
        writer.add_slice("t", (5, 10), "0,2:-", full[:2])
        writer.add("x", np.ones(2))
    with BundleWriter(part1) as writer:
        writer.add_slice("t", (5, 10), "2,3:-", full[2:])
    out = str(tmp_path / "ckpt")
    merge_bundles([part0, part1], out)
    reader = tf.train.load_checkpoint(out)
    assert reader.get_variable_to_shape_map() == {"t": [5, 10], "x": [2]}
    np.testing.assert_array_equal(reader.get_tensor("t"), full)
    restored = tf.raw_ops.RestoreV2(
        prefix=out, tensor_names=["t"], shape_and_slices=["5 10 1,3:2,5"], dtypes=[tf.float32]
    )[0]
    np.testing.assert_array_equal(restored.numpy(), full[1:4, 2:7])


def test_we_read_what_tf_saved_and_index_is_identical(tf, tmp_path):
    tensors = all_tensors()
    del tensors["über/ключ"]  # SaveV2 takes any key bytes; kept for the unicode test below
    tf_prefix, our_prefix = str(tmp_path / "tf"), str(tmp_path / "ours")
    tf.raw_ops.SaveV2(
        prefix=tf_prefix,
        tensor_names=list(tensors),
        shape_and_slices=[""] * len(tensors),
        tensors=[tf.constant(v) for v in tensors.values()],
    )
    with BundleReader(tf_prefix) as reader:
        for key, value in tensors.items():
            assert same(reader.read(key), value), key
    with BundleWriter(our_prefix) as writer:
        for key, value in tensors.items():
            writer.add(key, value)
    for suffix in (".index", ".data-00000-of-00001"):
        assert Path(our_prefix + suffix).read_bytes() == Path(tf_prefix + suffix).read_bytes()


def test_unicode_keys_identical_to_tf(tf, tmp_path):
    keys = ["zeta", "über/ключ", "😀/x", "a"]
    tf_prefix, our_prefix = str(tmp_path / "tf"), str(tmp_path / "ours")
    tf.raw_ops.SaveV2(
        prefix=tf_prefix,
        tensor_names=keys,
        shape_and_slices=[""] * len(keys),
        tensors=[tf.constant([i]) for i in range(len(keys))],
    )
    with BundleWriter(our_prefix) as writer:
        for i, key in enumerate(keys):
            writer.add(key, np.array([i], np.int32))
    assert Path(our_prefix + ".index").read_bytes() == Path(tf_prefix + ".index").read_bytes()
    assert sorted(tf.train.load_checkpoint(our_prefix).get_variable_to_shape_map()) == sorted(keys)


def test_multi_block_index_identical_to_tf(tf, tmp_path):
    keys = [f"layer_{i:05d}/kernel/.ATTRIBUTES/VARIABLE_VALUE" for i in range(12000)]
    tf_prefix, our_prefix = str(tmp_path / "tf"), str(tmp_path / "ours")
    value = np.float32(1.0)
    tf.raw_ops.SaveV2(
        prefix=tf_prefix,
        tensor_names=keys,
        shape_and_slices=[""] * len(keys),
        tensors=[tf.constant(value)] * len(keys),
    )
    with BundleWriter(our_prefix) as writer:
        for key in keys:
            writer.add(key, value)
    ours = Path(our_prefix + ".index").read_bytes()
    assert ours == Path(tf_prefix + ".index").read_bytes()
    assert len(ours) > 2 * 262144  # really several data blocks
    with BundleReader(tf_prefix) as reader:
        assert reader.keys() == keys


def test_we_read_tf_checkpoint_of_variables(tf, tmp_path):
    variables = {
        "f32": tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3)),
        "i64": tf.Variable(np.int64(5)),
        "bf16": tf.Variable(tf.constant([1.5, -2.0], dtype=tf.bfloat16)),
        "b": tf.Variable([True, False]),
        "c": tf.Variable(np.array([1 + 2j], np.complex128)),
        "s": tf.Variable(["ab", "", "xyz"]),
    }
    checkpoint = tf.train.Checkpoint(**variables)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    with CheckpointReader(path) as reader:
        graph = reader.object_graph()
        assert graph is not None
        names = sorted(c.local_name for c in graph.nodes[0].children)
        assert names == sorted([*variables, "save_counter"])
        for name, variable in variables.items():
            key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
            got = reader.get_tensor(key)
            expected = variable.numpy()
            assert same(got, expected.astype(object) if expected.dtype == object else expected)
        assert reader.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE") == 1


def test_we_read_tf_partitioned_variable(tf, tmp_path):
    full = np.arange(24, dtype=np.float32).reshape(4, 6)
    prefix = str(tmp_path / "p")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["v"] * 4,
        shape_and_slices=["4 6 0,4:0,2", "4 6 0,2:2,4", "4 6 2,2:2,1", "4 6 2,2:3,3"],
        tensors=[
            tf.constant(full[:, :2]),
            tf.constant(full[:2, 2:]),
            tf.constant(full[2:, 2:3]),
            tf.constant(full[2:, 3:]),
        ],
    )
    with BundleReader(prefix) as reader:
        assert len(reader.slices("v")) == 4
        np.testing.assert_array_equal(reader.read("v"), full)
        np.testing.assert_array_equal(reader.read_slice("v", "1,2:1,4"), full[1:3, 1:5])
    ours = str(tmp_path / "o")
    with BundleWriter(ours) as writer:
        for spec, part in [
            ("0,4:0,2", full[:, :2]),
            ("0,2:2,4", full[:2, 2:]),
            ("2,2:2,1", full[2:, 2:3]),
            ("2,2:3,3", full[2:, 3:]),
        ]:
            writer.add_slice("v", (4, 6), spec, part)
    assert Path(ours + ".index").read_bytes() == Path(prefix + ".index").read_bytes()


def test_merge_identical_to_tf_merge(tf, tmp_path):
    def shards(root: Path) -> list[str]:
        prefixes = [str(root / "tmp" / f"part-{i}") for i in range(3)]
        (root / "tmp").mkdir(parents=True)
        for i, p in enumerate(prefixes):
            tf.raw_ops.SaveV2(
                prefix=p,
                tensor_names=[f"k{i}", "shared"],
                shape_and_slices=["", f"3 2 {i},1:-"],
                tensors=[tf.constant([i]), tf.constant([[i, i]])],
            )
        return prefixes

    tf_root, our_root = tmp_path / "tf", tmp_path / "ours"
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=shards(tf_root), destination_prefix=str(tf_root / "ckpt")
    )
    merge_bundles(shards(our_root), str(our_root / "ckpt"))
    names = sorted(n for n in os.listdir(tf_root) if n.startswith("ckpt"))
    assert names == sorted(n for n in os.listdir(our_root) if n.startswith("ckpt"))
    for name in names:
        assert (our_root / name).read_bytes() == (tf_root / name).read_bytes(), name
