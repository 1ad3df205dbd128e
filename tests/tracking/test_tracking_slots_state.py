"""SlotOwner and PythonState building blocks."""

from __future__ import annotations

import numpy as np
import pytest

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import AutoTrackable, PythonState, SlotOwner, Variable
from trackpoint.tracking.python_state import bytes_of, string_scalar


class Optimizer(SlotOwner, AutoTrackable):
    pass


def test_add_and_get_slots():
    opt = Optimizer()
    v = Variable(np.ones((2, 3), dtype=np.float32))
    m = opt.add_slot(v, "m")
    assert m.shape == (2, 3) and m.dtype == np.float32 and m.numpy().sum() == 0
    assert opt.add_slot(v, "m") is m and opt.get_slot(v, "m") is m
    array = np.zeros(4)
    a = opt.add_slot(array, "velocity", initial_value=np.full(4, 2.0))
    assert opt.get_slot(array, "velocity") is a and a.numpy().tolist() == [2.0] * 4
    assert opt.get_slot_names() == ["m", "velocity"]
    assert opt.get_slot(Variable(1.0), "m") is None
    with pytest.raises(InvalidArgumentError, match="per trackable variable"):
        opt.add_slot(5, "m")


def test_deferred_slot_positions_restore_on_add():
    log = []

    class Position:
        restore_uid = 4

        def restore(self, trackable):
            log.append(trackable)

        def value_spec(self):
            return None

    opt = Optimizer()
    v = Variable([1.0, 2.0])
    position = Position()
    assert opt._plan_slot_variable(position, v, "m") is None  # no value to create it from
    opt._defer_slot_variable(position, v, "m")
    m = opt.add_slot(v, "m")
    assert log == [m]


def test_python_state_bytes():
    class Blob(PythonState):
        def __init__(self):
            self.data = b"\x00abc"

        def serialize(self):
            return self.data

        def deserialize(self, data):
            self.data = data

    blob = Blob()
    value = blob._serialize_to_tensors()["py_state"]()
    assert value.shape == () and bytes_of(value) == b"\x00abc"
    blob._restore_from_tensors({"py_state": string_scalar(b"xyz")})
    assert blob.data == b"xyz"
    assert bytes_of(np.bytes_(b"q")) == b"q"
    with pytest.raises(InvalidArgumentError):
        bytes_of(np.zeros(2))
