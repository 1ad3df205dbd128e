"""Scenarios A1–A7 (format, naming, round trip) and unicode names (semantics §5.1)."""

from __future__ import annotations

import numpy as np
import pytest
from ckpt_helpers import keys_of, value_of

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph import list_objects
from trackpoint.management import object_metadata
from trackpoint.tracking import AutoTrackable, NoDependency, NotTrackable, Trackable, Variable

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _tree(seed: float) -> tuple[AutoTrackable, dict[str, np.ndarray]]:
    root = AutoTrackable()
    root.child = AutoTrackable()
    root.child.w = Variable(np.full((2, 3), seed, dtype=np.float32))
    root.child.step = Variable(np.int64(seed))
    root.child.flag = Variable(np.array(True))
    root.child.empty = Variable(np.zeros((0, 4), dtype=np.float64))
    root.child.half = np.full(3, seed, dtype=np.float16)
    root.items = [Variable(np.int32(seed)), np.arange(4, dtype=np.uint8) + int(seed)]
    root.table = {"a": Variable(np.complex64(seed + 1j)), "b": np.zeros((2, 0), dtype=np.int16)}
    values = {
        "child/w": root.child.w.array,
        "child/step": root.child.step.array,
        "child/flag": root.child.flag.array,
        "child/empty": root.child.empty.array,
        "child/half": root.child.half,
        "items/0": root.items[0].array,
        "items/1": root.items[1],
        "table/a": root.table["a"].array,
        "table/b": root.table["b"],
    }
    return root, values


def test_a1_nested_tree_round_trips_values_dtypes_shapes(tmp_path):
    saved_root, saved = _tree(3.0)
    saved_copy = {k: v.copy() for k, v in saved.items()}
    path = Checkpoint(model=saved_root).save(tmp_path / "ckpt")

    fresh_root, fresh = _tree(0.0)
    Checkpoint(model=fresh_root).restore(path).assert_consumed()
    for name, expected in saved_copy.items():
        got = fresh[name]
        assert got.dtype == expected.dtype, name
        assert got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_a2_keys_are_paths_plus_attributes_sorted(tmp_path):
    root, values = _tree(1.0)
    path = Checkpoint(model=root).save(tmp_path / "ckpt")
    keys = keys_of(path)
    expected = sorted(
        [f"model/{name}/.ATTRIBUTES/VARIABLE_VALUE" for name in values]
        + [GRAPH_KEY, "save_counter/.ATTRIBUTES/VARIABLE_VALUE"],
        key=lambda k: k.encode(),
    )
    assert keys == expected


def test_a2_write_has_no_save_counter_key(tmp_path):
    root, _ = _tree(1.0)
    path = Checkpoint(model=root).write(tmp_path / "ckpt")
    assert "save_counter/.ATTRIBUTES/VARIABLE_VALUE" not in keys_of(path)


def test_a2_root_attributes_have_empty_path(tmp_path):
    class Holder(Trackable):
        def _serialize_to_tensors(self):
            return {"v1": np.float32(1.0)}

    path = Checkpoint(Holder()).write(tmp_path / "ckpt")
    assert "/.ATTRIBUTES/v1" in keys_of(path)


def test_a3_local_names_are_escaped(tmp_path):
    root = AutoTrackable()
    root._track_trackable(Variable(1.0), "a/b.c")
    root._track_trackable(Variable(2.0), ".ATTRIBUTES")
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    keys = keys_of(path)
    assert "a.Sb..c/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "..ATTRIBUTES/.ATTRIBUTES/VARIABLE_VALUE" in keys
    # edge names in the graph stay unescaped, and the values restore
    names = {c.local_name for c in object_metadata(path).nodes[0].children}
    assert {"a/b.c", ".ATTRIBUTES"} <= names
    fresh = AutoTrackable()
    a = fresh._track_trackable(Variable(0.0), "a/b.c")
    b = fresh._track_trackable(Variable(0.0), ".ATTRIBUTES")
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert a.numpy() == 1.0 and b.numpy() == 2.0


