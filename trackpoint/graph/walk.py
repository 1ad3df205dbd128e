"""Walking the object graph: node ids, local names, checkpoint keys and the object-graph proto.

From the root, breadth first (tf-checkpoint-format.md §9.2): children in each object's child
order, an object reached twice keeps its first id and path, and slot variables come after all
other nodes (per optimizer × slot name × variable, each in node order). Keys follow §9.3:
local names escaped (``.`` → ``..``, ``/`` → ``.S``) and joined with ``/``, then
``/.ATTRIBUTES/<escaped value name>``.

Saving gets a :class:`SerializedGraph`: the values of every node keyed by checkpoint key, the
``TrackableObjectGraph`` proto (stored last, as a scalar string under
``_CHECKPOINTABLE_OBJECT_GRAPH``, like TF's data order §5.4) and the objects handled by
registered savers. Custom value names are escaped once, in the attribute and in the key: TF
escapes the key twice and then cannot restore its own file (§9.3 quirk); the once-escaped key is
the one TF's restore looks up, so both libraries read ours.
"""

from __future__ import annotations

import collections
import copy
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.table import encode_varint
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.graph.keys import (
    OBJECT_ATTRIBUTES_NAME,
    OBJECT_GRAPH_KEY,
    escape_local_name,
    slot_variable_key,
)
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import NotTrackable, Trackable, TrackableReference
from trackpoint.tracking.base import has_values as has_values_of
from trackpoint.tracking.python_state import string_scalar
from trackpoint.tracking.save_check import SaveChecked
from trackpoint.tracking.slots import SlotOwner
from trackpoint.tracking.variable import Variable

__all__ = [
    "ObjectGraphView",
    "SerializedGraph",
    "TensorsByTrackable",
    "list_objects",
    "node_names",
    "object_path_to_string",
    "parse_object_graph",
    "readable_path",
    "serialize_graph",
]

_Proto = TrackableObjectGraph.TrackableObject


def object_path_to_string(path: Sequence[TrackableReference]) -> str:
    """The object path of a node: escaped local names from the root joined by ``/``."""
    return "/".join(escape_local_name(ref.name) for ref in path)


def readable_path(path: Sequence[TrackableReference]) -> str:
    """``(root).model.dense.kernel``: unescaped local names, as in TF's messages."""
    return ".".join(["(root)", *(ref.name for ref in path)])


def _deepcopy_ref(obj: Any, memo: dict[int, Any]) -> Any:
    """A deep copy of ``obj``; of its referent for a live weakref, kept weak."""
    if isinstance(obj, weakref.ref):
        strong = obj()
        return weakref.ref(copy.deepcopy(strong, memo)) if strong is not None else obj
    return copy.deepcopy(obj, memo)


