"""The one restore engine: plan → read and verify every value → apply.

One :class:`RestoreCoordinator` per ``read``/``restore`` call. From node 0 and the root object
it walks the saved graph breadth first and binds each node to the live object reached by the
same local names (:class:`CheckpointPosition`). The walk only *plans*: it lists every object's
values (:class:`~trackpoint.saving.restore.RestoreItem`) and records the changes to make —
update uids, deferred dependencies, optimizer slots to create. The value phase
(:func:`~trackpoint.saving.restore.restore_items`) then reads and verifies every value (crc32c,
shape, dtype, each object's own checks) and only then copies them in; the recorded changes are
made last. A failure at any point before that leaves every object as it was.

A node whose object does not exist yet waits in its parent's ``_deferred_dependencies`` and is
restored, by the same engine and with the same all-or-nothing rule, when the object is attached
(deferred restoration, semantics B1/B2). Optimizer slots wait for both their variable and their
optimizer (F2); a slot the optimizer lacks is created, with its value, in the apply step.

Each object records the uid of the restore that last gave it values; an older restore reaching
it later leaves it alone, so the most recently *requested* restore wins (B4).

The coordinator holds objects weakly and nothing holds the coordinator but its status and the
pending positions, so dropping them frees it; a ``weakref.finalize`` hook then logs the values
that were never restored (C4) unless ``expect_partial()`` was called.
"""

from __future__ import annotations

import collections
import functools
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.reader import BundleReader
from trackpoint.checkpoint.unrestored import WarningState, warn_unrestored
from trackpoint.checkpoint.weak_objects import IdentityWeakSet, WeakObjects
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import ADVISORY_ATTRIBUTES, escape_local_name
from trackpoint.graph.walk import node_names
from trackpoint.saving.devices import DeviceValue
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.restore import RestoreItem, agreement_pending, restore_items
from trackpoint.tracking.adapters import to_trackable
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, has_values, next_restore_uid
from trackpoint.tracking.slots import PendingSlot, SlotOwner

__all__ = [
    "CheckpointPosition",
    "IdentityWeakSet",
    "RestoreCoordinator",
    "RestoreItem",
    "WeakObjects",
    "restore_items",
]

logger = logging.getLogger("trackpoint.checkpoint")


class _SlotRestoration(NamedTuple):
    optimizer_id: int
    slot_variable_id: int
    slot_name: str


class _DeferredSlotRestoration(NamedTuple):
    original_variable: weakref.ref[Trackable]
    slot_variable_id: int
    slot_name: str


