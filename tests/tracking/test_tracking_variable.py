"""Variable, the numpy adapter and the adapter registry."""

from __future__ import annotations

import numpy as np
import pytest

from trackpoint.errors import InvalidArgumentError
from trackpoint.tracking import AutoTrackable, Trackable, Variable, register_adapter
from trackpoint.tracking.adapters import is_adaptable, to_trackable


def test_variable_basics():
    v = Variable([1, 2], dtype=np.float32, name="w")
    assert v.shape == (2,) and v.dtype == np.float32 and v.name == "w"
    assert "CPU" in v.device
    copy = v.numpy()
    copy[0] = 100
    assert v.numpy()[0] == 1  # numpy() is a copy
    live = v.array
    assert v.assign([3, 4]) is v and live.tolist() == [3.0, 4.0]
    with pytest.raises(InvalidArgumentError, match="shape"):
        v.assign([1, 2, 3])
    assert np.asarray(v) is live
    assert Variable(lambda: np.int8(5)).dtype == np.int8
    with pytest.raises(InvalidArgumentError, match="dtype object"):
        Variable([object()])


def test_variable_restore_in_place_and_mismatch():
    v = Variable(np.zeros((2, 2), dtype=np.float64))
    live = v.array
    v._restore_from_tensors({"VARIABLE_VALUE": np.ones((2, 2))})
    assert v.array is live and live.sum() == 4
    with pytest.raises(InvalidArgumentError, match=r"incompatible tensor with shape \(3,\)"):
        v._restore_from_tensors({"VARIABLE_VALUE": np.ones(3)})
    with pytest.raises(InvalidArgumentError, match="dtype int64"):
        v._restore_from_tensors({"VARIABLE_VALUE": np.ones((2, 2), dtype=np.int64)})
    assert live.sum() == 4


def test_wrap_shares_memory_and_adapter_is_cached():
    array = np.zeros(3)
    adapter = to_trackable(array)
    assert isinstance(adapter, Variable) and adapter.array is array
    assert to_trackable(array) is adapter  # one node per object
    adapter._restore_from_tensors({"VARIABLE_VALUE": np.arange(3.0)})
    assert array.tolist() == [0.0, 1.0, 2.0]
    assert to_trackable(np.zeros(3)) is not adapter
    with pytest.raises(InvalidArgumentError, match="dtype object"):
        to_trackable(np.array([object()]))


def test_register_adapter_for_custom_type():
    class Box:
        def __init__(self):
            self.value = np.zeros(2)

    class BoxAdapter(Trackable):
        def __init__(self, box):
            self.box = box

        def _serialize_to_tensors(self):
            return {"value": self.box.value}

        def _restore_from_tensors(self, restored_tensors):
            self.box.value[...] = restored_tensors["value"]

    class SubBox(Box):
        pass

    assert not is_adaptable(Box())
    register_adapter(Box, BoxAdapter)
    box = SubBox()
    assert is_adaptable(box)
    holder = AutoTrackable()
    holder.box = box
    assert holder.box is box
    assert isinstance(holder._trackable_children()["box"], BoxAdapter)
    with pytest.raises(InvalidArgumentError, match="needs a class"):
        register_adapter("Box", BoxAdapter)
    with pytest.raises(InvalidArgumentError, match="not callable"):
        register_adapter(Box, None)


def test_lazy_integration_is_imported_on_first_use(tmp_path, monkeypatch):
    import sys
    import types

    from trackpoint.tracking import adapters

    framework = types.ModuleType("fakefw.core")
    exec("class Thing:\n    pass", framework.__dict__)
    framework.Thing.__module__ = "fakefw.core"
    integration = tmp_path / "fakefw_integration.py"
    integration.write_text(
        "from trackpoint.tracking import register_adapter, Variable\n"
        "import numpy as np\n"
        "import sys\n"
        "register_adapter(sys.modules['fakefw.core'].Thing, lambda t: Variable(np.zeros(1)))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "fakefw.core", framework)
    monkeypatch.setitem(adapters._lazy_integrations, "fakefw", "fakefw_integration")
    adapters.register_lazy_integration("fakefw", "fakefw_integration")

    class UserThing(framework.Thing):  # a user subclass: found through the MRO
        pass

    assert "fakefw_integration" not in sys.modules
    assert isinstance(to_trackable(UserThing()), Variable)
    assert "fakefw_integration" in sys.modules
    with pytest.raises(InvalidArgumentError):
        adapters.register_lazy_integration("", "x")
