"""Trackable, AutoTrackable and the deferred-restoration hook, without any files."""

from __future__ import annotations

import numpy as np
import pytest

from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.tracking import AutoTrackable, NoDependency, Trackable, Variable, has_values
from trackpoint.tracking.adapters import to_trackable


class FakePosition:
    """Stands in for the restore coordinator's CheckpointPosition."""

    def __init__(self, uid: int, log: list, spec=None) -> None:
        self.restore_uid = uid
        self.log = log
        self.spec = spec

    def restore(self, trackable):
        self.log.append((self.restore_uid, trackable))

    def value_spec(self):
        return self.spec


def test_track_trackable_rules():
    parent = Trackable()
    child = Variable(1.0)
    assert parent._track_trackable(child, "c") is child
    parent._track_trackable(child, "c")  # same object again: fine
    with pytest.raises(InvalidArgumentError, match="Names must be unique"):
        parent._track_trackable(Variable(2.0), "c")
    with pytest.raises(InvalidArgumentError, match="only track Trackable"):
        parent._track_trackable(np.zeros(2), "array")
    with pytest.raises(InvalidArgumentError, match="must be a str"):
        parent._track_trackable(Variable(2.0), 3)
    assert list(parent._trackable_children()) == ["c"]


def test_deferred_dependencies_newest_first_and_popped():
    log: list = []
    parent = Trackable()
    parent._deferred_dependencies["v"] = [FakePosition(1, log), FakePosition(3, log),
                                          FakePosition(2, log)]
    child = Variable(0.0)
    parent._track_trackable(child, "v")
    assert [uid for uid, _ in log] == [3, 2, 1]
    assert all(obj is child for _, obj in log)
    assert "v" not in parent._deferred_dependencies
    parent._track_trackable(Variable(5.0), "v", overwrite=True)
    assert len(log) == 3  # nothing left to apply


def test_add_variable_uses_saved_spec_for_restore_on_create():
    log: list = []
    parent = Trackable()
    parent._deferred_dependencies["w"] = [FakePosition(1, log, spec=((3,), np.dtype(np.int16)))]
    w = parent._add_variable("w", initial_value=np.ones(7))
    assert w.shape == (3,) and w.dtype == np.int16
    assert log == [(1, w)]
    plain = parent._add_variable("plain", shape=(2,))
    assert plain.dtype == np.float32 and plain.numpy().tolist() == [0.0, 0.0]


def test_add_variable_whose_waiting_restore_fails_is_not_left_declared():
    """A damaged saved value fails the restore on creation; the name must stay free, else the
    object could never create that variable again ("already declared")."""

    class Failing(FakePosition):
        def restore(self, trackable):
            raise DataLossError("damaged value")

    parent = Trackable()
    parent._deferred_dependencies["w"] = [Failing(1, [], spec=((2,), np.dtype(np.float32)))]
    with pytest.raises(DataLossError):
        parent._add_variable("w")
    assert "w" not in parent._trackable_children()
    with pytest.raises(DataLossError):  # tried again, not refused as "already declared"
        parent._add_variable("w")
    parent._deferred_dependencies.clear()
    w = parent._add_variable("w", shape=(2,))
    assert parent._trackable_children()["w"] is w


def test_has_values():
    assert has_values(Variable(1.0))
    assert not has_values(Trackable())
    assert not has_values(AutoTrackable())


def test_autotrackable_tracks_assignments():
    obj = AutoTrackable()
    obj.v = Variable(1.0)
    obj.array = np.zeros(2)
    obj.number = 3
    obj.skipped = NoDependency(Variable(2.0))
    children = obj._trackable_children()
    assert list(children) == ["v", "array"]
    assert isinstance(obj.array, np.ndarray)  # the attribute keeps the array itself
    assert children["array"] is to_trackable(obj.array)
    assert isinstance(obj.skipped, Variable)


def test_autotrackable_reassign_and_delete_drop_dependency():
    obj = AutoTrackable()
    obj.v = Variable(1.0)
    obj.v = None
    assert "v" not in obj._trackable_children()
    obj.w = Variable(1.0)
    del obj.w
    assert obj._trackable_children() == {}
    replacement = Variable(3.0)
    obj.x = Variable(2.0)
    obj.x = replacement
    assert obj._trackable_children() == {"x": replacement}


def test_explicit_dependency_survives_attribute_reassignment():
    obj = AutoTrackable()
    explicit = obj._track_trackable(Variable(1.0), "slot")
    obj.slot = 5  # the dependency was not made from this attribute
    assert obj._lookup_dependency("slot") is explicit