def test_a4_duplicate_local_name_needs_overwrite():
    obj = Trackable()
    obj._track_trackable(Variable(1.0), "v")
    with pytest.raises(InvalidArgumentError, match="already declared"):
        obj._track_trackable(Variable(2.0), "v")
    replacement = Variable(3.0)
    obj._track_trackable(replacement, "v", overwrite=True)
    assert obj._lookup_dependency("v") is replacement
    assert [ref.name for ref in obj._checkpoint_dependencies] == ["v"]


def test_a4_same_leaf_name_on_two_objects_is_fine(tmp_path):
    root = AutoTrackable()
    root.a = AutoTrackable()
    root.b = AutoTrackable()
    root.a.v = Variable(1.0)
    root.b.v = Variable(2.0)
    keys = keys_of(Checkpoint(root=root).write(tmp_path / "ckpt"))
    assert {"a/v/.ATTRIBUTES/VARIABLE_VALUE", "b/v/.ATTRIBUTES/VARIABLE_VALUE"} <= set(keys)


def test_a4_checkpoint_kwarg_colliding_with_root_child():
    root = AutoTrackable()
    root.v = Variable(1.0)
    with pytest.raises(ValueError, match="root.v already exists"):
        Checkpoint(root, v=Variable(2.0))
    Checkpoint(root, v=root.v)  # the same object is fine


class _TwoValues(Trackable):
    """Custom serialize/restore hooks (semantics A5)."""

    def __init__(self, a: float, b: float) -> None:
        self.a = np.array([a], dtype=np.float32)
        self.b = np.array(b, dtype=np.int64)
        self.restored_with: list[set[str]] = []

    def _serialize_to_tensors(self):
        return {"first": self.a, "second": self.b}

    def _restore_from_tensors(self, restored_tensors):
        self.restored_with.append(set(restored_tensors))
        self.a[...] = restored_tensors["first"]
        self.b[...] = restored_tensors["second"]


def test_a5_custom_hooks_keys_and_names(tmp_path):
    root = _TwoValues(1.0, 2)
    root.child = root._track_trackable(_TwoValues(3.0, 4), "child")
    path = Checkpoint(root).write(tmp_path / "ckpt")
    keys = keys_of(path)
    for key in ("/.ATTRIBUTES/first", "/.ATTRIBUTES/second", "child/.ATTRIBUTES/first",
                "child/.ATTRIBUTES/second"):
        assert key in keys
    fresh = _TwoValues(0.0, 0)
    fresh_child = fresh._track_trackable(_TwoValues(0.0, 0), "child")
    Checkpoint(fresh).read(path).assert_consumed()
    assert fresh.restored_with == [{"first", "second"}]
    assert fresh_child.a[0] == 3.0 and fresh_child.b == 4


def test_a5_missing_value_name_is_an_error(tmp_path):
    class OneValue(Trackable):
        def _serialize_to_tensors(self):
            return {"first": np.zeros(1, np.float32)}

        def _restore_from_tensors(self, restored_tensors):
            self.restored = dict(restored_tensors)

    class ThreeValues(_TwoValues):
        def _serialize_to_tensors(self):
            return {**super()._serialize_to_tensors(), "third": np.zeros(1)}

    path = Checkpoint(OneValue()).write(tmp_path / "one")
    with pytest.raises(InvalidArgumentError, match="Could not restore object"):
        Checkpoint(ThreeValues(0, 0)).read(path)
    # an extra name in the checkpoint is an unused attribute, not an error
    path2 = Checkpoint(_TwoValues(5.0, 6)).write(tmp_path / "two")
    status = Checkpoint(OneValue()).read(path2)
    with pytest.raises(AssertionError, match="Unused attributes"):
        status.assert_consumed()


def test_a5_one_saved_value_restored_into_two_holders(tmp_path):
    class Mirror(Trackable):
        def __init__(self):
            self.x = np.zeros(2)
            self.y = np.zeros(2)

        def _serialize_to_tensors(self):
            return {"value": self.x}

        def _restore_from_tensors(self, restored_tensors):
            self.x[...] = restored_tensors["value"]
            self.y[...] = restored_tensors["value"]

    saved = Mirror()
    saved.x[:] = [1, 2]
    path = Checkpoint(m=saved).write(tmp_path / "ckpt")
    fresh = Mirror()
    Checkpoint(m=fresh).read(path).assert_consumed()
    np.testing.assert_array_equal(fresh.x, [1, 2])
    np.testing.assert_array_equal(fresh.y, [1, 2])


