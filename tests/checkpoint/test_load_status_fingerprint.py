"""Scenarios C1/C2 when the status answers from the structure the read met (a fingerprint).

A status whose read recorded the program's structure answers ``assert_consumed`` and
``assert_existing_objects_matched`` without walking the program while the structure is
unchanged; it must still fail wherever a walk would: a child attached since the read, and an
optimizer's slot the checkpoint lacks (optimizer state is no structure: a fingerprint never
covers it).
"""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_helpers import NumpyAdam

import trackpoint.checkpoint.load_status as load_status
from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.checkpoint.load_status import CheckpointLoadStatus
from trackpoint.graph.structure import StructureFingerprint
from trackpoint.graph.walk import walk_graph
from trackpoint.tracking import AutoTrackable, Variable


def _no_walk(*args, **kwargs):
    raise AssertionError("the status walked the program")


def _model() -> AutoTrackable:
    root = AutoTrackable()
    root.layers = [Variable(np.full(3, float(i), np.float32)) for i in range(20)]
    root.bias = Variable(np.float32(1.0))
    return root


def test_c1_unchanged_structure_answers_without_walking(tmp_path, monkeypatch):
    path = Checkpoint(model=_model()).write(tmp_path / "ckpt")
    status = Checkpoint(model=_model()).read(path)
    assert status._fingerprint is not None  # the read recorded the structure it met
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    assert status.assert_consumed() is status
    assert status.assert_existing_objects_matched().assert_nontrivial_match() is status


def test_c1_child_attached_after_the_read_is_not_bound(tmp_path, monkeypatch):
    path = Checkpoint(model=_model()).write(tmp_path / "ckpt")
    model = _model()
    status = Checkpoint(model=model).read(path)
    status.assert_consumed()
    model.extra = Variable(np.float32(5.0))  # the structure changed: the status walks again
    with pytest.raises(AssertionError, match=r"not bound to checkpointed values.*\.extra"):
        status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="not bound"):
        status.assert_consumed()
    del model.extra
    status.assert_consumed()


def _trained(v1: float, v2: float, slots_for_v2: bool) -> tuple[AutoTrackable, NumpyAdam]:
    root = AutoTrackable()
    root.v1 = Variable(np.full(2, v1, np.float32))
    root.v2 = Variable(np.full(2, v2, np.float32))
    optimizer = NumpyAdam()
    variables = [root.v1, root.v2] if slots_for_v2 else [root.v1]
    optimizer.apply_gradients((np.ones(2, np.float32), v) for v in variables)
    root.optimizer = optimizer
    return root, optimizer


def _status_with_snapshot(status: CheckpointLoadStatus) -> CheckpointLoadStatus:
    """``status`` as a read that recorded the structure it met (optimizer included) gives it."""
    view = status._view
    walk = walk_graph(view, skip_slot_variables=True)
    fingerprint = StructureFingerprint.capture(view, walk.objects, walk.children)
    assert fingerprint is not None and fingerprint.unchanged() is not None
    return CheckpointLoadStatus(
        status._coordinator, view, status._options, fingerprint=fingerprint
    )


def test_c2_fingerprint_with_optimizer_passes_when_every_slot_is_in_the_checkpoint(
    tmp_path, monkeypatch
):
    saved, _ = _trained(1.0, 2.0, slots_for_v2=True)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live, _ = _trained(0.0, 0.0, slots_for_v2=True)
    status = _status_with_snapshot(Checkpoint(root=live).read(path))
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    status.assert_consumed()
    status.assert_existing_objects_matched()


def test_c2_fingerprint_with_optimizer_reports_a_slot_the_checkpoint_lacks(tmp_path, monkeypatch):
    saved, _ = _trained(1.0, 2.0, slots_for_v2=False)  # no slots for v2 in the checkpoint
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live, optimizer = _trained(0.0, 0.0, slots_for_v2=True)  # the program has them
    status = _status_with_snapshot(Checkpoint(root=live).read(path))
    monkeypatch.setattr(load_status, "list_objects", _no_walk)  # the fingerprint holds: no walk
    with pytest.raises(AssertionError, match=r"Found 2 Python objects that were not bound"):
        status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="not bound"):
        status.assert_consumed()
    # The walk's answer is the same.
    monkeypatch.undo()
    walked = Checkpoint(root=live).read(path)
    assert walked._fingerprint is None  # a read with an optimizer records no structure (yet)
    with pytest.raises(AssertionError, match=r"Found 2 Python objects that were not bound"):
        walked.assert_existing_objects_matched()
    walked.expect_partial()
    status.expect_partial()
    assert optimizer.get_slot(live.v2, "m") is not None


def test_c2_skip_slot_variables_ignores_the_slots_with_a_snapshot(tmp_path, monkeypatch):
    from trackpoint.saving import CheckpointOptions

    saved, _ = _trained(1.0, 2.0, slots_for_v2=False)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live, _ = _trained(0.0, 0.0, slots_for_v2=True)
    options = CheckpointOptions(skip_slot_variables=True)
    status = _status_with_snapshot(Checkpoint(root=live).read(path, options))
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    status.assert_existing_objects_matched()
    status.expect_partial()


# -- no record: the structure the read's bindings form ---------------------------------------


def test_c2_optimizer_read_answers_from_its_bindings_without_walking(tmp_path, monkeypatch):
    saved, _ = _trained(1.0, 2.0, slots_for_v2=True)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live, _ = _trained(0.0, 0.0, slots_for_v2=True)
    status = Checkpoint(root=live).read(path)
    assert status._fingerprint is None  # slot variables: the read keeps no record
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    assert status.assert_consumed() is status
    status.assert_existing_objects_matched().assert_nontrivial_match()


def test_c2_bindings_report_a_slot_the_checkpoint_lacks_without_walking(tmp_path, monkeypatch):
    saved, _ = _trained(1.0, 2.0, slots_for_v2=False)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live, _ = _trained(0.0, 0.0, slots_for_v2=True)
    status = Checkpoint(root=live).read(path).expect_partial()
    monkeypatch.setattr(load_status, "list_objects", _no_walk)
    with pytest.raises(AssertionError, match=r"Found 2 Python objects that were not bound"):
        status.assert_existing_objects_matched()


def test_c1_bindings_see_a_child_attached_after_the_read(tmp_path):
    saved, _ = _trained(1.0, 2.0, slots_for_v2=True)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live, _ = _trained(0.0, 0.0, slots_for_v2=True)
    status = Checkpoint(root=live).read(path)
    status.assert_consumed()
    live.extra = Variable(np.float32(3.0))
    with pytest.raises(AssertionError, match=r"not bound to checkpointed values.*\.extra"):
        status.assert_consumed()
    live.v1 = Variable(np.zeros(2, np.float32))  # replaced: the bound v1 is no longer reached
    del live.extra
    with pytest.raises(AssertionError, match=r"not bound to checkpointed values.*\.v1"):
        status.assert_consumed()
    status.expect_partial()


def test_c1_bindings_of_an_object_the_checkpoint_shares_but_the_program_does_not(tmp_path):
    shared = Variable(np.float32(1.0))
    saved = AutoTrackable()
    saved.a, saved.b = AutoTrackable(), AutoTrackable()
    saved.a.v = saved.b.v = shared
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    live = AutoTrackable()
    live.a, live.b = AutoTrackable(), AutoTrackable()
    live.a.v, live.b.v = Variable(np.float32(0.0)), Variable(np.float32(0.0))
    status = Checkpoint(root=live).read(path).expect_partial()
    with pytest.raises(AssertionError, match="not bound"):
        status.assert_existing_objects_matched()
