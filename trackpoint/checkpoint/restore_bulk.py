"""How the restore walk plans many alike nodes in one pass (issues 19 and 28).

``CheckpointPosition._walk`` (``restore.py``) binds and plans a checkpoint's nodes breadth
first. A model of 100,000 variables is nearly all one case: a container whose saved children
all exist, each a leaf whose class declares ``_whole_value_names`` (``tp.Variable``, and the
adapters of other frameworks' tensors) on a node whose attributes are exactly those values.
The walk plans every such leaf here — :func:`plan_leaves`, a run at a time, protobuf fields
read through ``map``, bookkeeping extended at once — and every other node through
``value_matching.plan_values``; which one is decided by the class's declaration (through
``batch_hook``), never by a concrete type. :func:`queue_all_children` binds the children of
such a container in one pass, and declines any other node (the walk's loop binds it child by
child).
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from trackpoint.checkpoint.restore_plan import PlannedBatch, RestorePlan, WalkRecord
from trackpoint.graph.keys import escape_local_name
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import Trackable, batch_hook

__all__ = [
    "NO_CHILDREN",
    "Queue",
    "WholeValues",
    "children_of",
    "is_leaf",
    "plan_leaves",
    "queue_all_children",
    "set_update_uids",
    "whole_values",
]

NO_CHILDREN: Mapping[str, Trackable] = {}  # shared by every leaf of a WalkRecord (read-only)
Queue = list[tuple[int, Trackable]]
"""The walk's queue: ``(node id, bound object)``, iterated while it grows (breadth first)."""
_NODE_ID = operator.attrgetter("node_id")  # of an ObjectReference (a saved child)
_LOCAL_NAME = operator.attrgetter("local_name")


def queue_all_children(
    coordinator: Any,  # restore.RestoreCoordinator (that module imports this one)
    plan: RestorePlan,
    queue: Queue,
    node_children: Any,
    children: Mapping[str, Trackable],
    record: WalkRecord | None,
) -> bool:
    """The loop of ``CheckpointPosition._queue_children`` in one pass per list, for the
    usual large node (a container of 100,000 variables): every saved child exists under its
    name, none is bound yet, each is a distinct node. False, doing nothing, for any other
    node (the loop then handles it child by child)."""
    child_ids = list(map(_NODE_ID, node_children))
    names = list(map(_LOCAL_NAME, node_children))
    refs = coordinator.object_by_proto_id.refs
    if len(set(child_ids)) != len(child_ids) or any(map(refs.__contains__, child_ids)):
        return False
    locals_: list[Any] = list(map(children.get, names))
    if any(local is None for local in locals_):
        return False
    refs.update(zip(child_ids, map(weakref.ref, locals_)))
    coordinator.matched_proto_ids.update(child_ids)
    plan.bound.extend(child_ids)
    queue.extend(zip(child_ids, locals_))
    if record is not None:
        if names != list(children):
            record.fail()  # live children without a node, or in another order
        record.children.append(children)
    return True


class WholeValues(NamedTuple):
    """What the walk asks of a class that declares ``_whole_value_names`` (once per walk)."""

    names: tuple[str, ...]
    """The class's own value names."""
    attributes: tuple[str, ...]
    """The same, escaped: the names of the checkpoint node's attributes."""
    update_uid: Callable[[Any], int]
    """Reads an object's update uid (the plain attribute unless the class changed the property)."""
    plain_children: bool
    """Whether the class keeps ``Trackable``'s ``_trackable_children`` (leaves asked cheaply)."""


def whole_values(cls: type) -> WholeValues | None:
    """``cls``'s declared whole values (``batch_hook(cls, "_whole_value_names")``), or None."""
    names = batch_hook(cls, "_whole_value_names")
    if not names:
        return None
    plain_uid = getattr(cls, "_update_uid", None) is _PLAIN_UPDATE_UID
    return WholeValues(
        tuple(names),
        tuple(map(escape_local_name, names)),
        operator.attrgetter("_self_update_uid" if plain_uid else "_update_uid"),
        cls._trackable_children is _PLAIN_CHILDREN,  # type: ignore[attr-defined]
    )


_FIRST_WINDOW = 16  # queue entries tried by plan_leaves' first pass; each next pass 4 times more
_WINDOW = 4096  # at most, per pass


def plan_leaves(
    plan: RestorePlan,
    queue: Queue,
    start: int,
    nodes: Any,
    uid: int,
    record: WalkRecord | None,
    kind: WholeValues,
) -> int:
    """Plan the objects from queue entry ``start`` on that are leaves of entry ``start``'s
    class (which declares ``kind``), as many as follow in a row: each on a node whose
    attributes are exactly the class's whole values, no registered saver and no children, and
    not given values by this or a newer restore. One pass per list, in growing windows (a run
    of one costs little more than the check of one entry).

    Returns:
        How many entries were planned (0: entry ``start`` is not such a leaf; the walk plans it
        as any other node).
    """
    planned, size = 0, _FIRST_WINDOW
    while True:
        count = _plan_window(plan, queue, start + planned, size, nodes, uid, record, kind)
        planned += count
        if count < size:
            return planned
        size = min(size * 4, _WINDOW)


