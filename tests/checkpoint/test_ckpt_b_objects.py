"""Scenarios B9–B14: root + kwargs, memory hygiene, containers, Python state, deepcopy."""

from __future__ import annotations

import collections
import copy
import gc
import json
import logging
import os
import weakref

import numpy as np
import pytest
from ckpt_helpers import JsonState, NumpyState, keys_of

from trackpoint.checkpoint.checkpoint import Checkpoint
from trackpoint.management import object_metadata
from trackpoint.tracking import AutoTrackable, ListWrapper, NoDependency, Variable

VV = "/.ATTRIBUTES/VARIABLE_VALUE"


def _child(graph, node_id: int, name: str) -> int:
    return next(c.node_id for c in graph.nodes[node_id].children if c.local_name == name)


# -- B9 --------------------------------------------------------------------------------------


def _model(value: float) -> AutoTrackable:
    model = AutoTrackable()
    model.v = Variable(value)
    return model


def test_b9_root_and_kwargs_share_one_namespace(tmp_path):
    model = _model(2.0)
    extra = Variable(3.0)
    path = Checkpoint(model, extra=extra).save(tmp_path / "a")
    assert keys_of(path) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH", "extra" + VV, "save_counter" + VV, "v" + VV,
    ]
    # (a) same layout, fresh objects
    model2, extra2 = _model(0.0), Variable(0.0)
    Checkpoint(model2, extra=extra2).restore(path).assert_consumed()
    assert model2.v.numpy() == 2.0 and extra2.numpy() == 3.0
    # (b) kwargs layout without a root restores by the same names
    v3, extra3 = Variable(0.0), Variable(0.0)
    Checkpoint(v=v3, extra=extra3).restore(path).assert_consumed()
    assert v3.numpy() == 2.0 and extra3.numpy() == 3.0
    # (c) the root already tracks the kwarg: one node, no duplicate key
    model.extra = extra
    path_c = Checkpoint(model, extra=extra).save(tmp_path / "c")
    assert keys_of(path_c).count("extra" + VV) == 1


def test_b9_root_keyword_equals_positional(tmp_path):
    p1 = Checkpoint(_model(1.0)).write(tmp_path / "positional")
    p2 = Checkpoint(root=_model(1.0)).write(tmp_path / "keyword")
    assert keys_of(p1) == keys_of(p2) == ["_CHECKPOINTABLE_OBJECT_GRAPH", "v" + VV]
    fresh = _model(0.0)
    Checkpoint(root=fresh).read(p1).assert_consumed()
    assert fresh.v.numpy() == 1.0


def test_b9_non_trackable_argument_names_it():
    with pytest.raises(ValueError, match=r"expecting step .*int"):
        Checkpoint(step=5)
    with pytest.raises(ValueError, match=r"expecting root .*str"):
        Checkpoint("not trackable")


# -- B10 -------------------------------------------------------------------------------------


def test_b10_weakref_root_is_not_kept_alive(tmp_path):
    root = _model(1.0)
    ckpt = Checkpoint(root=weakref.ref(root))
    path = ckpt.save(tmp_path / "ckpt")
    assert "v" + VV in keys_of(path)
    alive = weakref.ref(root)
    del root
    gc.collect()
    assert alive() is None


def test_b10_pending_restores_leave_no_cycles(tmp_path, caplog):
    saved = AutoTrackable()
    saved.a = _model(1.0)
    saved.b = _model(2.0)
    path = Checkpoint(root=saved).write(tmp_path / "ckpt")
    gc.collect()
    gc.disable()
    try:
        with caplog.at_level(logging.WARNING, logger="trackpoint"):
            fresh = AutoTrackable()
            fresh.a = _model(0.0)
            status = Checkpoint(root=fresh).read(path)  # "b" stays pending on fresh
            fresh_ref = weakref.ref(fresh)
            del status, fresh
            assert fresh_ref() is None  # freed by reference counting alone
            assert "(root).b.v" in caplog.text  # the finalizer ran on `del`
            caplog.clear()
            fresh = AutoTrackable()
            Checkpoint(root=fresh).read(path).expect_partial()
            del fresh
            assert caplog.text == ""
    finally:
        gc.enable()


def test_b10_a_dropped_checkpoint_is_freed_without_the_collector(tmp_path):
    """A Checkpoint and everything it tracks go with the last reference (no cycle through its
    own object graph view, its save's reusable state or a commit), also after saves and reads
    that keep reusable state."""
    values = {f"layer/{i}": np.full(3, float(i)) for i in range(40)}
    gc.collect()
    gc.disable()
    try:
        ckpt = Checkpoint(state=values, step=Variable(3))
        path = ckpt.save(tmp_path / "ckpt")
        for _ in range(3):  # the second save captures the structure, the third reuses it
            ckpt.write(tmp_path / "again")
        target = Checkpoint(state={k: np.zeros(3) for k in values}, step=Variable(0))
        for _ in range(2):  # the second read replays the first one's walk
            target.restore(path).assert_consumed()
        tracked = weakref.ref(ckpt._lookup_dependency("state"))
        refs = [weakref.ref(ckpt), weakref.ref(target), tracked]
        del ckpt, target
        assert [ref() for ref in refs] == [None, None, None]
        assert gc.collect() == 0  # and nothing of the saves and reads was left in a cycle
        # A load status keeps its Checkpoint's objects alive on its own.
        into = {k: np.zeros(3) for k in values}
        status = Checkpoint(state=into, step=Variable(0)).restore(path)
        status.assert_consumed()
        assert into["layer/7"].tolist() == [7.0, 7.0, 7.0]
    finally:
        gc.enable()


