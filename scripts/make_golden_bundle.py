"""Regenerate tests/golden/bundle/ with real TensorFlow.

Run: ``.venv/bin/python scripts/make_golden_bundle.py``. Writes three small TF-made
checkpoints and ``manifest.json`` describing every tensor in save order (key, dtype name,
shape, value bytes), so tests check our reader and writer against TensorFlow's bytes without
importing TensorFlow:

* ``dtypes``: one SaveV2 call with a [2, 3] tensor of every dtype TF saves, a scalar, a
  zero-size tensor and strings.
* ``sliced``: a [5, 10] float tensor saved as two slices by two SaveV2 calls, then merged by
  MergeV2Checkpoints into two data files (plus an unsliced tensor in each shard).
* ``object/ckpt-1``: ``tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).save`` (§9.6).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import ml_dtypes
import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "golden", "bundle"
)

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "bfloat16",
    "float8_e5m2",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2fnuz",
    "int4",
    "uint4",
    "int2",
    "uint2",
    "float4_e2m1fn",
]


def np_dtype(name: str) -> np.dtype:
    return (
        np.dtype(getattr(ml_dtypes, name))
        if hasattr(ml_dtypes, name) and not hasattr(np, name)
        else np.dtype(name)
    )


def values_for(name: str) -> np.ndarray:
    dtype = np_dtype(name)
    if dtype.kind == "b":
        return np.array([[True, False, True], [False, False, True]])
    base = np.array([[0, 1, 1], [0, 1, 0]], dtype=np.float64)
    if "uint" not in name and dtype.kind != "u":
        base = base - np.array([[1, 0, 0], [0, 0, 1]])
    if dtype.kind == "c":
        base = base + 1j * np.array([[1, 0, -1], [0, 1, 0]])
    return base.astype(dtype)


def describe(value: np.ndarray) -> dict:
    if value.dtype == object or value.dtype.kind == "S":
        flat = [bytes(v).hex() for v in value.reshape(-1).tolist()]
        return {"dtype": "string", "shape": list(value.shape), "hex": flat}
    return {
        "dtype": value.dtype.name,
        "shape": list(value.shape),
        "hex": value.astype(value.dtype.newbyteorder("<")).tobytes().hex()
        if value.dtype.kind != "V"
        else value.tobytes().hex(),
    }


def save_v2(prefix: str, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    names = list(tensors)
    specs = [tensors[n][0] for n in names]
    values = [tf.constant(tensors[n][1]) for n in names]
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=values)


def main() -> int:
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    manifest: dict[str, dict] = {}

    # 1. Every dtype in one SaveV2 call.
    tensors: dict[str, tuple[str, np.ndarray]] = {
        f"dtype/{name}": ("", values_for(name)) for name in DTYPES
    }
    tensors["scalar"] = ("", np.array(7, dtype=np.int64))
    tensors["empty"] = ("", np.zeros((0, 3), np.float32))
    tensors["strings"] = ("", np.array([[b"ab", b""], [b"xyz", "\u00fcber".encode()]], object))
    tensors["string_scalar"] = ("", np.array(b"\x00\xffbinary", object))
    save_v2(os.path.join(OUT, "dtypes"), tensors)
    manifest["dtypes"] = [{"key": k, **describe(v)} for k, (_, v) in tensors.items()]

    # 2. A sliced tensor across two shards, merged by TF.
    full = np.arange(50, dtype=np.float32).reshape(5, 10)
    tmp = tempfile.mkdtemp()
    part0, part1 = os.path.join(tmp, "part-0"), os.path.join(tmp, "part-1")
    save_v2(part0, {"t": ("5 10 0,2:0,10", full[:2]), "a": ("", np.arange(3, dtype=np.int32))})
    save_v2(part1, {"t": ("5 10 2,3:0,10", full[2:]), "b": ("", np.array([b"q"], object))})
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=[part0, part1], destination_prefix=os.path.join(OUT, "sliced")
    )
    shutil.rmtree(tmp, ignore_errors=True)  # MergeV2Checkpoints already removed it
    manifest["sliced"] = [
        {"key": "t", **describe(full)},
        {"key": "a", **describe(np.arange(3, dtype=np.int32))},
        {"key": "b", **describe(np.array([b"q"], object))},
    ]

    # 3. An object-based checkpoint (§9.6).
    ckpt = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
    ckpt.save(os.path.join(OUT, "object", "ckpt"))
    os.remove(os.path.join(OUT, "object", "checkpoint"))
    manifest["object/ckpt-1"] = [
        {"key": "v/.ATTRIBUTES/VARIABLE_VALUE", **describe(np.array([1.0, 2.0], np.float32))},
        {"key": "save_counter/.ATTRIBUTES/VARIABLE_VALUE", **describe(np.array(1, np.int64))},
    ]

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"tensorflow": tf.__version__, "checkpoints": manifest}, f, indent=1)
        f.write("\n")
    for name in sorted(os.listdir(OUT)):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
