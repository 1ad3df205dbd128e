"""The one-pass paths for large containers (issue 19) give exactly what the per-value paths
give: tracking a dict, walking many children, serializing many plain variables."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.graph import ObjectGraphView, graph_bytes, serialize_graph
from trackpoint.graph import serialize as serialize_module
from trackpoint.graph import walk as walk_module
from trackpoint.tracking import AutoTrackable, Variable, adapters
from trackpoint.tracking.mappings import DictWrapper

STRING_DTYPE = getattr(np.dtypes, "StringDType", None)


def _mixed_root() -> AutoTrackable:
    """Many children of every kind the bulk paths must get right."""
    shared = np.arange(3.0)
    state: dict[str, Any] = {
        f"layer{i}/w.{i}": np.full(2 + i % 3, float(i), dtype=np.float32) for i in range(40)
    }
    state["alias/a"] = shared
    state["alias/b"] = shared  # one node, two names
    state["ünï/cöde"] = np.ones(2)
    state["nul\x00name"] = np.zeros(1)  # holds the separator the bulk paths join with
    state["long" * 40] = np.zeros(2)  # a key past one varint byte
    state["named"] = Variable([1.0], name="weights/" * 30)  # long full name
    state["unnamed"] = Variable([2.0], name="")
    state["empty"] = AutoTrackable()  # has_checkpoint_values false
    state["plain"] = 3  # a plain value: the dict's JSON
    if STRING_DTYPE is not None:
        state["text"] = np.array(["a", "bc"], dtype=STRING_DTYPE())
    root = AutoTrackable()
    root.state = state
    root.more = [np.full(1, float(i)) for i in range(20)]
    root.more.append(root)  # a child that is the root: node id 0
    return root


def _value_label(value: Any) -> Any:
    """What identifies a saved value: the array itself, or the content of one made anew."""
    if callable(value):
        return "callable"
    if isinstance(value, dict) or value.dtype == object:  # the graph; StringDType as objects
        return repr(value)
    return id(value)


def _serialized(root: AutoTrackable) -> Any:
    graph = serialize_graph(ObjectGraphView(root))
    keys = [
        (id(obj), {key: _value_label(value) for key, value in values.items()})
        for obj, values in graph.tensors.items()
    ]  # fmt: skip
    return graph.object_graph_bytes, keys, [id(obj) for obj in graph.objects]


def _one_by_one(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Encode alike leaves and many children one node, one child at a time (graph_bytes's
    per-item functions); returns the number of leaves the bulk encoder was asked for."""
    asked: list[int] = []

    def each_leaf(escaped: Any, keys: Any, full_names: Any) -> list[bytes]:
        asked.append(len(keys[0]))
        fields = [graph_bytes.name_field(name) for name in escaped]
        names = full_names or [""] * len(keys[0])
        return [
            graph_bytes.node(b"".join(graph_bytes.attribute(f, full, k[i])
                                      for f, k in zip(fields, keys)), True)
            for i, full in enumerate(names)
        ]  # fmt: skip

    monkeypatch.setattr(serialize_module, "encode_alike_leaves", each_leaf)
    monkeypatch.setattr(serialize_module, "child_refs", lambda ids, names: b"".join(
        map(graph_bytes._child_ref, ids, names)))  # fmt: skip
    return asked


def test_bulk_serialization_equals_the_per_node_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    root = _mixed_root()
    fast = _serialized(root)
    asked = _one_by_one(monkeypatch)
    slow = _serialized(root)
    assert sum(asked) > 40  # the variables went through the alike-leaf encoder
    assert fast == slow
    data = fast[0]
    assert TrackableObjectGraph.FromString(data).SerializeToString() == data


def _reference_walk(view: ObjectGraphView) -> tuple[list[int], dict[int, Any], dict[int, str]]:
    """The walk one child at a time, as it was written before the one-pass path."""
    root = view.root
    objects, paths, names = [root], {id(root): ()}, {id(root): ""}
    index = 0
    while index < len(objects):
        current = objects[index]
        index += 1
        for ref in view.list_children(current):
            if id(ref.ref) not in paths:
                paths[id(ref.ref)] = (*paths[id(current)], ref)
                escaped = walk_module.escape_local_name(ref.name)
                base = names[id(current)]
                names[id(ref.ref)] = f"{base}/{escaped}" if base else escaped
                objects.append(ref.ref)
    return [id(obj) for obj in objects], paths, names


def test_bulk_walk_equals_the_per_child_walk() -> None:
    root = _mixed_root()
    view = ObjectGraphView(root)
    fast = view._traverse()
    objects, paths, names = _reference_walk(view)
    assert [id(obj) for obj in fast.objects] == objects
    assert fast.paths == paths and fast.names == names
    assert fast.names[id(adapters.to_trackable(root.state["nul\x00name"]))] == "state/nul\x00name"
    assert fast.names[id(adapters.to_trackable(root.state["layer3/w.3"]))] == "state/layer3.Sw..3"


def test_dict_tracked_at_once_equals_tracked_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {f"w{i}": np.full(2, float(i)) for i in range(30)}
    state["v"] = Variable([1.0])
    state["again"] = state["w0"]
    fast = DictWrapper(state)
    monkeypatch.setattr(DictWrapper, "_track_all_at_once", lambda self, original: False)
    slow = DictWrapper(dict(state))
    assert [(ref.name, ref.ref) for ref in fast._checkpoint_dependencies] == [
        (ref.name, ref.ref) for ref in slow._checkpoint_dependencies
    ]
    assert fast._trackable_children() == slow._trackable_children()
    assert fast._self_dependency_names == slow._self_dependency_names
    assert dict(fast) == {key: value for key, value in state.items()} and fast == slow
    assert fast["w1"] is state["w1"]
    assert fast._lookup_dependency("again") is fast._lookup_dependency("w0")


