"""trackpoint.graph: names, keys, breadth-first order, the object-graph proto."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.graph import (
    ObjectGraphView,
    checkpoint_key,
    escape_local_name,
    list_objects,
    node_names,
    object_path_to_string,
    serialize_graph,
    slot_variable_key,
)
from trackpoint.tracking import (
    AutoTrackable,
    SlotOwner,
    Trackable,
    TrackableReference,
    Variable,
)


class Opt(SlotOwner, AutoTrackable):
    pass


def test_escaping_and_keys():
    assert escape_local_name("a/b.c") == "a.Sb..c"
    assert escape_local_name(".ATTRIBUTES") == "..ATTRIBUTES"
    assert escape_local_name("..S") == "....S"
    refs = [TrackableReference("model", Trackable()), TrackableReference("a/b", Trackable())]
    assert object_path_to_string(refs) == "model/a.Sb"
    assert checkpoint_key("model/a.Sb", "VARIABLE_VALUE") == "model/a.Sb/.ATTRIBUTES/VARIABLE_VALUE"
    assert checkpoint_key("", "v1") == "/.ATTRIBUTES/v1"
    assert checkpoint_key("x", "my.val/x") == "x/.ATTRIBUTES/my..val.Sx"  # escaped once
    assert slot_variable_key("model/w", "opt", "m") == "model/w/.OPTIMIZER_SLOT/opt/m"


def test_breadth_first_order_and_first_path_wins():
    root = AutoTrackable()
    root.a = AutoTrackable()
    root.b = Variable(1.0)
    root.a.deep = Variable(2.0)
    root.a.alias = root.b
    objects, paths = ObjectGraphView(root).breadth_first_traversal()
    assert objects == [root, root.a, root.b, root.a.deep]
    assert [ref.name for ref in paths[id(root.b)]] == ["b"]


def test_attached_dependencies_follow_root_children_and_may_be_weak():
    root = AutoTrackable()
    root.own = Variable(1.0)
    extra = Variable(2.0)
    attached = [TrackableReference("extra", extra), TrackableReference("root", weakref.ref(root))]
    view = ObjectGraphView(weakref.ref(root), attached)
    assert [ref.name for ref in view.list_children(root)] == ["own", "extra", "root"]
    proto = serialize_graph(view).object_graph_proto
    assert [(c.local_name, c.node_id) for c in proto.nodes[0].children] == [
        ("own", 1), ("extra", 2), ("root", 0)
    ]
    attached.append(TrackableReference("late", Variable(3.0)))
    assert [ref.name for ref in view.list_children(root)][-1] == "late"


def test_serialized_graph_contents():
    root = AutoTrackable()
    root.w = Variable(np.ones(2, np.float32), name="kernel")
    root.empty = AutoTrackable()
    graph = serialize_graph(ObjectGraphView(root))
    proto = graph.object_graph_proto
    assert graph.tensors.keys() == ["w/.ATTRIBUTES/VARIABLE_VALUE", "_CHECKPOINTABLE_OBJECT_GRAPH"]
    owners = list(graph.tensors)
    assert owners == [root.w, None]  # the graph is written last, owned by nobody
    attribute = proto.nodes[1].attributes[0]
    assert (attribute.name, attribute.full_name) == ("VARIABLE_VALUE", "kernel")
    assert [n.has_checkpoint_values.value for n in proto.nodes] == [True, True, False]
    stored = graph.tensors.items()[-1][1]["_CHECKPOINTABLE_OBJECT_GRAPH"]
    reparsed = TrackableObjectGraph()
    reparsed.ParseFromString(stored[()])
    assert reparsed == proto


def test_slot_variables_appended_per_optimizer_slot_variable():
    root = AutoTrackable()
    root.v1 = Variable([1.0])
    root.v2 = Variable([2.0])
    root.opt = Opt()
    root.opt.add_slot(root.v2, "b")
    root.opt.add_slot(root.v1, "b")
    root.opt.add_slot(root.v1, "a")
    objects = list_objects(root)
    assert len(objects) == 7
    proto = serialize_graph(ObjectGraphView(root)).object_graph_proto
    refs = [(s.slot_name, s.original_variable_node_id, s.slot_variable_node_id)
            for s in proto.nodes[3].slot_variables]
    assert refs == [("a", 1, 4), ("b", 1, 5), ("b", 2, 6)]
    assert proto.nodes[5].attributes[0].checkpoint_key == (
        "v1/.OPTIMIZER_SLOT/opt/b/.ATTRIBUTES/VARIABLE_VALUE"
    )
    names = node_names(proto)
    assert names[6] == "(root).opt's state 'b' for (root).v2"
    assert len(list_objects(root, skip_slot_variables=True)) == 4


def test_slot_of_unreachable_variable_is_not_saved():
    root = AutoTrackable()
    root.opt = Opt()
    root.opt.add_slot(Variable([1.0]), "m")
    assert len(serialize_graph(ObjectGraphView(root)).object_graph_proto.nodes) == 2


def test_registered_saver_seam():
    root = AutoTrackable()
    root.table = Variable([1.0])
    graph = serialize_graph(
        ObjectGraphView(root),
        registered_saver_for=lambda obj: "Tables" if obj is root.table else None,
    )
    node = graph.object_graph_proto.nodes[1]
    assert (node.registered_saver.name, node.registered_saver.object_name) == ("Tables", "table")
    assert not node.attributes and graph.registered_savers == {"Tables": {"table": root.table}}
    assert graph.object_graph_proto.nodes[0].has_checkpoint_values.value


def test_list_objects_rejects_untrackable_root():
    with pytest.raises(ValueError, match="trackable root"):
        list_objects(42)
    assert len(list_objects(np.zeros(2))) == 1


def test_node_names_for_unreachable_nodes():
    proto = TrackableObjectGraph()
    proto.nodes.add().children.add(node_id=1, local_name="x")
    proto.nodes.add()
    proto.nodes.add()
    assert node_names(proto) == {0: "(root)", 1: "(root).x", 2: "<unreachable node 2>"}
