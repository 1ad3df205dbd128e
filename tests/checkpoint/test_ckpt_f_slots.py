"""Scenarios F1–F4: optimizer slot state as a generic slot relation."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest
from ckpt_helpers import NumpyAdam, keys_of

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.management import object_metadata
from trackpoint.saving import CheckpointOptions
from trackpoint.tracking import AutoTrackable, Variable

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


def _trained(tmp_path, *, with_unreachable=False):
    model = AutoTrackable()
    model.w = Variable([1.0, 2.0], dtype=np.float32)
    model.b = np.zeros(2, dtype=np.float32)
    optimizer = NumpyAdam()
    pairs = [(np.ones(2, np.float32), model.w), (np.ones(2, np.float32), model.b)]
    if with_unreachable:
        pairs.append((np.ones(1, np.float32), Variable([5.0], dtype=np.float32)))
    optimizer.apply_gradients(pairs)
    ckpt = Checkpoint(model=model, optimizer=optimizer)
    return model, optimizer, ckpt.save(tmp_path / "ckpt")


def test_f1_slot_keys_and_non_slot_state(tmp_path):
    _, optimizer, path = _trained(tmp_path, with_unreachable=True)
    keys = keys_of(path)
    assert "model/w/.OPTIMIZER_SLOT/optimizer/m" + VV in keys
    assert "model/w/.OPTIMIZER_SLOT/optimizer/v" + VV in keys
    assert "model/b/.OPTIMIZER_SLOT/optimizer/m" + VV in keys
    assert "optimizer/beta1_power" + VV in keys
    slot_keys = [k for k in keys if ".OPTIMIZER_SLOT" in k]
    assert len(slot_keys) == 4  # the unreachable variable's slots are not saved
    graph = object_metadata(path)
    refs = [(n, s.slot_name) for n, node in enumerate(graph.nodes) for s in node.slot_variables]
    assert [name for _, name in refs] == ["m", "m", "v", "v"]  # per slot name, per variable
    slot_ids = [s.slot_variable_node_id for node in graph.nodes for s in node.slot_variables]
    assert slot_ids == list(range(len(graph.nodes) - 4, len(graph.nodes)))  # appended last


def test_f2_immediate_slot_restore_into_existing_optimizer(tmp_path):
    model, optimizer, path = _trained(tmp_path)
    m = optimizer.get_slot(model.w, "m")
    expected = m.numpy()
    m_array = m.array
    m.assign([9.0, 9.0])
    Checkpoint(model=model, optimizer=optimizer).restore(path).assert_consumed()
    np.testing.assert_array_equal(m.numpy(), expected)
    assert m.array is m_array


@pytest.mark.parametrize("order", ["optimizer-first", "variables-first"])
def test_f2_deferred_slots_appear_when_both_exist(tmp_path, order):
    model, optimizer, path = _trained(tmp_path)
    expected_m = optimizer.get_slot(model.w, "m").numpy()
    expected_b_v = optimizer.get_slot(model.b, "v").numpy()

    ckpt = Checkpoint()
    status = ckpt.restore(path)
    new_model = AutoTrackable()
    new_optimizer = NumpyAdam()
    if order == "optimizer-first":
        ckpt.optimizer = new_optimizer
        ckpt.model = new_model
        new_model.w = Variable([0.0, 0.0], dtype=np.float32)
        new_model.b = np.zeros(2, np.float32)
    else:
        new_model.w = Variable([0.0, 0.0], dtype=np.float32)
        new_model.b = np.zeros(2, np.float32)
        ckpt.model = new_model
        ckpt.optimizer = new_optimizer
    np.testing.assert_array_equal(new_optimizer.get_slot(new_model.w, "m").numpy(), expected_m)
    np.testing.assert_array_equal(new_optimizer.get_slot(new_model.b, "v").numpy(), expected_b_v)
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match=r"Unresolved object.*beta1_power"):
        status.assert_consumed()
    new_optimizer._ensure_non_slot()  # non-slot state created: restored on creation
    assert new_optimizer.beta1_power.numpy() == pytest.approx(0.81)
    status.assert_consumed()


def test_f2_later_no_slot_restore_overrides_variable_not_slot(tmp_path):
    root = Checkpoint()
    root.var = root._add_variable("var", 0.0)
    optimizer = NumpyAdam()
    optimizer.apply_gradients([(np.float64(1.0), root.var)])
    root.var.assign(12.0)
    no_slots_path = root.save(tmp_path / "no_slots")
    root.optimizer = optimizer
    root.var.assign(13.0)
    optimizer.get_slot(root.var, "m").assign(14.0)
    slots_path = root.save(tmp_path / "with_slots")

    new_root = Checkpoint()
    slot_status = new_root.restore(slots_path)
    no_slot_status = new_root.restore(no_slots_path)
    with pytest.raises(AssertionError):
        no_slot_status.assert_consumed()
    new_root.var = new_root._add_variable("var", 0.0)
    no_slot_status.assert_consumed()
    assert new_root.var.numpy() == 12.0
    new_root.optimizer = NumpyAdam()
    slot_status.assert_existing_objects_matched()
    assert new_root.var.numpy() == 12.0
    assert new_root.optimizer.get_slot(new_root.var, "m").numpy() == 14.0
    slot_status.expect_partial()


def test_f2_slot_created_later_by_the_optimizer(tmp_path):
    """A slot the optimizer can only make itself is restored when add_slot creates it."""
    model, optimizer, path = _trained(tmp_path)
    expected = optimizer.get_slot(model.w, "m").numpy()

    class Lazy(NumpyAdam):
        def _plan_slot_variable(self, position, variable, slot_name):
            return None  # the engine then keeps the position for add_slot

    new_model = AutoTrackable()
    new_model.w = Variable([0.0, 0.0], dtype=np.float32)
    new_model.b = np.zeros(2, np.float32)
    lazy = Lazy()
    status = Checkpoint(model=new_model, optimizer=lazy).restore(path)
    assert lazy.get_slot(new_model.w, "m") is None
    lazy.apply_gradients([(np.zeros(2, np.float32), new_model.w),
                          (np.zeros(2, np.float32), new_model.b)])
    # apply_gradients used the restored state: m decays from the saved value
    np.testing.assert_allclose(lazy.get_slot(new_model.w, "m").numpy(), 0.9 * expected)
    status.assert_consumed()


def test_f3_skip_slot_variables_on_restore(tmp_path):
    model, optimizer, path = _trained(tmp_path)
    saved_w = model.w.numpy()
    m = optimizer.get_slot(model.w, "m")
    m.assign([7.0, 7.0])
    model.w.assign([0.0, 0.0])
    options = CheckpointOptions(skip_slot_variables=True)
    Checkpoint(model=model, optimizer=optimizer).restore(path, options).assert_consumed()
    np.testing.assert_array_equal(m.numpy(), [7.0, 7.0])
    np.testing.assert_array_equal(model.w.numpy(), saved_w)
    Checkpoint(model=model, optimizer=optimizer).restore(path).assert_consumed()
    assert m.numpy().tolist() != [7.0, 7.0]


def test_f4_missing_slot_is_described_in_warning(tmp_path, caplog):
    _, _, path = _trained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trackpoint"):
        model = AutoTrackable()
        model.w = Variable([0.0, 0.0], dtype=np.float32)
        model.b = np.zeros(2, np.float32)
        status = Checkpoint(model=model).restore(path)
        del status, model
        gc.collect()
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert "(root).optimizer's state 'm' for (root).model.w" in message