def _plan_window(
    plan: RestorePlan,
    queue: Queue,
    start: int,
    size: int,
    nodes: Any,
    uid: int,
    record: WalkRecord | None,
    kind: WholeValues,
) -> int:
    """:func:`plan_leaves` for at most ``size`` entries from ``start``; how many it planned."""
    stop = min(len(queue), start + size)
    if start >= stop:
        return 0
    cls = type(queue[start][1])
    entries = map(queue.__getitem__, range(start, stop))  # lazy: a short run costs little
    count = _leading(map(operator.is_, map(type, map(_SECOND, entries)), itertools.repeat(cls)),
                     stop - start)  # fmt: skip
    window = queue[start : start + count]
    node_ids = list(map(_FIRST, window))
    saved = list(map(nodes.__getitem__, node_ids))
    attributes = list(map(_ATTRIBUTES, saved))
    expected = kind.attributes
    if len(expected) == 1:
        count = _leading(map(operator.eq, map(len, attributes), itertools.repeat(1)), count)
        count = _leading(map(operator.eq, map(_NAME, map(_FIRST, attributes[:count])),
                             itertools.repeat(expected[0])), count)  # fmt: skip
    else:
        count = _leading((tuple(map(_NAME, a)) == expected for a in attributes[:count]), count)
    count = _leading(map(operator.not_, map(_HAS_SAVER, saved[:count])), count)
    count = _leading(map(operator.not_, map(len, map(_CHILDREN, saved[:count]))), count)
    trackables = list(map(_SECOND, window[:count]))
    count = _leading(map(operator.lt, map(kind.update_uid, trackables), itertools.repeat(uid)),
                     count)  # fmt: skip
    ids = list(map(id, trackables[:count]))
    if len(set(ids)) != count or not plan.planned.isdisjoint(ids):
        count = _distinct(ids, plan.planned)  # a second path to an object: the walk plans it
    if not count:
        return 0
    del trackables[count:]
    plan.planned.update(ids[:count])
    batch = plan.batches.get(cls)
    if batch is None:
        batch = plan.batches[cls] = PlannedBatch(kind.names, len(plan.items))
        if record is not None:
            record.batches[cls] = (len(record.general), [])
    batch.objects.extend(trackables)
    for index, column in enumerate(batch.keys):
        column.extend(map(_CHECKPOINT_KEY, map(operator.itemgetter(index), attributes[:count])))
    batch.nodes.extend(node_ids[:count])
    if record is not None:
        record.batches[cls][1].extend(range(start, start + count))
        if kind.plain_children:
            leaves = not any(map(getattr, trackables, itertools.repeat("_self_dependencies"),
                                 itertools.repeat(None)))  # fmt: skip
        else:
            leaves = all(map(is_leaf, trackables))
        if not leaves:
            record.fail()  # the program's object has children the checkpoint's lacks
        record.children.extend(itertools.repeat(NO_CHILDREN, count))
    return count


def _distinct(ids: list[int], planned: set[int]) -> int:
    """How many of ``ids`` come before the first one planned already or met twice."""
    seen: set[int] = set()
    for index, key in enumerate(ids):
        if key in planned or key in seen:
            return index
        seen.add(key)
    return len(ids)


def set_update_uids(objects: list[Trackable], uid: int) -> None:
    """Record that restore ``uid`` gave each of ``objects`` (all of one class) its values."""
    cls = type(objects[0])
    if cls._update_uid is not _PLAIN_UPDATE_UID:
        for trackable in objects:
            trackable._update_uid = uid
    elif cls.__setattr__ is object.__setattr__:  # the plain attribute, set directly
        for trackable in objects:
            trackable._self_update_uid = uid
    else:
        set_attribute = object.__setattr__  # what the property's setter does
        for trackable in objects:
            set_attribute(trackable, "_self_update_uid", uid)


def _leading(flags: Any, limit: int) -> int:
    """How many of ``flags`` (at most ``limit``) are true before the first false one."""
    return len(list(itertools.takewhile(bool, itertools.islice(flags, limit))))


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_ATTRIBUTES = operator.attrgetter("attributes")
_CHILDREN = operator.attrgetter("children")
_NAME = operator.attrgetter("name")
_CHECKPOINT_KEY = operator.attrgetter("checkpoint_key")
_HAS_SAVER = operator.methodcaller("HasField", "registered_saver")
_PLAIN_CHILDREN = Trackable._trackable_children
_PLAIN_UPDATE_UID = vars(Trackable)["_update_uid"]


# -- what the walk's loop asks of one object (moved here from restore.py) --------------------


def children_of(trackable: Trackable, record: WalkRecord | None) -> dict[str, Trackable]:
    """``trackable``'s children as trackables (adapters for adapted values).

    A child that is not trackable is left out (a walk of the program's graph would raise on
    it: ``record`` fails).
    """
    children = trackable._trackable_children()
    if all(map(isinstance, children.values(), itertools.repeat(Trackable))):
        return dict(children)  # the usual case: already trackables
    converted = {}
    for name, child in children.items():
        trackable_child = to_trackable(child)
        if trackable_child is not None:
            converted[name] = trackable_child
        elif record is not None:
            record.fail()
    return converted


def is_leaf(trackable: Trackable) -> bool:
    """Whether ``trackable`` has no children (asked without a call for most objects)."""
    if type(trackable)._trackable_children is _PLAIN_CHILDREN and not getattr(
        trackable, "_self_dependencies", None
    ):
        return True
    return not trackable._trackable_children()
