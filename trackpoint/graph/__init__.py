"""The object graph: the key grammar (``keys``) and walking the graph from a root (``walk``)."""

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
from trackpoint.graph.walk import (
    ObjectGraphView,
    SerializedGraph,
    TensorsByTrackable,
    list_objects,
    node_names,
    object_path_to_string,
    parse_object_graph,
    readable_path,
    serialize_graph,
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
