"""The restore coordinator: matching checkpoint nodes to live objects, now or when they appear.

One :class:`RestoreCoordinator` per ``read``/``restore`` call. From node 0 and the root object
it walks the saved graph breadth first and binds each node to the live object reached by the
same local names (:class:`CheckpointPosition`). Bound objects get their values at once, in one
batched read per walk through :class:`~trackpoint.saving.MultiDeviceSaver`; a node whose object
does not exist yet waits in its parent's ``_deferred_dependencies`` and is restored when the
object is attached (deferred restoration, semantics B1/B2). Optimizer slots wait for both their
variable and their optimizer (F2).

Each object records the uid of the restore that last gave it values; an older restore reaching
it later leaves it alone, so the most recently *requested* restore wins (B4).

The coordinator holds objects weakly and nothing holds the coordinator but its status and the
pending positions, so dropping them frees it; a ``weakref.finalize`` hook then logs the values
that were never restored (C4) unless ``expect_partial()`` was called.
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from trackpoint.bundle.protos.trackable_object_graph_pb2 import TrackableObjectGraph
from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import InvalidArgumentError
from trackpoint.graph.keys import escape_local_name, local_name
from trackpoint.graph.walk import node_names
from trackpoint.saving import CheckpointOptions, MultiDeviceSaver
from trackpoint.saving.devices import DeviceValue
from trackpoint.tracking.base import VARIABLE_VALUE_KEY, Trackable, has_values, next_restore_uid
from trackpoint.tracking.slots import SlotOwner

__all__ = ["CheckpointPosition", "IdentityWeakSet", "RestoreCoordinator", "WeakObjects"]

logger = logging.getLogger("trackpoint.checkpoint")


class IdentityWeakSet:
    """A set of objects by identity, holding them weakly (trackables may be unhashable)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def add(self, obj: Any) -> None:
        # No removal callback (one closure per object costs more than the set is used): a
        # collected object's entry reads as absent and is replaced if its id is reused.
        ref = self._refs.get(id(obj))
        if ref is None or ref() is not obj:
            self._refs[id(obj)] = weakref.ref(obj)

    def __iter__(self) -> Iterator[Any]:
        for ref in list(self._refs.values()):
            obj = ref()
            if obj is not None:
                yield obj


