"""The one serializer asks every class's batch hook for its values and encodes many alike leaves
at once whatever their class (issue 28): the bytes and keys equal those of the per-node encoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pytest

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph import ObjectGraphView, graph_bytes, serialize_graph
from trackpoint.graph import serialize as serialize_module
from trackpoint.tracking import AutoTrackable, Trackable, Variable


class Pair(Trackable):
    """Two values per object, batch form of its own: alike leaves of a class not a Variable."""

    batches: ClassVar[list[int]] = []
    _whole_value_names = ("lo", "hi.x/y")

    def __init__(self, value: float) -> None:
        self.value = value

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"lo": np.full(2, self.value), "hi.x/y": np.full(1, -self.value)}

    @classmethod
    def _serialize_many(cls, trackables: Sequence[Trackable]) -> list[dict[str, Any]]:
        cls.batches.append(len(trackables))
        return [t._serialize_to_tensors() for t in trackables]


class Odd(Pair):
    """Declares Pair's names but saves another value: the declaration is not trusted blindly."""

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"other": np.zeros(1)}


class Counted(Variable):
    """A Variable subclass that overrides the per-object method: off Variable's batch form."""

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"VARIABLE_VALUE": self.numpy() + 1}


def _root() -> AutoTrackable:
    root = AutoTrackable()
    root.pairs = [Pair(float(i)) for i in range(30)]
    root.odd = [Odd(1.0), Odd(2.0)]
    root.counted = Counted([1.0, 2.0], name="c")
    root.plain = Variable([3.0], name="plain/v")
    root.branch = Pair(9.0)
    root.branch._track_trackable(Variable([4.0]), "child")  # a child: encoded node by node
    return root


def _per_node(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []

    def each_leaf(escaped: Any, keys: Any, full_names: Any) -> list[bytes]:
        asked.append(len(keys[0]))
        fields = [graph_bytes.name_field(name) for name in escaped]
        names = full_names or [""] * len(keys[0])
        return [graph_bytes.node(b"".join(graph_bytes.attribute(f, full, k[i])
                                          for f, k in zip(fields, keys)), True)
                for i, full in enumerate(names)]  # fmt: skip

    monkeypatch.setattr(serialize_module, "encode_alike_leaves", each_leaf)
    return asked


def _saved(root: AutoTrackable) -> tuple[bytes, list[tuple[int, dict[str, Any]]]]:
    graph = serialize_graph(ObjectGraphView(root))
    values = [(id(obj), {k: np.asarray(v).tolist() for k, v in tensors.items()})
              for obj, tensors in graph.tensors.items() if obj is not None]  # fmt: skip
    return graph.object_graph_bytes, values


def test_alike_leaves_of_any_class_encode_as_node_by_node(monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root()
    Pair.batches.clear()
    fast = _saved(root)
    assert Pair.batches == [31]  # one call for every Pair of the graph (Odd: its own class)
    asked = _per_node(monkeypatch)
    assert _saved(root) == fast
    assert 30 in asked  # the Pair leaves went through the alike-leaf encoder
    proto = TrackableObjectGraph.FromString(fast[0])
    assert proto.SerializeToString() == fast[0]
    keys = {key for _, values in fast[1] for key in values}
    assert "pairs/0/.ATTRIBUTES/hi..x.Sy" in keys and "odd/1/.ATTRIBUTES/other" in keys
    by_id = dict(fast[1])
    assert by_id[id(root.counted)] == {"counted/.ATTRIBUTES/VARIABLE_VALUE": [2.0, 3.0]}
    full_names = {a.full_name for node in proto.nodes for a in node.attributes}
    assert {"c", "plain/v"} <= full_names  # a variable's name, written for subclasses too


def test_a_batch_hook_returning_too_few_results_is_refused() -> None:
    class Short(Pair):
        @classmethod
        def _serialize_many(cls, trackables: Sequence[Trackable]) -> list[dict[str, Any]]:
            return []

    root = AutoTrackable()
    root.s = Short(1.0)
    with pytest.raises(InvalidArgumentError, match="Short._serialize_many returned 0 results"):
        serialize_graph(ObjectGraphView(root))
