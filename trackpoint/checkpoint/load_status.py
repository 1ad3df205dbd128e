"""Load statuses: what ``Checkpoint.read``/``restore`` return, and their assertions.

The assertions are TensorFlow's contract (semantics §2, C1–C5) and raise ``AssertionError``
with TF's message fragments, since users catch exactly that:

* ``assert_existing_objects_matched()``: every bound node got values from this restore (or a
  newer one) — "not assigned a value from checkpoint" — and every reachable object that owns
  values is bound — "not bound to checkpointed values".
* ``assert_consumed()``: that, plus every checkpoint node with values matched ("Unresolved
  object in checkpoint"), no slot restorations pending, and no "Unused attributes".
* ``assert_nontrivial_match()``: something besides the root matched ("Nothing except the root
  object matched a checkpointed value").
* ``expect_partial()``: silence the warning logged when a partial restore is dropped (C4).

A checkpoint without an object graph (TF1 ``Saver``) gives a :class:`NameBasedSaverStatus`,
whose three assertions all check that every object that owns values found them by name.

Bookkeeping: the Checkpoint's own ``save_counter`` is not required to be bound when the
checkpoint has none (a ``write()`` checkpoint read with ``restore()``, semantics D2): it is the
Checkpoint's numbering, not the program's state.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING, Protocol

from trackpoint._gc import collector_paused
from trackpoint.graph.keys import SAVE_COUNTER
from trackpoint.graph.structure import StructureFingerprint
from trackpoint.graph.walk import ObjectGraphView, list_objects, readable_path
from trackpoint.tracking.base import Trackable, has_values
from trackpoint.tracking.slots import SlotOwner

if TYPE_CHECKING:
    from typing_extensions import Self

    from trackpoint.checkpoint.restore import RestoreCoordinator
    from trackpoint.saving import CheckpointOptions

__all__ = [
    "CheckpointLoadStatus",
    "InitializationOnlyStatus",
    "LoadStatus",
    "NameBasedLoad",
    "NameBasedSaverStatus",
]

_SHOW_AT_MOST = 10


class LoadStatus:
    """The result of ``read``/``restore``: assertions about how the checkpoint matched.

    Every method returns the status, so calls chain:
    ``ckpt.restore(path).assert_existing_objects_matched().expect_partial()``.
    """

    def assert_consumed(self) -> Self:
        """Every checkpoint value and every object matched; no deferred values remain."""
        raise NotImplementedError

    def assert_existing_objects_matched(self) -> Self:
        """Every existing object that owns values got them from this checkpoint."""
        raise NotImplementedError

    def assert_nontrivial_match(self) -> Self:
        """Something besides the root object matched a checkpoint value."""
        raise NotImplementedError

    def expect_partial(self) -> Self:
        """Do not warn about checkpoint values left unrestored when this status is dropped."""
        return self

    def initialize_or_restore(self) -> None:
        """TensorFlow-compatibility no-op: values are initialized at creation and restored
        eagerly, so there is nothing left to run (semantics C5)."""
        return None


class InitializationOnlyStatus(LoadStatus):
    """Returned by ``restore(None)``: nothing is restored; every assertion fails."""

    _MESSAGE = "No checkpoint specified (save_path=None); nothing is being restored."

    def assert_consumed(self) -> Self:
        raise AssertionError(self._MESSAGE)

    def assert_existing_objects_matched(self) -> Self:
        raise AssertionError(self._MESSAGE)

    def assert_nontrivial_match(self) -> Self:
        raise AssertionError(self._MESSAGE)


class CheckpointLoadStatus(LoadStatus):
    """Status of an object-based restore (``Checkpoint.read``/``restore``).

    Holds the root (strongly: assertions must see the objects even if the Checkpoint was
    dropped) and the coordinator, which keeps matching objects attached later.
    """

    def __init__(
        self, coordinator: RestoreCoordinator, view: ObjectGraphView, options: CheckpointOptions,
        *, fingerprint: StructureFingerprint | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._view = view
        self._root = view.root
        self._options = options
        # The program's structure as the read met it: while unchanged, the assertions take the
        # program's objects from it instead of walking the program again.
        self._fingerprint = fingerprint

    # -- helpers -----------------------------------------------------------------------------

    def _bookkeeping_objects(self) -> set[int]:
        """ids of objects exempt from "not bound": the Checkpoint's own save_counter if the
        checkpoint has none."""
        proto = self._coordinator.proto
        saved = {child.local_name for child in proto.nodes[0].children} if proto.nodes else set()
        if SAVE_COUNTER in saved:
            return set()
        return {
            id(ref.ref) for ref in self._view.list_children(self._view.root)
            if ref.name == SAVE_COUNTER
        }

    def _unbound_objects(self) -> list[Trackable]:
        with collector_paused():  # walks every object of the program's graph
            return self._unbound_objects_unpaused()

    def _unbound_objects_unpaused(self) -> list[Trackable]:
        coordinator = self._coordinator
        met = coordinator.unbound_objects  # reported while they live, as every object met
        bound: set[int] | None = None
        # The read bound every object of the structure it recorded (or, without a record, of
        # the structure its bindings form): while that structure is unchanged, only objects
        # met apart from it can be unbound, and the slots of its optimizers (optimizer state,
        # created by the program at any time, is no structure).
        fingerprint = self._fingerprint
        if fingerprint is None:
            fingerprint = self._bound_structure()
        recorded = fingerprint.unchanged() if fingerprint is not None else None
        if recorded is None:
            objects = list_objects(
                self._view, skip_slot_variables=self._options.skip_slot_variables
            )
        else:  # (a read's record may list its slot variables; the bindings' structure never)
            objects = self._slots_of(recorded, with_slots=fingerprint is self._fingerprint)
        if objects:
            bound = set(map(id, coordinator.object_by_proto_id.values()))
            for obj in [obj for obj in objects if id(obj) not in bound]:
                met.add(obj)
        if not met:
            return []
        if bound is None:
            bound = set(map(id, coordinator.object_by_proto_id.values()))
        exempt: set[int] | None = None
        seen: set[int] = set()
        unbound = []
        for obj in met:
            if id(obj) in seen or id(obj) in bound:
                continue
            seen.add(id(obj))
            if exempt is None:
                exempt = self._bookkeeping_objects()
            if id(obj) not in exempt and has_values(obj) and obj._serialize_to_tensors():
                unbound.append(obj)
        return unbound

    def _bound_structure(self) -> StructureFingerprint | None:
        """The structure the read's bindings form: from the root, each bound object with the
        bound objects of its node's children by local name (checkpoint order). Unchanged
        means the program's objects are exactly these, all bound. None: an object is bound to
        two nodes, or the root is not bound (the walk answers then)."""
        coordinator = self._coordinator
        refs = coordinator.object_by_proto_id.refs
        root_ref = refs.get(0)
        root = root_ref() if root_ref is not None else None
        if root is None:
            return None
        nodes = coordinator.proto.nodes
        # Breadth first over bound children, as the read went: only objects reachable now.
        node_of: dict[int, int] = {0: 0}  # node id -> index in objects
        objects: list[Trackable] = [root]
        node_ids = [0]
        children: list[dict[str, Trackable]] = []
        for node_id in node_ids:  # grows while iterated
            found: dict[str, Trackable] = {}
            for edge in nodes[node_id].children:
                child_id = edge.node_id
                index = node_of.get(child_id)
                if index is None:
                    ref = refs.get(child_id)
                    child = ref() if ref is not None else None
                    if child is None:
                        continue  # not bound (deferred), or its object is gone
                    index = node_of[child_id] = len(objects)
                    objects.append(child)
                    node_ids.append(child_id)
                found[edge.local_name] = objects[index]
            children.append(found)
        if len(set(map(id, objects))) != len(objects):
            return None  # one object at two nodes: the program's graph has it once
        return StructureFingerprint.capture(self._view, objects, children)

    def _slot_nodes_objects(self) -> set[int]:
        """ids of the objects bound to the checkpoint's slot variable nodes."""
        get = self._coordinator.object_by_proto_id.get
        found = map(get, self._coordinator.slot_node_ids)
        return {id(obj) for obj in found if obj is not None}

    def _slots_of(self, recorded: list[Trackable], *, with_slots: bool) -> list[Trackable]:
        """The slot variables a walk of the recorded structure would list: each optimizer's
        slot of each object that is not itself a slot, per slot name (``graph.walk``).
        ``with_slots``: ``recorded`` may hold slot variables (left out as variables)."""
        owners = [obj for obj in recorded if isinstance(obj, SlotOwner)]
        if not owners or self._options.skip_slot_variables:
            return []
        variables = recorded
        if with_slots:
            slot_objects = self._slot_nodes_objects()
            variables = [obj for obj in recorded if id(obj) not in slot_objects]
        slots: list[Trackable] = []
        for owner in owners:
            get_slot = owner.get_slot
            for slot_name in owner.get_slot_names():
                found = map(get_slot, variables, repeat(slot_name))
                slots.extend(slot for slot in found if slot is not None)
        return slots

    def _describe(self, objects: list[Trackable]) -> list[str]:
        _, paths = self._view.breadth_first_traversal()
        return [
            f"{readable_path(paths[id(obj)]) if id(obj) in paths else '<not reachable>'} "
            f"({obj!r})"
            for obj in objects
        ]

    # -- assertions --------------------------------------------------------------------------

    def assert_consumed(self) -> Self:
        # docstring inherited
        self.assert_existing_objects_matched()
        coordinator = self._coordinator
        names = coordinator.graph.node_names
        skip_slots = self._options.skip_slot_variables
        # Nodes with values and no (live) object.
        dead = coordinator.object_by_proto_id.dead_keys()
        matched = coordinator.matched_proto_ids
        unresolved = coordinator.graph.unmatched(
            matched.difference(dead) if dead else matched, with_saver=True
        )
        if skip_slots:
            unresolved = [n for n in unresolved if n not in coordinator.slot_node_ids]
        if unresolved:
            node_id = unresolved[0]
            raise AssertionError(
                f"Unresolved object in checkpoint {names()[node_id]}: the checkpoint "
                f"{coordinator.prefix} has values for it, but no Python object was matched "
                "(create and attach it, or call expect_partial()). "
                f"Node: {coordinator.proto.nodes[node_id]}"
            )
        if not skip_slots and any(coordinator.slot_restorations.values()):
            pending = [
                f"{names()[var_id]}: {[s.slot_name for s in slots]}"
                for var_id, slots in coordinator.slot_restorations.items() if slots
            ]
            raise AssertionError(f"Unresolved slot restorations: {pending}")
        if coordinator.unused_attributes:
            lines = []
            for node_id, attributes in coordinator.unused_attributes.items():
                obj = coordinator.object_by_proto_id.get(node_id)
                lines.append(f"{names()[node_id]} ({obj!r}): {attributes}")
            raise AssertionError(
                "Unused attributes in these objects (the attributes exist in the checkpoint but "
                "were not restored):\n" + "\n".join(lines)
            )
        return self

    def assert_existing_objects_matched(self) -> Self:
        # docstring inherited
        coordinator = self._coordinator
        # Every other bound node's object got values from this restore (uids only grow).
        get, uid = coordinator.object_by_proto_id.get, coordinator.restore_uid
        stale = [
            node_id for node_id in coordinator.unassigned
            if (trackable := get(node_id)) is not None and trackable._update_uid < uid
        ]
        if stale:
            node_id = min(stale)
            raise AssertionError(
                f"Object {coordinator.node_name(node_id)} ({get(node_id)!r}) not assigned a "
                f"value from checkpoint {coordinator.prefix}: the checkpoint node has no value "
                f"this object accepts. Node: {coordinator.proto.nodes[node_id]}"
            )
        unbound = self._unbound_objects()
        if unbound:
            shown = min(_SHOW_AT_MOST, len(unbound))
            raise AssertionError(
                f"Found {len(unbound)} Python objects that were not bound to checkpointed "
                "values, likely due to changes in the Python program. Showing "
                f"{shown} of {len(unbound)} unmatched objects: "
                f"{self._describe(unbound[:shown])}"
            )
        return self

    def assert_nontrivial_match(self) -> Self:
        # docstring inherited
        coordinator = self._coordinator
        if len(coordinator.object_by_proto_id) <= 1:
            unbound = self._unbound_objects()
            if unbound:
                raise AssertionError(
                    "Nothing except the root object matched a checkpointed value. Typically "
                    "this means that the checkpoint does not match the Python program. The "
                    "following objects have no matching checkpointed value: "
                    f"{self._describe(unbound)}"
                )
            raise AssertionError(
                "Nothing except the root object matched a checkpointed value: nothing to load. "
                f"No dependencies have been added to {self._view.root!r} yet."
            )
        return self

    def expect_partial(self) -> Self:
        # docstring inherited
        self._coordinator.expect_partial = True
        return self


