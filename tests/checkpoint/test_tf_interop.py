"""TensorFlow interop: object trees checkpointed by TF restore into trackpoint, and back.

Both directions use real TensorFlow (``tf`` fixture): tf.Variable trees under nested
tf.Module children, lists and dicts, and a ``tf.compat.v1.train.AdamOptimizer`` with slots.
"""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_helpers import NumpyAdam

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.management import object_metadata
from trackpoint.tracking import AutoTrackable, Variable

pytestmark = pytest.mark.interop

KERNEL = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
BIAS = np.array([0.5, -0.5], dtype=np.float32)


def _tf_tree(tf, scale: float = 1.0):
    model = tf.Module()
    model.dense = tf.Module()
    model.dense.kernel = tf.Variable(KERNEL * scale)
    model.dense.bias = tf.Variable(BIAS * scale)
    model.layers = [tf.Variable(int(7 * scale), dtype=tf.int32), tf.Module()]
    model.layers[1].w = tf.Variable(tf.zeros([0, 3]))
    model.table = {
        "a": tf.Variable(1.5 * scale, dtype=tf.float64),
        "b": tf.Variable([scale > 0, False]),
    }
    return model


def _tp_tree(scale: float = 1.0):
    model = AutoTrackable()
    model.dense = AutoTrackable()
    model.dense.kernel = Variable(KERNEL * scale)
    model.dense.bias = np.array(BIAS * scale)  # a plain array works as well as a Variable
    model.layers = [Variable(np.int32(7 * scale)), AutoTrackable()]
    model.layers[1].w = Variable(np.zeros((0, 3), np.float32))
    model.table = {"a": Variable(np.float64(1.5 * scale)), "b": np.array([scale > 0, False])}
    return model


def _tp_values(model) -> dict[str, np.ndarray]:
    return {
        "kernel": model.dense.kernel.numpy(),
        "bias": np.array(model.dense.bias),
        "layer0": model.layers[0].numpy(),
        "w": model.layers[1].w.numpy(),
        "a": model.table["a"].numpy(),
        "b": np.array(model.table["b"]),
    }


def _tf_values(model) -> dict[str, np.ndarray]:
    return {
        "kernel": model.dense.kernel.numpy(),
        "bias": model.dense.bias.numpy(),
        "layer0": model.layers[0].numpy(),
        "w": model.layers[1].w.numpy(),
        "a": model.table["a"].numpy(),
        "b": model.table["b"].numpy(),
    }


def _assert_same(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    assert left.keys() == right.keys()
    for name in left:
        assert np.asarray(left[name]).dtype == np.asarray(right[name]).dtype, name
        np.testing.assert_array_equal(left[name], right[name], err_msg=name)


def _structure(graph) -> list:
    """Node-by-node structure of an object graph, ignoring full_name."""
    return [
        (
            [(c.node_id, c.local_name) for c in node.children],
            [(a.name, a.checkpoint_key) for a in node.attributes],
            [(s.original_variable_node_id, s.slot_name, s.slot_variable_node_id)
             for s in node.slot_variables],
            node.has_checkpoint_values.value,
        )
        for node in graph.nodes
    ]


def test_tf_checkpoint_restores_into_trackpoint_tree(tf, tmp_path):
    tf_model = _tf_tree(tf)
    tf_opt = tf.compat.v1.train.AdamOptimizer(0.1)
    tf_opt.apply_gradients([(tf.ones([2, 2]), tf_model.dense.kernel),
                            (tf.ones([2]), tf_model.dense.bias)])
    path = tf.train.Checkpoint(model=tf_model, optimizer=tf_opt).save(str(tmp_path / "tf"))

    model = _tp_tree(scale=0.0)
    optimizer = NumpyAdam()
    ckpt = Checkpoint(model=model, optimizer=optimizer)
    status = ckpt.restore(path)
    optimizer._ensure_non_slot()  # beta1/2_power: restored on creation
    status.assert_consumed()

    _assert_same(_tp_values(model), _tf_values(tf_model))
    assert int(ckpt.save_counter.numpy()) == 1
    for slot in ("m", "v"):
        np.testing.assert_array_equal(
            optimizer.get_slot(model.dense.kernel, slot).numpy(),
            tf_opt.get_slot(tf_model.dense.kernel, slot).numpy(),
        )
        np.testing.assert_array_equal(
            optimizer.get_slot(model.dense.bias, slot).numpy(),
            tf_opt.get_slot(tf_model.dense.bias, slot).numpy(),
        )
    beta1_power, _ = tf_opt._get_beta_accumulators()
    assert optimizer.beta1_power.numpy() == beta1_power.numpy()


def test_trackpoint_checkpoint_restores_into_tf_tree(tf, tmp_path):
    model = _tp_tree()
    optimizer = NumpyAdam()
    optimizer.apply_gradients([(np.ones((2, 2), np.float32), model.dense.kernel),
                               (np.ones(2, np.float32), model.dense.bias)])
    path = Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "tp")

    tf_model = _tf_tree(tf, scale=0.0)
    tf_opt = tf.compat.v1.train.AdamOptimizer(0.1)
    tf_opt.apply_gradients([(tf.zeros([2, 2]), tf_model.dense.kernel),
                            (tf.zeros([2]), tf_model.dense.bias)])
    tf_ckpt = tf.train.Checkpoint(model=tf_model, optimizer=tf_opt)
    tf_ckpt.restore(path).assert_consumed()

    _assert_same(_tf_values(tf_model), _tp_values(model))
    assert int(tf_ckpt.save_counter.numpy()) == 1
    for slot in ("m", "v"):
        np.testing.assert_array_equal(
            tf_opt.get_slot(tf_model.dense.kernel, slot).numpy(),
            optimizer.get_slot(model.dense.kernel, slot).numpy(),
        )
    beta1_power, beta2_power = tf_opt._get_beta_accumulators()
    assert beta1_power.numpy() == optimizer.beta1_power.numpy()
    assert beta2_power.numpy() == optimizer.beta2_power.numpy()