class ObjectGraphView:
    """The object graph seen from ``root``, plus dependencies attached to the root from outside.

    ``Checkpoint(root, **kwargs)`` attaches its keyword arguments (and later ``save_counter``)
    to the root's node without making them the root's own children.

    Args:
        root: the root trackable, or a ``weakref.ref`` to it (the view then does not keep the
            root alive).
        attached_dependencies: extra children of the root's node, in order; a reference may
            hold a ``weakref.ref`` (a dead one is skipped). The list is shared, not copied:
            appending to it later shows in the view.
    """

    def __init__(
        self,
        root: Trackable | weakref.ref[Trackable],
        attached_dependencies: list[TrackableReference] | None = None,
    ) -> None:
        self._root = root
        self._attached = attached_dependencies if attached_dependencies is not None else []

    @property
    def root(self) -> Trackable:
        """The root object.

        Raises:
            InvalidArgumentError: the root was held weakly and has been garbage-collected.
        """
        if isinstance(self._root, weakref.ref):
            root = self._root()
            if root is None:
                raise InvalidArgumentError(
                    "the checkpoint's root object (held through a weakref) no longer exists"
                )
            return root
        return self._root

    @property
    def attached_dependencies(self) -> list[TrackableReference]:
        return self._attached

    def __deepcopy__(self, memo: dict[int, Any]) -> ObjectGraphView:
        copied = ObjectGraphView.__new__(ObjectGraphView)
        memo[id(self)] = copied
        copied._root = _deepcopy_ref(self._root, memo)
        attached = [
            TrackableReference(ref.name, _deepcopy_ref(ref.ref, memo)) for ref in self._attached
        ]
        copied._attached = attached
        return copied

    def list_children(self, obj: Trackable) -> list[TrackableReference]:
        """Children of ``obj`` in child order (the root's attached dependencies last).

        Raises:
            InvalidArgumentError: a child is neither a Trackable nor adaptable.
        """
        children = []
        for name, child in obj._trackable_children().items():
            trackable = to_trackable(child)
            if trackable is None:
                raise InvalidArgumentError(
                    f"{type(obj).__name__}._trackable_children() returned {child!r} of type "
                    f"{type(child).__name__} under {name!r}, which is not trackable"
                )
            children.append(TrackableReference(name, trackable))
        root = self._root
        if obj is root or (isinstance(root, weakref.ref) and obj is self.root):
            for ref in self._attached:
                # A reference may hold a weakref (see the class docstring).
                held = ref.ref
                attached: Trackable | None = held() if isinstance(held, weakref.ref) else held
                if attached is not None:
                    children.append(TrackableReference(ref.name, attached))
        return children

    def breadth_first_traversal(
        self,
    ) -> tuple[list[Trackable], dict[int, tuple[TrackableReference, ...]]]:
        """Every reachable object in node order, and its path by ``id()``."""
        traversal = self._traverse()
        return traversal.objects, traversal.paths

    def _traverse(self) -> _Traversal:
        """The breadth-first walk, keeping each object's children and object path string."""
        root = self.root
        objects = [root]
        paths: dict[int, tuple[TrackableReference, ...]] = {id(root): ()}
        names: dict[int, str] = {id(root): ""}
        children: list[list[TrackableReference]] = []
        queue = collections.deque([root])
        plain = Trackable._trackable_children
        while queue:
            current = queue.popleft()
            if (
                current is not root
                and type(current)._trackable_children is plain
                and getattr(current, "_self_dependencies", None) == []
            ):  # a leaf such as a variable (most objects of a large model): nothing to list
                children.append([])
                continue
            refs = self.list_children(current)
            children.append(refs)
            base_path = paths[id(current)]
            base_name = names[id(current)]
            for ref in refs:
                child = ref.ref
                if id(child) not in paths:
                    paths[id(child)] = (*base_path, ref)
                    escaped = escape_local_name(ref.name)
                    names[id(child)] = f"{base_name}/{escaped}" if base_name else escaped
                    objects.append(child)
                    queue.append(child)
        return _Traversal(objects, paths, names, children)


@dataclass(slots=True)
class _Traversal:
    objects: list[Trackable]
    paths: dict[int, tuple[TrackableReference, ...]]
    names: dict[int, str]  # object path strings (object_path_to_string of the path)
    children: list[list[TrackableReference]]  # of objects[i], for the non-slot objects


class TensorsByTrackable:
    """``{trackable: {checkpoint_key: value}}`` keyed by identity (trackables may be unhashable
    or define ``__eq__``); what ``MultiDeviceSaver`` takes. ``None`` owns the object graph."""

    def __init__(self) -> None:
        self._pairs: list[tuple[Trackable | None, dict[str, Any]]] = []

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


@dataclass(slots=True)
class _Walk:
    objects: list[Trackable]
    paths: dict[int, tuple[TrackableReference, ...]]
    names: dict[int, str]
    node_ids: dict[int, int]
    children: list[list[TrackableReference]]
    # optimizer id -> (original variable node id, slot name, slot variable node id)
    slot_refs: dict[int, list[tuple[int, str, int]]]


def _walk(view: ObjectGraphView, *, skip_slot_variables: bool = False) -> _Walk:
    traversal = view._traverse()
    objects = traversal.objects
    node_ids = {id(obj): i for i, obj in enumerate(objects)}
    walk = _Walk(objects, traversal.paths, traversal.names, node_ids, traversal.children, {})
    if not skip_slot_variables:
        _add_slot_variables(walk)
    return walk


def _check_slot_variables_reachable(walk: _Walk) -> None:
    """Every variable an optimizer keeps state for is a node: else its value and its state
    would be left out of the checkpoint without a word (slots are saved only for variables
    the walk reaches, tf-checkpoint-format.md §9.2)."""
    for optimizer in walk.objects:
        if not isinstance(optimizer, SlotOwner):
            continue
        for description, variable in optimizer._slot_variables():
            trackable = to_trackable(variable)
            if trackable is not None and id(trackable) in walk.node_ids:
                continue
            path = readable_path(walk.paths[id(optimizer)])
            raise InvalidArgumentError(
                f"{path} holds {description}, which is not reachable from the checkpoint's "
                "root: its value and its optimizer state would not be saved. Add the module "
                "or tensor that owns it to the checkpoint (e.g. tp.Checkpoint(model=model, "
                "optimizer=optimizer, extra=tensor)), or remove it from the optimizer."
            )


