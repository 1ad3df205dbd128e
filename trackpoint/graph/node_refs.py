"""Range checks of the node ids a saved object graph refers to (tf-checkpoint-format.md §9).

A ``TrackableObjectGraph`` names nodes by position: a child reference's ``node_id``, a slot
variable reference's ``original_variable_node_id`` and ``slot_variable_node_id``. Every reader
indexes ``nodes`` with them, and Python indexing turns a negative id into another node (a
variable silently given another's value) and an id past the end into an ``IndexError``; so
:func:`check_node_references` refuses a graph with such an id once, where it is parsed.

Reading a field of each of 100,000 nodes through protobuf's Python objects costs as much as a
whole restore's walk, so protobuf gathers the ids itself, in one parse of the graph's bytes as a
*shadow* message: the same field numbers and wire types, but the repeated message fields
(``nodes``, ``children``, ``slot_variables``) declared singular. Protobuf merges every
occurrence of a singular message field into one message (the encoding's rule), so the parse
yields one node holding one reference whose repeated ``node_id`` lists every child id of the
graph, and one slot reference listing every slot id: checked as arrays, no Python object per
node. Every id the real parse keeps is there (a reference that repeats its id field contributes
each value, so such a file may be refused where the last value alone is in range; a file no
writer produces).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from trackpoint.errors import DataLossError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY

if TYPE_CHECKING:
    from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph

__all__ = ["check_node_references"]

_LABEL_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_LABEL_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_INT32 = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE


def _shadow_class() -> tuple[Any, ...]:
    """The shadow ``TrackableObjectGraph``, in a descriptor pool of its own (the real protos
    are untouched): ``Graph.nodes`` (1) a singular ``Node``; ``Node.children`` (1) a singular
    ``Ref`` and ``Node.slot_variables`` (3) a singular ``Slot``; ``Ref.node_id`` (1) and
    ``Slot``'s ``original_variable_node_id`` (1) and ``slot_variable_node_id`` (3) repeated
    ``int32`` (unpacked, as written; a parser accepts both forms)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="trackpoint_graph_node_refs_shadow.proto",
        package="trackpoint.shadow",
        syntax="proto3",
    )
    shapes: dict[str, list[tuple[str, int, str | None]]] = {
        "Graph": [("nodes", 1, "Node")],
        "Node": [("children", 1, "Ref"), ("slot_variables", 3, "Slot")],
        "Ref": [("node_id", 1, None)],
        "Slot": [("original_variable_node_id", 1, None), ("slot_variable_node_id", 3, None)],
    }
    for name, fields in shapes.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind in fields:
            if kind is None:  # a repeated int32 id
                field = message.field.add(
                    name=field_name, number=number, label=_LABEL_REPEATED, type=_INT32
                )
                field.options.packed = False
            else:  # a singular message: every occurrence merges into one
                message.field.add(
                    name=field_name, number=number, label=_LABEL_OPTIONAL, type=_MESSAGE,
                    type_name=f".trackpoint.shadow.{kind}",
                )  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    # Every class is held here: a nested message class made on first access and held by
    # nothing is made again (and left to the cyclic collector) at each parse.
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"trackpoint.shadow.{name}"))
        for name in shapes
    )


_SHADOW_GRAPH, *_SHADOW_PARTS = _shadow_class()


def check_node_references(data: bytes, graph: TrackableObjectGraph, *, prefix: str = "") -> None:
    """Refuse a graph whose child or slot variable references name a node it lacks.

    Args:
        data: the graph's serialized bytes (they parsed as ``graph``).
        graph: ``data`` parsed, for the node count and the error message.
        prefix: the checkpoint, for the error message.

    Raises:
        DataLossError: an id is negative or not below the node count; names the node.
    """
    count = len(graph.nodes)
    merged = _SHADOW_GRAPH.FromString(data).nodes
    slots = merged.slot_variables
    for field in (
        merged.children.node_id,
        slots.original_variable_node_id,
        slots.slot_variable_node_id,
    ):
        ids = np.asarray(field, np.int64)  # a repeated scalar field converts in C
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= count):
            _raise_bad_reference(graph, prefix)


def _raise_bad_reference(graph: TrackableObjectGraph, prefix: str) -> NoReturn:
    """Find the first reference out of range, node by node (only for a corrupt graph)."""
    count = len(graph.nodes)
    for node_id, node in enumerate(graph.nodes):
        for child in node.children:
            if not 0 <= child.node_id < count:
                _raise(prefix, f"node {node_id} lists child node {child.node_id}", count)
        for slot in node.slot_variables:
            for what, ref in (
                ("variable", slot.original_variable_node_id),
                ("slot variable", slot.slot_variable_node_id),
            ):
                if not 0 <= ref < count:
                    _raise(
                        prefix,
                        f"node {node_id} lists slot {slot.slot_name!r} with {what} node {ref}",
                        count,
                    )
    # Only a reference that repeats its id field, an earlier value out of range, gets here.
    _raise(prefix, "a reference repeats its node id with one out of range", count)


def _raise(prefix: str, what: str, count: int) -> NoReturn:
    raise DataLossError(
        f"The object graph in {prefix} is corrupt: {what}, but the graph has {count} "
        f"node(s), ids 0 to {count - 1}. This checkpoint cannot be restored; restore an "
        "earlier one",
        path=prefix,
        key=OBJECT_GRAPH_KEY,
    )
