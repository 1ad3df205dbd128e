"""What the save-replay tests compare: a replayed serialization against a fresh walk's."""

from __future__ import annotations

from typing import Any

import numpy as np

from trackpoint.graph import ObjectGraphView, SerializedGraph, serialize_graph

__all__ = ["assert_same", "fresh", "values_of"]


def fresh(view: ObjectGraphView) -> SerializedGraph:
    """A walk from scratch of ``view``'s objects (a new view lends no replay)."""
    return serialize_graph(ObjectGraphView(view.root, list(view.attached_dependencies)))


def values_of(graph: SerializedGraph) -> dict[str, Any]:
    return {key: value for _, tensors in graph.tensors.items() for key, value in tensors.items()}


def assert_same(got: SerializedGraph, want: SerializedGraph) -> None:
    """Same object-graph bytes, same keys in the same order, equal values."""
    assert got.object_graph_bytes == want.object_graph_bytes
    got_values, want_values = values_of(got), values_of(want)
    assert list(got_values) == list(want_values)
    for key, value in want_values.items():
        if key.endswith("_CHECKPOINTABLE_OBJECT_GRAPH"):
            continue
        other = got_values[key]
        if callable(value):  # plain values are JSON made at save time
            value, other = value(), other()
        assert other is value or np.array_equal(np.asarray(other), np.asarray(value)), key
