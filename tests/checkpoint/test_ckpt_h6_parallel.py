"""H6: per-device replicas of one value (``tp.ParallelVariable``), TensorFlow's key layout."""

from __future__ import annotations

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError

ATTR = "/.ATTRIBUTES/"


def _replicas(n: int = 3, dtype: str = "float32") -> tp.ParallelVariable:
    return tp.ParallelVariable(
        [np.full((2, 3), i + 1, dtype=dtype) for i in range(n)], name="w"
    )


def test_h6_components_saved_under_tf_keys(tmp_path):
    path = tp.Checkpoint(w=_replicas()).write(str(tmp_path / "ckpt"))
    keys = {k for k, _ in tp.list_variables(path) if not k.startswith("_")}
    assert keys == {
        "w" + ATTR + "VARIABLE_VALUE",
        "w" + ATTR + "parallel_component_1",
        "w" + ATTR + "parallel_component_2",
    }
    assert np.array_equal(tp.load_variable(path, "w" + ATTR + "parallel_component_2"),
                          np.full((2, 3), 3, np.float32))


def test_h6_round_trip_restores_every_component_in_place(tmp_path):
    path = tp.Checkpoint(w=_replicas()).write(str(tmp_path / "ckpt"))
    target = tp.ParallelVariable([np.zeros((2, 3), np.float32) for _ in range(3)])
    arrays = target.components
    tp.Checkpoint(w=target).read(path).assert_consumed()
    for i, array in enumerate(target.components):
        assert array is arrays[i]
        assert np.array_equal(array, np.full((2, 3), i + 1, np.float32))


def test_h6_single_device_loader_gets_component_zero(tmp_path):
    path = tp.Checkpoint(w=_replicas()).write(str(tmp_path / "ckpt"))
    plain = tp.Variable(np.zeros((2, 3), np.float32))
    status = tp.Checkpoint(w=plain).read(path)
    assert np.array_equal(plain.numpy(), np.ones((2, 3), np.float32))
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="parallel_component_1"):
        status.assert_consumed()
    status.expect_partial()


def test_h6_single_device_checkpoint_fills_every_component(tmp_path):
    path = tp.Checkpoint(w=tp.Variable(np.full((2, 3), 7, np.float32))).write(
        str(tmp_path / "ckpt"))
    target = _replicas()
    tp.Checkpoint(w=target).read(path).assert_consumed()
    for array in target.components:
        assert np.array_equal(array, np.full((2, 3), 7, np.float32))


def test_h6_restore_on_create_fills_every_component(tmp_path):
    path = tp.Checkpoint(w=tp.Variable(np.full((2, 3), 5, np.float32))).write(
        str(tmp_path / "ckpt"))
    root = tp.Checkpoint()
    status = root.read(path)
    root.w = _replicas(2)  # created after the restore was requested: deferred restoration
    for array in root.w.components:
        assert np.array_equal(array, np.full((2, 3), 5, np.float32))
    status.assert_consumed()


def test_h6_more_saved_components_than_live_ones_are_reported(tmp_path):
    path = tp.Checkpoint(w=_replicas(3)).write(str(tmp_path / "ckpt"))
    target = _replicas(2)
    status = tp.Checkpoint(w=target).read(path)
    assert np.array_equal(target.components[1], np.full((2, 3), 2, np.float32))
    with pytest.raises(AssertionError, match="parallel_component_2"):
        status.assert_consumed()
    status.expect_partial()


def test_h6_shape_mismatch_names_component_and_changes_nothing(tmp_path):
    path = tp.Checkpoint(w=_replicas(2)).write(str(tmp_path / "ckpt"))
    target = tp.ParallelVariable([np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)])
    bad = tp.ParallelVariable([np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32)])
    with pytest.raises(InvalidArgumentError, match=r"\(2, 3\).*component 0 .*\(3, 2\)"):
        tp.Checkpoint(w=bad).read(path)
    assert not target.components[0].any()
    assert not bad.components[1].any()


def test_h6_components_must_agree():
    with pytest.raises(InvalidArgumentError, match="component 1"):
        tp.ParallelVariable([np.zeros(3, np.float32), np.zeros(4, np.float32)])
    with pytest.raises(InvalidArgumentError, match="at least one"):
        tp.ParallelVariable([])


def test_h6_tensorflow_variable_reads_component_zero(tmp_path, tf):
    # TensorFlow's own loader takes VARIABLE_VALUE; the other components stay unread.
    path = tp.Checkpoint(w=_replicas()).write(str(tmp_path / "ckpt"))
    v = tf.Variable(tf.zeros((2, 3)))
    status = tf.train.Checkpoint(w=v).read(path)
    status.assert_existing_objects_matched()
    assert np.array_equal(v.numpy(), np.ones((2, 3), np.float32))
