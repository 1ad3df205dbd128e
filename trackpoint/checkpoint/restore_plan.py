"""What one walk of the restore engine decides, and what a top-level walk records for replay.

A :class:`RestorePlan` lists the values to read and the changes to make once every value is
verified (``checkpoint/restore.py`` walks, ``saving/restore.py`` reads, verifies and applies).
Objects whose class declares ``_whole_value_names`` (variables: nearly every node of a large
model) are kept by class as a :class:`PlannedBatch`, columns of keys instead of one
:class:`~trackpoint.saving.restore.RestoreItem` each: a restore of 100,000 of them then builds
no object per value.

A :class:`WalkRecord` is kept by the top-level walk of ``Checkpoint.read`` when the walk met
exactly the structure a walk of the program's object graph would meet (every live child matched
to a checkpoint node, in order; see ``checkpoint/replay.py``): it becomes the structure fingerprint
that lets the load status skip walking the program again, and the recorded walk the next read of
the same graph replays instead of walking.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trackpoint.tracking.base import DeferredRestoration, Trackable

if TYPE_CHECKING:
    from trackpoint.saving.restore import RestoreItem
    from trackpoint.tracking.slots import PendingSlot

__all__ = ["PlannedBatch", "RestorePlan", "WalkRecord"]


class PlannedBatch:
    """The objects of one class a walk planned from the checkpoint's attributes, in walk order.

    Args:
        names: the class's ``_whole_value_names`` (each object's own value names).
        position: how many items the plan had when the walk met the first object.
    """

    __slots__ = ("keys", "names", "nodes", "objects", "position")

    def __init__(self, names: tuple[str, ...], position: int) -> None:
        self.names = names
        self.position = position
        self.objects: list[Trackable] = []
        self.keys: list[list[str]] = [[] for _ in names]  # keys[j][i]: names[j] of objects[i]
        self.nodes: list[int] = []  # node id of objects[i] (for messages)


class RestorePlan:
    """What one walk decided: the values to read, and the changes to make once they verify.

    Nothing of the program changes while a plan is built: objects' update uids, deferred
    dependencies, deferred slots and slots created from the checkpoint are recorded here and
    made only by the coordinator's commit, after the engine has read, verified and applied
    every value; a failed restore instead forgets the walk's node bindings
    (``RestoreCoordinator.execute``).
    """

    __slots__ = (
        "batches",
        "bound",
        "deferred",
        "items",
        "pending_slots",
        "planned",
        "registered",
        "seen",
        "slots_taken",
        "unassigned",
        "updated",
    )

    def __init__(self) -> None:
        self.batches: dict[type, PlannedBatch] = {}  # objects planned from attributes, by class
        self.items: list[RestoreItem] = []  # every other object with values, in walk order
        self.registered: dict[str, dict[str, Trackable]] = {}
        self.planned: set[int] = set()  # ids of objects given values by this walk
        self.updated: list[Trackable] = []  # those of them that are not in batches
        self.unassigned: list[int] = []  # nodes bound by this walk that it gave no values
        self.bound: list[int] = []  # node ids bound by this walk
        self.seen: list[Trackable] = []  # objects first met, and left unbound, by this walk
        self.deferred: list[tuple[Trackable, str, DeferredRestoration]] = []
        self.pending_slots: list[tuple[int, PendingSlot]] = []  # (slot's node id, placeholder)
        self.slots_taken: list[Callable[[], None]] = []  # deferred-slot bookkeeping to apply

    def plan(self, trackable: Trackable) -> bool:
        """Record that this walk gives ``trackable`` values; False if it already does."""
        key = id(trackable)
        if key in self.planned:
            return False
        self.planned.add(key)
        self.updated.append(trackable)
        return True

    def add_item(self, item: RestoreItem) -> None:
        """Read ``item``'s values."""
        self.items.append(item)


class WalkRecord:
    """What a top-level walk met, kept while it met exactly the program's object graph.

    ``queue[i]`` is ``(node id, object)`` in walk order, which is then the node order a walk of
    the program's graph gives (``ObjectGraphView``); ``children[i]`` the object's live children
    (each bound to the node of its name: the walk checked it).
    """

    __slots__ = ("batches", "children", "deferred", "failed", "general", "queue")

    def __init__(self, queue: list[tuple[int, Trackable]]) -> None:
        self.queue = queue
        self.children: list[Mapping[str, Trackable]] = []  # of queue[i], by local name
        # class -> (len(general) when its batch began, queue index of each object of the batch)
        self.batches: dict[type, tuple[int, list[int]]] = {}
        # queue index of every object planned another way: the replay plans it again, so what
        # it holds now (plain values) is read now
        self.general: list[int] = []
        self.deferred: list[tuple[int, str, int]] = []  # (parent's queue index, name, node)
        self.failed = False

    def fail(self, *_: Any) -> None:
        """The walk met something a walk of the program's graph would not: keep nothing."""
        self.failed = True
