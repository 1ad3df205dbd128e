"""Serializing the object graph for a save: every node's values and the ``TrackableObjectGraph``.

Saving gets a :class:`SerializedGraph`: the values of every node keyed by checkpoint key, the
``TrackableObjectGraph`` proto (stored last, as a scalar string under
``_CHECKPOINTABLE_OBJECT_GRAPH``, like TF's data order §5.4) and the objects handled by
registered savers. Custom value names are escaped once, in the attribute and in the key: TF
escapes the key twice and then cannot restore its own file (§9.3 quirk); the once-escaped key is
the one TF's restore looks up, so both libraries read ours.

One walk serializes every object the same way, batch first: the nodes are grouped by class and
each class's values are asked of its batch hook, ``_serialize_many`` (a per-object default maps
over ``_serialize_to_tensors``). Leaves of a class whose nodes all save the same value names (its
declared ``_whole_value_names``, or found so in what its objects returned) are encoded together
(:func:`~trackpoint.graph.graph_bytes.encode_alike_leaves`); whatever the class.

A view saved again (a training loop) replays the previous save's node ids, keys and encoded
graph while its structure is exactly as it was (:mod:`trackpoint.graph.save_replay`); the values
themselves are always gathered anew, from the objects reachable at the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import add, attrgetter, is_, itemgetter, not_
from typing import Any

from trackpoint.graph.graph_bytes import (
    attribute,
    child_refs,
    encode_alike_leaves,
    field,
    has_checkpoint_values,
    name_field,
    node,
    slot_ref,
    string,
)
from trackpoint.graph.keys import OBJECT_ATTRIBUTES_NAME, OBJECT_GRAPH_KEY, escape_local_name
from trackpoint.graph.save_replay import SaveReplay, ValueGroup, place, serialize_many
from trackpoint.graph.serialized import SerializedGraph, TensorsByTrackable
from trackpoint.graph.walk import (
    GraphWalk,
    ObjectGraphView,
    check_slot_variables_reachable,
    readable_path,
    walk_graph,
)
from trackpoint.tracking.base import NotTrackable, Trackable, TrackableReference, batch_hook
from trackpoint.tracking.python_state import string_scalar
from trackpoint.tracking.save_check import SaveChecked
from trackpoint.tracking.variable import Variable

__all__ = ["SerializedGraph", "TensorsByTrackable", "serialize_graph"]


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
    replay: SaveReplay | None = view.save_replay
    view.save_replay = None
    if replay is not None and registered_saver_for is None:
        graph = replay.serialize()
        if graph is not None:
            view.save_replay = replay
            return graph
    return _serialize_walk(view, registered_saver_for)


_NO_EDGES: list[int] = []  # shared by every leaf; never mutated
_NO_REFS: list[TrackableReference] = []
_LOCAL_NAME = itemgetter(0)  # TrackableReference.name
_REFERENT = itemgetter(1)  # TrackableReference.ref
_FULL_NAME = attrgetter("name")  # Variable.name: the attributes' full_name


def _serialize_walk(
    view: ObjectGraphView, registered_saver_for: Callable[[Trackable], str | None] | None
) -> SerializedGraph:
    """``serialize_graph`` from a new walk; leaves a :class:`SaveReplay` on ``view`` when it can."""
    walk = walk_graph(view)
    check_slot_variables_reachable(walk)
    objects, names, children = walk.objects, walk.names, walk.children
    count, listed = len(objects), len(children)
    classes = _by_class(objects)
    checks = _check_nodes(walk, classes)
    registered: dict[str, dict[str, Trackable]] = {}
    saver_of: dict[int, str] = {}  # node -> the registered saver that writes it
    if registered_saver_for is not None:
        for index, obj in enumerate(objects):
            saver_name = registered_saver_for(obj)
            if saver_name:
                saver_of[index] = saver_name
                registered.setdefault(saver_name, {})[names[id(obj)]] = obj
    owners = {walk.node_ids[owner] for owner in walk.slot_refs}
    # A leaf: no children, no slot references (the alike leaves' nodes are written whole).
    leaf = [*map(not_, children), *repeat(True, count - listed)]
    for index in owners:
        leaf[index] = False
    nodes: list[bytes] = [b""] * count  # fields 1-4 of each node; an alike leaf's whole node
    whole = [False] * count  # nodes[i] is the whole encoded node
    attributes: list[Any] = [None] * count  # (keys, name fields, full name) of other nodes
    pairs: list[Any] = [None] * count  # (trackable, {key: value}) of nodes with values
    groups: list[ValueGroup] = []
    for cls, members in classes:
        if cls._serialize_to_tensors is Trackable._serialize_to_tensors:
            continue  # saves no values of its own
        if saver_of:
            members = [index for index in members if index not in saver_of]
            if not members:
                continue
        group, found = _values(cls, members, objects, names)
        groups.append(group)
        place(pairs, members, found)
        full_names = list(map(_FULL_NAME, map(objects.__getitem__, members))) if issubclass(
            cls, Variable
        ) else None  # fmt: skip
        _encode_group(group, full_names, leaf, nodes, whole, attributes)
    edges: list[list[int]] = [_NO_EDGES] * count
    marked = whole[:]  # nodes with values, slots or a registered saver
    node_ids, slot_refs = walk.node_ids, walk.slot_refs
    others = list(compress(range(count), map(not_, whole)))
    for index in others:
        obj = objects[index]
        refs = children[index] if index < listed else _NO_REFS
        parts: list[bytes] = []
        if refs:
            child_ids = list(map(node_ids.__getitem__, map(id, map(_REFERENT, refs))))
            parts.append(child_refs(child_ids, list(map(_LOCAL_NAME, refs))))
            edges[index] = child_ids
        own = attributes[index]
        if own is not None:
            keys, name_fields, full_name = own
            parts += map(attribute, name_fields, repeat(full_name), keys)  # field 2
            marked[index] = bool(keys)
        slots = slot_refs.get(id(obj), ())
        if slots:
            parts += [slot_ref(*slot) for slot in slots]  # field 3 follows the attributes
            marked[index] = True
        saver_name = saver_of.get(index)
        if saver_name:
            saver = string(b"\x0a", saver_name) + string(b"\x12", names[id(obj)])
            parts.append(field(b"\x22", saver))  # field 4: the registered saver
            marked[index] = True
        nodes[index] = b"".join(parts)
    flags = has_checkpoint_values(edges, marked)
    for index in others:
        nodes[index] = node(nodes[index], flags[index])
    graph = b"".join(nodes)
    tensors = TensorsByTrackable(list(filter(None, pairs)))
    tensors.add(None, {OBJECT_GRAPH_KEY: string_scalar(graph)})
    # The first save of a view lends nothing: many views are saved once (a Checkpoint made
    # for one write), and the fingerprint costs about a tenth of the walk. From the second on,
    # the view is being saved again and again (a training loop).
    view.save_walks += 1
    if registered_saver_for is None and view.save_walks > 1:
        view.save_replay = SaveReplay.capture(view, walk, graph, groups, checks)
    return SerializedGraph(graph, tensors, registered, tuple(objects))


def _by_class(objects: list[Trackable]) -> list[tuple[type[Trackable], list[int]]]:
    """The node ids of each class, classes in first-seen order, ids ascending."""
    kinds = list(map(type, objects))
    distinct = list(dict.fromkeys(kinds))
    if len(distinct) == 1:
        return [(distinct[0], list(range(len(objects))))]
    if len(distinct) <= 32:  # the usual few classes: one pass in C per class
        every = range(len(objects))
        return [(cls, list(compress(every, map(is_, kinds, repeat(cls))))) for cls in distinct]
    members: dict[type[Trackable], list[int]] = {}
    for index, kind in enumerate(kinds):
        members.setdefault(kind, []).append(index)
    return list(members.items())


def _check_nodes(
    walk: GraphWalk, classes: list[tuple[type[Trackable], list[int]]]
) -> list[tuple[int, str]]:
    """Refuse a ``NotTrackable`` node and run the save checks of ``SaveChecked`` ones, in node
    order; returns ``(node, readable path)`` of the checked ones (a replay checks them again)."""
    refused = {cls for cls, _ in classes if issubclass(cls, NotTrackable)}
    checked = {cls for cls, _ in classes if issubclass(cls, SaveChecked)}
    if not refused and not checked:
        return []
    special = sorted(i for cls, members in classes if cls in refused or cls in checked
                     for i in members)  # fmt: skip
    checks: list[tuple[int, str]] = []
    for index in special:
        obj = walk.objects[index]
        path = walk.paths.get(id(obj))
        where = readable_path(path) if path is not None else walk.names[id(obj)]
        if type(obj) in refused:
            raise NotImplementedError(
                f"{where} is a {type(obj).__name__}, which opted out of checkpointing "
                "(NotTrackable); keep it out of the object graph (assign it through "
                "NoDependency) to save this checkpoint"
            )
        # A container's entries that are neither trackable nor plain, a deleted jax array:
        # an error naming the value, never a value silently left out (issue 13).
        obj._check_saveable(where)  # type: ignore[attr-defined]
        checks.append((index, where))
    return checks


def _values(
    cls: type[Trackable], members: list[int], objects: list[Trackable], names: dict[int, str]
) -> tuple[ValueGroup, list[Any]]:
    """The values of the nodes ``members`` (of class ``cls``) and their keys, as a group.

    The value names of the whole class come from its declared ``_whole_value_names`` when the
    values bear them out, else from what the objects returned when they all name the same.
    """
    group_objects = list(map(objects.__getitem__, members))
    values = serialize_many(cls, group_objects)
    object_names = list(map(names.__getitem__, map(id, group_objects)))
    alike: tuple[str, ...] | None = batch_hook(cls, "_whole_value_names")
    if alike is None or set(map(len, values)) - {len(alike)}:
        found = set(map(tuple, values))
        alike = found.pop() if len(found) == 1 else None
    if alike is not None:
        keys = [list(map(add, object_names, repeat(_suffix(name)))) for name in alike]
        group = ValueGroup(cls, members, tuple(alike), keys, [])
        found_pairs = group.pairs(group_objects, values)
        if found_pairs is not None:
            return group, found_pairs
    node_names = list(map(tuple, values))
    keys = [[f"{base}{_suffix(name)}" for name in value_names]
            for base, value_names in zip(object_names, node_names)]  # fmt: skip
    group = ValueGroup(cls, members, None, keys, node_names)
    found_pairs = group.pairs(group_objects, values)
    assert found_pairs is not None  # the names were just read off these values
    return group, found_pairs


_SUFFIXES: dict[str, str] = {}  # value name -> "/.ATTRIBUTES/<escaped>"; a few names recur
_NAME_FIELDS: dict[str, bytes] = {}  # value name -> its SerializedTensor name field


def _suffix(value_name: str) -> str:
    """``/.ATTRIBUTES/<escaped value name>``: what follows the object path in a key
    (``checkpoint_key``)."""
    suffix = _SUFFIXES.get(value_name)
    if suffix is None:
        if len(_SUFFIXES) > 4096:
            _SUFFIXES.clear()
        escaped = escape_local_name(value_name)
        suffix = _SUFFIXES[value_name] = f"/{OBJECT_ATTRIBUTES_NAME}/{escaped}"
    return suffix


def _name_field(value_name: str) -> bytes:
    known = _NAME_FIELDS.get(value_name)
    if known is None:
        if len(_NAME_FIELDS) > 4096:
            _NAME_FIELDS.clear()
        known = _NAME_FIELDS[value_name] = name_field(escape_local_name(value_name))
    return known


def _encode_group(
    group: ValueGroup,
    full_names: list[str] | None,
    leaf: list[bool],
    nodes: list[bytes],
    whole: list[bool],
    attributes: list[Any],
) -> None:
    """Encode the group's leaves whole when they save alike values; leave the attributes of
    its other nodes for the per-node pass."""
    members = group.nodes
    alike = group.names
    rest: Sequence[int] = range(len(members))  # group positions of nodes encoded one by one
    if alike:
        at_leaf = list(map(leaf.__getitem__, members))
        bulk = list(compress(range(len(members)), at_leaf))
        if bulk:
            pick = bulk.__len__() != len(members)
            keys = [list(map(k.__getitem__, bulk)) for k in group.keys] if pick else group.keys
            names = list(map(full_names.__getitem__, bulk)) if pick and full_names else full_names
            bulk_nodes = list(map(members.__getitem__, bulk)) if pick else members
            encoded = encode_alike_leaves(tuple(map(escape_local_name, alike)), keys, names)
            place(nodes, bulk_nodes, encoded)
            place(whole, bulk_nodes, [True] * len(bulk_nodes))
            rest = list(compress(range(len(members)), map(not_, at_leaf)))
    name_fields_of: dict[tuple[str, ...], tuple[bytes, ...]] = {}
    for position in rest:
        index = members[position]
        value_names = alike if alike is not None else group.node_names[position]
        node_keys = (
            [keys_of_value[position] for keys_of_value in group.keys]
            if alike is not None else group.keys[position]
        )  # fmt: skip
        fields = name_fields_of.get(value_names)
        if fields is None:
            fields = name_fields_of[value_names] = tuple(map(_name_field, value_names))
        full_name = full_names[position] if full_names is not None else ""
        attributes[index] = (node_keys, fields, full_name)