def _open_files_under(directory) -> list[str]:
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            names.append(target)
    return names


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_b10_no_files_stay_open_after_restore(tmp_path):
    root = AutoTrackable()
    root.big = np.arange(100_000, dtype=np.float64)
    root.late = Variable(3.0)
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.big = np.zeros(100_000)
    status = Checkpoint(root=fresh).read(path)
    assert _open_files_under(tmp_path) == []
    fresh.late = Variable(0.0)  # the deferred value is read now, and the file closed again
    assert fresh.late.numpy() == 3.0
    status.assert_consumed()
    assert _open_files_under(tmp_path) == []


# -- B11 -------------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", ["first", "second"])


def _containers(value: float) -> AutoTrackable:
    root = AutoTrackable()
    root.items = [Variable(value), np.full(2, value)]
    root.table = {"x": Variable(value + 1), "nested": {"y": np.full(1, value + 2)}}
    root.pair = Pair(Variable(value + 3), [np.full(3, value + 4)])
    root.plain = (Variable(value + 5), 7)
    return root


def test_b11_containers_round_trip(tmp_path):
    path = Checkpoint(root=_containers(1.0)).write(tmp_path / "ckpt")
    keys = set(keys_of(path))
    for key in ("items/0", "items/1", "table/x", "table/nested/y", "pair/first",
                "pair/second/0", "plain/0"):
        assert key + VV in keys, key
    graph = object_metadata(path)
    pair = graph.nodes[_child(graph, 0, "pair")]
    edges = {c.local_name: c.node_id for c in pair.children}
    assert edges["first"] == edges["0"] and edges["second"] == edges["1"]  # name and index
    fresh = _containers(0.0)
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert fresh.items[0].numpy() == 1.0 and fresh.items[1].tolist() == [1.0, 1.0]
    assert fresh.table["nested"]["y"][0] == 3.0
    assert fresh.pair.first.numpy() == 4.0 and fresh.pair[0] is fresh.pair.first
    assert fresh.pair.second[0].tolist() == [5.0] * 3
    assert isinstance(fresh.pair, Pair) and fresh.plain[1] == 7


def test_b11_empty_containers_are_ignored_plain_values_are_saved(tmp_path):
    # Issue 13: TF ignores containers of plain ints; trackpoint saves them (nothing dropped
    # without a word), so only empty containers are ignored by the assertions.
    model = AutoTrackable()
    model.v = Variable(1.0)
    path = Checkpoint(model=model).save(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.v = Variable(0.0)
    fresh.empty_list = []
    fresh.empty_dict = {}
    Checkpoint(model=fresh).restore(path).assert_consumed().assert_existing_objects_matched()
    fresh.ints = [1, 2, 3]
    fresh.int_dict = {"a": 1}
    status = Checkpoint(model=fresh).restore(path)
    with pytest.raises(AssertionError, match=r"model\.ints.*model\.int_dict"):
        status.assert_existing_objects_matched()
    status.expect_partial()
    # and the other way round: containers in the checkpoint, none in the program
    path2 = Checkpoint(model=fresh).save(tmp_path / "ckpt2")
    bare = AutoTrackable()
    bare.v = Variable(0.0)
    bare.empty_list, bare.ints, bare.int_dict = [], [0, 0, 0], {"a": 0}
    Checkpoint(model=bare).restore(path2).assert_consumed()
    assert bare.ints == [1, 2, 3] and bare.int_dict == {"a": 1}
    bare2 = AutoTrackable()
    bare2.v = Variable(0.0)
    with pytest.raises(AssertionError, match="Unresolved object"):
        Checkpoint(model=bare2).restore(path2).expect_partial().assert_consumed()


# -- B12 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        lambda items: items.__delitem__(0),
        lambda items: items.sort(key=id),
        lambda items: items.__setitem__(slice(0, 1), [Variable(9.0)]),
        lambda items: items.__imul__(-1),
        lambda items: items.pop(),
        lambda items: items.insert(0, Variable(1.0)),
        lambda items: items.reverse(),
    ],
    ids=["del", "sort", "slice-replace", "negative-multiply", "pop", "insert", "reverse"],
)
def test_b12_identity_losing_mutations_make_save_fail(tmp_path, mutate):
    root = AutoTrackable()
    root.items = [Variable(1.0), Variable(2.0)]
    mutate(root.items)
    with pytest.raises(ValueError, match="Unable to save"):
        Checkpoint(root=root).write(tmp_path / "ckpt")