class NameBasedLoad(Protocol):
    """What :class:`NameBasedSaverStatus` needs of a name-based load (``name_based``)."""

    prefix: str
    expect_partial: bool

    def unrestored(self, view: ObjectGraphView) -> list[str]:
        """Why each reachable object that owns values did not get them from this load."""
        ...


class NameBasedSaverStatus(LoadStatus):
    """Status of a restore from a name-based (TF1 ``Saver``) checkpoint (``name_based``).

    A checkpoint without an object graph says nothing about which objects should exist, so the
    three assertions check the same thing, as in TensorFlow: every reachable object that owns
    values got them from this restore (or a newer one). Checkpoint values no object used do
    not fail them; the Checkpoint's ``save_counter`` is exempt.
    """

    def __init__(self, coordinator: NameBasedLoad, view: ObjectGraphView) -> None:
        self._coordinator = coordinator
        self._view = view
        self._root = view.root  # the assertions must see the objects if the Checkpoint goes

    def assert_consumed(self) -> Self:
        # docstring inherited
        with collector_paused():  # walks every object of the program's graph
            missing = self._coordinator.unrestored(self._view)
        if missing:
            shown = min(_SHOW_AT_MOST, len(missing))
            raise AssertionError(
                f"{len(missing)} objects found no value in the name-based checkpoint "
                f"{self._coordinator.prefix}; showing {shown}:\n  "
                + "\n  ".join(missing[:shown])
                + "\nName them: tp.Variable(name=<TF1 name>), or map their object-based keys "
                "with tp.CheckpointOptions(name_map={key: <TF1 name>}); or call "
                "expect_partial() and skip this assertion."
            )
        return self

    def assert_existing_objects_matched(self) -> Self:
        # docstring inherited
        return self.assert_consumed()

    def assert_nontrivial_match(self) -> Self:
        # docstring inherited
        return self.assert_consumed()

    def expect_partial(self) -> Self:
        # docstring inherited
        self._coordinator.expect_partial = True
        return self
