"""Walking the object graph: node ids, local names and checkpoint keys.

From the root, breadth first (tf-checkpoint-format.md §9.2): children in each object's child
order, an object reached twice keeps its first id and path, and slot variables come after all
other nodes (per optimizer × slot name × variable, each in node order). Keys follow §9.3:
local names escaped (``.`` → ``..``, ``/`` → ``.S``) and joined with ``/``, then
``/.ATTRIBUTES/<escaped value name>``.

``serialize.py`` turns a walk into what a save writes.
"""

from __future__ import annotations

import collections
import copy
import operator
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from google.protobuf.message import DecodeError

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.errors import DataLossError, InvalidArgumentError
from trackpoint.graph.keys import OBJECT_GRAPH_KEY, escape_local_name, slot_variable_key
from trackpoint.graph.node_refs import check_node_references
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable, TrackableReference
from trackpoint.tracking.slots import SlotOwner

__all__ = [
    "GraphWalk",
    "ObjectGraphView",
    "check_slot_variables_reachable",
    "list_objects",
    "node_names",
    "object_path_to_string",
    "parse_object_graph",
    "readable_path",
    "slots_of",
    "walk_graph",
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
        # What the last save of this view lends the next one while the structure holds, and
        # how many saves walked it (graph/serialize.py, graph/save_replay.py).
        self.save_replay: Any = None
        self.save_walks = 0

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
        copied.save_replay = None
        copied.save_walks = 0
        return copied

    def list_children(self, obj: Trackable) -> list[TrackableReference]:
        """Children of ``obj`` in child order (the root's attached dependencies last).

        Raises:
            InvalidArgumentError: a child is neither a Trackable nor adaptable.
        """
        named = obj._trackable_children()
        if all(issubclass(kind, Trackable) for kind in set(map(type, named.values()))):
            # Every child is a Trackable already (a container of 100,000 variables): the
            # references are built in C (a NamedTuple's __new__ is a Python function).
            children = list(map(tuple.__new__, repeat(TrackableReference), named.items()))
        else:
            children = []
            for name, child in named.items():
                trackable = to_trackable(child)
                if trackable is None:
                    raise InvalidArgumentError(
                        f"{type(obj).__name__}._trackable_children() returned {child!r} of "
                        f"type {type(child).__name__} under {name!r}, which is not trackable"
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
        add_children = children.append
        plain = Trackable._trackable_children
        # The queue is `objects` itself: breadth first, each object is appended once.
        index = 0
        while index < len(objects):
            current = objects[index]
            index += 1
            if (
                current is not root
                and type(current)._trackable_children is plain
                and not getattr(current, "_self_dependencies", None)
            ):  # a leaf such as a variable (most objects of a large model): nothing to list
                add_children(_NO_CHILDREN)
                continue
            refs = self.list_children(current)
            add_children(refs)
            if refs:
                _add_new_children(refs, paths[id(current)], names[id(current)], objects, paths,
                                  names)  # fmt: skip
        return _Traversal(objects, paths, names, children)


_NO_CHILDREN: list[TrackableReference] = []  # shared by every leaf; never mutated
_LOCAL_NAME = operator.itemgetter(0)  # TrackableReference.name
_REFERENT = operator.itemgetter(1)  # TrackableReference.ref
_SEPARATOR = "\x00"  # joins local names to escape them in one call


def _add_new_children(
    refs: list[TrackableReference],
    base_path: tuple[TrackableReference, ...],
    base_name: str,
    objects: list[Trackable],
    paths: dict[int, tuple[TrackableReference, ...]],
    names: dict[int, str],
) -> None:
    """Append the children in ``refs`` not seen before to the walk, with their paths and
    object path strings; a child reached twice keeps its first path."""
    ids = list(map(id, map(_REFERENT, refs)))
    local_names = list(map(_LOCAL_NAME, refs))
    joined = _SEPARATOR.join(local_names)
    if (
        len(refs) < 16
        or joined.count(_SEPARATOR) != len(refs) - 1  # a name holds the separator
        or not paths.keys().isdisjoint(ids)
        or len(set(ids)) != len(ids)
    ):
        for child_id, ref in zip(ids, refs):
            if child_id not in paths:
                paths[child_id] = (*base_path, ref)
                escaped = escape_local_name(ref.name)
                names[child_id] = f"{base_name}/{escaped}" if base_name else escaped
                objects.append(ref.ref)
        return
    # Many children, all new and distinct (a large container): the same, one pass per list.
    # Escaping only replaces "." and "/", so the joined names escape as each name would.
    escaped_names = escape_local_name(joined).split(_SEPARATOR)
    if base_name:
        escaped_names = list(map(operator.add, repeat(base_name + "/"), escaped_names))
    paths.update(zip(ids, map(operator.add, repeat(base_path), zip(refs))))
    names.update(zip(ids, escaped_names))
    objects.extend(map(_REFERENT, refs))


@dataclass(slots=True)
class _Traversal:
    objects: list[Trackable]
    paths: dict[int, tuple[TrackableReference, ...]]
    names: dict[int, str]  # object path strings (object_path_to_string of the path)
    children: list[list[TrackableReference]]  # of objects[i], for the non-slot objects


@dataclass(slots=True)
class GraphWalk:
    """One walk of a view: every node (slot variables last), its path, name and id."""

    objects: list[Trackable]
    paths: dict[int, tuple[TrackableReference, ...]]
    names: dict[int, str]
    node_ids: dict[int, int]
    children: list[list[TrackableReference]]
    # optimizer id -> (original variable node id, slot name, slot variable node id)
    slot_refs: dict[int, list[tuple[int, str, int]]]


def walk_graph(view: ObjectGraphView, *, skip_slot_variables: bool = False) -> GraphWalk:
    traversal = view._traverse()
    objects = traversal.objects
    node_ids = dict(zip(map(id, objects), range(len(objects))))
    walk = GraphWalk(objects, traversal.paths, traversal.names, node_ids, traversal.children, {})
    if not skip_slot_variables:
        _add_slot_variables(walk)
    return walk


def check_slot_variables_reachable(walk: GraphWalk) -> None:
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
                "root: its value (and any optimizer state) would not be saved. Add the module "
                "or tensor that owns it to the checkpoint (e.g. tp.Checkpoint(model=model, "
                "optimizer=optimizer, extra=tensor)), or remove it from the optimizer."
            )


def slots_of(
    optimizer: SlotOwner, non_slot: Sequence[Trackable]
) -> Iterator[tuple[int, str, Trackable]]:
    """``(variable node, slot name, slot)`` of every slot ``optimizer`` keeps for a node of
    ``non_slot`` (the walk's nodes before the slot variables), in save order (§9.2): per slot
    name, the variables in node order. The walk and the replay of a save both ask this."""
    for slot_name in optimizer.get_slot_names():
        for variable_id, variable in enumerate(non_slot):
            slot = optimizer.get_slot(variable, slot_name)
            if slot is not None:
                yield variable_id, slot_name, slot


def _add_slot_variables(walk: GraphWalk) -> None:
    """Append slot variables after the BFS nodes (§9.2) and record their references."""
    non_slot = list(walk.objects)
    for optimizer in non_slot:
        if not isinstance(optimizer, SlotOwner):
            continue
        for variable_id, slot_name, slot in slots_of(optimizer, non_slot):
            variable = non_slot[variable_id]
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
    return walk_graph(view, skip_slot_variables=skip_slot_variables).objects


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
    """The ``TrackableObjectGraph`` serialized in ``data`` (the value of ``OBJECT_GRAPH_KEY``),
    its node references checked (:func:`check_node_references`): every reader of a saved
    graph gets it from here, so none indexes ``nodes`` with an id the file made up.

    Raises:
        DataLossError: the bytes do not parse, or a reference names a node the graph lacks
            (names ``prefix``, the checkpoint they came from).
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
    check_node_references(data, graph, prefix=prefix)
    return graph
