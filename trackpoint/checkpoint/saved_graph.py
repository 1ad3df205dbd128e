"""A checkpoint's object graph as the restore engine asks it, parsed once per distinct bytes.

Reading a protobuf field from Python costs about as much as the engine's own work for a node,
so what a restore asks of the whole graph is answered once and kept: which nodes are slot
variables, and their readable names (messages). Which unmatched nodes hold values
(``assert_consumed``, the "unrestored values" warning) is asked of the unmatched nodes only.

A Checkpoint keeps the graph of its last read (``trackpoint.checkpoint.replay``): a
training loop reading checkpoints of one program gets byte-identical graphs, so the next read
compares bytes (a ``memcmp``) instead of parsing again, and everything derived from the graph
is reused. The graph is immutable once made; coordinators of several reads share it.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection
from typing import TYPE_CHECKING

from trackpoint.bundle.dtypes import DataType
from trackpoint.errors import DataLossError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY
from trackpoint.graph.walk import node_names, parse_object_graph

if TYPE_CHECKING:
    from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
    from trackpoint.bundle.reader import BundleReader

__all__ = ["SavedGraph", "SlotVariable"]

_SLOT_VARIABLES = operator.attrgetter("slot_variables")

SlotVariable = tuple[int, int, int, str]
"""``(optimizer node, original variable node, slot variable node, slot name)``."""


class SavedGraph:
    """One object graph: its exact bytes, the parsed proto, and tables computed on first use.

    Args:
        data: the serialized ``TrackableObjectGraph`` (the value of ``OBJECT_GRAPH_KEY``).
        proto: ``data`` parsed; treat it as read-only (coordinators share it).
    """

    __slots__ = ("_names", "_slots", "data", "proto")

    def __init__(self, data: bytes, proto: TrackableObjectGraph) -> None:
        self.data = data
        self.proto = proto
        self._slots: list[SlotVariable] | None = None
        self._names: dict[int, str] | None = None

    @classmethod
    def from_proto(cls, proto: TrackableObjectGraph) -> SavedGraph:
        """A graph built by the program rather than read (its bytes are re-serialized)."""
        return cls(proto.SerializeToString(), proto)

    @classmethod
    def load(cls, bundle: BundleReader, previous: SavedGraph | None = None) -> SavedGraph | None:
        """The object graph of the checkpoint ``bundle`` reads; None for one without (TF1).

        ``previous`` is returned as is when the checkpoint's graph has the same bytes.

        Raises:
            DataLossError: the graph value is not a scalar string, or does not parse.
        """
        if not bundle.has_tensor(OBJECT_GRAPH_KEY):
            return None
        if (
            bundle.datatype(OBJECT_GRAPH_KEY) != DataType.DT_STRING
            or bundle.shape(OBJECT_GRAPH_KEY) != ()
        ):
            raise DataLossError(
                f"{OBJECT_GRAPH_KEY} in {bundle.prefix} is not a scalar string",
                path=bundle.prefix,
                key=OBJECT_GRAPH_KEY,
            )
        data = bundle.read(OBJECT_GRAPH_KEY).item()  # a scalar string: the bytes object
        if previous is not None and previous.data == data:
            return previous
        return cls(data, parse_object_graph(data, prefix=bundle.prefix))

    def slot_variables(self) -> list[SlotVariable]:
        """Every slot variable the graph lists, in node order of the optimizers."""
        if self._slots is None:
            nodes = self.proto.nodes
            # Which nodes list slots, asked through map (no bytecode per node): most have none.
            counts = list(map(len, map(_SLOT_VARIABLES, nodes)))
            self._slots = [
                (node_id, slot.original_variable_node_id, slot.slot_variable_node_id,
                 slot.slot_name)
                for node_id in itertools.compress(range(len(counts)), counts)
                for slot in nodes[node_id].slot_variables
            ]  # fmt: skip
        return self._slots

    def unmatched(self, matched: Collection[int], *, with_saver: bool) -> list[int]:
        """Nodes not in ``matched`` (node ids) that hold values, ascending: attributes, or
        with ``with_saver`` also a registered saver (set arithmetic first: the nodes of a
        restore nearly all match, and asking each node costs as much as the walk did)."""
        nodes = self.proto.nodes
        if len(matched) >= len(nodes):
            return []  # every node
        rest = set(range(len(nodes))).difference(matched)
        return sorted(
            node_id
            for node_id in rest
            if nodes[node_id].attributes
            or with_saver
            and nodes[node_id].HasField("registered_saver")
        )

    def node_names(self) -> dict[int, str]:
        """Readable path of every node, ``(root).model.dense.kernel`` (for messages)."""
        if self._names is None:
            self._names = node_names(self.proto)
        return self._names