def _add_slot_variables(walk: _Walk) -> None:
    """Append slot variables after the BFS nodes (§9.2) and record their references."""
    non_slot = list(walk.objects)
    for optimizer in non_slot:
        if not isinstance(optimizer, SlotOwner):
            continue
        for slot_name in optimizer.get_slot_names():
            for variable_id, variable in enumerate(non_slot):
                slot = optimizer.get_slot(variable, slot_name)
                if slot is None:
                    continue
                if slot._trackable_children():
                    raise NotImplementedError(
                        f"slot {slot_name!r} of {readable_path(walk.paths[id(variable)])} has "
                        "children; only variables without dependencies can be slot variables"
                    )
                if id(slot) in walk.node_ids:
                    raise NotImplementedError(
                        f"slot {slot_name!r} of {readable_path(walk.paths[id(variable)])} is also "
                        "a regular dependency of a trackable; a slot variable may not be reused"
                    )
                walk.names[id(slot)] = slot_variable_key(
                    walk.names[id(variable)], walk.names[id(optimizer)], slot_name
                )
                walk.node_ids[id(slot)] = len(walk.objects)
                walk.objects.append(slot)
                walk.slot_refs.setdefault(id(optimizer), []).append(
                    (variable_id, slot_name, walk.node_ids[id(slot)])
                )


def _full_name(trackable: Trackable) -> str:
    return trackable.name if isinstance(trackable, Variable) else ""


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


def _child_ref(node_id: int, local_name: str) -> bytes:
    # Written out (no helper calls): one per edge of the graph.
    body = b"\x08" + encode_varint(node_id) if node_id else b""
    if local_name:
        name = local_name.encode("utf-8")
        body += b"\x12" + encode_varint(len(name)) + name
    return b"\x0a" + encode_varint(len(body)) + body


def _name_field(name: str) -> bytes:
    """Field 1 (name) of a ``SerializedTensor``; the few value names recur, so it is cached."""
    return _string(b"\x0a", name)


def _attribute(name_field: bytes, full_name: str, key: str) -> bytes:
    # Written out (no helper calls): one per value of the checkpoint.
    body = name_field
    if full_name:
        data = full_name.encode("utf-8")
        body += b"\x12" + encode_varint(len(data)) + data
    if key:
        data = key.encode("utf-8")
        body += b"\x1a" + encode_varint(len(data)) + data
    return b"\x12" + encode_varint(len(body)) + body


def _slot_ref(variable_id: int, slot_name: str, slot_id: int) -> bytes:
    return _field(
        b"\x1a", _int(b"\x08", variable_id) + _string(b"\x12", slot_name) + _int(b"\x18", slot_id)
    )