class RestoreCoordinator:
    """The state of one checkpoint load: which node is bound to which object, what is left.

    Args:
        proto: the checkpoint's object graph.
        prefix: the checkpoint, reopened for every batch of values (no file stays open).
        options: restore options (``skip_slot_variables``).
        shapes: ``{checkpoint key: shape}`` of the checkpoint (None: asked of ``index``).
        dtypes: ``{checkpoint key: numpy dtype}`` of the checkpoint (None: asked of ``index``).
        index: the checkpoint's reader, possibly closed: every batch of values is read through
            ``index.reopen()``, so the index is parsed once per load, not once per batch.
    """

    def __init__(
        self,
        proto: TrackableObjectGraph,
        prefix: str,
        options: CheckpointOptions,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        dtypes: Mapping[str, np.dtype[Any]] | None = None,
        *,
        index: BundleReader | None = None,
    ) -> None:
        self.proto = proto
        self.prefix = prefix
        self.options = options
        self.index = index
        self._shapes = dict(shapes) if shapes is not None else None
        self._dtypes = dict(dtypes) if dtypes is not None else None
        self.restore_uid = next_restore_uid()
        # Weak: objects with deferred restorations point at positions, which point here.
        self.object_by_proto_id = WeakObjects()
        self.matched_proto_ids: set[int] = set()
        self.unused_attributes: dict[int, list[str]] = {}
        # Every Python object seen while matching, even if not used (e.g. a second object
        # where the checkpoint had one shared object): the assertions report them.
        self.all_python_objects = IdentityWeakSet()
        # variable node id -> slots to restore once the variable is bound; moved to
        # deferred_slot_restorations (by optimizer node id) if the optimizer is missing then.
        self.slot_restorations: dict[int, list[_SlotRestoration]] = collections.defaultdict(list)
        self.deferred_slot_restorations: dict[int, list[_DeferredSlotRestoration]] = {}
        slot_node_ids = set()
        for node_id, node in enumerate(proto.nodes):
            for slot in node.slot_variables:
                slot_node_ids.add(slot.slot_variable_node_id)
                if not options.skip_slot_variables:
                    self.slot_restorations[slot.original_variable_node_id].append(
                        _SlotRestoration(node_id, slot.slot_variable_node_id, slot.slot_name)
                    )
        self.slot_node_ids = frozenset(slot_node_ids)
        self._names: dict[int, str] | None = None
        self._warning = WarningState(
            proto,
            self.matched_proto_ids,
            self.unused_attributes,
            self.slot_node_ids if options.skip_slot_variables else frozenset(),
            prefix=prefix,
        )
        finalizer = weakref.finalize(self, warn_unrestored, self._warning)
        finalizer.atexit = False

    @property
    def expect_partial(self) -> bool:
        return self._warning.expect_partial

    @expect_partial.setter
    def expect_partial(self, value: bool) -> None:
        self._warning.expect_partial = value

    def __deepcopy__(self, memo: dict[int, Any]) -> RestoreCoordinator:
        return self  # shared by copies of objects with pending restorations

    def value_spec(self, key: str) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
        """Saved ``(shape, dtype)`` of checkpoint key ``key``; None if the key is absent."""
        if self._shapes is not None and self._dtypes is not None:
            if key not in self._shapes:
                return None
            return tuple(self._shapes[key]), self._dtypes[key]
        index = self.index
        if index is None or not index.has_tensor(key):
            return None
        return index.shape(key), index.dtype(key)

    def node_name(self, node_id: int) -> str:
        """Readable path of a checkpoint node, e.g. ``(root).model.dense.kernel``."""
        if self._names is None:
            self._names = node_names(self.proto)
        return self._names[node_id]

    def reader(self) -> BundleReader:
        """A reader of the checkpoint for one batch of values (reuses the parsed index)."""
        if self.index is not None:
            return self.index.reopen()
        return BundleReader(self.prefix, storage=self.options.storage)


class _Plan:
    """What one walk decided: the values to read, and the changes to make once they verify.

    Nothing of the program changes while a plan is built: objects' update uids, deferred
    dependencies, deferred slots and slots created from the checkpoint are recorded here and
    made only by :meth:`commit`, after the engine has read, verified and applied every value
    (trackpoint/saving/restore.py). :meth:`rollback` forgets the walk's node bindings so a
    later attach can try again.
    """

    __slots__ = (
        "bound", "deferred", "items", "pending_slots", "planned", "registered", "seen",
        "slots_taken", "updated",
    )

    def __init__(self) -> None:
        self.items: list[RestoreItem] = []
        self.registered: dict[str, dict[str, Trackable]] = {}
        self.planned: set[int] = set()  # ids of objects given values by this walk
        self.updated: list[Trackable] = []
        self.bound: list[int] = []  # proto ids bound by this walk
        self.seen: list[Trackable] = []  # objects this walk first met
        self.deferred: list[tuple[Trackable, str, CheckpointPosition]] = []
        self.pending_slots: list[tuple[CheckpointPosition, PendingSlot]] = []
        self.slots_taken: list[Callable[[], None]] = []  # deferred-slot bookkeeping to apply

    def plan(self, trackable: Trackable) -> bool:
        """Record that this walk gives ``trackable`` values; False if it already does."""
        key = id(trackable)
        if key in self.planned:
            return False
        self.planned.add(key)
        self.updated.append(trackable)
        return True

    def commit(self, coordinator: RestoreCoordinator) -> None:
        uid = coordinator.restore_uid
        for trackable in self.updated:
            trackable._update_uid = uid
        for position, pending in self.pending_slots:
            slot = pending.created
            if slot is not None:
                slot._update_uid = uid
                coordinator.object_by_proto_id[position.proto_id] = slot
                coordinator.all_python_objects.add(slot)
        for trackable, name, position in self.deferred:
            trackable._deferred_dependencies.setdefault(name, []).append(position)
        for action in self.slots_taken:
            action()

    def rollback(self, coordinator: RestoreCoordinator) -> None:
        bound = coordinator.object_by_proto_id
        for proto_id in self.bound:
            bound.forget(proto_id)
            coordinator.matched_proto_ids.discard(proto_id)
        for trackable in self.seen:
            coordinator.all_python_objects.discard(trackable)


