"""TensorFlow reads what MultiDeviceSaver writes: several shards, slices, tasks (§11–§13)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trackpoint.bundle.reader import BundleReader
from trackpoint.saving import CheckpointOptions, DeviceValue, MaxShardSizePolicy, MultiDeviceSaver

pytestmark = pytest.mark.interop


def _data_sizes(prefix: str) -> list[int]:
    directory, base = os.path.split(prefix)
    names = sorted(n for n in os.listdir(directory) if n.startswith(f"{base}.data-"))
    return [os.path.getsize(os.path.join(directory, n)) for n in names]


def test_tensorflow_loads_sharded_sliced_multi_task_checkpoint(tf, prefix) -> None:  # noqa: ANN001
    rng = np.random.default_rng(0)
    big = rng.standard_normal((12, 7)).astype(np.float32)
    values = {
        "big/.ATTRIBUTES/VARIABLE_VALUE": big,
        "ints/.ATTRIBUTES/VARIABLE_VALUE": np.arange(40, dtype=np.int64),
        "scalar/.ATTRIBUTES/VARIABLE_VALUE": np.float64(2.5),
        "flags/.ATTRIBUTES/VARIABLE_VALUE": np.array([True, False, True]),
        "name/.ATTRIBUTES/VARIABLE_VALUE": np.array(b"a longer string value", dtype=object),
    }
    part = np.arange(30, dtype=np.float32).reshape(6, 5)
    tensors = {
        None: {
            **{k: DeviceValue(v, "/job:worker/task:0/device:CPU:0") for k, v in values.items()},
            # Two partitions of one variable, on another task.
            "part/.ATTRIBUTES/VARIABLE_VALUE": {
                "6 5 0,4:0,5": DeviceValue(part[:4], "/job:worker/task:1/device:GPU:0"),
                "6 5 4,2:0,5": DeviceValue(part[4:], "/job:worker/task:1/device:GPU:0"),
            },
        }
    }
    MultiDeviceSaver(tensors).save(
        prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(64))
    )
    assert len(_data_sizes(prefix)) > 5
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    assert shapes == {
        "big/.ATTRIBUTES/VARIABLE_VALUE": [12, 7],
        "ints/.ATTRIBUTES/VARIABLE_VALUE": [40],
        "scalar/.ATTRIBUTES/VARIABLE_VALUE": [],
        "flags/.ATTRIBUTES/VARIABLE_VALUE": [3],
        "name/.ATTRIBUTES/VARIABLE_VALUE": [],
        "part/.ATTRIBUTES/VARIABLE_VALUE": [6, 5],
    }
    for key, value in values.items():
        got = reader.get_tensor(key)
        if value.dtype == object:
            assert got == value.item()
        else:
            np.testing.assert_array_equal(got, value)
    np.testing.assert_array_equal(reader.get_tensor("part/.ATTRIBUTES/VARIABLE_VALUE"), part)


def test_strings_unsliced_for_tensorflow_with_slice_strings_false(tf, prefix) -> None:  # noqa: ANN001
    strings = np.array([b"abc", b"defgh", b"", b"ij"], dtype=object)
    saver = MultiDeviceSaver({None: {"s": strings, "x": np.arange(8, dtype=np.float32)}})
    # TF's own layout slices strings, which TF 2.21 itself cannot restore...
    saver.save(prefix, CheckpointOptions(sharding_policy=MaxShardSizePolicy(5)))
    with BundleReader(prefix) as ours:
        assert len(ours.slices("s")) == 4
        assert ours.read("s").tolist() == strings.tolist()
    with pytest.raises(tf.errors.InvalidArgumentError, match="Dtype string not supported"):
        tf.raw_ops.RestoreV2(
            prefix=prefix, tensor_names=["s"], shape_and_slices=[""], dtypes=[tf.string]
        )
    # ...so slice_strings=False keeps them whole, and TF reads the file.
    policy = MaxShardSizePolicy(5, slice_strings=False)
    saver.save(prefix, CheckpointOptions(sharding_policy=policy))
    restored_s, restored_x = tf.raw_ops.RestoreV2(
        prefix=prefix, tensor_names=["s", "x"], shape_and_slices=["", ""],
        dtypes=[tf.string, tf.float32],
    )
    assert restored_s.numpy().tolist() == strings.tolist()
    np.testing.assert_array_equal(restored_x.numpy(), np.arange(8))
    assert tf.train.load_checkpoint(prefix).get_tensor("s").tolist() == strings.tolist()


def test_trace_a_layout_matches_a_tensorflow_checkpoint(tf, tmp_path) -> None:  # noqa: ANN001
    v = np.arange(24, dtype=np.float32).reshape(4, 6)
    s = np.arange(5, dtype=np.int64)
    ckpt = tf.train.Checkpoint(v=tf.Variable(v), s=tf.Variable(s))
    tf_prefix = ckpt.write(
        str(tmp_path / "tf" / "ckpt"),
        options=tf.train.CheckpointOptions(
            experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(40)
        ),
    )
    ours = str(tmp_path / "ours" / "ckpt")
    graph = np.array(b"graph", dtype=object)
    MultiDeviceSaver(
        {None: {
            "s/.ATTRIBUTES/VARIABLE_VALUE": s,
            "v/.ATTRIBUTES/VARIABLE_VALUE": v,
            "_CHECKPOINTABLE_OBJECT_GRAPH": graph,
        }}
    ).save(ours, CheckpointOptions(sharding_policy=MaxShardSizePolicy(40)))
    with BundleReader(tf_prefix) as theirs, BundleReader(ours) as mine:
        assert mine.num_shards == theirs.num_shards == 4
        key = "v/.ATTRIBUTES/VARIABLE_VALUE"
        assert [str(x) for x in mine.slices(key)] == [str(x) for x in theirs.slices(key)]
        assert mine.slices("s/.ATTRIBUTES/VARIABLE_VALUE") == []
        np.testing.assert_array_equal(mine.read(key), theirs.read(key))
    # Same bytes per data file, except the last, which holds the differing object graph.
    assert _data_sizes(ours)[:3] == _data_sizes(tf_prefix)[:3] == [40, 32, 40]
