"""Serializing the object graph for a save: every node's values and the ``TrackableObjectGraph``.

Saving gets a :class:`SerializedGraph`: the values of every node keyed by checkpoint key, the
``TrackableObjectGraph`` proto (stored last, as a scalar string under
``_CHECKPOINTABLE_OBJECT_GRAPH``, like TF's data order §5.4) and the objects handled by
registered savers. Custom value names are escaped once, in the attribute and in the key: TF
escapes the key twice and then cannot restore its own file (§9.3 quirk); the once-escaped key is
the one TF's restore looks up, so both libraries read ours.

A view saved again (a training loop) reuses the previous save's node ids, keys and encoded
graph when a :class:`~trackpoint.graph.structure.StructureSnapshot` confirms the structure is
exactly as it was; the values themselves are always gathered anew, from the objects reachable
at the call.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import numpy as np

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.table import encode_varint
from trackpoint.bundle.table_batch import varint_bytes, varint_sizes
from trackpoint.graph.keys import OBJECT_ATTRIBUTES_NAME, OBJECT_GRAPH_KEY, escape_local_name
from trackpoint.graph.structure import StructureSnapshot
from trackpoint.graph.walk import (
    GraphWalk,
    ObjectGraphView,
    check_slot_variables_reachable,
    readable_path,
    walk_graph,
)
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, NotTrackable, Trackable
from trackpoint.tracking.base import has_values as has_values_of
from trackpoint.tracking.python_state import string_scalar
from trackpoint.tracking.save_check import SaveChecked
from trackpoint.tracking.slots import SlotOwner
from trackpoint.tracking.variable import Variable

__all__ = ["SerializedGraph", "TensorsByTrackable", "serialize_graph"]


class TensorsByTrackable:
    """``{trackable: {checkpoint_key: value}}`` keyed by identity (trackables may be unhashable
    or define ``__eq__``); what ``MultiDeviceSaver`` takes. ``None`` owns the object graph."""

    def __init__(self, pairs: list[tuple[Trackable | None, dict[str, Any]]] | None = None) -> None:
        self._pairs: list[tuple[Trackable | None, dict[str, Any]]] = pairs or []

    def add(self, trackable: Trackable | None, tensors: dict[str, Any]) -> None:
        self._pairs.append((trackable, tensors))

    def items(self) -> list[tuple[Trackable | None, dict[str, Any]]]:
        return list(self._pairs)

    def __iter__(self) -> Iterator[Trackable | None]:
        return (trackable for trackable, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def keys(self) -> list[str]:
        """Every checkpoint key, in data order."""
        return [key for _, tensors in self._pairs for key in tensors]


@dataclass(frozen=True, slots=True)
class SerializedGraph:
    """Everything one save writes, gathered from the live objects."""

    object_graph_bytes: bytes
    """The serialized ``TrackableObjectGraph`` (what is stored under the object graph key)."""
    tensors: TensorsByTrackable
    """Values by trackable and checkpoint key, the object graph last."""
    registered_savers: dict[str, dict[str, Trackable]]
    """``{saver name: {object path: trackable}}`` for registered savers."""
    objects: tuple[Trackable, ...]
    """Every node's object, by node id."""

    @property
    def object_graph_proto(self) -> TrackableObjectGraph:
        """The graph, ``has_checkpoint_values`` set on every node (parsed on each access)."""
        return TrackableObjectGraph.FromString(self.object_graph_bytes)


