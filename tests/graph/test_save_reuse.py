"""A view saved again reuses its previous walk only while the structure is exactly the same.

The first save of a view leaves nothing to reuse; the second leaves the fingerprint (``_ckpt``
saves once, so each test's first save is a view's second).

Every case compares the graph a repeated save produces with the graph a brand-new view of the
same objects produces (nothing to reuse), after one kind of change to the structure.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from graph_checks import assert_same, fresh, values_of

import trackpoint as tp
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph import ObjectGraphView, serialize_graph
from trackpoint.tracking import AutoTrackable


def _ckpt() -> tuple[tp.Checkpoint, dict[str, Any], ObjectGraphView]:
    state = {f"block{i}/w": np.full(3, i, np.float32) for i in range(5)}
    ckpt = tp.Checkpoint(state=state, step=np.zeros((), np.int64))
    view = ckpt._self_view
    assert serialize_graph(view) is not None and view.save_replay is None  # the first lends none
    return ckpt, state, view


def test_an_unchanged_structure_reuses_the_encoded_graph() -> None:
    _, state, view = _ckpt()
    first = serialize_graph(view)
    state["block0/w"][...] = 7  # a value changed in place: not a structure change
    second = serialize_graph(view)
    assert second.object_graph_bytes is first.object_graph_bytes  # reused, not rebuilt
    assert (values_of(second)["state/block0.Sw/.ATTRIBUTES/VARIABLE_VALUE"] == 7).all()
    assert_same(second, fresh(view))


def _rebind(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    state["block1/w"] = np.ones(4, np.float64)  # on the original dict, behind the wrapper


def _add_key(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    ckpt.state["new"] = np.ones(2, np.float32)


def _delete_key(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    del state["block2/w"]


def _to_plain(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    ckpt.state["block3/w"] = 0.5


def _nested(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    ckpt.state["opt"] = {"lr": 0.1}


def _nested_gains_array(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    ckpt.state["opt"] = {"lr": 0.1}
    serialize_graph(ckpt._self_view)  # saved once with the plain nested dict
    ckpt.state["opt"]["m"] = np.zeros(3, np.float32)


def _attribute(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    ckpt.extra = AutoTrackable()
    serialize_graph(ckpt._self_view)
    ckpt.extra.v = np.arange(3)


def _leaf_gains_child(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    leaf = AutoTrackable()
    ckpt.leaf = leaf
    serialize_graph(ckpt._self_view)  # saved while a leaf
    leaf.w = np.ones(2)


def _save_counter(ckpt: tp.Checkpoint, state: dict[str, Any]) -> None:
    _ = ckpt.save_counter  # attaches a dependency to the root


@pytest.mark.parametrize(
    "change",
    [_rebind, _add_key, _delete_key, _to_plain, _nested, _nested_gains_array, _attribute,
     _leaf_gains_child, _save_counter],
)
def test_a_changed_structure_is_walked_again(
    change: Callable[[tp.Checkpoint, dict[str, Any]], None],
) -> None:
    ckpt, state, view = _ckpt()
    before = serialize_graph(view)
    change(ckpt, state)
    after = serialize_graph(view)
    assert_same(after, fresh(view))
    assert after.object_graph_bytes != before.object_graph_bytes or values_of(after).keys() != (
        values_of(before).keys()
    ) or change is _rebind
    assert serialize_graph(view).object_graph_bytes == after.object_graph_bytes


def test_a_rebound_value_is_the_one_saved() -> None:
    _, state, view = _ckpt()
    serialize_graph(view)
    new = np.full(3, 42, np.float32)
    state["block1/w"] = new
    assert values_of(serialize_graph(view))["state/block1.Sw/.ATTRIBUTES/VARIABLE_VALUE"] is new


def test_an_unsaveable_value_fails_a_repeated_save() -> None:
    _, state, view = _ckpt()
    ckpt_view = view
    state["note"] = "text"  # plain: saved as JSON
    serialize_graph(ckpt_view)
    state["handle"] = object()
    with pytest.raises(InvalidArgumentError, match="handle"):
        serialize_graph(ckpt_view)


def test_a_list_mutation_still_fails_the_next_save() -> None:
    ckpt = tp.Checkpoint(items=[np.zeros(2), np.ones(2)])
    view = ckpt._self_view
    serialize_graph(view)
    serialize_graph(view)  # the second save leaves the reuse
    del ckpt.items[0]
    with pytest.raises(InvalidArgumentError, match="Unable to save"):
        serialize_graph(view)


def test_the_reuse_keeps_no_dropped_object_alive() -> None:
    ckpt, state, view = _ckpt()
    serialize_graph(view)
    old = state["block4/w"]
    probe = _weak_array_probe(old)
    ckpt.state["block4/w"] = np.zeros(3, np.float32)  # through the wrapper: dropped at once
    del old
    gc.collect()
    assert probe() is None  # the fingerprint holds objects weakly
    assert_same(serialize_graph(view), fresh(view))


def _weak_array_probe(array: np.ndarray) -> Callable[[], Any]:
    import weakref

    # numpy arrays take weak references; the adapter holding ``array`` is what could leak.
    return weakref.ref(array)
