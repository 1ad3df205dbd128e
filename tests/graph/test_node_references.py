"""Issue 27 finding 5: node ids of a saved object graph are range-checked where it is parsed.

A negative id used to wrap around (a variable silently restored from another's value, and
``assert_consumed`` passed); an id past the end raised IndexError/KeyError. Every reader gets
the graph from ``parse_object_graph``, which now refuses both with a DataLossError.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.reader import BundleReader
from trackpoint.bundle.writer import BundleWriter
from trackpoint.errors import DataLossError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY
from trackpoint.graph.walk import parse_object_graph


def _rewrite_graph(prefix: str, change) -> None:
    """Write the checkpoint at ``prefix`` again with its object graph changed by ``change``."""
    with BundleReader(prefix) as reader:
        values = {key: np.array(reader.read(key), copy=True) for key in reader.keys()}
    graph = TrackableObjectGraph.FromString(values[OBJECT_GRAPH_KEY].item())
    change(graph)
    values[OBJECT_GRAPH_KEY] = np.array(graph.SerializeToString(), dtype=object)
    for name in os.listdir(os.path.dirname(prefix)):
        if name.startswith(os.path.basename(prefix) + "."):
            os.remove(os.path.join(os.path.dirname(prefix), name))
    with BundleWriter(prefix) as writer:
        for key, value in values.items():
            writer.add(key, value)


def _child(graph: TrackableObjectGraph, name: str):
    return next(c for c in graph.nodes[0].children if c.local_name == name)


def _two_variables(tmp_path):
    prefix = tp.Checkpoint(a=tp.Variable(np.array([1.0, 1.0])),
                           b=tp.Variable(np.array([2.0, 2.0]))).write(str(tmp_path / "ckpt"))
    fresh_a, fresh_b = tp.Variable(np.zeros(2)), tp.Variable(np.zeros(2))
    return prefix, fresh_a, fresh_b


def test_negative_child_id_is_refused_not_wrapped_to_another_node(tmp_path):
    prefix, a, b = _two_variables(tmp_path)

    def point_a_at_minus(graph):
        count = len(graph.nodes)
        b_id = _child(graph, "b").node_id
        _child(graph, "a").node_id = b_id - count  # nodes[-k] is b: a would get b's value

    _rewrite_graph(prefix, point_a_at_minus)
    with pytest.raises(DataLossError, match="lists child node -"):
        tp.Checkpoint(a=a, b=b).restore(prefix).assert_consumed()
    assert a.numpy().tolist() == [0.0, 0.0]
    assert b.numpy().tolist() == [0.0, 0.0]


@pytest.mark.parametrize("past", [0, 1, 2**31 - 1 - 3])
def test_child_id_past_the_end_is_a_data_loss_error(tmp_path, past):
    prefix, a, b = _two_variables(tmp_path)
    _rewrite_graph(prefix, lambda g: setattr(_child(g, "a"), "node_id", len(g.nodes) + past))
    with pytest.raises(DataLossError, match="corrupt"):
        tp.Checkpoint(a=a, b=b).restore(prefix)
    with pytest.raises(DataLossError):
        tp.object_metadata(prefix)
    assert a.numpy().tolist() == [0.0, 0.0]


def _graph_with_slot(original: int, slot: int) -> TrackableObjectGraph:
    graph = TrackableObjectGraph()
    root = graph.nodes.add()
    root.children.add(node_id=1, local_name="v")
    root.children.add(node_id=2, local_name="opt")
    graph.nodes.add()  # v
    graph.nodes.add().slot_variables.add(
        original_variable_node_id=original, slot_name="m", slot_variable_node_id=slot
    )
    graph.nodes.add()  # the slot variable
    return graph


@pytest.mark.parametrize(("original", "slot"), [(1, 3), (-3, 3), (1, -1), (4, 3), (1, 2**31 - 1)])
def test_slot_variable_references_are_range_checked(original, slot):
    data = _graph_with_slot(original, slot).SerializeToString()
    if 0 <= original < 4 and 0 <= slot < 4:
        assert len(parse_object_graph(data, prefix="p").nodes) == 4
    else:
        with pytest.raises(DataLossError, match="slot 'm'"):
            parse_object_graph(data, prefix="p")


def test_a_reference_repeating_its_id_field_is_checked_for_every_value():
    # Root's ObjectReference holds node_id twice, -1 then 1: protobuf keeps the last, 1. A
    # file no writer produces; refused rather than trusted.
    body = b"\x08" + b"\xff" * 9 + b"\x01" + b"\x08\x01" + b"\x12\x01v"
    node = b"\x0a" + bytes([len(body)]) + body
    encoded = b"\x0a" + bytes([len(node)]) + node + b"\x0a\x00"
    assert TrackableObjectGraph.FromString(encoded).nodes[0].children[0].node_id == 1
    with pytest.raises(DataLossError):
        parse_object_graph(encoded, prefix="p")


def test_jax_restore_of_a_graph_with_a_bad_id_is_a_data_loss_error(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    prefix = tp.jax.write(str(tmp_path / "ckpt"), {"w": jnp.ones(3), "b": jnp.zeros(2)})
    _rewrite_graph(prefix, lambda g: setattr(_child(g, "w"), "node_id", 2**20))
    with pytest.raises(DataLossError):
        tp.jax.restore(prefix, {"w": jnp.zeros(3), "b": jnp.ones(2)})
