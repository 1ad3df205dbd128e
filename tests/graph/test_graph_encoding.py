"""The hand-serialized object graph equals protobuf's own serialization of the same graph."""

from __future__ import annotations

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.graph import ObjectGraphView, serialize_graph
from trackpoint.tracking import AutoTrackable, SlotOwner, Variable


class Opt(SlotOwner, AutoTrackable):
    pass


def _graph_bytes(root, **kwargs) -> bytes:  # noqa: ANN001, ANN003
    graph = serialize_graph(ObjectGraphView(root), **kwargs)
    stored = graph.tensors.items()[-1][1]["_CHECKPOINTABLE_OBJECT_GRAPH"][()]
    assert stored == graph.object_graph_bytes
    return stored


def test_object_graph_bytes_are_protobufs_canonical_encoding():
    root = AutoTrackable()
    root.layers = AutoTrackable()
    for i in range(200):  # node ids and lengths past one varint byte
        setattr(root.layers, f"l{i}", Variable([float(i)], name=f"layer/{i}" * (i % 3)))
    root.layers.alias = root.layers.l7  # a second path to a node
    root.empty = AutoTrackable()  # has_checkpoint_values false
    root.weird = Variable(2.0, name="")
    setattr(root, "ünï/cöde.x", Variable(3.0))
    root.table = Variable([1.0])
    root.opt = Opt()
    root.opt.add_slot(root.layers.l1, "m")
    root.opt.add_slot(root.weird, "v")
    data = _graph_bytes(
        root, registered_saver_for=lambda obj: "Tables" if obj is root.table else None
    )
    proto = TrackableObjectGraph.FromString(data)
    assert proto.SerializeToString() == data
    assert [n.HasField("has_checkpoint_values") for n in proto.nodes] == [True] * len(proto.nodes)
    flags = {n.has_checkpoint_values.value for n in proto.nodes}
    assert flags == {True, False}
    assert proto.nodes[0].children[0].node_id == 1 and len(proto.nodes) > 200
    assert any(n.slot_variables for n in proto.nodes)
    assert any(n.registered_saver.name == "Tables" for n in proto.nodes)


def test_a_lone_root_without_values():
    data = _graph_bytes(AutoTrackable())
    assert data == bytes.fromhex("0a02 2a00")
    assert TrackableObjectGraph.FromString(data).SerializeToString() == data