def test_a_restore_waiting_for_a_dict_still_restores_it(tmp_path: Any) -> None:
    values = {f"w{i}": np.full(2, float(i)) for i in range(30)}
    prefix = tp.Checkpoint(state=values).write(str(tmp_path / "ckpt"))
    ckpt = tp.Checkpoint()
    status = ckpt.read(prefix)
    ckpt.state = {key: np.zeros(2) for key in values}  # attached after the read: deferred
    status.assert_consumed()
    assert all(np.array_equal(ckpt.state[key], value) for key, value in values.items())


def test_an_array_under_two_keys_is_one_node() -> None:
    shared = np.zeros(2)
    state = {f"w{i}": np.full(2, float(i)) for i in range(20)}
    state["a"] = state["b"] = shared
    wrapper = DictWrapper(state)
    assert wrapper._lookup_dependency("a") is wrapper._lookup_dependency("b")
    assert wrapper._lookup_dependency("a") is adapters.to_trackable(shared)
    batch = adapters.to_trackables([np.ones(1)] * 3)
    assert batch[0] is batch[1] is batch[2]


def test_bulk_serialization_of_one_run_of_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    root = AutoTrackable()
    root.state = {f"w/{i}": np.full(1 + i % 3, float(i)) for i in range(50)}
    fast = _serialized(root)
    _one_by_one(monkeypatch)
    assert fast == _serialized(root)


def test_to_trackables_is_to_trackable_of_each() -> None:
    arrays = [np.zeros(i + 1) for i in range(50)]
    earlier = adapters.to_trackable(arrays[3])
    batch = adapters.to_trackables(arrays)
    assert batch[3] is earlier
    assert [adapters.to_trackable(a) for a in arrays] == batch
    assert all(isinstance(v, Variable) and v.array is a for v, a in zip(batch, arrays))
    mixed: list[Any] = [arrays[0], Variable([1.0]), object()]
    assert adapters.to_trackables(mixed) == [batch[0], mixed[1], None]


def test_adapters_are_held_weakly_and_dead_entries_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    array = np.zeros(3)
    first = adapters.to_trackable(array)
    assert adapters.to_trackable(array) is first
    first_id = id(first)
    del first
    gc.collect()
    again = adapters.to_trackable(array)
    assert again is not None and again.array is array  # type: ignore[attr-defined]
    del again
    # Dead entries are swept once the table reaches its threshold (twice the size left by
    # the previous sweep), so it stays within twice its peak of live adapters.
    for _ in range(3):
        batch = adapters.to_trackables([np.zeros(1) for _ in range(100)])
        del batch  # dead entries now
    gc.collect()
    gc.disable()  # nothing else dies while the table is looked at
    try:
        monkeypatch.setattr(adapters, "_sweep_at", len(adapters._adapters))
        batch = adapters.to_trackables([np.zeros(1) for _ in range(100)])
        assert all(ref() is not None for ref in adapters._adapters.values())
        assert adapters._sweep_at == max(1024, 2 * len(adapters._adapters))
        del batch
    finally:
        gc.enable()
    assert first_id is not None


def test_wrap_all_is_wrap_of_each() -> None:
    numeric = [np.zeros(2), np.ones((2, 2), np.float32), np.arange(3)]  # the one-pass path
    with_strings = [np.zeros(2), np.array([b"a", b"bc"], dtype=object), np.ones((2, 2))]
    for arrays in (numeric, with_strings):
        variables = Variable.wrap_all(arrays)
        for variable, array in zip(variables, arrays):
            single = Variable.wrap(array)
            assert type(variable) is Variable and variable.array is array
            assert variable.__dict__ == {**single.__dict__, "_self_adapted_value": array}
            variable.assign(np.full(array.shape, 7, array.dtype) if array.dtype != object
                            else np.array([b"x", b"y"], dtype=object))
            assert variable.array is array and (array == variable.numpy()).all()  # in place
    with pytest.raises(tp.errors.InvalidArgumentError):
        Variable.wrap_all([np.array([1, "x"], dtype=object)])  # not strings: as wrap()


def test_registering_a_factory_again_drops_its_batch_factory() -> None:
    made: list[Any] = []

    def factory(array: np.ndarray) -> Variable:
        made.append(array)
        return Variable.wrap(array)

    try:
        adapters.register_adapter(np.ndarray, factory)
        arrays = [np.zeros(1) for _ in range(20)]
        batch = adapters.to_trackables(arrays)
        assert made == arrays and [v.array for v in batch] == arrays  # type: ignore[union-attr]
    finally:
        adapters.register_adapter(np.ndarray, Variable.wrap, many=Variable.wrap_all)
    with pytest.raises(tp.errors.InvalidArgumentError):
        adapters.register_adapter(np.ndarray, Variable.wrap, many="no")  # type: ignore[arg-type]
    assert adapters._batch_factories[np.ndarray] == Variable.wrap_all


def test_varints_in_one_pass_equal_encode_varint() -> None:
    from trackpoint.bundle.table import encode_varint
    from trackpoint.graph.graph_bytes import _varints

    values = [0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**63 - 1]
    assert _varints(values) == [encode_varint(v) for v in values]
    assert _varints([]) == []
