"""Scenarios B1–B8: deferred, immediate, overlapping, shared, cyclic and mismatched restores."""

from __future__ import annotations

import numpy as np
import pytest

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import AutoTrackable, Variable


def _saved(tmp_path, name="ckpt"):
    root = AutoTrackable()
    root.child = AutoTrackable()
    root.child.v = Variable([1.0, 2.0])
    root.child.w = np.array([[3, 4]], dtype=np.int32)
    root.top = Variable(5.0)
    return root, Checkpoint(root=root).save(tmp_path / name)


def test_b1_deferred_restoration_on_attach(tmp_path):
    _, path = _saved(tmp_path)
    fresh = AutoTrackable()
    status = Checkpoint(root=fresh).restore(path)
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="Unresolved object"):
        status.assert_consumed()
    fresh.child = AutoTrackable()
    fresh.child.v = Variable([0.0, 0.0])
    np.testing.assert_array_equal(fresh.child.v.numpy(), [1.0, 2.0])  # at attach time
    array = np.zeros((1, 2), dtype=np.int32)
    fresh.child.w = array
    np.testing.assert_array_equal(array, [[3, 4]])  # restored into that very array
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="Unresolved object"):
        status.assert_consumed()
    fresh.top = Variable(0.0)
    assert fresh.top.numpy() == 5.0
    status.assert_consumed()


def test_b1_restore_on_create_takes_saved_shape(tmp_path):
    _, path = _saved(tmp_path)
    fresh = AutoTrackable()
    status = Checkpoint(root=fresh).restore(path)
    fresh.child = AutoTrackable()
    v = fresh.child._add_variable("v", initial_value=np.zeros(7))  # default ignored
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    fresh.child.w = np.zeros((1, 2), np.int32)
    fresh.top = Variable(0.0)
    status.assert_consumed()


