"""A TensorFlow-written object-tree checkpoint (committed golden file) restores without TF.

``tests/golden/objects`` comes from ``scripts/make_golden_objects.py``: nested modules, a list,
a dict, a zero-size variable and a v1 Adam optimizer with slots, after one step. The manifest
holds TensorFlow's values afterwards.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from ckpt_helpers import NumpyAdam

import trackpoint as tp
from trackpoint.graph import node_names
from trackpoint.tracking import AutoTrackable, Variable

GOLDEN = pathlib.Path(__file__).parent.parent / "golden" / "objects"


def _expected() -> dict[str, np.ndarray]:
    manifest = json.loads((GOLDEN / "manifest.json").read_text())["values"]
    return {
        name: np.frombuffer(bytes.fromhex(v["hex"]), dtype=v["dtype"]).reshape(v["shape"])
        for name, v in manifest.items()
    }


def test_tf_golden_object_tree_restores_with_slots_and_consumes_everything():
    model = AutoTrackable()
    model.dense = AutoTrackable()
    model.dense.kernel = Variable(np.zeros((2, 2), np.float32))
    model.dense.bias = np.zeros(2, np.float32)
    model.layers = [Variable(np.int32(0)), AutoTrackable()]
    model.layers[1].w = Variable(np.zeros((0, 3), np.float32))
    model.table = {"a": Variable(np.float64(0)), "b": np.zeros(2, bool)}
    optimizer = NumpyAdam()
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)
    status = ckpt.restore(str(GOLDEN / "ckpt-1"))
    optimizer._ensure_non_slot()
    status.assert_consumed()

    want = _expected()
    got = {
        "kernel": model.dense.kernel.numpy(), "bias": model.dense.bias,
        "layer0": model.layers[0].numpy(), "w": model.layers[1].w.numpy(),
        "a": model.table["a"].numpy(), "b": model.table["b"],
        "kernel_m": optimizer.get_slot(model.dense.kernel, "m").numpy(),
        "kernel_v": optimizer.get_slot(model.dense.kernel, "v").numpy(),
        "bias_m": optimizer.get_slot(model.dense.bias, "m").numpy(),
        "bias_v": optimizer.get_slot(model.dense.bias, "v").numpy(),
        "beta1_power": optimizer.beta1_power.numpy(),
        "beta2_power": optimizer.beta2_power.numpy(),
    }
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert int(ckpt.save_counter.numpy()) == 1


def test_tf_golden_object_graph_reads_as_readable_paths():
    names = set(node_names(tp.object_metadata(str(GOLDEN / "ckpt-1"))).values())
    assert "(root).model.dense.kernel" in names
    assert "(root).optimizer's state 'm' for (root).model.dense.kernel" in names
    assert "(root).model.table.a" in names