def test_a6_object_metadata_and_list_objects(tmp_path):
    root = AutoTrackable()
    root.layer = AutoTrackable()
    root.layer.kernel = Variable(np.ones((2, 2)))
    objects = list_objects(root)
    assert objects[0] is root and objects[1] is root.layer and objects[2] is root.layer.kernel
    path = Checkpoint(model=root).save(tmp_path / "ckpt")
    graph = object_metadata(path)
    assert [c.local_name for c in graph.nodes[0].children] == ["model", "save_counter"]
    node = graph.nodes[0]
    for name in ("model", "layer", "kernel"):
        node = graph.nodes[next(c.node_id for c in node.children if c.local_name == name)]
    kernel = node
    assert kernel.attributes[0].checkpoint_key == "model/layer/kernel/.ATTRIBUTES/VARIABLE_VALUE"
    assert object_metadata(tmp_path / "ckpt-1").nodes == graph.nodes  # pathlib accepted
    with pytest.raises(FileNotFoundError):
        object_metadata(tmp_path / "missing")


def test_a7_not_trackable_in_graph_fails_save(tmp_path):
    class Socketish(NotTrackable):
        pass

    root = AutoTrackable()
    root.inner = AutoTrackable()
    root.inner.conn = Socketish()
    with pytest.raises(NotImplementedError, match=r"\(root\)\.inner\.conn"):
        Checkpoint(root=root).write(tmp_path / "ckpt")
    root.inner.conn = NoDependency(Socketish())
    Checkpoint(root=root).write(tmp_path / "ckpt")


def test_a7_aliases_save_and_restore(tmp_path):
    shared = Variable([1.0, 2.0])
    array = np.array([3.0])
    root = AutoTrackable()
    root.a = shared
    root.b = shared
    root.items = [shared, array]
    root.also = array
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    assert len(list_objects(root)) == 4  # root, shared, the list, the array
    shared.assign([0.0, 0.0])
    array[:] = 0
    Checkpoint(root=root).read(path).assert_consumed()
    np.testing.assert_array_equal(shared.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(array, [3.0])


@pytest.mark.parametrize("name", ["über/ключ", "emoji😀.v", "日本語"])
def test_unicode_local_names_round_trip(tmp_path, name):
    root = AutoTrackable()
    root._track_trackable(Variable([1.5]), name)
    root.table = {name: np.array([7], dtype=np.int32)}
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    keys = keys_of(path)
    escaped = name.replace(".", "..").replace("/", ".S")
    assert f"{escaped}/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert f"table/{escaped}/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert all(isinstance(k, str) for k in keys)
    assert keys == sorted(keys, key=lambda k: k.encode("utf-8"))
    fresh = AutoTrackable()
    v = fresh._track_trackable(Variable([0.0]), name)
    fresh.table = {name: np.zeros(1, dtype=np.int32)}
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert v.numpy()[0] == 1.5 and fresh.table[name][0] == 7
    assert value_of(path, f"{escaped}/.ATTRIBUTES/VARIABLE_VALUE")[0] == 1.5


def test_numpy_arrays_dicts_and_lists_as_checkpoint_arguments(tmp_path):
    weights = np.arange(3.0)
    table = {"bias": np.ones(2, np.float32)}
    history = [np.zeros(1, np.int64)]
    ckpt = Checkpoint(weights=weights, table=table, history=history)
    assert ckpt.weights is weights and ckpt.table["bias"] is table["bias"]
    path = ckpt.save(tmp_path / "ckpt")
    assert {"weights" + "/.ATTRIBUTES/VARIABLE_VALUE", "table/bias/.ATTRIBUTES/VARIABLE_VALUE",
            "history/0/.ATTRIBUTES/VARIABLE_VALUE"} <= set(keys_of(path))
    bias = table["bias"]
    weights[:] = -1
    bias[:] = -1
    ckpt.restore(path).assert_consumed()
    assert weights.tolist() == [0.0, 1.0, 2.0] and bias.tolist() == [1.0, 1.0]
    assert ckpt.weights is weights and ckpt.table["bias"] is bias
