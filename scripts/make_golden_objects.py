"""Regenerate tests/golden/objects/ with real TensorFlow.

Run: ``.venv/bin/python scripts/make_golden_objects.py``. Saves the object tree of
``tests/checkpoint/test_tf_interop.py`` (nested tf.Module children, a list and a dict of
variables, a zero-size variable) with a ``tf.compat.v1.train.AdamOptimizer`` after one step, as
``ckpt-1``, and ``manifest.json`` with every value TensorFlow holds afterwards, so
``test_golden_objects.py`` checks restoring into trackpoint without importing TensorFlow.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "golden", "objects"
)


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    model = tf.Module()
    model.dense = tf.Module()
    model.dense.kernel = tf.Variable(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    model.dense.bias = tf.Variable(np.array([0.5, -0.5], np.float32))
    model.layers = [tf.Variable(7, dtype=tf.int32), tf.Module()]
    model.layers[1].w = tf.Variable(tf.zeros([0, 3]))
    model.table = {"a": tf.Variable(1.5, dtype=tf.float64), "b": tf.Variable([True, False])}
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    opt.apply_gradients([(tf.constant([[0.5, -1.0], [2.0, 0.25]]), model.dense.kernel),
                         (tf.constant([1.0, -2.0]), model.dense.bias)])
    tf.train.Checkpoint(model=model, optimizer=opt).save(os.path.join(OUT, "ckpt"))
    os.remove(os.path.join(OUT, "checkpoint"))
    beta1_power, beta2_power = opt._get_beta_accumulators()
    values = {
        "kernel": model.dense.kernel, "bias": model.dense.bias, "layer0": model.layers[0],
        "w": model.layers[1].w, "a": model.table["a"], "b": model.table["b"],
        "kernel_m": opt.get_slot(model.dense.kernel, "m"),
        "kernel_v": opt.get_slot(model.dense.kernel, "v"),
        "bias_m": opt.get_slot(model.dense.bias, "m"),
        "bias_v": opt.get_slot(model.dense.bias, "v"),
        "beta1_power": beta1_power, "beta2_power": beta2_power,
    }
    manifest = {"tensorflow": tf.__version__, "values": {
        name: {"dtype": v.dtype.as_numpy_dtype.__name__, "shape": v.shape.as_list(),
               "hex": v.numpy().tobytes().hex()}
        for name, v in values.items()
    }}
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