def _has_checkpoint_values(edges: list[list[int]], marked: list[bool]) -> list[bool]:
    """``marked`` (nodes with values, slots or a registered saver) spread to all ancestors."""
    parents: dict[int, list[int]] = {}
    for node_id, child_ids in enumerate(edges):
        for child in child_ids:
            parents.setdefault(child, []).append(node_id)
    queue = [i for i, flag in enumerate(marked) if flag]
    while queue:
        for parent in parents.pop(queue.pop(), ()):
            if not marked[parent]:
                marked[parent] = True
                queue.append(parent)
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
    walk = _walk(view)
    _check_slot_variables_reachable(walk)
    tensors = TensorsByTrackable()
    registered: dict[str, dict[str, Trackable]] = {}
    bodies: list[bytes] = []  # each node's fields 1-4
    edges: list[list[int]] = []
    marked: list[bool] = []
    node_ids, names, children = walk.node_ids, walk.names, walk.children
    # value name -> (escaped, its encoded name field): a few names recur
    escaped_names: dict[str, tuple[str, bytes]] = {}
    for index, obj in enumerate(walk.objects):
        if isinstance(obj, NotTrackable):
            path = walk.paths.get(id(obj))
            where = readable_path(path) if path is not None else names[id(obj)]
            raise NotImplementedError(
                f"{where} is a {type(obj).__name__}, which opted out of checkpointing "
                "(NotTrackable); keep it out of the object graph (assign it through "
                "NoDependency) to save this checkpoint"
            )
        if isinstance(obj, SaveChecked):
            # A container's entries that are neither trackable nor plain, a deleted jax
            # array: an error naming the value, never a value silently left out (issue 13).
            path = walk.paths.get(id(obj))
            obj._check_saveable(readable_path(path) if path is not None else names[id(obj)])
        refs = children[index] if index < len(children) else []
        if refs:
            child_ids = [node_ids[id(ref.ref)] for ref in refs]
            parts = [_child_ref(i, ref.name) for i, ref in zip(child_ids, refs)]
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
        elif has_values_of(obj):
            values: dict[str, Any] = {}
            full_name = _full_name(obj)
            attributes = []
            for value_name, value in obj._serialize_to_tensors().items():
                known = escaped_names.get(value_name)
                if known is None:
                    escaped = escape_local_name(value_name)
                    known = escaped_names[value_name] = (escaped, _name_field(escaped))
                escaped, name_field = known
                key = f"{object_name}/{OBJECT_ATTRIBUTES_NAME}/{escaped}"  # checkpoint_key()
                attributes.append(_attribute(name_field, full_name, key))
                values[key] = value
            tensors.add(obj, values)
            has_values = bool(attributes)
            # Field order: children (1), attributes (2), slot variables (3).
            parts[len(refs) : len(refs)] = attributes
        bodies.append(b"".join(parts))
        edges.append(child_ids)
        marked.append(has_values or bool(slots))
    flags = _has_checkpoint_values(edges, marked)
    graph = b"".join(
        _field(b"\x0a", body + _HAS_VALUES[flag]) for body, flag in zip(bodies, flags)
    )
    tensors.add(None, {OBJECT_GRAPH_KEY: string_scalar(graph)})
    return SerializedGraph(graph, tensors, registered, tuple(walk.objects))


def list_objects(root: Any, *, skip_slot_variables: bool = False) -> list[Trackable]:
    """Every object a checkpoint of ``root`` would save, in node order (slot variables last).

    Args:
        root: a Trackable, an adaptable object (e.g. a numpy array) or an ``ObjectGraphView``.

    Raises:
        InvalidArgumentError: ``root`` is not trackable.
    """
    if isinstance(root, ObjectGraphView):
        view = root
    else:
        trackable = to_trackable(root)
        if trackable is None:
            raise InvalidArgumentError(
                f"list_objects() needs a trackable root, got {type(root).__name__}"
            )
        view = ObjectGraphView(trackable)
    return _walk(view, skip_slot_variables=skip_slot_variables).objects


def node_names(proto: TrackableObjectGraph) -> dict[int, str]:
    """Readable path of every node of a saved graph: ``(root).model.dense.kernel``, and
    ``(root).opt's state 'm' for (root).v`` for a slot variable (TF's message wording)."""
    paths: dict[int, tuple[str, ...]] = {0: ("(root)",)} if len(proto.nodes) else {}
    queue = collections.deque([0] if paths else [])
    while queue:
        node_id = queue.popleft()
        for child in proto.nodes[node_id].children:
            if child.node_id not in paths and 0 <= child.node_id < len(proto.nodes):
                paths[child.node_id] = (*paths[node_id], child.local_name)
                queue.append(child.node_id)
    names = {node_id: ".".join(path) for node_id, path in paths.items()}
    for node_id, node in enumerate(proto.nodes):
        for slot in node.slot_variables:
            names[slot.slot_variable_node_id] = (
                f"{names.get(node_id, f'<node {node_id}>')}'s state '{slot.slot_name}' for "
                f"{names.get(slot.original_variable_node_id, '<unreachable variable>')}"
            )
    for node_id in range(len(proto.nodes)):
        names.setdefault(node_id, f"<unreachable node {node_id}>")
    return names


def parse_object_graph(data: bytes, *, prefix: str = "") -> TrackableObjectGraph:
    """The ``TrackableObjectGraph`` serialized in ``data`` (the value of ``OBJECT_GRAPH_KEY``).

    Raises:
        DataLossError: the bytes do not parse (names ``prefix``, the checkpoint they came from).
    """
    graph = TrackableObjectGraph()
    try:
        graph.ParseFromString(data)
    except DecodeError as exc:
        raise DataLossError(
            f"The object graph in {prefix} does not parse ({exc})",
            path=prefix,
            key=OBJECT_GRAPH_KEY,
        ) from exc
    return graph
