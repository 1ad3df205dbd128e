"""MaxShardSizePolicy against TensorFlow's own implementation on random inputs (H1 parity)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from trackpoint.saving import MaxShardSizePolicy
from trackpoint.saving.sharding import OBJECT_GRAPH_KEY

pytestmark = pytest.mark.interop

_DTYPES = [np.float32, np.int64, np.int8, np.float64, np.int16, "string"]


def _random_tensors(rng: random.Random) -> list[tuple[str, np.ndarray]]:
    tensors = []
    for i in range(rng.randint(1, 5)):
        dtype = rng.choice(_DTYPES)
        if dtype == "string":
            n = rng.randint(1, 6)
            shape: tuple[int, ...] = () if rng.random() < 0.2 else (n,)
            words = [bytes(rng.choice(b"abcdef") for _ in range(rng.randint(1, 9)))
                     for _ in range(max(1, math.prod(shape)))]
            array = np.array(words[0] if not shape else words, dtype=object)
        else:
            shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(0, 3)))
            array = (np.arange(math.prod(shape)) % 100).astype(dtype).reshape(shape)
        tensors.append((f"t{i}/.ATTRIBUTES/VARIABLE_VALUE", array))
    if rng.random() < 0.7:
        tensors.append((OBJECT_GRAPH_KEY, np.array(b"graph bytes", dtype=object)))
    return tensors


def _hangs_tf(tensors: list[tuple[str, np.ndarray]], max_bytes: int) -> bool:
    """TF 2.21 loops forever when a tensor's thinnest slice exceeds the limit (§13.3)."""
    for key, array in tensors:
        if key == OBJECT_GRAPH_KEY or array.ndim == 0:
            continue
        if array.dtype == object:
            elem = max(len(x) for x in array.reshape(-1))
        else:
            elem = array.dtype.itemsize
        if min(array.size // n * elem for n in array.shape) > max_bytes:
            return True
    return False


def _tf_layout(tf, tensors, max_bytes):  # noqa: ANN001, ANN202
    from tensorflow.python.checkpoint.sharding import sharding_policies, sharding_util
    from tensorflow.python.framework import device as device_lib

    device = device_lib.DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:CPU:0")
    shardable = []
    for key, array in tensors:
        value = tf.constant(array)
        shardable.append(
            sharding_util.ShardableTensor(
                _tensor_save_spec=None, tensor=value, dtype=value.dtype, device=device,
                name=key, shape=value.shape, slice_spec="", checkpoint_key=key, trackable=None,
            )
        )
    shards = sharding_policies.MaxShardSizePolicy(max_shard_size=max_bytes)(shardable)
    return [
        {k: {spec: v.numpy() for spec, v in slices.items()} for k, slices in shard.items()}
        for shard in shards
        if shard
    ]


def test_h1_shard_layouts_match_tensorflow_on_random_inputs(tf, make_st) -> None:  # noqa: ANN001
    rng = random.Random(1234)
    compared = 0
    while compared < 40:
        tensors = _random_tensors(rng)
        max_bytes = rng.randint(4, 64)
        if _hangs_tf(tensors, max_bytes):
            continue
        expected = _tf_layout(tf, tensors, max_bytes)
        ours = MaxShardSizePolicy(max_bytes)([make_st(k, a) for k, a in tensors])
        assert [{k: list(s) for k, s in shard.items()} for shard in ours] == [
            {k: list(s) for k, s in shard.items()} for shard in expected
        ], (tensors, max_bytes)
        for mine, theirs in zip(ours, expected):
            for key, slices in theirs.items():
                for spec, value in slices.items():
                    np.testing.assert_array_equal(np.asarray(mine[key][spec]), value)
        compared += 1