def test_b2_subtree_built_before_attach(tmp_path):
    _, path = _saved(tmp_path)
    fresh = AutoTrackable()
    status = Checkpoint(root=fresh).restore(path)
    subtree = AutoTrackable()
    subtree.v = Variable([9.0, 9.0])
    subtree.w = np.zeros((1, 2), np.int32)
    fresh.child = subtree
    np.testing.assert_array_equal(subtree.v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(subtree.w, [[3, 4]])
    status.assert_existing_objects_matched()


def test_b2_holder_created_outside_is_overwritten_on_assign(tmp_path):
    first = AutoTrackable()
    first.var1 = Variable(4.0)
    first.var2 = Variable(8.0)
    path = Checkpoint(first=first).save(tmp_path / "ckpt")
    second = AutoTrackable()
    second.var2 = Variable(0.0)
    status = Checkpoint(first=second).restore(path)
    outside = Variable(0.0)
    assert second.var2.numpy() == 8.0
    outside.assign(-2.0)
    assert outside.numpy() == -2.0
    second.var1 = outside
    assert outside.numpy() == 4.0
    status.assert_consumed()


def test_b3_immediate_restore_is_in_place(tmp_path):
    root, path = _saved(tmp_path)
    v_array = root.child.v.array
    w_array = root.child.w
    root.child.v.assign([7.0, 7.0])
    w_array[...] = 0
    Checkpoint(root=root).restore(path).assert_consumed()
    assert root.child.v.array is v_array and root.child.w is w_array
    np.testing.assert_array_equal(v_array, [1.0, 2.0])
    np.testing.assert_array_equal(w_array, [[3, 4]])
    # a re-restore after further mutation works too
    v_array[:] = -1
    Checkpoint(root=root).restore(path).assert_consumed()
    np.testing.assert_array_equal(v_array, [1.0, 2.0])


def _dep_checkpoints(tmp_path):
    root = Checkpoint()
    root.dep = AutoTrackable()
    root.dep.var = Variable(0.0)
    root.dep.var.assign(1.0)
    first = root.save(tmp_path / "ckpt")
    root.dep.var.assign(2.0)
    second = root.save(tmp_path / "ckpt")
    return first, second


def test_b4_most_recently_requested_restore_wins(tmp_path):
    first, second = _dep_checkpoints(tmp_path)
    ckpt = Checkpoint()
    first_status = ckpt.restore(first)
    second_status = ckpt.restore(second)
    ckpt.dep = AutoTrackable()
    ckpt.dep.var = Variable(0.0)
    assert ckpt.dep.var.numpy() == 2.0
    first_status.assert_consumed()
    second_status.assert_consumed()

    ckpt = Checkpoint()
    ckpt.restore(second)
    ckpt.restore(first)
    ckpt.dep = AutoTrackable()
    ckpt.dep.var = Variable(0.0)
    assert ckpt.dep.var.numpy() == 1.0
    assert int(ckpt.save_counter.numpy()) == 1


def test_b4_newest_request_wins_for_existing_objects(tmp_path):
    first, second = _dep_checkpoints(tmp_path)
    ckpt = Checkpoint()
    ckpt.dep = AutoTrackable()
    ckpt.dep.var = Variable(0.0)
    ckpt.restore(second)
    ckpt.restore(first)
    assert ckpt.dep.var.numpy() == 1.0


def test_b5_one_saved_object_loaded_into_two_objects_fails(tmp_path):
    shared = Variable(1.0)
    saved = AutoTrackable()
    saved.a = shared
    saved.b = shared
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.a = Variable(0.0)
    fresh.b = Variable(0.0)
    status = Checkpoint(root=fresh).read(path)
    with pytest.raises(AssertionError, match="not bound to checkpointed values"):
        status.assert_existing_objects_matched()
    with pytest.raises(AssertionError):
        status.assert_consumed()


def test_b5_two_saved_objects_loaded_into_one_object(tmp_path):
    saved = AutoTrackable()
    saved.a = Variable(1.0)
    saved.b = Variable(2.0)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    combined = Variable(0.0)
    fresh = AutoTrackable()
    fresh.a = combined
    fresh.b = combined
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert combined.numpy() in (1.0, 2.0)


def test_b6_cycles_save_and_restore(tmp_path):
    a = AutoTrackable()
    b = AutoTrackable()
    a.b = b
    b.a = a
    a.v = Variable(1.0)
    b.v = Variable(2.0)
    path = Checkpoint(root=a).write(tmp_path / "ckpt")

    fresh_a = AutoTrackable()
    status = Checkpoint(root=fresh_a).read(path)
    fresh_b = AutoTrackable()
    fresh_b.a = fresh_a
    fresh_b.v = Variable(0.0)
    fresh_a.v = Variable(0.0)
    fresh_a.b = fresh_b  # deferred restore reaches the cycle
    assert fresh_a.v.numpy() == 1.0 and fresh_b.v.numpy() == 2.0
    status.assert_consumed()
    fresh_a.v.assign(-1.0)
    Checkpoint(root=fresh_a).read(path).assert_consumed()
    assert fresh_a.v.numpy() == 1.0


def test_b6_container_holding_itself(tmp_path):
    root = AutoTrackable()
    root.items = []
    root.items.append(root.items)
    root.items.append(Variable(3.0))
    assert set(root.items._trackable_children()) == {"0", "1"}
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.items = []
    fresh.items.append(fresh.items)
    fresh.items.append(Variable(0.0))
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert fresh.items[1].numpy() == 3.0


def test_b7_older_checkpoint_after_adding_leaves(tmp_path):
    root = AutoTrackable()
    root.v1 = Variable(1.0)
    ckpt = Checkpoint(root=root)
    old = ckpt.save(tmp_path / "ckpt")
    root.v2 = Variable(2.0)
    root.v1.assign(10.0)
    ckpt.save(tmp_path / "ckpt")
    root.v1.assign(100.0)
    root.v2.assign(200.0)
    status = ckpt.restore(old)
    assert root.v1.numpy() == 1.0
    assert root.v2.numpy() == 200.0
    with pytest.raises(AssertionError, match="not bound"):
        status.assert_existing_objects_matched()


def test_b8_shape_mismatch_names_key_and_keeps_value(tmp_path):
    saved = AutoTrackable()
    saved.v = Variable([1.0, 2.0])
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.v = Variable([42.0])
    with pytest.raises(ValueError, match="incompatible tensor with shape") as info:
        Checkpoint(root=fresh).read(path)
    assert "v/.ATTRIBUTES/VARIABLE_VALUE" in str(info.value)
    assert "(2,)" in str(info.value) and "(1,)" in str(info.value)
    assert isinstance(info.value, InvalidArgumentError)
    assert info.value.key == "v/.ATTRIBUTES/VARIABLE_VALUE"
    assert fresh.v.numpy().tolist() == [42.0]


def test_b8_dtype_mismatch_is_an_error(tmp_path):
    saved = AutoTrackable()
    saved.v = Variable(np.array([1.5, 2.5], dtype=np.float64))
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    holder = np.array([7, 8], dtype=np.int32)
    fresh = AutoTrackable()
    fresh.v = holder
    with pytest.raises(InvalidArgumentError, match="dtype float64.*int32") as info:
        Checkpoint(root=fresh).read(path)
    assert "v/.ATTRIBUTES/VARIABLE_VALUE" in str(info.value)
    assert holder.tolist() == [7, 8]


def test_b8_read_only_array_is_a_clear_error(tmp_path):
    saved = AutoTrackable()
    saved.v = np.array([1.0, 2.0])
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    frozen = np.zeros(2)
    frozen.setflags(write=False)
    fresh = AutoTrackable()
    fresh.v = frozen
    with pytest.raises(InvalidArgumentError, match="read-only"):
        Checkpoint(root=fresh).read(path)
    assert frozen.tolist() == [0.0, 0.0]


def test_b8_mismatch_on_deferred_attach_keeps_attribute_and_dependency(tmp_path):
    saved = AutoTrackable()
    saved.v = Variable([1.0, 2.0])
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    status = Checkpoint(root=fresh).read(path)
    wrong = Variable([0.0, 0.0, 0.0])
    with pytest.raises(InvalidArgumentError, match="incompatible tensor with shape"):
        fresh.v = wrong
    assert fresh.v is wrong and fresh._lookup_dependency("v") is wrong
    assert wrong.numpy().tolist() == [0.0, 0.0, 0.0]
    status.expect_partial()