def test_b12_external_mutation_of_the_original_list(tmp_path):
    # Rebinding and appending on the original list are adopted (issue 13, the training-loop
    # pattern); removing tracked elements behind the wrapper's back still fails.
    original = [Variable(1.0)]
    root = AutoTrackable()
    root.items = original
    original.append(Variable(2.0))
    original[0] = Variable(5.0)
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    fresh = AutoTrackable()
    fresh.items = [Variable(0.0), Variable(0.0)]
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert [v.numpy() for v in fresh.items] == [5.0, 2.0]
    del original[0]
    with pytest.raises(ValueError, match="Unable to save.*outside the wrapper"):
        Checkpoint(root=root).write(tmp_path / "ckpt")


def test_b12_wrapper_mirrors_into_original_list():
    original = []
    root = AutoTrackable()
    root.items = original
    v = Variable(1.0)
    root.items.append(v)
    assert original == [v] and isinstance(root.items, ListWrapper)


def test_b12_plain_lists_mutate_freely_and_duplicates_restore(tmp_path):
    root = AutoTrackable()
    root.ints = [3, 1, 2]
    root.ints.sort()
    del root.ints[0]
    v = Variable(4.0)
    root.items = [v]
    root.items *= 2  # duplicates: tracked under "0" and "1"
    path = Checkpoint(root=root).write(tmp_path / "ckpt")
    graph = object_metadata(path)
    items = graph.nodes[_child(graph, 0, "items")]
    assert [(c.local_name, c.node_id) for c in items.children] == [
        ("0", items.children[0].node_id), ("1", items.children[0].node_id)
    ]
    fresh = AutoTrackable()
    fresh.ints = [2, 3]
    w = Variable(0.0)
    fresh.items = [w, w]
    Checkpoint(root=fresh).read(path).assert_consumed()
    assert w.numpy() == 4.0


def test_b12_no_dependency_list_is_not_tracked(tmp_path):
    root = AutoTrackable()
    root.cache = NoDependency([Variable(1.0)])
    assert type(root.cache) is list
    root.cache.sort(key=id)
    assert keys_of(Checkpoint(root=root).write(tmp_path / "ckpt")) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH"
    ]


# -- B13 -------------------------------------------------------------------------------------


def test_b13_python_state_restores_immediately(tmp_path):
    state = JsonState(step=3, name="run")
    ckpt = Checkpoint(state=state)
    path = ckpt.save(tmp_path / "ckpt")
    assert "state/.ATTRIBUTES/py_state" in keys_of(path)
    state.values["step"] = 99
    ckpt.restore(path).assert_consumed()
    assert state.values == {"step": 3, "name": "run"}
    late = JsonState()
    status_ckpt = Checkpoint()
    status = status_ckpt.restore(path)
    status_ckpt.state = late  # deferred Python state is restored on attach
    assert late.values == {"step": 3, "name": "run"}
    status.assert_consumed()


def test_b13_numpy_state_recreates_missing_attributes(tmp_path):
    saved = NumpyState()
    saved.weights = np.arange(4.0)
    saved.mask = np.array([True, False])
    path = Checkpoint(numpy=saved).save(tmp_path / "ckpt")
    empty = NumpyState()
    Checkpoint(numpy=empty).restore(path).assert_consumed()
    np.testing.assert_array_equal(empty.weights, np.arange(4.0))
    np.testing.assert_array_equal(empty.mask, [True, False])


def test_b13_unmatched_state_attribute_fails_assert_consumed(tmp_path):
    path = Checkpoint(state=JsonState(a=1)).write(tmp_path / "ckpt")
    status = Checkpoint(state=AutoTrackable()).read(path)
    with pytest.raises(AssertionError, match=r"(?s)Unused attributes.*\(root\)\.state.*py_state"):
        status.assert_consumed()
    status.expect_partial()


def test_b13_unserializable_get_config_does_not_break_save(tmp_path):
    class Layer(AutoTrackable):
        def get_config(self):
            return {"fn": object()}  # not JSON-serializable

    layer = Layer()
    layer.v = Variable(1.0)
    path = Checkpoint(layer=layer).save(tmp_path / "ckpt")
    with pytest.raises(TypeError):
        json.dumps(layer.get_config())
    assert "layer" + VV not in keys_of(path) and "layer/v" + VV in keys_of(path)


# -- B14 -------------------------------------------------------------------------------------


def test_b14_deepcopy_checkpoint(tmp_path):
    v = Variable(1.0)
    original = Checkpoint(v=v)
    copied = copy.deepcopy(original)
    copied.v.assign(2.0)
    assert v.numpy() == 1.0
    path = copied.save(tmp_path / "ckpt")
    original.restore(path).assert_consumed()
    assert v.numpy() == 2.0
    assert int(original.save_counter.numpy()) == 1


def test_b14_deepcopy_with_root_and_arrays(tmp_path):
    root = AutoTrackable()
    root.w = np.zeros(2)
    original = Checkpoint(root)
    copied = copy.deepcopy(original)
    copied.root.w[:] = 5.0
    path = copied.write(tmp_path / "ckpt")
    assert root.w.tolist() == [0.0, 0.0]
    original.read(path).assert_consumed()
    assert root.w.tolist() == [5.0, 5.0]
