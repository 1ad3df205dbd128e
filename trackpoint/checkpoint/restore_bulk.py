"""The restore walk's one-pass paths for the usual large node (issue 19).

``CheckpointPosition._walk`` (``restore.py``) binds and plans a checkpoint's nodes one queue
entry at a time. A model of 100,000 variables is nearly all one case: a container whose saved
children all exist, each a plain ``Variable`` on a node with one ``VARIABLE_VALUE`` attribute.
The functions here do exactly what the walk's loop does for such entries, one pass per list
(protobuf fields read through ``map``, bookkeeping extended at once), and decline anything
else, which the loop then handles entry by entry.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Mapping
from typing import Any

from trackpoint.checkpoint.restore_plan import RestorePlan, WalkRecord
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable
from trackpoint.tracking.variable import Variable

__all__ = ["NO_CHILDREN", "Queue", "children_of", "is_leaf", "plan_variables", "queue_all_children"]

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


_BULK_WINDOW = 4096  # queue entries planned per pass of plan_variables
_BULK_RETRY = 64  # after a pass planned nothing, entries left to the loop before the next


def plan_variables(
    plan: RestorePlan,
    queue: Queue,
    start: int,
    nodes: Any,
    uid: int,
    record: WalkRecord | None,
) -> tuple[int, int]:
    """What ``_walk``'s loop does for each of the plain variables from queue entry ``start``
    on, for as many as are in the usual case, in one pass per list: a ``Variable`` (exactly)
    on a node with one ``VARIABLE_VALUE`` attribute, no registered saver and no children,
    not given values by this or a newer restore, and without children of its own.

    Returns:
        How many entries were planned (0: none, the loop plans entry ``start``), and the
        first entry the loop may offer here again.
    """
    window = queue[start : start + _BULK_WINDOW]
    trackables = list(map(_SECOND, window))
    count = _leading(map(operator.is_, map(type, trackables), itertools.repeat(Variable)),
                     len(window))  # fmt: skip
    node_ids = list(map(_FIRST, window[:count]))
    saved = list(map(nodes.__getitem__, node_ids))
    attributes = list(map(_ATTRIBUTES, saved))
    count = _leading(map(operator.eq, map(len, attributes), itertools.repeat(1)), count)
    firsts = list(map(_FIRST, attributes[:count]))
    count = _leading(map(operator.eq, map(_NAME, firsts), itertools.repeat(VARIABLE_VALUE_KEY)),
                     count)  # fmt: skip
    count = _leading(map(operator.not_, map(_HAS_SAVER, saved[:count])), count)
    count = _leading(map(operator.not_, map(len, map(_CHILDREN, saved[:count]))), count)
    count = _leading(map(operator.lt, map(_UPDATE_UID, trackables[:count]), itertools.repeat(uid)),
                     count)  # fmt: skip
    trackables = trackables[:count]
    ids = list(map(id, trackables))
    if not count or len(set(ids)) != count or not plan.planned.isdisjoint(ids):
        return 0, start + _BULK_RETRY  # a second path to an object, or none here
    plan.planned.update(ids)
    plan.targets.extend(trackables)
    plan.keys.extend(map(_CHECKPOINT_KEY, firsts[:count]))
    plan.nodes.extend(node_ids[:count])
    if record is not None:
        record.target_index.extend(range(start, start + count))
        if any(map(getattr, trackables, itertools.repeat("_self_dependencies"),
                   itertools.repeat(None))):  # fmt: skip
            record.fail()  # the program's object has children the checkpoint's lacks
        record.children.extend(itertools.repeat(NO_CHILDREN, count))
    return count, start + count


def _leading(flags: Any, limit: int) -> int:
    """How many of ``flags`` (at most ``limit``) are true before the first false one."""
    return len(list(itertools.takewhile(bool, itertools.islice(flags, limit))))


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_ATTRIBUTES = operator.attrgetter("attributes")
_CHILDREN = operator.attrgetter("children")
_NAME = operator.attrgetter("name")
_CHECKPOINT_KEY = operator.attrgetter("checkpoint_key")
_UPDATE_UID = operator.attrgetter("_self_update_uid")
_HAS_SAVER = operator.methodcaller("HasField", "registered_saver")
_PLAIN_CHILDREN = Trackable._trackable_children


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