# -- the object graph's bytes ---------------------------------------------------------------
# ``TrackableObjectGraph`` serialized by hand, as protobuf does it (fields in number order,
# empty strings and zero ints left out): building one message per node, child and attribute
# costs more than the rest of a save of many small tensors. tests/test_graph_encoding.py
# pins the bytes against protobuf's own serialization.
_HAS_VALUES = (b"\x2a\x00", b"\x2a\x02\x08\x01")  # BoolValue field 5: false / true


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (strings, sub-messages)."""
    return tag + encode_varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8")) if text else b""


def _int(tag: bytes, value: int) -> bytes:
    return tag + encode_varint(value) if value else b""


# The varints below 128 (one byte), looked up rather than encoded: most lengths are small.
_SMALL = [bytes([n]) for n in range(128)]


def _varint(value: int) -> bytes:
    return _SMALL[value] if value < 128 else encode_varint(value)


def _child_ref(node_id: int, local_name: str) -> bytes:
    # Written out (no helper calls): one per edge of the graph.
    body = b"\x08" + encode_varint(node_id) if node_id else b""
    if local_name:
        name = local_name.encode("utf-8")
        size = len(name)
        body += b"\x12" + (_SMALL[size] if size < 128 else encode_varint(size)) + name
    size = len(body)
    return b"\x0a" + (_SMALL[size] if size < 128 else encode_varint(size)) + body


def _name_field(name: str) -> bytes:
    """Field 1 (name) of a ``SerializedTensor``; the few value names recur, so it is cached."""
    return _string(b"\x0a", name)


def _attribute(name_field: bytes, full_name: str, key: str) -> bytes:
    # Written out (no helper calls): one per value of the checkpoint.
    body = name_field
    if full_name:
        data = full_name.encode("utf-8")
        body += b"\x12" + _varint(len(data)) + data
    if key:
        data = key.encode("utf-8")
        body += b"\x1a" + _varint(len(data)) + data
    return b"\x12" + _varint(len(body)) + body


def _slot_ref(variable_id: int, slot_name: str, slot_id: int) -> bytes:
    return _field(
        b"\x1a", _int(b"\x08", variable_id) + _string(b"\x12", slot_name) + _int(b"\x18", slot_id)
    )


def _has_checkpoint_values(edges: list[list[int]], marked: list[bool]) -> list[bool]:
    """``marked`` (nodes with values, slots or a registered saver) spread to all ancestors.

    A node is set when one of its children is, until nothing changes; nodes are visited
    deepest first (breadth-first ids: children mostly after their parents), so a tree takes
    one pass, and only unset nodes with children are visited at all.
    """
    pending = [node for node, child_ids in enumerate(edges) if child_ids and not marked[node]]
    pending.reverse()
    changed = True
    while changed and pending:
        changed = False
        still = []
        for node in pending:
            if any(map(marked.__getitem__, edges[node])):
                marked[node] = changed = True
            else:
                still.append(node)
        pending = still
    return marked


def serialize_graph(
    view: ObjectGraphView,
    *,
    registered_saver_for: Callable[[Trackable], str | None] | None = None,
) -> SerializedGraph:
    """Gather every node's values and build the object graph.

    Args:
        view: the graph to save.
        registered_saver_for: returns the registered saver name handling an object, or None
            (``trackpoint.saving.get_registered_saver_name``); None: no registered savers.

    Raises:
        NotImplementedError: a reachable object is a ``NotTrackable`` (semantics A7).
        InvalidArgumentError: a container cannot be saved ("Unable to save", B12), or holds
            a value that is neither trackable nor plain (names its path).
        FailedPreconditionError: a value no longer exists (a deleted jax array).
    """
    reuse: _Reuse | None = view.save_reuse
    view.save_reuse = None
    if reuse is not None and registered_saver_for is None:
        graph = reuse.serialize()
        if graph is not None:
            view.save_reuse = reuse
            return graph
    return _serialize_walk(view, registered_saver_for)


def _serialize_walk(
    view: ObjectGraphView, registered_saver_for: Callable[[Trackable], str | None] | None
) -> SerializedGraph:
    """``serialize_graph`` from a new walk; leaves a :class:`_Reuse` on ``view`` when it can."""
    walk = walk_graph(view)
    check_slot_variables_reachable(walk)
    objects = walk.objects
    count = len(objects)
    reusable = registered_saver_for is None  # slot owners turn it off below
    # Variables without children take the bulk path (below); every other node this loop.
    bulk = _plain_variables(walk) if registered_saver_for is None else []
    if bulk:
        in_bulk = set(bulk)
        others = [index for index in range(count) if index not in in_bulk]
    else:
        others = list(range(count))
    pairs: list[Any] = [None] * count  # (trackable, {key: value}) of nodes with values
    plan_at: list[Any] = [None] * count
    checks: list[tuple[int, str]] = []
    registered: dict[str, dict[str, Trackable]] = {}
    bodies: list[bytes] = [b""] * count  # fields 1-4 of each node; a bulk node's whole encoding
    edges: list[list[int]] = [_NO_EDGES] * count
    marked: list[bool] = [True] * count  # bulk nodes have a value
    node_ids, names, children = walk.node_ids, walk.names, walk.children
    # value name -> (escaped, its encoded name field): a few names recur
    escaped_names: dict[str, tuple[str, bytes]] = {}
    # type -> (NotTrackable, SaveChecked, SlotOwner, has values, Variable): asked once per type
    kinds: dict[type, tuple[bool, bool, bool, bool, bool]] = {}
    for index in others:
        obj = objects[index]
        kind = kinds.get(type(obj))
        if kind is None:
            kind = kinds[type(obj)] = (
                isinstance(obj, NotTrackable), isinstance(obj, SaveChecked),
                isinstance(obj, SlotOwner), has_values_of(obj), isinstance(obj, Variable),
            )  # fmt: skip
        not_trackable, save_checked, slot_owner, with_values, variable = kind
        if not_trackable:
            path = walk.paths.get(id(obj))
            where = readable_path(path) if path is not None else names[id(obj)]
            raise NotImplementedError(
                f"{where} is a {type(obj).__name__}, which opted out of checkpointing "
                "(NotTrackable); keep it out of the object graph (assign it through "
                "NoDependency) to save this checkpoint"
            )
        if save_checked:
            # A container's entries that are neither trackable nor plain, a deleted jax
            # array: an error naming the value, never a value silently left out (issue 13).
            path = walk.paths.get(id(obj))
            where = readable_path(path) if path is not None else names[id(obj)]
            obj._check_saveable(where)  # type: ignore[attr-defined]
            checks.append((index, where))
        if slot_owner:
            reusable = False  # its slots are not part of the structure a snapshot checks
        refs = children[index] if index < len(children) else []
        if refs:
            child_ids = list(map(node_ids.__getitem__, map(id, map(_REFERENT, refs))))
            parts = [_child_refs(child_ids, list(map(_LOCAL_NAME, refs)))]
        else:  # a leaf, most nodes of a large model
            child_ids, parts = [], []
        slots = walk.slot_refs.get(id(obj), ())
        if slots:
            parts += [_slot_ref(*slot) for slot in slots]  # field 3 follows the attributes
        object_name = names[id(obj)]
        saver_name = registered_saver_for(obj) if registered_saver_for is not None else None
        has_values = False
        if saver_name:
            registered.setdefault(saver_name, {})[object_name] = obj
            parts.append(
                _field(b"\x22", _string(b"\x0a", saver_name) + _string(b"\x12", object_name))
            )
            has_values = True
        elif with_values:
            values: dict[str, Any] = {}
            full_name = obj.name if variable else ""  # type: ignore[attr-defined]
            attributes = []
            live = obj._serialize_to_tensors()
            for value_name, value in live.items():
                known = escaped_names.get(value_name)
                if known is None:
                    escaped = escape_local_name(value_name)
                    known = escaped_names[value_name] = (escaped, _name_field(escaped))
                escaped, name_field = known
                key = f"{object_name}/{OBJECT_ATTRIBUTES_NAME}/{escaped}"  # checkpoint_key()
                attributes.append(_attribute(name_field, full_name, key))
                values[key] = value
            pairs[index] = (obj, values)
            plan_at[index] = (index, tuple(live), tuple(values))
            has_values = bool(attributes)
            # Field order: children (1), attributes (2), slot variables (3).
            parts[1 if refs else 0 : 1 if refs else 0] = attributes
        bodies[index] = b"".join(parts)
        edges[index] = child_ids
        marked[index] = has_values or bool(slots)
    if bulk:
        _serialize_variables(bulk, objects, names, bodies, pairs, plan_at)
    flags = _has_checkpoint_values(edges, marked)
    for index in others:
        bodies[index] = _node(bodies[index], flags[index])
    graph = b"".join(bodies)  # the bulk variables' nodes are whole already
    tensors = TensorsByTrackable([pair for pair in pairs if pair is not None])
    tensors.add(None, {OBJECT_GRAPH_KEY: string_scalar(graph)})
    # The first save of a view lends nothing: many views are saved once (a Checkpoint made
    # for one write), and the snapshot costs about a tenth of the walk. From the second on,
    # the view is being saved again and again (a training loop).
    view.save_walks += 1
    if reusable and view.save_walks > 1:
        snapshot = StructureSnapshot.capture(view, walk.objects, walk.children)
        if snapshot is not None:
            plan = [step for step in plan_at if step is not None]
            view.save_reuse = _Reuse(snapshot, graph, plan, checks)
    return SerializedGraph(graph, tensors, registered, tuple(walk.objects))


_NO_EDGES: list[int] = []  # shared by every leaf; never mutated
_LOCAL_NAME = operator.itemgetter(0)  # TrackableReference.name
_REFERENT = operator.itemgetter(1)  # TrackableReference.ref
_VALUE_OF = operator.attrgetter("_value")  # Variable's array
_NAME_OF = operator.attrgetter("_name")  # Variable.name
_KIND_OF = operator.attrgetter("_value.dtype.kind")
_VARIABLE_NAMES = (VARIABLE_VALUE_KEY,)  # what Variable._serialize_to_tensors names
_SEPARATOR = "\x00"  # joins texts to encode them in one call


def _node(body: bytes, has_values: bool) -> bytes:
    """One ``TrackableObject`` as field 1 of the graph: its fields 1-4, then field 5."""
    return _field(b"\x0a", body + _HAS_VALUES[has_values])


def _plain_variables(walk: GraphWalk) -> list[int]:
    """Node ids of the :class:`Variable` nodes (exactly that class) without children whose
    value ``Variable._serialize_to_tensors`` returns as it is: the bulk of a large model."""
    objects, children = walk.objects, walk.children
    listed = len(children)
    found = [
        index for index, kind in enumerate(map(type, objects))
        if kind is Variable and (index >= listed or not children[index])
    ]
    variables = list(map(objects.__getitem__, found))
    if "T" in set(map(_KIND_OF, variables)):  # StringDType: saved as an object array
        found = [index for index, kind in zip(found, map(_KIND_OF, variables)) if kind != "T"]
    return found


def _serialize_variables(
    bulk: list[int],
    objects: list[Trackable],
    names: dict[int, str],
    nodes: list[bytes],
    pairs: list[Any],
    plan_at: list[Any],
) -> None:
    """What the loop of ``_serialize_walk`` does for each plain variable, one pass per list:
    its value under ``<object path>/.ATTRIBUTES/VARIABLE_VALUE`` and its whole encoded node
    (one attribute, ``has_checkpoint_values`` true), as ``_attribute`` and ``_node`` write it."""
    variables = list(map(objects.__getitem__, bulk))
    escaped = escape_local_name(VARIABLE_VALUE_KEY)
    suffix = f"/{OBJECT_ATTRIBUTES_NAME}/{escaped}"  # checkpoint_key()
    keys = list(map(operator.add, map(names.__getitem__, map(id, variables)), repeat(suffix)))
    name_field = _name_field(escaped)
    # Fields 1 and 2 (name, full_name) of the SerializedTensor, per distinct variable name.
    heads: dict[str, bytes] = {}
    for full_name in set(map(_NAME_OF, variables)):
        data = full_name.encode("utf-8")
        heads[full_name] = name_field + (b"\x12" + _varint(len(data)) + data if full_name else b"")
    head_of = list(map(heads.__getitem__, map(_NAME_OF, variables)))
    encoded = _encode_all(keys)
    sizes = list(map(len, encoded))
    # Everything before the key's bytes, per distinct (head, key size): a few in all.
    before: dict[tuple[bytes, int], bytes] = {}
    for head, size in set(zip(head_of, sizes)):
        body_size = len(head) + 1 + len(_varint(size)) + size  # the SerializedTensor
        node_size = 1 + len(_varint(body_size)) + body_size + len(_HAS_VALUES[True])
        before[head, size] = (
            b"\x0a" + _varint(node_size) + b"\x12" + _varint(body_size) + head + b"\x1a"
            + _varint(size)
        )  # fmt: skip
    starts = map(before.__getitem__, zip(head_of, sizes))
    encoded_nodes = map(operator.add, map(operator.add, starts, encoded), repeat(_HAS_VALUES[True]))
    values = map(_VALUE_OF, variables)
    new_pairs = zip(variables, map(dict, zip(zip(keys, values))))  # (variable, {key: value})
    steps = zip(bulk, repeat(_VARIABLE_NAMES), zip(keys))  # as _Reuse plans each
    if bulk[-1] - bulk[0] + 1 == len(bulk):  # one run of nodes (ascending, distinct): slices
        where = slice(bulk[0], bulk[-1] + 1)
        nodes[where], pairs[where], plan_at[where] = encoded_nodes, new_pairs, steps
        return
    for index, node, pair, step in zip(bulk, encoded_nodes, new_pairs, steps):
        nodes[index], pairs[index], plan_at[index] = node, pair, step


def _encode_all(texts: list[str]) -> list[bytes]:
    """Each of ``texts`` in UTF-8 (one encode call when no text holds the separator)."""
    joined = _SEPARATOR.join(texts)
    if joined.count(_SEPARATOR) != len(texts) - 1:
        return [text.encode("utf-8") for text in texts]
    return joined.encode("utf-8").split(_SEPARATOR.encode("utf-8"))


def _child_refs(child_ids: list[int], local_names: list[str]) -> bytes:
    """Field 1 of a node: ``_child_ref`` of each child, in order (one pass per list for a
    node with many children)."""
    if len(child_ids) < 16 or 0 in child_ids or "" in local_names:
        return b"".join(map(_child_ref, child_ids, local_names))
    encoded = _encode_all(local_names)
    sizes = list(map(len, encoded))
    ids = _varints(child_ids)
    body_sizes = list(map(operator.add, map(len, ids), map(operator.add, repeat(3), sizes)))
    if max(body_sizes) >= 128:  # long names: lengths of two bytes
        return b"".join(map(_child_ref, child_ids, local_names))
    small = _SMALL.__getitem__
    return b"".join(
        chain.from_iterable(
            zip(
                repeat(b"\x0a"), map(small, body_sizes), repeat(b"\x08"), ids,
                repeat(b"\x12"), map(small, sizes), encoded,
            )
        )
    )  # fmt: skip


def _varints(values: list[int]) -> list[bytes]:
    """``encode_varint`` of each of ``values`` (non-negative), in one numpy pass."""
    array = np.fromiter(values, np.int64, len(values))
    sizes = varint_sizes(array)
    width = int(sizes.max()) if len(values) else 1
    data = varint_bytes(array, sizes, width).tobytes()
    starts = np.arange(0, len(values) * width, width)
    return list(map(data.__getitem__, map(slice, starts.tolist(), (starts + sizes).tolist())))


class _Reuse:
    """What one save of a view lends the next: the encoded graph and every value's key.

    Valid while the structure snapshot says nothing changed and each object still names the
    same values; the values themselves and the containers' save checks are taken anew.
    """

    __slots__ = ("_checks", "_graph", "_plan", "_snapshot")

    def __init__(
        self,
        snapshot: StructureSnapshot,
        graph: bytes,
        plan: list[tuple[int, tuple[str, ...], tuple[str, ...]]],
        checks: list[tuple[int, str]],
    ) -> None:
        self._snapshot = snapshot
        self._graph = graph
        self._plan = plan  # (node, value names, their checkpoint keys), in data order
        self._checks = checks  # (node, readable path) of containers with save checks

    def serialize(self) -> SerializedGraph | None:
        """The graph of a save now, or None if anything it depends on changed."""
        objects = self._snapshot.unchanged()
        if objects is None:
            return None
        for index, where in self._checks:
            objects[index]._check_saveable(where)  # type: ignore[attr-defined]
        pairs: list[tuple[Trackable | None, dict[str, Any]]] = []
        append = pairs.append
        for index, names, keys in self._plan:
            obj = objects[index]
            live = obj._serialize_to_tensors()
            if len(names) == 1:  # one value (a variable): the usual case
                value = live.get(names[0], _ABSENT)
                if value is _ABSENT or len(live) != 1:
                    return None
                append((obj, {keys[0]: value}))
            elif tuple(live) == names:
                append((obj, dict(zip(keys, live.values()))))
            else:
                return None
        append((None, {OBJECT_GRAPH_KEY: string_scalar(self._graph)}))
        return SerializedGraph(self._graph, TensorsByTrackable(pairs), {}, tuple(objects))


_ABSENT = object()