class WeakObjects:
    """``{node id: object}`` holding the objects weakly.

    The part of ``weakref.WeakValueDictionary``'s interface a load uses (``get``, ``[]``,
    ``in``, ``values``, ``len``) at a fraction of its per-call cost: a load looks up every
    node of the graph several times (100,000 nodes for a model of 100,000 variables). Entries
    of collected objects read as absent.
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def get(self, key: int, default: Any = None) -> Any:
        ref = self._refs.get(key)
        obj = ref() if ref is not None else None
        return default if obj is None else obj

    def __getitem__(self, key: int) -> Any:
        obj = self._refs[key]()
        if obj is None:
            raise KeyError(key)
        return obj

    def __setitem__(self, key: int, value: Any) -> None:
        self._refs[key] = weakref.ref(value)

    def __contains__(self, key: object) -> bool:
        ref = self._refs.get(key)  # type: ignore[call-overload]
        return ref is not None and ref() is not None

    def __len__(self) -> int:
        return sum(1 for ref in self._refs.values() if ref() is not None)

    def values(self) -> list[Any]:
        return [obj for obj in (ref() for ref in self._refs.values()) if obj is not None]


class _SlotRestoration(NamedTuple):
    optimizer_id: int
    slot_variable_id: int
    slot_name: str


class _DeferredSlotRestoration(NamedTuple):
    original_variable: weakref.ref[Trackable]
    slot_variable_id: int
    slot_name: str


@dataclass(slots=True)
class _WarningState:
    """What the C4 warning needs, kept apart from the coordinator so the finalizer can hold it."""

    proto: TrackableObjectGraph
    matched_proto_ids: set[int]
    unused_attributes: dict[int, list[str]]
    ignored_node_ids: frozenset[int]
    expect_partial: bool = False
    prefix: str = ""
    extra: list[str] = field(default_factory=list)


def _warn_unrestored(state: _WarningState) -> None:
    """Log one warning naming every checkpoint value this restore never used."""
    if state.expect_partial:
        return
    unmatched = [
        node_id
        for node_id, node in enumerate(state.proto.nodes)
        if node_id not in state.matched_proto_ids
        and node_id not in state.ignored_node_ids
        and node.attributes
    ]
    if not unmatched and not state.unused_attributes:
        return
    names = node_names(state.proto)
    lines = [
        f"Value in checkpoint could not be found in the restored object: {names[node_id]}"
        for node_id in unmatched
    ]
    lines += [
        "An attribute in the restored object could not be found in the checkpoint. "
        f"Object: {names[node_id]}, attribute: {attributes}"
        for node_id, attributes in state.unused_attributes.items()
    ]
    if lines:
        logger.warning(
            "A checkpoint restore from %s is being dropped with unrestored values. To silence "
            "this warning, call `status.expect_partial()` on the status that `read()`/`restore()` "
            "returned.\n  %s",
            state.prefix,
            "\n  ".join(lines),
        )


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
        self._warning = _WarningState(
            proto,
            self.matched_proto_ids,
            self.unused_attributes,
            self.slot_node_ids if options.skip_slot_variables else frozenset(),
            prefix=prefix,
        )
        finalizer = weakref.finalize(self, _warn_unrestored, self._warning)
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

    def restore_values(
        self, restorers: list[_Restorer], registered: dict[str, dict[str, Trackable]]
    ) -> None:
        """Read the values of ``restorers`` (one batched read) and hand them over."""
        if not restorers and not registered:
            return
        if not registered and self.index is not None and self.options.progress is None:
            keys = [key for restorer in restorers for key in restorer.specs]
            if len(set(keys)) == len(keys) and all(
                type(value) is np.ndarray or not isinstance(value, (Mapping, DeviceValue))
                for restorer in restorers
                for value in restorer.specs.values()
            ):
                self._restore_whole_values(restorers, self.index)
                return
        tensors = _RestorerMap(restorers)
        MultiDeviceSaver(tensors, registered).restore(self.prefix, self.options, index=self.index)

    @staticmethod
    def _restore_whole_values(restorers: list[_Restorer], index: BundleReader) -> None:
        """What ``MultiDeviceSaver.restore`` does for a batch of whole values on this task.

        The usual batch (no slices, devices, registered savers or progress callback) skips
        building a saver, its entries and its bookkeeping. Every key is read and verified first
        (one ``read_many``), then each object's ``_restore_from_tensors`` runs in the saver's
        order, so a missing or damaged value fails the batch before any object changes. Per-value
        cost is what a model of 100,000 small variables spends its restore on.
        """
        with index.reopen() as reader:
            values = iter(reader.read_many([k for r in restorers for k in r.specs], copy=False))
            for restorer in restorers:
                names = restorer.local_names
                restorer._restore_from_tensors({name: next(values) for name in names})


class _RestorerMap:
    """``{restorer: {checkpoint_key: live value}}`` as ``MultiDeviceSaver`` takes it."""

    def __init__(self, restorers: list[_Restorer]) -> None:
        self._restorers = restorers

    def items(self) -> list[tuple[_Restorer, dict[str, Any]]]:
        return [(r, r.specs) for r in self._restorers]


class _Restorer:
    """Adapts one object's ``_restore_from_tensors`` to the names stored in the checkpoint.

    The checkpoint may spell value names differently (TF escapes custom names twice); the
    object gets its own names back. Errors gain the checkpoint keys and the node path.
    """

    __slots__ = ("coordinator", "local_names", "names", "proto_id", "specs", "trackable")

    def __init__(
        self, trackable: Trackable, specs: dict[str, Any], local_names: tuple[str, ...],
        names: dict[str, str] | None, coordinator: RestoreCoordinator, proto_id: int,
    ) -> None:
        self.trackable = trackable
        self.specs = specs  # checkpoint key -> the live value (its slice layout matters)
        self.local_names = local_names  # local_name() of each key of specs, in order
        # local name in the key -> the object's own value name; None when they are the same
        # (the usual case: the values are passed on without renaming)
        self.names = names
        self.coordinator = coordinator
        self.proto_id = proto_id  # names the node in errors (computed only then)

    def _restore_from_tensors(self, restored: Mapping[str, Any]) -> None:
        names = self.names
        values = restored if names is None else {names[n]: v for n, v in restored.items()}
        try:
            self.trackable._restore_from_tensors(values)
        except InvalidArgumentError as exc:
            keys = sorted(self.specs)
            prefix = self.coordinator.prefix
            raise InvalidArgumentError(
                f"{exc.message} (object {self.coordinator.node_name(self.proto_id)}, "
                f"checkpoint key {', '.join(keys)} in {prefix})",
                path=prefix,
                key=keys[0] if keys else None,
            ) from exc


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
        return self._coordinator.object_by_proto_id[self._proto_id]

    def value_spec(self) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
        """Saved ``(shape, dtype)`` if this node is a plain variable (restore-on-create)."""
        node = self.node
        if len(node.attributes) != 1 or node.children:
            return None
        attribute = node.attributes[0]
        if attribute.name != VARIABLE_VALUE_KEY:
            return None
        return self._coordinator.value_spec(attribute.checkpoint_key)

    def bind_object(self, trackable: Trackable) -> bool:
        """Record that ``trackable`` is this node's object; False if the node was bound before."""
        coordinator = self._coordinator
        coordinator.all_python_objects.add(trackable)
        coordinator.matched_proto_ids.add(self._proto_id)
        current = coordinator.object_by_proto_id.get(self._proto_id)
        if current is None:
            coordinator.object_by_proto_id[self._proto_id] = trackable
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

        Args:
            trackable: the object.
            children: the object's children if not its own ``_trackable_children()`` (the
                root of a ``Checkpoint`` with attached dependencies).
        """
        if self.bind_object(trackable):
            self._restore_descendants(children)

    # -- the walk ----------------------------------------------------------------------------

    def _restore_descendants(self, root_children: Mapping[str, Trackable] | None) -> None:
        coordinator = self._coordinator
        restorers: list[_Restorer] = []
        registered: dict[str, dict[str, Trackable]] = {}
        # (position, its bound object): carried along instead of looked up again
        queue: collections.deque[tuple[CheckpointPosition, Trackable]] = collections.deque(
            [(self, self.trackable)]
        )
        first = True
        nodes = coordinator.proto.nodes
        while queue:
            position, trackable = queue.popleft()
            node = nodes[position._proto_id]
            position._single_restore(restorers, registered, node, trackable)
            children = root_children if first and root_children is not None else None
            first = False
            if node.children:  # a leaf of the saved graph: its live children do not matter
                position._queue_children(queue, children, node, trackable)
            if coordinator.slot_restorations or coordinator.deferred_slot_restorations:
                position._queue_slot_variables(queue, trackable)
        coordinator.restore_values(restorers, registered)

    def _single_restore(
        self, restorers: list[_Restorer], registered: dict[str, dict[str, Trackable]],
        node: TrackableObjectGraph.TrackableObject, trackable: Trackable,
    ) -> None:
        coordinator = self._coordinator
        if coordinator.restore_uid <= trackable._update_uid:
            return  # a more recently requested restore already gave it values
        if node.HasField("registered_saver") and node.registered_saver.name:
            saver = node.registered_saver
            registered.setdefault(saver.name, {})[saver.object_name] = trackable
            trackable._update_uid = coordinator.restore_uid
            return
        live = trackable._serialize_to_tensors() if has_values(trackable) else {}
        attributes = node.attributes
        if len(live) == 1 and len(attributes) == 1:
            # The common case (a variable): one value, stored under its own escaped name.
            ((own_name, value),) = live.items()
            attribute = attributes[0]
            if attribute.name == escape_local_name(own_name):
                key = attribute.checkpoint_key
                local = local_name(key)
                names = None if local == own_name else {local: own_name}
                restorers.append(
                    _Restorer(trackable, {key: value}, (local,), names, coordinator,
                              self._proto_id)
                )  # fmt: skip
                trackable._update_uid = coordinator.restore_uid
                return
        if not live:
            if node.attributes:
                coordinator.unused_attributes.setdefault(self._proto_id, []).extend(
                    a.name for a in node.attributes
                )
            trackable._update_uid = coordinator.restore_uid
            return
        by_escaped = {escape_local_name(name): name for name in live}
        for name, aliases in trackable._tensor_name_aliases().items():
            if name in live:
                for alias in aliases:
                    by_escaped.setdefault(escape_local_name(alias), name)
        specs: dict[str, Any] = {}
        names: dict[str, str] = {}
        present = {attribute.name for attribute in node.attributes}
        for attribute in node.attributes:
            own_name = by_escaped.get(attribute.name)
            if own_name is not None and attribute.name != escape_local_name(own_name) and (
                escape_local_name(own_name) in present
            ):
                own_name = None  # an old alias next to the current name: the current one wins
            if own_name is None:
                coordinator.unused_attributes.setdefault(self._proto_id, []).append(
                    attribute.name
                )
                continue
            specs[attribute.checkpoint_key] = live[own_name]
            names[local_name(attribute.checkpoint_key)] = own_name
        if not specs:
            return  # nothing of this object is in the checkpoint: it stays unmatched
        if len(live) == 1:  # the common case: its one value is named (specs is not empty)
            missing = []
        else:
            missing = sorted(
                set(live) - set(names.values()) - trackable._optional_tensor_names()
            )
        if missing:
            path = coordinator.node_name(self._proto_id)
            raise InvalidArgumentError(
                f"Could not restore object {path} ({type(trackable).__name__}): not all of its "
                f"values are in the checkpoint {coordinator.prefix}. Expected "
                f"{sorted(live)}, the checkpoint has {sorted(a.name for a in node.attributes)}",
                path=coordinator.prefix,
            )
        renamed = None if all(k == v for k, v in names.items()) else names
        locals_ = tuple(local_name(key) for key in specs)
        restorers.append(
            _Restorer(trackable, specs, locals_, renamed, coordinator, self._proto_id)
        )
        trackable._update_uid = coordinator.restore_uid

    def _queue_children(
        self, queue: collections.deque[tuple[CheckpointPosition, Trackable]],
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
                    trackable._deferred_dependencies.setdefault(child.local_name, []).append(
                        position
                    )
            elif position.bind_object(local):
                queue.append((position, local))

    def _queue_slot_variables(
        self, queue: collections.deque[tuple[CheckpointPosition, Trackable]], trackable: Trackable
    ) -> None:
        coordinator = self._coordinator
        # This node is an optimizer whose variables were bound before it existed.
        for deferred in coordinator.deferred_slot_restorations.pop(self._proto_id, ()):
            variable = deferred.original_variable()
            if variable is not None:
                self._create_slot_position(
                    queue, trackable, variable, deferred.slot_variable_id, deferred.slot_name
                )
        # This node is a variable with slots.
        for slot in coordinator.slot_restorations.pop(self._proto_id, ()):
            optimizer = coordinator.object_by_proto_id.get(slot.optimizer_id)
            if optimizer is None:
                coordinator.deferred_slot_restorations.setdefault(slot.optimizer_id, []).append(
                    _DeferredSlotRestoration(
                        weakref.ref(trackable), slot.slot_variable_id, slot.slot_name
                    )
                )
            elif isinstance(optimizer, SlotOwner):
                self._create_slot_position(
                    queue, optimizer, trackable, slot.slot_variable_id, slot.slot_name
                )

    def _create_slot_position(
        self, queue: collections.deque[tuple[CheckpointPosition, Trackable]], optimizer: Trackable,
        variable: Trackable, slot_variable_id: int, slot_name: str,
    ) -> None:
        if not isinstance(optimizer, SlotOwner):
            return
        position = CheckpointPosition(self._coordinator, slot_variable_id)
        slot = optimizer._create_or_restore_slot_variable(position, variable, slot_name)
        if slot is not None and position.bind_object(slot):
            queue.append((position, slot))


def _children_of(trackable: Trackable) -> dict[str, Trackable]:
    from trackpoint.tracking.adapters import to_trackable

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