class CheckpointPosition:
    """One node of a checkpoint being restored; implements ``DeferredRestoration``."""

    __slots__ = ("_coordinator", "_proto_id")

    def __init__(self, coordinator: RestoreCoordinator, proto_id: int) -> None:
        self._coordinator = coordinator
        self._proto_id = proto_id

    def __deepcopy__(self, memo: dict[int, Any]) -> CheckpointPosition:
        return self

    @property
    def restore_uid(self) -> int:
        return self._coordinator.restore_uid

    @property
    def proto_id(self) -> int:
        return self._proto_id

    @property
    def node(self) -> TrackableObjectGraph.TrackableObject:
        return self._coordinator.proto.nodes[self._proto_id]

    @property
    def trackable(self) -> Trackable:
        trackable: Trackable = self._coordinator.object_by_proto_id[self._proto_id]
        return trackable

    def value_spec(self) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
        """Saved ``(shape, dtype)`` if this node is a plain variable (restore-on-create)."""
        node = self.node
        if len(node.attributes) != 1 or node.children:
            return None
        attribute = node.attributes[0]
        if attribute.name != VARIABLE_VALUE_KEY:
            return None
        return self._coordinator.value_spec(attribute.checkpoint_key)

    def bind_object(self, trackable: Trackable, plan: _Plan | None = None) -> bool:
        """Record that ``trackable`` is this node's object; False if the node was bound before.

        ``plan`` remembers the binding so that a failed restore can forget it again.
        """
        coordinator = self._coordinator
        if coordinator.all_python_objects.add(trackable) and plan is not None:
            plan.seen.append(trackable)
        current = coordinator.object_by_proto_id.get(self._proto_id)
        if current is None:
            coordinator.object_by_proto_id[self._proto_id] = trackable
            coordinator.matched_proto_ids.add(self._proto_id)
            if plan is not None:
                plan.bound.append(self._proto_id)
            return True
        if current is not trackable:
            logger.warning(
                "Inconsistent references when loading %s: the checkpoint object %s is one "
                "object, but the program has two different objects there (%r and %r); only the "
                "first is restored", coordinator.prefix, coordinator.node_name(self._proto_id),
                current, trackable,
            )
        return False

    def restore(
        self, trackable: Trackable, children: Mapping[str, Trackable] | None = None
    ) -> None:
        """Bind ``trackable`` to this node and restore it and every descendant that exists.

        All or nothing: every value of the walk is read and verified before any object
        changes; on an error the objects, and this restore's bindings, are as before.

        Args:
            trackable: the object.
            children: the object's children if not its own ``_trackable_children()`` (the
                root of a ``Checkpoint`` with attached dependencies).
        """
        plan = _Plan()
        if not self.bind_object(trackable, plan):
            return
        try:
            self._restore_descendants(plan, children)
        except BaseException:
            plan.rollback(self._coordinator)
            raise
        plan.commit(self._coordinator)

    # -- the walk ----------------------------------------------------------------------------

    def _restore_descendants(
        self, plan: _Plan, root_children: Mapping[str, Trackable] | None
    ) -> None:
        coordinator = self._coordinator
        # (position, its bound object): carried along instead of looked up again
        queue: collections.deque[tuple[CheckpointPosition, Trackable]] = collections.deque(
            [(self, self.trackable)]
        )
        first = True
        nodes = coordinator.proto.nodes
        while queue:
            position, trackable = queue.popleft()
            node = nodes[position._proto_id]
            position._single_restore(plan, node, trackable)
            children = root_children if first and root_children is not None else None
            first = False
            if node.children:  # a leaf of the saved graph: its live children do not matter
                position._queue_children(plan, queue, children, node, trackable)
            if coordinator.slot_restorations or coordinator.deferred_slot_restorations:
                position._queue_slot_variables(plan, queue, trackable)
        if not plan.items and not plan.registered and not agreement_pending():
            return
        with coordinator.reader() as reader:
            restore_items(
                plan.items, reader, prefix=coordinator.prefix, registered=plan.registered,
                progress=coordinator.options.progress,
            )

    def _label(self) -> str:
        return self._coordinator.node_name(self._proto_id)

    def _single_restore(
        self, plan: _Plan, node: TrackableObjectGraph.TrackableObject, trackable: Trackable
    ) -> None:
        coordinator = self._coordinator
        if coordinator.restore_uid <= trackable._update_uid:
            return  # a more recently requested restore already gave it values
        if node.HasField("registered_saver") and node.registered_saver.name:
            saver = node.registered_saver
            if plan.plan(trackable):
                plan.registered.setdefault(saver.name, {})[saver.object_name] = trackable
            return
        live = trackable._serialize_to_tensors() if has_values(trackable) else {}
        attributes = node.attributes
        if len(live) == 1 and len(attributes) == 1:
            # The common case (a variable): one value, stored under its own escaped name.
            ((own_name, value),) = live.items()
            attribute = attributes[0]
            # ("VARIABLE_VALUE" and most names escape to themselves: skip building the copy)
            plain = "." not in own_name and "/" not in own_name
            if attribute.name == (own_name if plain else escape_local_name(own_name)):
                if plan.plan(trackable):
                    layouts = {own_name: value} if _has_layout(value) else None
                    plan.items.append(RestoreItem(
                        trackable, {own_name: attribute.checkpoint_key}, self._label, layouts
                    ))  # fmt: skip
                return
        if not live:
            if node.attributes:
                coordinator.unused_attributes.setdefault(self._proto_id, []).extend(
                    a.name for a in node.attributes
                )
            plan.plan(trackable)
            return
        by_escaped = {escape_local_name(name): name for name in live}
        for name, aliases in trackable._tensor_name_aliases().items():
            if name in live:
                for alias in aliases:
                    by_escaped.setdefault(escape_local_name(alias), name)
        keys: dict[str, str] = {}
        present = {attribute.name for attribute in node.attributes}
        for attribute in node.attributes:
            matched = by_escaped.get(attribute.name)
            if matched is not None and attribute.name != escape_local_name(matched) and (
                escape_local_name(matched) in present
            ):
                matched = None  # an old alias next to the current name: the current one wins
            if matched is None:
                if attribute.name not in ADVISORY_ATTRIBUTES:
                    coordinator.unused_attributes.setdefault(self._proto_id, []).append(
                        attribute.name
                    )
                continue
            keys[matched] = attribute.checkpoint_key
        if not keys:
            return  # nothing of this object is in the checkpoint: it stays unmatched
        missing = sorted(set(live) - set(keys) - trackable._optional_tensor_names())
        if missing:
            raise InvalidArgumentError(
                f"Could not restore object {self._label()} ({type(trackable).__name__}): not "
                f"all of its values are in the checkpoint {coordinator.prefix}. Expected "
                f"{sorted(live)}, the checkpoint has {sorted(a.name for a in node.attributes)}. "
                "Nothing was restored.",
                path=coordinator.prefix,
            )
        if plan.plan(trackable):
            layouts = {name: live[name] for name in keys if _has_layout(live[name])}
            plan.items.append(RestoreItem(trackable, keys, self._label, layouts or None))

    def _queue_children(
        self, plan: _Plan, queue: collections.deque[tuple[CheckpointPosition, Trackable]],
        children: Mapping[str, Trackable] | None,
        node: TrackableObjectGraph.TrackableObject, trackable: Trackable,
    ) -> None:
        node_children = node.children
        coordinator = self._coordinator
        if children is None:
            children = _children_of(trackable)
        bound = coordinator.object_by_proto_id
        for child in node_children:
            node_id = child.node_id
            if node_id in bound:
                continue
            position = CheckpointPosition(coordinator, node_id)
            local = trackable._lookup_dependency(child.local_name, children)
            if local is None:
                if _has_checkpoint_values(position.node):
                    plan.deferred.append((trackable, child.local_name, position))
            elif position.bind_object(local, plan):
                queue.append((position, local))

    def _queue_slot_variables(
        self, plan: _Plan, queue: collections.deque[tuple[CheckpointPosition, Trackable]],
        trackable: Trackable,
    ) -> None:
        coordinator = self._coordinator
        # This node is an optimizer whose variables were bound before it existed.
        waiting = coordinator.deferred_slot_restorations.get(self._proto_id, ())
        if waiting:
            plan.slots_taken.append(
                functools.partial(_forget, coordinator.deferred_slot_restorations, self._proto_id)
            )
        for deferred in waiting:
            variable = deferred.original_variable()
            if variable is not None:
                self._create_slot_position(
                    plan, queue, trackable, variable, deferred.slot_variable_id,
                    deferred.slot_name,
                )
        # This node is a variable with slots.
        slots = coordinator.slot_restorations.get(self._proto_id, ())
        if slots:
            plan.slots_taken.append(
                functools.partial(_forget, coordinator.slot_restorations, self._proto_id)
            )
        for slot in slots:
            optimizer = coordinator.object_by_proto_id.get(slot.optimizer_id)
            if optimizer is None:
                restoration = _DeferredSlotRestoration(
                    weakref.ref(trackable), slot.slot_variable_id, slot.slot_name
                )
                plan.slots_taken.append(functools.partial(
                    _defer_slot, coordinator, slot.optimizer_id, restoration
                ))  # fmt: skip
            elif isinstance(optimizer, SlotOwner):
                self._create_slot_position(
                    plan, queue, optimizer, trackable, slot.slot_variable_id, slot.slot_name
                )

    def _create_slot_position(
        self, plan: _Plan, queue: collections.deque[tuple[CheckpointPosition, Trackable]],
        optimizer: Trackable, variable: Trackable, slot_variable_id: int, slot_name: str,
    ) -> None:
        if not isinstance(optimizer, SlotOwner):
            return
        position = CheckpointPosition(self._coordinator, slot_variable_id)
        slot = optimizer._plan_slot_variable(position, variable, slot_name)
        if slot is None:  # no value to create it from: kept for the optimizer's add_slot
            plan.slots_taken.append(functools.partial(
                optimizer._defer_slot_variable, position, variable, slot_name
            ))  # fmt: skip
            return
        if isinstance(slot, PendingSlot):
            plan.pending_slots.append((position, slot))
        if position.bind_object(slot, plan):
            queue.append((position, slot))


def _forget(table: dict[int, Any], key: int) -> None:
    table.pop(key, None)


def _defer_slot(
    coordinator: RestoreCoordinator, optimizer_id: int, restoration: _DeferredSlotRestoration
) -> None:
    coordinator.deferred_slot_restorations.setdefault(optimizer_id, []).append(restoration)


def _has_layout(value: Any) -> bool:
    """Whether a live value's layout matters to reading it (slices, devices)."""
    return type(value) is not np.ndarray and isinstance(value, (Mapping, DeviceValue))


def _children_of(trackable: Trackable) -> dict[str, Trackable]:
    children = {}
    for name, child in trackable._trackable_children().items():
        converted = to_trackable(child)
        if converted is not None:
            children[name] = converted
    return children


def _has_checkpoint_values(node: TrackableObjectGraph.TrackableObject) -> bool:
    if node.HasField("has_checkpoint_values"):
        return node.has_checkpoint_values.value
    return bool(
        node.children or node.attributes or node.slot_variables
        or node.HasField("registered_saver")
    )
