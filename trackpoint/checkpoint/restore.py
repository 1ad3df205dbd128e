"""The one restore engine: plan → read and verify every value → apply.

One :class:`RestoreCoordinator` per ``read``/``restore`` call. From node 0 and the root object
it walks the saved graph breadth first and binds each node to the live object reached by the
same local names. The walk only *plans*: it lists every object's values
(:class:`~trackpoint.checkpoint.restore_plan.RestorePlan`; objects whose class declares
``_whole_value_names`` — variables, nearly every node of a large model — by class, as columns
of keys instead of an object each) and records the changes to make —
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

The top-level walk of ``Checkpoint.read`` may keep a
:class:`~trackpoint.checkpoint.restore_plan.WalkRecord`; ``checkpoint/replay.py`` turns it into
the structure fingerprint and the recorded walk that let the next read of the same graph replay it
instead of walking.

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
from trackpoint.checkpoint.restore_bulk import NO_CHILDREN as _NO_CHILDREN
from trackpoint.checkpoint.restore_bulk import (
    WholeValues,
    children_of,
    is_leaf,
    plan_leaves,
    queue_all_children,
    set_update_uids,
    whole_values,
)
from trackpoint.checkpoint.restore_plan import RestorePlan, WalkRecord
from trackpoint.checkpoint.saved_graph import SavedGraph
from trackpoint.checkpoint.unrestored import WarningState, warn_unrestored
from trackpoint.checkpoint.value_matching import plan_values
from trackpoint.checkpoint.weak_objects import IdentityWeakSet, WeakObjects
from trackpoint.saving.options import CheckpointOptions
from trackpoint.saving.restore import (
    RestoreBatch,
    RestoreItem,
    agreement_pending,
    restore_items,
)
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, next_restore_uid
from trackpoint.tracking.containers import TrackableDataStructure
from trackpoint.tracking.slots import PendingSlot, SlotOwner

__all__ = [
    "CheckpointPosition",
    "IdentityWeakSet",
    "RestoreCoordinator",
    "RestoreItem",
    "RestorePlan",
    "WeakObjects",
    "restore_items",
]

logger = logging.getLogger("trackpoint.checkpoint")

# What the walk asks of an object's type, compared once per object instead of called.
_PLAIN_LOOKUP = Trackable._lookup_dependency
_CONTAINER_LOOKUP = TrackableDataStructure._lookup_dependency

_Queue = list[tuple[int, Trackable]]
"""The walk's queue: ``(node id, bound object)``, iterated while it grows (breadth first)."""


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
        graph: the checkpoint's object graph (a bare proto is accepted too).
        prefix: the checkpoint, reopened for every batch of values (no file stays open).
        options: restore options (``skip_slot_variables``).
        shapes: ``{checkpoint key: shape}`` of the checkpoint (None: asked of ``index``).
        dtypes: ``{checkpoint key: numpy dtype}`` of the checkpoint (None: asked of ``index``).
        index: the checkpoint's reader, possibly closed: every batch of values is read through
            ``index.reopen()``, so the index is parsed once per load, not once per batch.
    """

    def __init__(
        self,
        graph: SavedGraph | TrackableObjectGraph,
        prefix: str,
        options: CheckpointOptions,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        dtypes: Mapping[str, np.dtype[Any]] | None = None,
        *,
        index: BundleReader | None = None,
    ) -> None:
        if not isinstance(graph, SavedGraph):
            graph = SavedGraph.from_proto(graph)
        self.graph = graph
        self.proto = graph.proto
        self.prefix = prefix
        self.options = options
        self.index = index
        self._shapes = dict(shapes) if shapes is not None else None
        self._dtypes = dict(dtypes) if dtypes is not None else None
        self.restore_uid = next_restore_uid()
        # Weak: objects with deferred restorations point at positions, which point here.
        self.object_by_proto_id = WeakObjects()
        self.matched_proto_ids: set[int] = set()  # the keys of object_by_proto_id
        self.unused_attributes: dict[int, list[str]] = {}
        # Objects met while matching that no node took (a second object where the checkpoint
        # had one shared object), and unbound objects the assertions found: they report them.
        self.unbound_objects = IdentityWeakSet()
        # Nodes bound by a walk that gave their object no values: the assertions check that a
        # more recent restore did (every other bound object got values from this one).
        self.unassigned: list[int] = []
        # variable node id -> slots to restore once the variable is bound; moved to
        # deferred_slot_restorations (by optimizer node id) if the optimizer is missing then.
        self.slot_restorations: dict[int, list[_SlotRestoration]] = collections.defaultdict(list)
        self.deferred_slot_restorations: dict[int, list[_DeferredSlotRestoration]] = {}
        slot_node_ids = set()
        for optimizer_id, variable_id, slot_id, slot_name in graph.slot_variables():
            slot_node_ids.add(slot_id)
            if not options.skip_slot_variables:
                self.slot_restorations[variable_id].append(
                    _SlotRestoration(optimizer_id, slot_id, slot_name)
                )
        self.slot_node_ids = frozenset(slot_node_ids)
        self._warning = WarningState(
            graph,
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
        return self.graph.node_names()[node_id]

    def reader(self) -> BundleReader:
        """A reader of the checkpoint for one batch of values (reuses the parsed index)."""
        if self.index is not None:
            return self.index.reopen()
        return BundleReader(self.prefix, storage=self.options.storage)

    def execute(
        self, plan: RestorePlan, build: Callable[[], None] | None = None, *,
        own: Mapping[int, Trackable] | None = None,
    ) -> None:
        """Run ``build`` (which fills ``plan``), read and verify every value, apply, commit.

        On any error the plan's bindings are forgotten and no object has changed. ``own``:
        node id -> an object of the checkpoint itself the program does not hold yet (the
        ``save_counter`` of a Checkpoint without one): a node the walk leaves for deferred
        restoration is planned into it instead, verified and applied with every other value.
        """
        try:
            if build is not None:
                build()
            if own:
                self._plan_own(plan, own)
            if plan.batches or plan.items or plan.registered or agreement_pending():
                self._restore_values(plan)
        except BaseException:
            self._rollback(plan)
            raise
        self._commit(plan)

    def _plan_own(self, plan: RestorePlan, own: Mapping[int, Trackable]) -> None:
        """Plan the deferred nodes ``own`` has an object for into that object (see execute)."""
        deferred, plan.deferred = plan.deferred, []
        for entry in deferred:
            position = entry[2]
            if not isinstance(position, CheckpointPosition) or (
                (trackable := own.get(position.proto_id)) is None
            ):
                plan.deferred.append(entry)
            elif position.bind_object(trackable, plan) and not self.plan_node(
                plan, position.proto_id, position.node, trackable
            ):
                plan.unassigned.append(position.proto_id)

    def _restore_values(self, plan: RestorePlan) -> None:
        batches = [
            RestoreBatch(
                batch.objects, batch.names, batch.keys,
                functools.partial(_node_label, self.node_name, batch.nodes), batch.position,
            )
            for batch in plan.batches.values()
        ]
        with self.reader() as reader:
            restore_items(
                plan.items, reader, prefix=self.prefix, registered=plan.registered,
                progress=self.options.progress, batches=batches,
            )

    def _commit(self, plan: RestorePlan) -> None:
        """Make the plan's recorded changes (every value is applied by now)."""
        uid = self.restore_uid
        for batch in plan.batches.values():
            set_update_uids(batch.objects, uid)
        for trackable in plan.updated:
            trackable._update_uid = uid
        self.unassigned.extend(plan.unassigned)
        for node_id, pending in plan.pending_slots:
            slot = pending.created
            if slot is not None:
                slot._update_uid = uid
                self.object_by_proto_id[node_id] = slot
        for trackable, name, position in plan.deferred:
            trackable._deferred_dependencies.setdefault(name, []).append(position)
        for action in plan.slots_taken:
            action()

    def _rollback(self, plan: RestorePlan) -> None:
        """Forget the plan's bindings (a failed restore leaves no trace)."""
        for node_id in plan.bound:
            self.object_by_proto_id.forget(node_id)
            self.matched_proto_ids.discard(node_id)
        for trackable in plan.seen:
            self.unbound_objects.discard(trackable)

    def plan_node(
        self, plan: RestorePlan, node_id: int, node: TrackableObjectGraph.TrackableObject,
        trackable: Trackable,
    ) -> bool:
        """Plan the values of ``trackable`` from node ``node_id``; True if the plan gives it
        values (False: a newer restore did, or the checkpoint has none it accepts)."""
        return plan_values(self, plan, node_id, node, trackable)


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

    def bind_object(self, trackable: Trackable, plan: RestorePlan | None = None) -> bool:
        """Record that ``trackable`` is this node's object; False if the node was bound before.

        ``plan`` remembers the binding so that a failed restore can forget it again.
        """
        coordinator = self._coordinator
        current = coordinator.object_by_proto_id.get(self._proto_id)
        if current is None:
            coordinator.object_by_proto_id[self._proto_id] = trackable
            coordinator.matched_proto_ids.add(self._proto_id)
            if plan is not None:
                plan.bound.append(self._proto_id)
            return True
        if current is not trackable:
            if coordinator.unbound_objects.add(trackable) and plan is not None:
                plan.seen.append(trackable)
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
        self.walk_and_restore(trackable, children)

    def walk_and_restore(
        self, trackable: Trackable, children: Mapping[str, Trackable] | None = None,
        record: WalkRecord | None = None, *, own: Mapping[int, Trackable] | None = None,
    ) -> RestorePlan | None:
        """:meth:`restore`, keeping what the walk met in ``record``; the plan carried out, or
        None if the node was bound before (nothing done). ``own``: see ``execute``."""
        plan = RestorePlan()
        if not self.bind_object(trackable, plan):
            return None
        self._coordinator.execute(
            plan, lambda: self._walk(plan, trackable, children, record), own=own
        )
        return plan

    # -- the walk ----------------------------------------------------------------------------

    def _walk(
        self, plan: RestorePlan, trackable: Trackable,
        root_children: Mapping[str, Trackable] | None, record: WalkRecord | None,
    ) -> None:
        """Bind and plan every node reachable from this one, breadth first.

        Every node is planned one way, chosen by what its object's class declares: a run of
        objects whose class declares ``_whole_value_names`` (variables: nearly every node of a
        large model) is planned from the checkpoint's attributes in one pass
        (:func:`~trackpoint.checkpoint.restore_bulk.plan_leaves`); any other node, and such an
        object on a node that does not fit, through :meth:`RestoreCoordinator.plan_node`.
        """
        coordinator = self._coordinator
        nodes = coordinator.proto.nodes
        uid = coordinator.restore_uid
        unassigned = plan.unassigned
        # Asked at every node (a nested restore may add deferred slots), of the tables themselves.
        slots, deferred_slots = (
            coordinator.slot_restorations, coordinator.deferred_slot_restorations
        )
        queue: _Queue = record.queue if record is not None else []
        queue.append((self._proto_id, trackable))
        kinds: dict[type, WholeValues | None] = {}  # what each class met declares
        index = -1
        while index + 1 < len(queue):
            index += 1
            node_id, trackable = queue[index]
            cls = type(trackable)
            if cls in kinds:
                kind = kinds[cls]
            else:
                kind = kinds[cls] = whole_values(cls)
            if kind is not None and (index or root_children is None):
                done = plan_leaves(plan, queue, index, nodes, uid, record, kind)
                if done:
                    if slots or deferred_slots:
                        if record is not None:
                            record.fail()
                        for leaf_id, leaf in queue[index : index + done]:
                            if leaf_id in slots or leaf_id in deferred_slots:
                                self._queue_slot_variables(plan, queue, leaf_id, leaf)
                    index += done - 1
                    continue
            node = nodes[node_id]
            if record is not None:
                record.general.append(index)
                if isinstance(trackable, SlotOwner):
                    record.fail()  # its slots are not part of the structure recorded
            if not plan_values(coordinator, plan, node_id, node, trackable):
                unassigned.append(node_id)
            node_children = node.children
            if node_children:
                if index == 0 and root_children is not None:
                    children = root_children
                else:
                    children = children_of(trackable, record)
                self._queue_children(plan, queue, index, trackable, node_children, children, record)
            elif record is not None:
                if not (not root_children if index == 0 else is_leaf(trackable)):
                    record.fail()  # the program's object has children the checkpoint's lacks
                record.children.append(_NO_CHILDREN)
            if slots or deferred_slots:
                if record is not None:
                    record.fail()
                self._queue_slot_variables(plan, queue, node_id, trackable)

    def _queue_children(
        self, plan: RestorePlan, queue: _Queue, index: int, trackable: Trackable,
        node_children: Any, children: Mapping[str, Trackable], record: WalkRecord | None,
    ) -> None:
        """Bind each saved child of ``trackable`` (queue entry ``index``) that exists."""
        coordinator = self._coordinator
        refs = coordinator.object_by_proto_id.refs
        nodes = coordinator.proto.nodes
        get, held_ref, new_ref = children.get, refs.get, weakref.ref
        add_matched, add_bound, add_queued = (
            coordinator.matched_proto_ids.add, plan.bound.append, queue.append
        )
        lookup = type(trackable)._lookup_dependency
        direct = lookup is _PLAIN_LOOKUP or lookup is _CONTAINER_LOOKUP  # children.get(name)
        fallback = lookup is not _PLAIN_LOOKUP  # and else, or if None, the object's own lookup
        if direct and len(node_children) >= 16 and queue_all_children(
            coordinator, plan, queue, node_children, children, record
        ):
            return
        found: list[str] = []  # names of live children met, in the checkpoint's order
        add_found = found.append if record is not None else None
        for child in node_children:
            child_id = child.node_id
            name = child.local_name
            ref = held_ref(child_id)
            if ref is not None and (held := ref()) is not None:
                # Bound before: an object the checkpoint shares.
                if add_found is not None:
                    if get(name) is not held:
                        record.fail()  # type: ignore[union-attr]  # add_found: a record
                    add_found(name)
                continue
            local = get(name) if direct else None
            if local is None and fallback:
                local = trackable._lookup_dependency(name, children)
                if record is not None and local is not get(name):
                    record.fail()  # the object's own lookup finds what its children lack
            if local is None:
                if _has_checkpoint_values(nodes[child_id]):
                    position = CheckpointPosition(coordinator, child_id)
                    plan.deferred.append((trackable, name, position))
                    if record is not None:
                        record.deferred.append((index, name, child_id))
                continue
            refs[child_id] = new_ref(local)
            add_matched(child_id)
            add_bound(child_id)
            add_queued((child_id, local))
            if add_found is not None:
                add_found(name)
        if record is not None:
            if found != list(children):
                record.fail()  # live children without a node, or in another order
            # Each found child is children[name]: the dict is the object's child list.
            record.children.append(children)

    def _queue_slot_variables(
        self, plan: RestorePlan, queue: _Queue, node_id: int, trackable: Trackable
    ) -> None:
        coordinator = self._coordinator
        # This node is an optimizer whose variables were bound before it existed.
        waiting = coordinator.deferred_slot_restorations.get(node_id, ())
        if waiting:
            plan.slots_taken.append(
                functools.partial(_forget, coordinator.deferred_slot_restorations, node_id)
            )
        for deferred in waiting:
            variable = deferred.original_variable()
            if variable is not None:
                self._create_slot_position(
                    plan, queue, trackable, variable, deferred.slot_variable_id,
                    deferred.slot_name,
                )
        # This node is a variable with slots.
        slots = coordinator.slot_restorations.get(node_id, ())
        if slots:
            plan.slots_taken.append(
                functools.partial(_forget, coordinator.slot_restorations, node_id)
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
        self, plan: RestorePlan, queue: _Queue, optimizer: Trackable, variable: Trackable,
        slot_variable_id: int, slot_name: str,
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
            plan.pending_slots.append((slot_variable_id, slot))
        if position.bind_object(slot, plan):
            queue.append((slot_variable_id, slot))


def _node_label(node_name: Callable[[int], str], nodes: list[int], index: int) -> str:
    return node_name(nodes[index])


def _forget(table: dict[int, Any], key: int) -> None:
    table.pop(key, None)


def _defer_slot(
    coordinator: RestoreCoordinator, optimizer_id: int, restoration: _DeferredSlotRestoration
) -> None:
    coordinator.deferred_slot_restorations.setdefault(optimizer_id, []).append(restoration)


def _has_checkpoint_values(node: TrackableObjectGraph.TrackableObject) -> bool:
    if node.HasField("has_checkpoint_values"):
        return node.has_checkpoint_values.value
    return bool(
        node.children or node.attributes or node.slot_variables
        or node.HasField("registered_saver")
    )