def test_object_graph_structure_matches_tf(tf, tmp_path):
    tf_model = _tf_tree(tf)
    tf_opt = tf.compat.v1.train.AdamOptimizer(0.1)
    tf_opt.apply_gradients([(tf.ones([2, 2]), tf_model.dense.kernel),
                            (tf.ones([2]), tf_model.dense.bias)])
    tf_path = tf.train.Checkpoint(model=tf_model, optimizer=tf_opt).save(str(tmp_path / "tf"))

    model = _tp_tree()
    optimizer = NumpyAdam()
    optimizer.apply_gradients([(np.ones((2, 2), np.float32), model.dense.kernel),
                               (np.ones(2, np.float32), model.dense.bias)])
    tp_path = Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "tp")

    tf_graph = TrackableObjectGraph()
    tf_graph.ParseFromString(tf.train.load_checkpoint(tf_path).get_tensor(
        "_CHECKPOINTABLE_OBJECT_GRAPH"))
    assert _structure(object_metadata(tp_path)) == _structure(tf_graph)
    assert sorted(tf.train.load_checkpoint(tf_path).get_variable_to_shape_map().items()) == (
        sorted(tf.train.load_checkpoint(tp_path).get_variable_to_shape_map().items())
    )


def test_root_with_kwargs_layout_matches_tf(tf, tmp_path):
    """``Checkpoint(root, opt=...)`` attaches kwargs (and the root self-edge) like TF."""
    tf_root = tf.Module()
    tf_root.v = tf.Variable(1.0)
    tf_path = tf.train.Checkpoint(tf_root, opt=tf.Variable(2.0)).save(str(tmp_path / "tf"))

    root = AutoTrackable()
    root.v = Variable(np.float32(0.0))
    extra = Variable(np.float32(0.0))
    ckpt = Checkpoint(root, opt=extra)
    ckpt.restore(tf_path).assert_consumed()
    assert root.v.numpy() == 1.0 and extra.numpy() == 2.0

    tp_path = ckpt.save(tmp_path / "tp")
    tf_graph = TrackableObjectGraph()
    tf_graph.ParseFromString(tf.train.load_checkpoint(tf_path).get_tensor(
        "_CHECKPOINTABLE_OBJECT_GRAPH"))
    assert _structure(object_metadata(tp_path)) == _structure(tf_graph)
    tf_root2 = tf.Module()
    tf_root2.v = tf.Variable(0.0)
    tf_extra = tf.Variable(0.0)
    tf.train.Checkpoint(tf_root2, opt=tf_extra).restore(tp_path).assert_consumed()
    assert tf_root2.v.numpy() == 1.0 and tf_extra.numpy() == 2.0


def test_python_state_interop(tf, tmp_path):
    """PythonState values (scalar DT_STRING under py_state) cross both ways."""
    from ckpt_helpers import JsonState

    class TFJson(tf.train.experimental.PythonState):
        def __init__(self, text=b"{}"):
            self.text = text

        def serialize(self):
            return self.text

        def deserialize(self, string_value):
            self.text = string_value

    tf_state = TFJson(b'{"step": 4}')
    tf_path = tf.train.Checkpoint(state=tf_state).save(str(tmp_path / "tf"))
    state = JsonState()
    Checkpoint(state=state).restore(tf_path).assert_consumed()
    assert state.values == {"step": 4}

    tp_path = Checkpoint(state=JsonState(step=9)).save(tmp_path / "tp")
    back = TFJson()
    tf.train.Checkpoint(state=back).restore(tp_path).assert_consumed()
    assert back.text == b'{"step": 9}'
