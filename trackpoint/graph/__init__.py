"""The object graph: the key grammar (``keys``), walking it from a root (``walk``), what a save
writes of it (``serialize``, its bytes by ``graph_bytes``), the replay of that walk while the
structure holds (``save_replay``) and the check that it has not changed (``structure``)."""

from __future__ import annotations

from trackpoint.graph.keys import (
    ATTRIBUTES,
    OBJECT_ATTRIBUTES_NAME,
    OBJECT_GRAPH_KEY,
    OPTIMIZER_SLOTS_NAME,
    SAVE_COUNTER,
    VARIABLE_VALUE_KEY,
    checkpoint_key,
    escape_local_name,
    local_name,
    slot_variable_key,
    split_checkpoint_key,
    unescape_local_name,
)
from trackpoint.graph.serialize import SerializedGraph, TensorsByTrackable, serialize_graph
from trackpoint.graph.structure import StructureFingerprint
from trackpoint.graph.walk import (
    ObjectGraphView,
    list_objects,
    node_names,
    object_path_to_string,
    parse_object_graph,
    readable_path,
)

__all__ = [
    "ATTRIBUTES",
    "OBJECT_ATTRIBUTES_NAME",
    "OBJECT_GRAPH_KEY",
    "OPTIMIZER_SLOTS_NAME",
    "SAVE_COUNTER",
    "VARIABLE_VALUE_KEY",
    "ObjectGraphView",
    "SerializedGraph",
    "StructureFingerprint",
    "TensorsByTrackable",
    "checkpoint_key",
    "escape_local_name",
    "list_objects",
    "local_name",
    "node_names",
    "object_path_to_string",
    "parse_object_graph",
    "readable_path",
    "serialize_graph",
    "slot_variable_key",
    "split_checkpoint_key",
    "unescape_local_name",
]
